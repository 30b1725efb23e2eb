// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Replayer: setting up a replay and the event loop (see replayer.hpp).
#include "replay/replayer.hpp"

#include <fmt/format.h>

#include <chrono>
#include <exception>

#include "cistern/errors.hpp"
#include "replay/warm_start.hpp"

namespace cistern::replay::detail {
namespace {

using trace::Op;

std::unique_ptr<SimDevice> make_device(const trace::Trace& trace, std::uint64_t capacity) {
  SimDeviceOptions o;
  o.capacity = static_cast<std::size_t>(capacity);
  o.index = trace.device;
  return std::make_unique<SimDevice>(o);
}

/// The rig of a replay on its own SimDevice.
Rig simulated(const trace::Trace& trace, SimDevice& device) {
  Rig rig;
  rig.device = rig.below_meter = rig.sim = &device;
  rig.streams = map_streams(trace, [&device] { return device.create_stream(); });
  return rig;
}

}  // namespace

std::vector<Stream> map_streams(const trace::Trace& trace, const std::function<Stream()>& create) {
  std::vector<Stream> streams;
  streams.reserve(trace.streams.size());
  for (std::size_t i = 0; i < trace.streams.size(); ++i) {
    streams.push_back(i == 0 && trace.streams[0] == 0 ? default_stream : create());
  }
  return streams;
}

Replayer::Replayer(const trace::Trace& trace, const Plan& plan, const Policy& policy,
                   const Options& options, std::uint64_t capacity, LoopHooks* hooks)
    : Replayer(trace, plan, policy, options, Rig{}, hooks, make_device(trace, capacity)) {}

Replayer::Replayer(const trace::Trace& trace, const Plan& plan, const Policy& policy,
                   const Options& options, Rig rig, LoopHooks* hooks)
    : Replayer(trace, plan, policy, options, std::move(rig), hooks, nullptr) {}

Replayer::Replayer(const trace::Trace& trace, const Plan& plan, const Policy& policy,
                   const Options& options, Rig rig, LoopHooks* hooks,
                   std::unique_ptr<SimDevice> own)
    : trace_(trace),
      plan_(plan),
      own_device_(std::move(own)),
      rig_(own_device_ ? simulated(trace, *own_device_) : std::move(rig)),
      meter_(*rig_.below_meter, options.costs),
      hooks_(hooks),
      allocator_(policy.for_trace(trace).make(meter_)),
      pointers_(plan.slots, nullptr),
      deferred_(trace, rig_.sim),
      warm_(options.start == Start::warm) {
  // The planned policy knows a lifetime list's future: it plans the whole list before the start.
  // Any other trace it learns from the first pass (see end_pass).
  auto* planned = dynamic_cast<plan::PlannedAllocator*>(allocator_.get());
  if (planned != nullptr && trace.format == "lifetimes") {
    planned->plan_ahead(trace);
  } else {
    learning_ = planned;
  }
  if (options.check_invariants) {
    checked_ = allocator_.get();
  }
}

Replayer::~Replayer() = default;

// --- the start -------------------------------------------------------------------------------------------

void Replayer::start(bool stop_at_oom) {
  if (warm_) {
    start_warm();
  } else {
    start_cold(stop_at_oom);
  }
  sample(kAtStart);
}

void Replayer::start_cold(bool stop_at_oom) {
  for (const Step& step : plan_.start) {
    const bool served = hooks_ != nullptr ? try_allocate<true>(kAtStart, step)
                                          : try_allocate<false>(kAtStart, step);
    if (!served && stop_at_oom) return;
  }
}

// The recorded cache, placed on the device directly (not a call the policy made, so the meter
// does not price it), and the live blocks at their recorded addresses.
void Replayer::start_warm() {
  auto* warm = dynamic_cast<WarmStart*>(allocator_.get());
  if (warm == nullptr) {
    throw InvalidArgument("replay: the allocator of this policy does not implement WarmStart");
  }
  if (rig_.sim == nullptr) {
    throw InvalidArgument("replay: a warm start needs the simulated device");
  }
  const WarmStartResult placed = apply_warm_start(trace_, *warm, *rig_.sim, rig_.streams);
  start_note_ = placed.note;
  for (std::size_t i = 0; i < placed.live.size() && i < plan_.slot_of_live_before.size(); ++i) {
    pointers_[plan_.slot_of_live_before[i]] = placed.live[i].second;
  }
  for (const trace::RecordedSegment& s : trace_.recorded.initial_segments) {
    meter_.note_segment(static_cast<std::uintptr_t>(s.addr), static_cast<std::size_t>(s.size));
  }
  meter_.clear_calls();  // the pages of expandable segments were mapped through the allocator
}

// --- the loop --------------------------------------------------------------------------------------------

// Returns false if the allocation failed for want of memory (counted; its free will be skipped).
template <bool kHooks>
bool Replayer::try_allocate(std::size_t event, const Step& step) {
  const Stream stream = rig_.streams[step.stream];
  try {
    void* const ptr = allocator_->allocate(step.size, stream);
    pointers_[step.slot] = ptr;
    if constexpr (kHooks) hooks_->allocated(event, step, ptr, stream);
    return true;
  } catch (const OutOfMemory& e) {
    pointers_[step.slot] = nullptr;
    ++measures_.ooms;
    if constexpr (kHooks) hooks_->out_of_memory(event, step, e, stream);
    return false;
  }
}

// One event. Returns false if it was an allocation that failed.
template <bool kHooks>
bool Replayer::play(std::size_t event, const Step& step) {
  switch (step.op) {
    case Op::alloc: ++measures_.allocator_calls; return try_allocate<kHooks>(event, step);
    case Op::free:
      // A free of an allocation that failed (or of 0 bytes) has nothing to free.
      if (void* p = pointers_[step.slot]) {
        const Stream stream = rig_.streams[step.stream];
        if constexpr (kHooks) {
          if (!hooks_->freeing(event, step, p, stream)) return true;
        }
        ++measures_.allocator_calls;
        if (deferred_.active()) {
          deferred_.deallocate(event, p, stream, *allocator_);
        } else {
          allocator_->deallocate(p, stream);
        }
        pointers_[step.slot] = nullptr;
      }
      return true;
    case Op::synchronize: (void)rig_.device->synchronize_device(); return true;
    case Op::empty_cache: allocator_->empty_cache(); return true;
  }
  return true;
}

std::uint64_t Replayer::sample(std::size_t event) {
  const std::uint64_t reserved = allocator_->reserved_bytes();
  if (reserved > measures_.pass_peak_reserved) measures_.pass_peak_reserved = reserved;
  if (reserved > measures_.peak_reserved) {
    measures_.peak_reserved = reserved;
    if (measures_.pass == 0) measures_.peak_reserved_event = event;
  }
  return reserved;
}

template <bool kHooks>
void Replayer::loop(std::size_t& i, std::size_t end, bool stop_at_oom,
                    std::vector<std::uint64_t>* reserved_after) {
  while (i < end) {
    if (deferred_.active()) deferred_.tick();
    if constexpr (kHooks) hooks_->before_event(i);
    const bool served = play<kHooks>(i, plan_.steps[i]);
    const std::uint64_t reserved = sample(i);
    if (reserved_after != nullptr) (*reserved_after)[i] = reserved;
    if (checked_ != nullptr) checked_->check();
    ++i;
    if (!served && stop_at_oom) break;
  }
  if constexpr (kHooks) {
    if (i == plan_.steps.size()) hooks_->before_event(i);
  }
}

void Replayer::replay(std::size_t end, bool stop_at_oom,
                      std::vector<std::uint64_t>* reserved_after) {
  using Clock = std::chrono::steady_clock;
  std::size_t i = measures_.events_done;
  const Clock::time_point began = Clock::now();
  try {
    if (hooks_ != nullptr) {
      loop<true>(i, end, stop_at_oom, reserved_after);
    } else {
      loop<false>(i, end, stop_at_oom, reserved_after);
    }
  } catch (const std::exception& e) {
    measures_.events_done = i;
    if (i >= trace_.events.size()) throw;  // a hook's work after the last event
    const trace::Event& event = trace_.events[i];
    throw Error(fmt::format("events[{}] ({} of id {}, {} bytes): {}", i, trace::to_string(event.op),
                            event.id, event.size, e.what()));
  }
  const Clock::duration elapsed = Clock::now() - began;
  measures_.loop_ns += std::chrono::duration<double, std::nano>(elapsed).count();
  measures_.events_done = i;
}

// --- between passes and after the last -------------------------------------------------------------

std::vector<std::uint16_t> Replayer::allocation_streams() const {
  std::vector<std::uint16_t> streams(pointers_.size(), 0);
  for (const Step& step : plan_.start) streams[step.slot] = step.stream;
  for (const Step& step : plan_.steps) {
    if (step.op == Op::alloc) streams[step.slot] = step.stream;
  }
  return streams;
}

void Replayer::free_all(bool keep_start) {
  std::vector<char> start(keep_start ? pointers_.size() : 0, 0);
  for (const Step& step : plan_.start) {
    if (keep_start) start[step.slot] = 1;
  }
  const std::vector<std::uint16_t> streams = allocation_streams();
  for (std::size_t slot = 0; slot < pointers_.size(); ++slot) {
    if (pointers_[slot] == nullptr || (keep_start && start[slot] != 0)) continue;
    void* const ptr = pointers_[slot];
    pointers_[slot] = nullptr;
    allocator_->deallocate(ptr, rig_.streams[streams[slot]]);
  }
}

void Replayer::end_pass(bool stop_at_oom) {
  if (learning_ != nullptr) {
    free_all(false);
    learning_->end_step();
    pass_start_counters_ = learning_->counters();
  } else {
    free_all(true);
  }
  for (const Step& step : plan_.start) {
    if (pointers_[step.slot] != nullptr) continue;
    const bool served = hooks_ != nullptr ? try_allocate<true>(kAtStart, step)
                                          : try_allocate<false>(kAtStart, step);
    if (!served && stop_at_oom) break;
  }
  ++measures_.pass;
  measures_.events_done = 0;
  measures_.pass_peak_reserved = 0;
  sample(kAtStart);
}

void Replayer::release_all() {
  free_all(false);
  allocator_->empty_cache();
}

void Replayer::free_slot(std::uint32_t slot, Stream stream) {
  void* const ptr = pointers_[slot];
  if (ptr == nullptr) return;
  pointers_[slot] = nullptr;
  allocator_->deallocate(ptr, stream);
}

}  // namespace cistern::replay::detail
