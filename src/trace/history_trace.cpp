// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "trace/history_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "cistern/errors.hpp"
#include "trace/address_lifetimes.hpp"
#include "trace/reader_support.hpp"

namespace cistern::trace {
namespace {

using Action = HistoryEntry::Action;
using detail::AddressLifetimes;

class HistoryReader {
 public:
  HistoryReader(Trace& trace, const std::string& source) : trace_(trace), source_(source) {}

  void read_start(const Snapshot& at_start) {
    std::uint64_t reserved = 0;
    for (const SegmentInfo& segment : at_start.segments) {
      const std::uint32_t stream = streams_.index(segment.stream.handle);
      trace_.recorded.initial_segments.push_back(RecordedSegment{
          segment.address, segment.total_size, stream, segment.is_large, segment.is_expandable});
      reserved += segment.total_size;
      for (const BlockInfo& block : segment.blocks) {
        if (block.state == BlockState::inactive) continue;
        start_blocks_.push_back({block.address, block.requested_size, stream});
      }
    }
    trace_.recorded.initial_reserved = reserved;
    reserved_ = reserved;
    peak_reserved_ = reserved;
  }

  void read(const HistoryEntry& entry, std::size_t index) {
    switch (entry.action) {
      case Action::alloc: return on_alloc(entry, index);
      case Action::free_requested: return on_free_requested(entry, index);
      case Action::free_completed: return on_free_completed(entry);
      case Action::segment_alloc: return on_segment(entry, RecordedSegmentEvent::Kind::alloc);
      case Action::segment_free: return on_segment(entry, RecordedSegmentEvent::Kind::free);
      case Action::segment_map: return on_segment(entry, RecordedSegmentEvent::Kind::map);
      case Action::segment_unmap: return on_segment(entry, RecordedSegmentEvent::Kind::unmap);
      case Action::oom: return on_oom(entry);
    }
  }

  void finish() {
    // Blocks of the start snapshot that the history never freed were live throughout.
    for (const StartBlock& block : start_blocks_) {
      if (!lifetimes_.live_at(block.addr) && !lifetimes_.freed_at(block.addr)) {
        lifetimes_.live_throughout(block.addr, block.size, block.stream);
      }
    }
    lifetimes_.finish();
    trace_.streams = streams_.handles();
    // Reserved bytes are known only when the start was: the history shows changes, not levels.
    if (trace_.recorded.initial_reserved) trace_.recorded.peak_reserved = peak_reserved_;
  }

 private:
  struct StartBlock {
    std::uint64_t addr;
    std::uint64_t size;
    std::uint32_t stream;
  };
  struct Pending {
    std::uint64_t id;
    std::size_t free_event;
  };

  [[noreturn]] void fail(std::size_t index, const std::string& what) const {
    throw InvalidArgument(fmt::format("{}: history[{}]: {}", source_, index, what));
  }

  /// The entry's stack, checked against the trace's table (0 when the history came without one).
  std::uint32_t stack(const HistoryEntry& entry, std::size_t index) const {
    if (trace_.stacks.size() == 1) return 0;
    if (entry.stack >= trace_.stacks.size()) {
      fail(index, fmt::format("stack {} but the table has {}", entry.stack, trace_.stacks.size()));
    }
    return entry.stack;
  }

  static std::int64_t time(const HistoryEntry& entry) {
    return static_cast<std::int64_t>(entry.time_us);
  }

  void on_alloc(const HistoryEntry& entry, std::size_t index) {
    if (lifetimes_.live_at(entry.addr)) {
      fail(index, fmt::format("alloc at {:#x}, which is allocated and not freed", entry.addr));
    }
    pending_.erase(entry.addr);
    lifetimes_.alloc(entry.addr, entry.size, streams_.index(entry.stream.handle), time(entry),
                     stack(entry, index));
  }

  void on_free_requested(const HistoryEntry& entry, std::size_t index) {
    if (lifetimes_.freed_at(entry.addr)) {
      fail(index, fmt::format("free_requested of {:#x}, which was already freed", entry.addr));
    }
    const AddressLifetimes::Freed freed =
        lifetimes_.free(entry.addr, entry.size, streams_.index(entry.stream.handle), time(entry),
                        stack(entry, index));
    pending_[entry.addr] = Pending{freed.id, trace_.events.size() - 1};
  }

  void on_free_completed(const HistoryEntry& entry) {
    const auto found = pending_.find(entry.addr);
    if (found == pending_.end()) return;  // requested before recording began
    const std::size_t next = trace_.events.size();
    if (found->second.free_event + 1 != next) {
      trace_.recorded.deferred_frees.push_back(
          RecordedFreeCompletion{found->second.id, next, time(entry)});
    }
    pending_.erase(found);
  }

  void on_segment(const HistoryEntry& entry, RecordedSegmentEvent::Kind kind) {
    RecordedSegmentEvent segment;
    segment.kind = kind;
    segment.before_event = trace_.events.size();
    segment.addr = entry.addr;
    segment.size = entry.size;
    segment.stream = streams_.index(entry.stream.handle);
    segment.time = time(entry);
    trace_.recorded.segment_events.push_back(segment);
    const bool grows =
        kind == RecordedSegmentEvent::Kind::alloc || kind == RecordedSegmentEvent::Kind::map;
    reserved_ = grows ? reserved_ + entry.size : reserved_ - entry.size;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
  }

  void on_oom(const HistoryEntry& entry) {
    RecordedOom oom;
    oom.before_event = trace_.events.size();
    oom.size = entry.size;
    oom.device_free = entry.addr;  // the history keeps the device's free bytes in addr
    oom.stream = streams_.index(entry.stream.handle);
    oom.time = time(entry);
    trace_.recorded.ooms.push_back(oom);
  }

  Trace& trace_;
  const std::string& source_;
  AddressLifetimes lifetimes_{trace_};
  detail::StreamTable streams_;
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::vector<StartBlock> start_blocks_;
  std::uint64_t reserved_ = 0;  ///< meaningful only from a start snapshot
  std::uint64_t peak_reserved_ = 0;
};

}  // namespace

Trace trace_from_history(const std::vector<HistoryEntry>& history, const Snapshot* at_start,
                         int device, const std::string& source, const StackTable* stacks) {
  Trace trace;
  if (stacks != nullptr) trace.stacks = *stacks;
  trace.source = source;
  trace.format = "cistern";
  trace.device = device;
  HistoryReader reader(trace, source);
  if (at_start != nullptr) reader.read_start(*at_start);
  for (std::size_t i = 0; i < history.size(); ++i) reader.read(history[i], i);
  reader.finish();
  trace.check();
  return trace;
}

}  // namespace cistern::trace
