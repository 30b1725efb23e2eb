// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// record_run and snapshot_path (see snapshot_run.hpp).
#include "replay/snapshot_run.hpp"

#include <cctype>
#include <memory>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"
#include "replay/plan.hpp"
#include "replay/torch_allocator.hpp"

namespace cistern::replay {
namespace {

using Action = HistoryEntry::Action;

/// The history being recorded around an allocator that keeps none.
struct Recorder {
  std::vector<HistoryEntry>* history = nullptr;  ///< null: the allocator records its own
  std::uint64_t time_us = 0;                     ///< the current event's time

  void add(Action action, std::uintptr_t addr, std::size_t size, Stream stream) const {
    if (history == nullptr) return;
    HistoryEntry entry;
    entry.action = action;
    entry.addr = addr;
    entry.size = size;
    entry.stream = stream;
    entry.time_us = time_us;
    entry.sequence = history->size();
    history->push_back(entry);
  }
};

/// Forwards every call to a SimDevice and records segment allocations and frees.
class RecordingDevice final : public Device {
 public:
  RecordingDevice(SimDevice& device, const Recorder& recorder)
      : device_(device), recorder_(recorder) {}

  int index() const noexcept override { return device_.index(); }
  std::string name() const override { return device_.name(); }
  std::size_t granularity() const noexcept override { return device_.granularity(); }
  Status memory_info(MemoryInfo* info) noexcept override { return device_.memory_info(info); }
  std::string last_error() const override { return device_.last_error(); }
  Status allocate(std::size_t bytes, void** ptr) noexcept override {
    const Status status = device_.allocate(bytes, ptr);
    if (status == Status::ok) {
      sizes_.emplace_back(reinterpret_cast<std::uintptr_t>(*ptr), bytes);
      note(Action::segment_alloc, reinterpret_cast<std::uintptr_t>(*ptr), bytes);
    }
    return status;
  }
  Status deallocate(void* ptr) noexcept override {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    std::size_t bytes = 0;
    for (auto it = sizes_.begin(); it != sizes_.end(); ++it) {
      if (it->first != addr) continue;
      bytes = it->second;
      sizes_.erase(it);
      break;
    }
    note(Action::segment_free, addr, bytes);
    return device_.deallocate(ptr);
  }
  // Virtual memory is forwarded: cistern's engine records its own segment_map / segment_unmap.
  bool supports_virtual_memory() const noexcept override {
    return device_.supports_virtual_memory();
  }
  Status reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept override {
    return device_.reserve(bytes, alignment, va);
  }
  Status release_reservation(void* va, std::size_t bytes) noexcept override {
    return device_.release_reservation(va, bytes);
  }
  Status create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept override {
    return device_.create_physical(bytes, handle);
  }
  Status release_physical(PhysicalHandle handle) noexcept override {
    return device_.release_physical(handle);
  }
  Status map(void* va, std::size_t bytes, PhysicalHandle handle,
             std::size_t offset) noexcept override {
    return device_.map(va, bytes, handle, offset);
  }
  Status unmap(void* va, std::size_t bytes) noexcept override { return device_.unmap(va, bytes); }
  Status create_event(Event* event) noexcept override { return device_.create_event(event); }
  Status destroy_event(Event event) noexcept override { return device_.destroy_event(event); }
  Status record_event(Event event, Stream stream) noexcept override {
    return device_.record_event(event, stream);
  }
  Status query_event(Event event) noexcept override { return device_.query_event(event); }
  Status synchronize_event(Event event) noexcept override {
    return device_.synchronize_event(event);
  }
  Status stream_wait_event(Stream stream, Event event) noexcept override {
    return device_.stream_wait_event(stream, event);
  }
  Status synchronize_stream(Stream stream) noexcept override {
    return device_.synchronize_stream(stream);
  }
  Status synchronize_device() noexcept override { return device_.synchronize_device(); }

 private:
  void note(Action action, std::uintptr_t addr, std::size_t bytes) noexcept {
    try {
      recorder_.add(action, addr, bytes, default_stream);
    } catch (...) {  // out of host memory: the history misses an entry, the replay goes on
    }
  }

