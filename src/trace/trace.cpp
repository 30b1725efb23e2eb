// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "trace/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "cistern/errors.hpp"

namespace cistern::trace {

const char* to_string(Op op) noexcept {
  switch (op) {
    case Op::alloc: return "alloc";
    case Op::free: return "free";
    case Op::synchronize: return "synchronize";
    case Op::empty_cache: return "empty_cache";
  }
  return "unknown";
}

std::uint64_t Trace::peak_live() const {
  // Sizes by id, because a free's own `size` is only "if known" for hand-built traces.
  std::unordered_map<std::uint64_t, std::uint64_t> size_of;
  size_of.reserve(live_before.size() + events.size() / 2);
  std::uint64_t live = 0;
  for (const LiveBlock& block : live_before) {
    size_of.emplace(block.id, block.size);
    live += block.size;
  }
  std::uint64_t peak = live;
  for (const Event& event : events) {
    if (event.op == Op::alloc) {
      size_of[event.id] = event.size;
      live += event.size;
      peak = std::max(peak, live);
    } else if (event.op == Op::free) {
      const auto found = size_of.find(event.id);
      if (found == size_of.end()) continue;  // not live: check() reports it; nothing to subtract
      live -= found->second;
      size_of.erase(found);
    }
  }
  return peak;
}

std::size_t Trace::allocations() const {
  return static_cast<std::size_t>(std::count_if(
      events.begin(), events.end(), [](const Event& event) { return event.op == Op::alloc; }));
}

namespace {

/// Walks a trace once and throws at the first broken invariant.
class Checker {
 public:
  explicit Checker(const Trace& trace) : trace_(trace) {}

  void run() {
    if (trace_.streams.empty()) fail("streams: empty; a trace has at least one stream");
    check_live_before();
    for (std::size_t i = 0; i < trace_.events.size(); ++i) check_event(i, trace_.events[i]);
    check_recorded();
    check_stacks();
  }

 private:
  void check_stacks() const {
    for (std::size_t id = 0; id < trace_.alloc_stacks.size(); ++id) {
      if (trace_.alloc_stacks[id] >= trace_.stacks.size()) {
        fail("alloc_stacks[{}]: stack {} but the trace has {} stacks", id, trace_.alloc_stacks[id],
             trace_.stacks.size());
      }
    }
  }

  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) const {
    throw InvalidArgument(fmt::format("{}: {}", trace_.source.empty() ? "trace" : trace_.source,
                                      fmt::format(format, std::forward<Args>(args)...)));
  }

  void check_stream(std::uint32_t stream, std::string_view where, std::size_t index) const {
    if (stream >= trace_.streams.size()) {
      fail("{}[{}]: stream index {} but the trace has {} streams", where, index, stream,
           trace_.streams.size());
    }
  }

  void check_size(std::uint64_t size, std::string_view where, std::size_t index) const {
    if (size > max_allocation_size) {
      fail("{}[{}]: size {} exceeds the limit of {} bytes", where, index, size,
           max_allocation_size);
    }
  }

  void check_live_before() {
    for (std::size_t i = 0; i < trace_.live_before.size(); ++i) {
      const LiveBlock& block = trace_.live_before[i];
      check_stream(block.stream, "live_before", i);
      check_size(block.size, "live_before", i);
      if (i > 0 && block.addr < trace_.live_before[i - 1].addr) {
        fail("live_before[{}]: address {:#x} below its predecessor's: not in address order", i,
             block.addr);
      }
      if (!seen_.insert(block.id).second) fail("live_before[{}]: duplicate id {}", i, block.id);
      live_.emplace(block.id, Allocation{block.size, block.addr});
      add_live(block.size, "live_before", i);
    }
  }

  /// Keeps the live total, which `peak_live` reports, inside 64 bits.
  void add_live(std::uint64_t size, std::string_view where, std::size_t index) {
    if (size > std::numeric_limits<std::uint64_t>::max() - live_bytes_) {
      fail("{}[{}]: the live bytes exceed 2^64", where, index);
    }
    live_bytes_ += size;
  }

