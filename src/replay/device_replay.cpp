// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Replay on a given device (see device_replay.hpp): the engine's Replayer over a timing adaptor
// over the device (allocator -> meter -> timer -> device), with hooks for the writes.
#include "replay/device_replay.hpp"

#include <chrono>
#include <exception>
#include <memory>
#include <vector>

#include "cistern/errors.hpp"
#include "replay/engine_detail.hpp"
#include "replay/forwarding_device.hpp"
#include "replay/plan.hpp"
#include "replay/replayer.hpp"

namespace cistern::replay {
namespace {

using Clock = std::chrono::steady_clock;

/// Measures the real time of every call, by kind; the meter above it counts and prices them.
class TimedDevice final : public ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;

  const DeviceTimes& times() const noexcept { return times_; }

  Status allocate(std::size_t bytes, void** ptr) noexcept override {
    return timed(times_.segment_ms, [&] { return upstream().allocate(bytes, ptr); });
  }
  Status deallocate(void* ptr) noexcept override {
    return timed(times_.segment_ms, [&] { return upstream().deallocate(ptr); });
  }
  Status reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept override {
    return timed(times_.vmm_ms, [&] { return upstream().reserve(bytes, alignment, va); });
  }
  Status release_reservation(void* va, std::size_t bytes) noexcept override {
    return timed(times_.vmm_ms, [&] { return upstream().release_reservation(va, bytes); });
  }
  Status create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept override {
    return timed(times_.vmm_ms, [&] { return upstream().create_physical(bytes, handle); });
  }
  Status release_physical(PhysicalHandle handle) noexcept override {
    return timed(times_.vmm_ms, [&] { return upstream().release_physical(handle); });
  }
  Status map(void* va, PhysicalHandle handle) noexcept override {
    return timed(times_.vmm_ms, [&] { return upstream().map(va, handle); });
  }
  Status map_run(void* va, const PhysicalHandle* handles, std::size_t count) noexcept override {
    return timed(times_.vmm_ms, [&] { return upstream().map_run(va, handles, count); });
  }
  Status unmap(void* va, std::size_t bytes) noexcept override {
    return timed(times_.vmm_ms, [&] { return upstream().unmap(va, bytes); });
  }
  Status create_event(Event* event) noexcept override {
    return timed(times_.event_ms, [&] { return upstream().create_event(event); });
  }
  Status destroy_event(Event event) noexcept override {
    return timed(times_.event_ms, [&] { return upstream().destroy_event(event); });
  }
  Status record_event(Event event, Stream stream) noexcept override {
    return timed(times_.event_ms, [&] { return upstream().record_event(event, stream); });
  }
  Status query_event(Event event) noexcept override {
    return timed(times_.event_ms, [&] { return upstream().query_event(event); });
  }
  Status synchronize_event(Event event) noexcept override {
    return timed(times_.event_ms, [&] { return upstream().synchronize_event(event); });
  }
  Status stream_wait_event(Stream stream, Event event) noexcept override {
    return timed(times_.event_ms, [&] { return upstream().stream_wait_event(stream, event); });
  }
  Status synchronize_stream(Stream stream) noexcept override {
    return timed(times_.event_ms, [&] { return upstream().synchronize_stream(stream); });
  }
  Status synchronize_device() noexcept override {
    return timed(times_.event_ms, [&] { return upstream().synchronize_device(); });
  }

 private:
  template <class Call>
  static Status timed(double& total_ms, Call&& call) noexcept {
    const Clock::time_point began = Clock::now();
    const Status status = call();
    total_ms += std::chrono::duration<double, std::milli>(Clock::now() - began).count();
    return status;
  }

  DeviceTimes times_;
};

/// Writes every allocation through `DeviceHooks::touch`.
class Toucher final : public detail::LoopHooks {
 public:
  explicit Toucher(const DeviceHooks& hooks) : hooks_(hooks) {}
  std::uint64_t touched() const noexcept { return touched_; }

  void allocated(std::size_t, const detail::Step& step, void* ptr, Stream stream) override {
    if (ptr == nullptr || step.size == 0) return;
    hooks_.touch(ptr, step.size, stream);
    touched_ += step.size;
  }

 private:
  const DeviceHooks& hooks_;
  std::uint64_t touched_ = 0;
};

std::vector<Stream> device_streams(const trace::Trace& trace, const DeviceHooks& hooks) {
  return detail::map_streams(trace, [&hooks] {
    if (!hooks.create_stream) {
      throw InvalidArgument("replay on a device: the trace has streams but no create_stream");
    }
    return hooks.create_stream();
  });
}

/// One replay in progress: the streams (returned at the end), the timer, the engine's replayer.
class DeviceReplay {
 public:
  DeviceReplay(const trace::Trace& trace, const detail::Plan& plan, const Policy& policy,
               Device& device, const DeviceHooks& hooks, const Options& options)
      : plan_(plan), hooks_(hooks), timed_(device), toucher_(hooks) {
    detail::Rig rig;
    rig.device = &device;
    rig.below_meter = &timed_;
    rig.streams = device_streams(trace, hooks);
    streams_ = rig.streams;
    replayer_ = std::make_unique<detail::Replayer>(trace, plan, policy, options, std::move(rig),
                                                   hooks.touch ? &toucher_ : nullptr);
  }
  ~DeviceReplay() {
    try {
      if (replayer_) replayer_->release_all();  // after a failure: leave the device as it was
    } catch (...) {
      // The allocator or the device is failing: what is left is the device's to reclaim.
    }
    replayer_.reset();
    if (!hooks_.destroy_stream) return;
    for (Stream stream : streams_) {
      if (stream != default_stream) hooks_.destroy_stream(stream);
    }
  }
  DeviceReplay(const DeviceReplay&) = delete;
  DeviceReplay& operator=(const DeviceReplay&) = delete;

  /// The cold start and every event, timed, then the clean-up; fills `r`.
  void run(DeviceResult& r) {
    replayer_->start(false);
    const double device_ms_before = timed_.times().total_ms();
    replayer_->replay(plan_.steps.size(), false, nullptr);
    const double loop_device_ms = timed_.times().total_ms() - device_ms_before;
    fill(r, loop_device_ms);  // the trace's figures, before the clean-up's frees
    replayer_->release_all();
    if (hooks_.finish) hooks_.finish();
  }

 private:
  void fill(DeviceResult& r, double loop_device_ms) const {
    const detail::Measures& m = replayer_->measures();
    const detail::DeviceCalls& calls = replayer_->device_calls();
    Result& row = r.result;
    row.peak_reserved = m.peak_reserved;
    if (row.peak_live > 0) {
      row.overhead =
          static_cast<double>(m.peak_reserved) / static_cast<double>(row.peak_live) - 1.0;
    }
    row.ooms = m.ooms;
    detail::set_device_calls(row, calls);
    r.real = timed_.times();
    r.touched_bytes = toucher_.touched();
    if (m.allocator_calls > 0) {
      const auto n = static_cast<double>(m.allocator_calls);
      row.ns_per_op = m.loop_ns / n;
      r.allocator_ns_per_op = (m.loop_ns - loop_device_ms * 1e6) / n;
    }
  }

  const detail::Plan& plan_;
  const DeviceHooks& hooks_;
  TimedDevice timed_;
  Toucher toucher_;
  std::vector<Stream> streams_;
  std::unique_ptr<detail::Replayer> replayer_;  // destroyed first (see the destructor)
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
