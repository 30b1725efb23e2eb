// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Compiling a trace into a replay plan (see plan.hpp).
#include "replay/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace cistern::replay::detail {
namespace {

using trace::Op;

/// Maps allocation ids to dense slots. Readers number ids densely, so the id itself is the slot
/// whenever the largest id is not much larger than the number of allocations; other traces
/// (hand-made, or from a foreign writer) go through a hash map, once, at compile time.
class SlotMap {
 public:
  explicit SlotMap(const trace::Trace& trace) {
    std::uint64_t allocations = trace.live_before.size();
    std::uint64_t max_id = 0;
    for (const trace::LiveBlock& b : trace.live_before) max_id = std::max(max_id, b.id);
    for (const trace::Event& e : trace.events) {
      if (e.op != Op::alloc) continue;
      ++allocations;
      max_id = std::max(max_id, e.id);
    }
    direct_ = max_id < 2 * allocations + 1024;
    if (direct_) slots_ = static_cast<std::size_t>(max_id) + 1;
  }

  /// The slot of an id that is being allocated (created on first sight).
  std::uint32_t assign(std::uint64_t id) {
    if (direct_) return static_cast<std::uint32_t>(id);
    const auto [it, added] = hashed_.emplace(id, static_cast<std::uint32_t>(slots_));
    if (added) ++slots_;
    return it->second;
  }

  /// The slot of an id being freed, or `kNone` if the id was never allocated.
  std::uint32_t find(std::uint64_t id) const {
    if (direct_) return id < slots_ ? static_cast<std::uint32_t>(id) : kNone;
    const auto it = hashed_.find(id);
    return it == hashed_.end() ? kNone : it->second;
  }

  /// Slots handed out so far (direct: every possible one).
  std::size_t size() const noexcept { return slots_; }

  static constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();

 private:
  bool direct_ = false;
  std::size_t slots_ = 0;
  std::unordered_map<std::uint64_t, std::uint32_t> hashed_;
};

/// What is live during compilation: per slot, whether it is and its requested size.
class LiveSet {
 public:
  void ensure(std::size_t slots) {
    if (size_.size() < slots) {
      size_.resize(slots, 0);
      live_.resize(slots, 0);
    }
  }
  bool is_live(std::uint32_t slot) const { return slot < live_.size() && live_[slot] != 0; }
  void add(std::uint32_t slot, std::uint64_t size) {
    ensure(std::size_t{slot} + 1);
    live_[slot] = 1;
    size_[slot] = size;
    bytes_ += size;
  }
  void remove(std::uint32_t slot) {
    live_[slot] = 0;
    bytes_ -= size_[slot];
  }
  std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  std::vector<std::uint64_t> size_;
  std::vector<std::uint8_t> live_;
  std::uint64_t bytes_ = 0;
};

constexpr std::size_t kMaxStreams = std::numeric_limits<std::uint16_t>::max() + std::size_t{1};
constexpr std::size_t kMaxSlots = SlotMap::kNone;

/// The first problem of the trace's shape that no event loop could handle, or "".
std::string shape_error(const trace::Trace& trace) {
  if (trace.streams.empty()) return "the trace lists no streams";
  if (trace.streams.size() > kMaxStreams) {
    return fmt::format("{} streams; the replay engine handles at most {}", trace.streams.size(),
                       kMaxStreams);
  }
  if (trace.live_before.size() + trace.events.size() >= kMaxSlots) {
    return fmt::format("{} events; the replay engine handles fewer than {}", trace.events.size(),
                       kMaxSlots);
  }
  return "";
}

/// Live-before blocks in address order (readers give them so; hand-made traces may not).
std::vector<std::size_t> address_order(const std::vector<trace::LiveBlock>& blocks) {
  std::vector<std::size_t> order(blocks.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return blocks[a].addr < blocks[b].addr; });
  return order;
}

/// Compiles live_before into `plan.start`; returns an error or "".
std::string compile_start(const trace::Trace& trace, SlotMap& slots, LiveSet& live, Plan& plan) {
  plan.slot_of_live_before.resize(trace.live_before.size());
  for (std::size_t i : address_order(trace.live_before)) {
    const trace::LiveBlock& b = trace.live_before[i];
    if (b.stream >= trace.streams.size()) {
      return fmt::format("live_before[{}]: stream index {} but the trace has {} streams", i,
                         b.stream, trace.streams.size());
    }
    const std::uint32_t slot = slots.assign(b.id);
    if (live.is_live(slot)) return fmt::format("live_before[{}]: id {} listed twice", i, b.id);
    live.add(slot, b.size);
    plan.slot_of_live_before[i] = slot;
    plan.start.push_back({b.size, slot, static_cast<std::uint16_t>(b.stream), Op::alloc});
  }
  return "";
}

/// Compiles one event into `plan.steps`; returns an error or "".
std::string compile_event(const trace::Trace& trace, std::size_t i, SlotMap& slots, LiveSet& live,
                          Plan& plan) {
  const trace::Event& e = trace.events[i];
  if (e.stream >= trace.streams.size()) {
    return fmt::format("events[{}]: stream index {} but the trace has {} streams", i, e.stream,
                       trace.streams.size());
  }
  Step step{0, 0, static_cast<std::uint16_t>(e.stream), e.op};
  switch (e.op) {
    case Op::alloc:
      step.slot = slots.assign(e.id);
      if (live.is_live(step.slot)) {
        return fmt::format("events[{}]: alloc of id {}, which is already live", i, e.id);
      }
      step.size = e.size;
      live.add(step.slot, e.size);
      break;
    case Op::free:
      step.slot = slots.find(e.id);
      if (!live.is_live(step.slot)) {
        return fmt::format("events[{}]: free of id {}, which is not live", i, e.id);
      }
      live.remove(step.slot);
      break;
    case Op::synchronize:
    case Op::empty_cache: break;
    default: return fmt::format("events[{}]: unknown op {}", i, static_cast<int>(e.op));
  }
  plan.steps.push_back(step);
  return "";
}

Plan failed(std::string error) {
  Plan plan;
  plan.error = std::move(error);
  return plan;
}

}  // namespace

Plan compile(const trace::Trace& trace) {
  if (std::string error = shape_error(trace); !error.empty()) return failed(std::move(error));
  Plan plan;
  SlotMap slots(trace);
  LiveSet live;
  live.ensure(slots.size());
  if (std::string error = compile_start(trace, slots, live, plan); !error.empty()) {
    return failed(std::move(error));
  }
  plan.live_at_start = plan.peak_live = live.bytes();
  plan.steps.reserve(trace.events.size());
  plan.live_after.reserve(trace.events.size());
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    if (std::string error = compile_event(trace, i, slots, live, plan); !error.empty()) {
      return failed(std::move(error));
    }
    plan.live_after.push_back(live.bytes());
    if (live.bytes() > plan.peak_live) {
      plan.peak_live = live.bytes();
      plan.peak_live_event = i;
    }
  }
  plan.slots = slots.size();
  return plan;
}

}  // namespace cistern::replay::detail
