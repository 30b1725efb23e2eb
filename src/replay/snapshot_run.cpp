// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// record_run and snapshot_path (see snapshot_run.hpp).
#include "replay/snapshot_run.hpp"

#include <cctype>
#include <memory>
#include <unordered_map>
#include <utility>
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
  std::size_t event = 0;                         ///< the current event (kAtStart: the start)
  Stream stream;                                 ///< the current event's stream

  void add(Action action, std::uintptr_t addr, std::size_t size, Stream on) const {
    if (history == nullptr) return;
    HistoryEntry entry;
    entry.action = action;
    entry.addr = addr;
    entry.size = size;
    entry.stream = on;
    entry.time_us = time_us;
    entry.sequence = history->size();
    history->push_back(entry);
  }

  /// A map or unmap of pages: one entry for the pages one event maps (or unmaps) in a row, as
  /// PyTorch writes one per range.
  void add_pages(Action action, std::uintptr_t addr, std::size_t size, Stream on) {
    if (history == nullptr) return;
    if (!history->empty() && pages_event_ == event) {
      HistoryEntry& last = history->back();
      if (last.action == action && last.addr + last.size == addr && last.stream == on) {
        last.size += size;
        return;
      }
    }
    pages_event_ = event;
    add(action, addr, size, on);
  }

 private:
  std::size_t pages_event_ = static_cast<std::size_t>(-2);  ///< the event of the last page entry
};

/// Records segment allocations and frees, and the maps and unmaps of pages (an emulation's
/// expandable segments); forwards everything else. Segments and maps are recorded on the
/// stream of the event that made them (the start's on the default stream).
class RecordingDevice final : public ForwardingDevice {
 public:
  RecordingDevice(Device& device, Recorder& recorder)
      : ForwardingDevice(device), recorder_(recorder) {}

  Status allocate(std::size_t bytes, void** ptr) noexcept override {
    const Status status = upstream().allocate(bytes, ptr);
    if (status == Status::ok) {
      const auto addr = reinterpret_cast<std::uintptr_t>(*ptr);
      note(Action::segment_alloc, addr, bytes, held(addr, bytes));
    }
    return status;
  }
  Status deallocate(void* ptr) noexcept override {
    const Range range = release(reinterpret_cast<std::uintptr_t>(ptr));
    note(Action::segment_free, range.addr, range.bytes, range.stream);
    return upstream().deallocate(ptr);
  }
  // cistern's engine records its own segment_map / segment_unmap in the allocator's history
  // (`recorder_.history` is null then); an emulation's maps are recorded here.
  Status map(void* va, PhysicalHandle handle) noexcept override {
    const Status status = upstream().map(va, handle);
    const std::size_t bytes = handle.bytes;
    if (status == Status::ok && recorder_.history != nullptr) {
      const auto addr = reinterpret_cast<std::uintptr_t>(va);
      note_pages(Action::segment_map, addr, bytes, held(addr, bytes));
    }
    return status;
  }
  Status unmap(void* va, std::size_t bytes) noexcept override {
    const Status status = upstream().unmap(va, bytes);
    if (status == Status::ok && recorder_.history != nullptr) {
      const Range range = release(reinterpret_cast<std::uintptr_t>(va));
      note_pages(Action::segment_unmap, range.addr, bytes, range.stream);
    }
    return status;
  }

 private:
  /// A live segment or mapping and the stream it was recorded on.
  struct Range {
    std::uintptr_t addr = 0;
    std::size_t bytes = 0;
    Stream stream;
  };

  /// Remembers a new segment or mapping; returns its stream (the current event's).
  Stream held(std::uintptr_t addr, std::size_t bytes) noexcept {
    try {
      ranges_[addr] = Range{addr, bytes, recorder_.stream};
    } catch (...) {  // out of host memory: its release is recorded with size 0
    }
    return recorder_.stream;
  }
  /// Forgets the segment or mapping at `addr` and returns it (size 0 if unknown).
  Range release(std::uintptr_t addr) noexcept {
    const auto found = ranges_.find(addr);
    if (found == ranges_.end()) return Range{addr, 0, default_stream};
    const Range range = found->second;
    ranges_.erase(found);
    return range;
  }
  void note(Action action, std::uintptr_t addr, std::size_t bytes, Stream stream) noexcept {
    try {
      recorder_.add(action, addr, bytes, stream);
    } catch (...) {  // out of host memory: the history misses an entry, the replay goes on
    }
  }
  void note_pages(Action action, std::uintptr_t addr, std::size_t bytes, Stream stream) noexcept {
    try {
      recorder_.add_pages(action, addr, bytes, stream);
    } catch (...) {  // as in note
    }
  }