  void check_event(std::size_t i, const Event& event) {
    check_stream(event.stream, "events", i);
    check_size(event.size, "events", i);
    switch (event.op) {
      case Op::alloc:
        if (!seen_.insert(event.id).second) fail("events[{}]: alloc reuses id {}", i, event.id);
        live_.emplace(event.id, Allocation{event.size, event.addr});
        add_live(event.size, "events", i);
        break;
      case Op::free: check_free(i, event); break;
      case Op::synchronize:
      case Op::empty_cache:
        if (event.id != 0 || event.size != 0 || event.addr != 0) {
          fail("events[{}]: {} with a nonzero id, size or addr", i, to_string(event.op));
        }
        break;
      default: fail("events[{}]: unknown op {}", i, static_cast<int>(event.op));
    }
  }

  void check_free(std::size_t i, const Event& event) {
    const auto found = live_.find(event.id);
    if (found == live_.end()) fail("events[{}]: free of id {}, which is not live", i, event.id);
    const Allocation allocation = found->second;
    if (event.size != allocation.size || event.addr != allocation.addr) {
      fail(
          "events[{}]: free of id {} with size {} at {:#x}, but it was allocated with size {} at "
          "{:#x}",
          i, event.id, event.size, event.addr, allocation.size, allocation.addr);
    }
    live_.erase(found);
    live_bytes_ -= allocation.size;
    freed_at_.emplace(event.id, i);
  }

  /// `position` must not decrease along a list and must lie in [0, events.size()].
  void check_position(std::size_t position, std::size_t& previous, std::string_view where,
                      std::size_t index) const {
    if (position > trace_.events.size() || position < previous) {
      fail("{}[{}]: position {} is out of order or past the {} events", where, index, position,
           trace_.events.size());
    }
    previous = position;
  }

  void check_recorded() {
    const Recorded& recorded = trace_.recorded;
    std::size_t previous = 0;
    for (std::size_t i = 0; i < recorded.initial_segments.size(); ++i) {
      check_stream(recorded.initial_segments[i].stream, "recorded.initial_segments", i);
    }
    for (std::size_t i = 0; i < recorded.segment_events.size(); ++i) {
      check_position(recorded.segment_events[i].before_event, previous, "recorded.segment_events",
                     i);
      check_stream(recorded.segment_events[i].stream, "recorded.segment_events", i);
    }
    check_samples();
    check_deferred_frees();
    previous = 0;
    for (std::size_t i = 0; i < recorded.ooms.size(); ++i) {
      check_position(recorded.ooms[i].before_event, previous, "recorded.ooms", i);
      check_stream(recorded.ooms[i].stream, "recorded.ooms", i);
    }
  }

  void check_samples() const {
    const auto& samples = trace_.recorded.reserved_samples;
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const bool increasing = i == 0 || samples[i].first > samples[i - 1].first;
      if (!increasing || samples[i].first >= trace_.events.size()) {
        fail("recorded.reserved_samples[{}]: event index {} is out of order or past the {} events",
             i, samples[i].first, trace_.events.size());
      }
    }
  }

  void check_deferred_frees() const {
    std::size_t previous = 0;
    const auto& completions = trace_.recorded.deferred_frees;
    for (std::size_t i = 0; i < completions.size(); ++i) {
      check_position(completions[i].before_event, previous, "recorded.deferred_frees", i);
      const auto freed = freed_at_.find(completions[i].id);
      if (freed == freed_at_.end() || freed->second >= completions[i].before_event) {
        fail("recorded.deferred_frees[{}]: id {} completes before it is freed", i,
             completions[i].id);
      }
    }
  }

  struct Allocation {
    std::uint64_t size;
    std::uint64_t addr;
  };

  const Trace& trace_;
  std::unordered_set<std::uint64_t> seen_;
  std::unordered_map<std::uint64_t, Allocation> live_;
  std::uint64_t live_bytes_ = 0;
  std::unordered_map<std::uint64_t, std::size_t> freed_at_;
};

}  // namespace

void Trace::check() const { Checker(*this).run(); }

void require_history(const Trace& trace) {
  if (trace.recorded.has_history) return;
  throw InvalidArgument(fmt::format(
      "{}: the snapshot holds no allocation history (device_traces has no events): it was "
      "dumped without recording one. Call torch.cuda.memory._record_memory_history() before "
      "the work, then torch.cuda.memory._dump_snapshot(\"memory.pickle\") after it",
      trace.source));
}

}  // namespace cistern::trace
