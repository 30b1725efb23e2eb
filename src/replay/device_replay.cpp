// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Replay on a given device (see device_replay.hpp): a timing adaptor over the device and the
// engine's event loop over a compiled plan.
#include "replay/device_replay.hpp"

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "replay/engine_detail.hpp"
#include "replay/plan.hpp"
#include "replay/torch_allocator.hpp"

namespace cistern::replay {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point began) {
  return std::chrono::duration<double, std::milli>(Clock::now() - began).count();
}

/// Forwards every call to the device, counts the allocator's segment and mapping calls, prices
/// them with the cost model (as the engine's MeteredDevice does) and measures their real time.
class TimedDevice final : public Device {
 public:
  TimedDevice(Device& device, const CostModel& costs) : device_(device), costs_(costs) {}

  const DeviceTimes& times() const noexcept { return times_; }
  std::uint64_t allocs() const noexcept { return allocs_; }
  std::uint64_t frees() const noexcept { return frees_; }
  std::uint64_t maps() const noexcept { return maps_; }
  std::uint64_t unmaps() const noexcept { return unmaps_; }
  double simulated_ns() const noexcept { return simulated_ns_; }

  int index() const noexcept override { return device_.index(); }
  std::string name() const override { return device_.name(); }
  std::size_t granularity() const noexcept override { return device_.granularity(); }
  Status memory_info(MemoryInfo* info) noexcept override { return device_.memory_info(info); }
  std::string last_error() const override { return device_.last_error(); }
  bool supports_virtual_memory() const noexcept override {
    return device_.supports_virtual_memory();
  }

  Status allocate(std::size_t bytes, void** ptr) noexcept override {
    const Status status = timed(times_.segment_ms, [&] { return device_.allocate(bytes, ptr); });
    simulated_ns_ += costs_.alloc_ns;
    if (status != Status::ok) return status;
    ++allocs_;
    simulated_ns_ += costs_.alloc_size_ns(bytes);
    remember(*ptr, bytes);
    return status;
  }
  Status deallocate(void* ptr) noexcept override {
    const Status status = timed(times_.segment_ms, [&] { return device_.deallocate(ptr); });
    simulated_ns_ += costs_.free_ns;
    if (status != Status::ok) return status;
    ++frees_;
    const auto it = segments_.find(ptr);
    if (it != segments_.end()) {
      simulated_ns_ += costs_.free_size_ns(it->second);
      segments_.erase(it);
    }
    return status;
  }

  Status reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept override {
    return timed(times_.vmm_ms, [&] { return device_.reserve(bytes, alignment, va); });
  }
  Status release_reservation(void* va, std::size_t bytes) noexcept override {
    return timed(times_.vmm_ms, [&] { return device_.release_reservation(va, bytes); });
  }
  Status create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept override {
    return timed(times_.vmm_ms, [&] { return device_.create_physical(bytes, handle); });
  }
  Status release_physical(PhysicalHandle handle) noexcept override {
    return timed(times_.vmm_ms, [&] { return device_.release_physical(handle); });
  }
  Status map(void* va, std::size_t bytes, PhysicalHandle handle,
             std::size_t offset) noexcept override {
    const Status status =
        timed(times_.vmm_ms, [&] { return device_.map(va, bytes, handle, offset); });
    if (status != Status::ok) {
      simulated_ns_ += costs_.map_ns;
      return status;
    }
    ++maps_;
    simulated_ns_ += costs_.map_granules_ns(bytes, device_.granularity());
    return status;
  }
  Status unmap(void* va, std::size_t bytes) noexcept override {
    const Status status = timed(times_.vmm_ms, [&] { return device_.unmap(va, bytes); });
    if (status != Status::ok) {
      simulated_ns_ += costs_.unmap_ns;
      return status;
    }
    ++unmaps_;
    simulated_ns_ += costs_.unmap_granules_ns(bytes, device_.granularity());
    return status;
  }