  Recorder& recorder_;
  std::unordered_map<std::uintptr_t, Range> ranges_;  // live segments and mappings, by address
};

/// The engine's loop hooks of a recorded run: the history's alloc, free and oom entries at the
/// trace's event times.
class RecordingHooks final : public detail::LoopHooks {
 public:
  RecordingHooks(const trace::Trace& trace, Recorder& recorder, std::size_t slots,
                 std::vector<Stream> streams)
      : trace_(trace), recorder_(recorder), sizes_(slots, 0), streams_(std::move(streams)) {}

  void before_event(std::size_t event) override {
    if (event < trace_.events.size()) {
      const trace::Event& e = trace_.events[event];
      recorder_.time_us = static_cast<std::uint64_t>(e.time);
      recorder_.event = event;
      recorder_.stream = streams_[e.stream];
    }
  }
  void allocated(std::size_t event, const detail::Step& step, void* ptr, Stream stream) override {
    recorder_.add(Action::alloc, reinterpret_cast<std::uintptr_t>(ptr), step.size, stream);
    sizes_[step.slot] = step.size;
    if (!trace_.alloc_stacks.empty()) alloc_stacks_.push_back(trace_.stack_of(id_of(event)));
  }
  void out_of_memory(std::size_t event, const detail::Step&, const OutOfMemory& e,
                     Stream stream) override {
    recorder_.add(Action::oom, e.info().device_free, e.info().rounded, stream);
    (void)id_of(event);  // keeps the count of the start's allocations
  }
  bool freeing(std::size_t, const detail::Step& step, void* ptr, Stream stream) override {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    recorder_.add(Action::free_requested, addr, sizes_[step.slot], stream);
    recorder_.add(Action::free_completed, addr, sizes_[step.slot], stream);
    return true;
  }

  /// The trace's stack of each alloc entry the run made, in order (empty: the trace has none).
  const std::vector<std::uint32_t>& alloc_stacks() const noexcept { return alloc_stacks_; }

 private:
  /// The allocation id of an allocation at `event` (the start's, kAtStart, in live_before order).
  std::uint64_t id_of(std::size_t event) {
    if (event != detail::kAtStart) return trace_.events[event].id;
    const std::size_t index = started_++;
    return index < trace_.live_before.size() ? trace_.live_before[index].id : 0;
  }

  const trace::Trace& trace_;
  Recorder& recorder_;
  std::vector<std::uint64_t> sizes_;  // requested size by slot
  std::vector<Stream> streams_;       // the replay's stream of each trace stream
  std::vector<std::uint32_t> alloc_stacks_;
  std::size_t started_ = 0;  // allocations of the start so far
};

/// Gives the history's entries the trace's stacks: the n-th alloc entry is the n-th successful
/// allocation (`stacks`, one per alloc entry), and a free carries the stack of the allocation
/// it frees, as PyTorch's do. Left without stacks if the counts disagree.
void attach_stacks(DeviceRecord& record, const trace::Trace& trace,
                   const std::vector<std::uint32_t>& stacks) {
  std::size_t allocs = 0;
  for (const HistoryEntry& entry : record.history) allocs += entry.action == Action::alloc;
  if (trace.alloc_stacks.empty() || allocs != stacks.size()) return;
  record.stacks = trace.stacks;
  std::unordered_map<std::uintptr_t, std::uint32_t> live;  // address -> its allocation's stack
  std::size_t next = 0;
  for (HistoryEntry& entry : record.history) {
    if (entry.action == Action::alloc) {
      entry.stack = stacks[next++];
      live[entry.addr] = entry.stack;
    } else if (entry.action == Action::free_requested || entry.action == Action::free_completed) {
      const auto found = live.find(entry.addr);
      if (found != live.end()) entry.stack = found->second;
      if (found != live.end() && entry.action == Action::free_completed) live.erase(found);
    }
  }
}

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
  recorder.event = detail::kAtStart;
  RecordingDevice recording(device, recorder);
  detail::Rig rig;
  rig.device = rig.sim = &device;
  rig.below_meter = &recording;
  rig.streams = detail::map_streams(trace, [&device] { return device.create_stream(); });
  RecordingHooks hooks(trace, recorder, plan.slots, rig.streams);
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
  attach_stacks(out.record, trace, hooks.alloc_stacks());
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