  SimDevice& device_;
  const Recorder& recorder_;
  std::vector<std::pair<std::uintptr_t, std::size_t>> sizes_;  // live segments
};

std::vector<Stream> map_streams(const trace::Trace& trace, SimDevice& device) {
  std::vector<Stream> streams;
  for (std::size_t i = 0; i < trace.streams.size(); ++i) {
    streams.push_back(i == 0 && trace.streams[0] == 0 ? default_stream : device.create_stream());
  }
  return streams;
}

/// The loop: one allocator call per step, recording around it when needed.
class Run {
 public:
  Run(const trace::Trace& trace, const detail::Plan& plan, Allocator& allocator, SimDevice& device,
      Recorder& recorder)
      : trace_(trace),
        plan_(plan),
        allocator_(allocator),
        device_(device),
        recorder_(recorder),
        streams_(map_streams(trace, device)),
        pointers_(plan.slots, nullptr) {}

  void go() {
    for (const detail::Step& step : plan_.start) play(step);
    for (std::size_t i = 0; i < plan_.steps.size(); ++i) {
      recorder_.time_us = static_cast<std::uint64_t>(trace_.events[i].time);
      play(plan_.steps[i]);
    }
  }

 private:
  void play(const detail::Step& step) {
    const Stream stream = streams_[step.stream];
    switch (step.op) {
      case trace::Op::alloc: return allocate(step, stream);
      case trace::Op::free: return release(step, stream);
      case trace::Op::synchronize: device_.synchronize_device(); return;
      case trace::Op::empty_cache: allocator_.empty_cache(); return;
    }
  }
  void allocate(const detail::Step& step, Stream stream) {
    try {
      void* p = allocator_.allocate(step.size, stream);
      pointers_[step.slot] = p;
      recorder_.add(Action::alloc, reinterpret_cast<std::uintptr_t>(p), step.size, stream);
      sizes_[step.slot] = step.size;
    } catch (const OutOfMemory& e) {
      recorder_.add(Action::oom, e.info().device_free, e.info().rounded, stream);
    }
  }
  void release(const detail::Step& step, Stream stream) {
    void* p = pointers_[step.slot];
    if (p == nullptr) return;
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    recorder_.add(Action::free_requested, addr, sizes_[step.slot], stream);
    recorder_.add(Action::free_completed, addr, sizes_[step.slot], stream);
    allocator_.deallocate(p, stream);
    pointers_[step.slot] = nullptr;
  }

  const trace::Trace& trace_;
  const detail::Plan& plan_;
  Allocator& allocator_;
  SimDevice& device_;
  Recorder& recorder_;
  std::vector<Stream> streams_;
  std::vector<void*> pointers_;
  std::unordered_map<std::uint32_t, std::uint64_t> sizes_;  // requested size by slot
};

}  // namespace

RecordedRun record_run(const trace::Trace& trace, const Policy& policy, const Options& options) {
  const detail::Plan plan = detail::compile(trace);
  if (!plan.error.empty()) throw InvalidArgument(trace.source + ": " + plan.error);
  SimDeviceOptions device_options;
  device_options.capacity = options.capacity;
  device_options.index = trace.device;
  SimDevice device(device_options);
  RecordedRun out;
  Recorder recorder;
  RecordingDevice recording(device, recorder);
  const std::unique_ptr<Allocator> allocator = policy.make(recording);
  auto* own = dynamic_cast<CachingAllocator*>(allocator.get());
  if (own != nullptr) {
    own->record_history(true, SIZE_MAX);
    out.config = own->config();
  } else {
    recorder.history = &out.record.history;
    if (const auto* torch = dynamic_cast<const TorchAllocator*>(allocator.get())) {
      out.config = torch->config();
    }
  }
  Run(trace, plan, *allocator, device, recorder).go();
  out.record.device = trace.device;
  out.record.snapshot = allocator->snapshot();
  if (own != nullptr) out.record.history = own->history();
  // The snapshot is the state after the last event: the segments the allocator returns when it
  // is destroyed below must not reach the history (`out` is the returned object itself).
  recorder.history = nullptr;
  return out;
}

std::string snapshot_path(const std::string& path, const std::string& label, std::size_t trace,
                          bool several_policies, bool several_traces) {
  std::string insert;
  if (several_policies) {
    insert += '.';
    for (const char c : label) {
      const bool keep = std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_';
      insert += keep ? c : '_';
    }
  }
  if (several_traces) insert += '.' + std::to_string(trace);
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  const bool has_extension =
      dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return has_extension ? path.substr(0, dot) + insert + path.substr(dot) : path + insert;
}

}  // namespace cistern::replay