  Status create_event(Event* event) noexcept override {
    return timed(times_.event_ms, [&] { return device_.create_event(event); });
  }
  Status destroy_event(Event event) noexcept override {
    return timed(times_.event_ms, [&] { return device_.destroy_event(event); });
  }
  Status record_event(Event event, Stream stream) noexcept override {
    return priced_event([&] { return device_.record_event(event, stream); });
  }
  Status query_event(Event event) noexcept override {
    return priced_event([&] { return device_.query_event(event); });
  }
  Status synchronize_event(Event event) noexcept override {
    return priced_event([&] { return device_.synchronize_event(event); });
  }
  Status stream_wait_event(Stream stream, Event event) noexcept override {
    return priced_event([&] { return device_.stream_wait_event(stream, event); });
  }
  Status synchronize_stream(Stream stream) noexcept override {
    return timed(times_.event_ms, [&] { return device_.synchronize_stream(stream); });
  }
  Status synchronize_device() noexcept override {
    return timed(times_.event_ms, [&] { return device_.synchronize_device(); });
  }

 private:
  template <class Call>
  static Status timed(double& total_ms, Call&& call) noexcept {
    const Clock::time_point began = Clock::now();
    const Status status = call();
    total_ms += ms_since(began);
    return status;
  }
  template <class Call>
  Status priced_event(Call&& call) noexcept {
    simulated_ns_ += costs_.event_ns;
    return timed(times_.event_ms, call);
  }
  void remember(void* ptr, std::size_t bytes) noexcept {
    try {
      segments_[ptr] = bytes;
    } catch (...) {
      // Out of host memory for the map: the free is priced at its fixed cost only.
    }
  }

  Device& device_;
  CostModel costs_;
  DeviceTimes times_;
  std::uint64_t allocs_ = 0;
  std::uint64_t frees_ = 0;
  std::uint64_t maps_ = 0;
  std::uint64_t unmaps_ = 0;
  double simulated_ns_ = 0;
  std::unordered_map<void*, std::size_t> segments_;
};

/// One replay in progress: the allocator over the timed device, the streams, the pointers.
class DeviceReplay {
 public:
  DeviceReplay(const trace::Trace& trace, const detail::Plan& plan, const Policy& policy,
               Device& device, const DeviceHooks& hooks, const Options& options)
      : trace_(trace),
        plan_(plan),
        device_(device),
        hooks_(hooks),
        timed_(device, options.costs),
        pointers_(plan.slots, nullptr) {
    make_streams();
    allocator_ = policy.make(timed_);
    if (options.check_invariants) {
      checked_ = dynamic_cast<const CachingAllocator*>(allocator_.get());
      checked_torch_ = dynamic_cast<const TorchAllocator*>(allocator_.get());
    }
  }
  ~DeviceReplay() {
    try {
      if (allocator_) release();  // after a failure: leave the device as it was found
    } catch (...) {
      // The allocator or the device is failing: what is left is the device's to reclaim.
    }
    allocator_.reset();
    if (!hooks_.destroy_stream) return;
    for (Stream stream : streams_) {
      if (stream != default_stream) hooks_.destroy_stream(stream);
    }
  }
  DeviceReplay(const DeviceReplay&) = delete;
  DeviceReplay& operator=(const DeviceReplay&) = delete;

  /// The cold start and every event, timed, then the clean-up; fills `r`.
  void run(DeviceResult& r) {
    for (const detail::Step& step : plan_.start) allocate(step);
    sample();
    const Clock::time_point began = Clock::now();
    const double device_ms_before = timed_.times().total_ms();
    std::size_t i = 0;
    try {
      for (; i < plan_.steps.size(); ++i) {
        play(plan_.steps[i]);
        sample();
        if (checked_ != nullptr) checked_->check();
        if (checked_torch_ != nullptr) checked_torch_->check();
      }
    } catch (const std::exception& e) {
      const trace::Event& event = trace_.events[i];
      throw Error(fmt::format("events[{}] ({} of id {}, {} bytes): {}", i,
                              trace::to_string(event.op), event.id, event.size, e.what()));
    }
    const double loop_ms = ms_since(began);
    const double loop_device_ms = timed_.times().total_ms() - device_ms_before;
    fill(r, loop_ms, loop_device_ms);  // the trace's figures, before the clean-up's frees
    clean_up();
  }

 private:
  void make_streams() {
    streams_.reserve(trace_.streams.size());
    for (std::size_t i = 0; i < trace_.streams.size(); ++i) {
      if (i == 0 && trace_.streams[0] == 0) {
        streams_.push_back(default_stream);
      } else if (hooks_.create_stream) {
        streams_.push_back(hooks_.create_stream());
      } else {
        throw InvalidArgument("replay on a device: the trace has streams but no create_stream");
      }
    }
  }

