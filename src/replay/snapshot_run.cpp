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
#include "replay/forwarding_device.hpp"
#include "replay/plan.hpp"
#include "replay/replayer.hpp"
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

/// Records segment allocations and frees; forwards everything else. It offers no virtual memory,
/// so that every segment the allocator makes is one the history can describe.
class RecordingDevice final : public ForwardingDevice {
 public:
  RecordingDevice(Device& device, const Recorder& recorder)
      : ForwardingDevice(device), recorder_(recorder) {}

  Status allocate(std::size_t bytes, void** ptr) noexcept override {
    const Status status = upstream().allocate(bytes, ptr);
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
    return upstream().deallocate(ptr);
  }
  // Virtual memory and events are forwarded as they are: cistern's engine records its own
  // segment_map / segment_unmap in the allocator's history.

 private:
  void note(Action action, std::uintptr_t addr, std::size_t bytes) noexcept {
    try {
      recorder_.add(action, addr, bytes, default_stream);
    } catch (...) {  // out of host memory: the history misses an entry, the replay goes on
    }
  }

  const Recorder& recorder_;
  std::vector<std::pair<std::uintptr_t, std::size_t>> sizes_;  // live segments
};

/// The engine's loop hooks of a recorded run: the history's alloc, free and oom entries at the
/// trace's event times.
class RecordingHooks final : public detail::LoopHooks {
 public:
  RecordingHooks(const trace::Trace& trace, Recorder& recorder, std::size_t slots)
      : trace_(trace), recorder_(recorder), sizes_(slots, 0) {}

  void before_event(std::size_t event) override {
    if (event < trace_.events.size()) {
      recorder_.time_us = static_cast<std::uint64_t>(trace_.events[event].time);
    }
  }
  void allocated(std::size_t, const detail::Step& step, void* ptr, Stream stream) override {
    recorder_.add(Action::alloc, reinterpret_cast<std::uintptr_t>(ptr), step.size, stream);
    sizes_[step.slot] = step.size;
  }
  void out_of_memory(std::size_t, const detail::Step&, const OutOfMemory& e,
                     Stream stream) override {
    recorder_.add(Action::oom, e.info().device_free, e.info().rounded, stream);
  }
  bool freeing(std::size_t, const detail::Step& step, void* ptr, Stream stream) override {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    recorder_.add(Action::free_requested, addr, sizes_[step.slot], stream);
    recorder_.add(Action::free_completed, addr, sizes_[step.slot], stream);
    return true;
  }

 private:
  const trace::Trace& trace_;
  Recorder& recorder_;
  std::vector<std::uint64_t> sizes_;  // requested size by slot
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
  RecordingHooks hooks(trace, recorder, plan.slots);
  detail::Rig rig;
  rig.device = rig.sim = &device;
  rig.below_meter = &recording;
  rig.streams = detail::map_streams(trace, [&device] { return device.create_stream(); });
  Options cold = options;
  cold.start = Start::cold;
  cold.repeat = 1;
  detail::Replayer replayer(trace, plan, policy, cold, std::move(rig), &hooks);
  Allocator& allocator = replayer.allocator();
  auto* own = dynamic_cast<DeviceAllocator*>(&allocator);
  if (own != nullptr) {
    own->record_history(true, SIZE_MAX);
    out.config = own->config();
  } else {
    recorder.history = &out.record.history;
    if (const auto* torch = dynamic_cast<const TorchAllocator*>(&allocator)) {
      out.config = torch->config();
    }
  }
  replayer.start(false);
  replayer.replay(plan.steps.size(), false, nullptr);
  out.record.device = trace.device;
  out.record.snapshot = allocator.snapshot();
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