  void allocate(const detail::Step& step) {
    const Stream stream = streams_[step.stream];
    try {
      void* ptr = allocator_->allocate(step.size, stream);
      pointers_[step.slot] = ptr;
      if (hooks_.touch && ptr != nullptr && step.size > 0) {
        hooks_.touch(ptr, step.size, stream);
        touched_ += step.size;
      }
    } catch (const OutOfMemory&) {
      pointers_[step.slot] = nullptr;
      ++ooms_;
    }
  }

  void play(const detail::Step& step) {
    switch (step.op) {
      case trace::Op::alloc:
        ++calls_;
        allocate(step);
        return;
      case trace::Op::free:
        if (void* p = pointers_[step.slot]) {
          ++calls_;
          allocator_->deallocate(p, streams_[step.stream]);
          pointers_[step.slot] = nullptr;
        }
        return;
      case trace::Op::synchronize: (void)device_.synchronize_device(); return;
      case trace::Op::empty_cache: allocator_->empty_cache(); return;
    }
  }

  void sample() {
    const std::uint64_t reserved = allocator_->reserved_bytes();
    if (reserved > peak_reserved_) peak_reserved_ = reserved;
  }

  /// Frees what the trace left allocated and empties the cache: the next replay starts afresh.
  void clean_up() {
    release();
    if (hooks_.finish) hooks_.finish();
  }

  void release() {
    for (void*& ptr : pointers_) {
      if (ptr == nullptr) continue;
      void* const live = ptr;
      ptr = nullptr;
      allocator_->deallocate(live, default_stream);
    }
    allocator_->empty_cache();
  }

  void fill(DeviceResult& r, double loop_ms, double loop_device_ms) const {
    Result& row = r.result;
    row.peak_reserved = peak_reserved_;
    if (row.peak_live > 0) {
      row.overhead = static_cast<double>(peak_reserved_) / static_cast<double>(row.peak_live) - 1.0;
    }
    row.ooms = ooms_;
    row.device_allocs = timed_.allocs();
    row.device_frees = timed_.frees();
    row.device_maps = timed_.maps();
    row.device_unmaps = timed_.unmaps();
    row.device_ms = timed_.simulated_ns() / 1e6;
    r.real = timed_.times();
    r.touched_bytes = touched_;
    if (calls_ > 0) {
      const auto calls = static_cast<double>(calls_);
      row.ns_per_op = loop_ms * 1e6 / calls;
      r.allocator_ns_per_op = (loop_ms - loop_device_ms) * 1e6 / calls;
    }
  }

  const trace::Trace& trace_;
  const detail::Plan& plan_;
  Device& device_;
  const DeviceHooks& hooks_;
  TimedDevice timed_;
  std::vector<Stream> streams_;
  std::unique_ptr<Allocator> allocator_;  // destroyed first (see the destructor)
  const CachingAllocator* checked_ = nullptr;
  const TorchAllocator* checked_torch_ = nullptr;
  std::vector<void*> pointers_;
  std::uint64_t peak_reserved_ = 0;
  std::uint64_t ooms_ = 0;
  std::uint64_t calls_ = 0;
  std::uint64_t touched_ = 0;
};

}  // namespace

DeviceResult run_on_device(const trace::Trace& trace, const Policy& policy, Device& device,
                           const DeviceHooks& hooks, const Options& options) {
  if (options.start != Start::cold) {
    throw InvalidArgument(
        "replay on a device: only a cold start is possible (a warm start "
        "places blocks at recorded addresses)");
  }
  const detail::Plan plan = detail::compile(trace);
  const std::string label = policy.label.empty() ? policy.name : policy.label;
  DeviceResult r;
  r.device = device.name();
  r.result = detail::result_header(trace, plan, label, to_string(Start::cold));
  MemoryInfo info;
  if (device.memory_info(&info) == Status::ok) r.result.capacity = info.total;
  if (!plan.error.empty()) {
    r.result.error = plan.error;
    return r;
  }
  try {
    DeviceReplay replay(trace, plan, policy, device, hooks, options);
    replay.run(r);
  } catch (const std::exception& e) {
    DeviceResult failed;
    failed.device = r.device;
    failed.result = detail::result_header(trace, plan, label, to_string(Start::cold));
    failed.result.capacity = r.result.capacity;
    failed.result.error = e.what();
    return failed;
  }
  return r;
}

}  // namespace cistern::replay
