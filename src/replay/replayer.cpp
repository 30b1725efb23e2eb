// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Replayer: setting up a replay and the event loop (see replayer.hpp).
#include "replay/replayer.hpp"

#include <fmt/format.h>

#include <chrono>
#include <exception>

#include "cistern/errors.hpp"
#include "plan/planned_allocator.hpp"
#include "replay/torch_allocator.hpp"
#include "replay/warm_start.hpp"

namespace cistern::replay::detail {
namespace {

using trace::Op;

SimDeviceOptions device_options(const trace::Trace& trace, std::uint64_t capacity) {
  SimDeviceOptions o;
  o.capacity = static_cast<std::size_t>(capacity);
  o.index = trace.device;
  return o;
}

/// Stream index 0 is the program's default stream when it was recorded as handle 0; every other
/// recorded stream becomes a simulated stream of its own.
std::vector<Stream> map_streams(const trace::Trace& trace, SimDevice& device) {
  std::vector<Stream> streams;
  streams.reserve(trace.streams.size());
  for (std::size_t i = 0; i < trace.streams.size(); ++i) {
    streams.push_back(i == 0 && trace.streams[0] == 0 ? default_stream : device.create_stream());
  }
  return streams;
}

}  // namespace

Replayer::Replayer(const trace::Trace& trace, const Plan& plan, const Policy& policy,
                   const Options& options, std::uint64_t capacity)
    : trace_(trace),
      plan_(plan),
      device_(device_options(trace, capacity)),
      meter_(device_, options.costs),
      allocator_(policy.make(meter_)),
      streams_(map_streams(trace, device_)),
      pointers_(plan.slots, nullptr),
      warm_(options.start == Start::warm) {
  // The planned policy knows a lifetime list's future: it plans the whole list before the start.
  auto* planned = dynamic_cast<plan::PlannedAllocator*>(allocator_.get());
  if (planned != nullptr && trace.format == "lifetimes") planned->plan_ahead(trace);
  if (options.check_invariants) {
    checked_ = dynamic_cast<const CachingAllocator*>(allocator_.get());
    checked_torch_ = dynamic_cast<const TorchAllocator*>(allocator_.get());
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
    if (!try_allocate(step) && stop_at_oom) return;
  }
}

// The recorded cache, placed on the device directly (not a call the policy made, so the meter
// does not price it), and the live blocks at their recorded addresses.
void Replayer::start_warm() {
  auto* warm = dynamic_cast<WarmStart*>(allocator_.get());
  if (warm == nullptr) {
    throw InvalidArgument("replay: the allocator of this policy does not implement WarmStart");
  }
  const WarmStartResult placed = apply_warm_start(trace_, *warm, device_, streams_);
  for (std::size_t i = 0; i < placed.live.size() && i < plan_.slot_of_live_before.size(); ++i) {
    pointers_[plan_.slot_of_live_before[i]] = placed.live[i].second;
  }
  for (const trace::RecordedSegment& s : trace_.recorded.initial_segments) {
    meter_.note_segment(static_cast<std::uintptr_t>(s.addr), static_cast<std::size_t>(s.size));
  }
}

// --- the loop --------------------------------------------------------------------------------------------

// Returns false if the allocation failed for want of memory (counted; its free will be skipped).
bool Replayer::try_allocate(const Step& step) {
  try {
    pointers_[step.slot] = allocator_->allocate(step.size, streams_[step.stream]);
    return true;
  } catch (const OutOfMemory&) {
    pointers_[step.slot] = nullptr;
    ++measures_.ooms;
    return false;
  }
}

// One event. Returns false if it was an allocation that failed.
bool Replayer::play(const Step& step) {
  switch (step.op) {
    case Op::alloc: ++measures_.allocator_calls; return try_allocate(step);
    case Op::free:
      // A free of an allocation that failed (or of 0 bytes) has nothing to free.
      if (void* p = pointers_[step.slot]) {
        ++measures_.allocator_calls;
        allocator_->deallocate(p, streams_[step.stream]);
        pointers_[step.slot] = nullptr;
      }
      return true;
    case Op::synchronize: device_.synchronize_device(); return true;
    case Op::empty_cache: allocator_->empty_cache(); return true;
  }
  return true;
}

std::uint64_t Replayer::sample(std::size_t event) {
  const std::uint64_t reserved = allocator_->reserved_bytes();
  if (reserved > measures_.peak_reserved) {
    measures_.peak_reserved = reserved;
    measures_.peak_reserved_event = event;
  }
  return reserved;
}

void Replayer::replay(std::size_t end, bool stop_at_oom,
                      std::vector<std::uint64_t>* reserved_after) {
  using Clock = std::chrono::steady_clock;
  std::size_t i = measures_.events_done;
  const Clock::time_point began = Clock::now();
  try {
    while (i < end) {
      const bool served = play(plan_.steps[i]);
      const std::uint64_t reserved = sample(i);
      if (reserved_after != nullptr) (*reserved_after)[i] = reserved;
      if (checked_ != nullptr) checked_->check();
      if (checked_torch_ != nullptr) checked_torch_->check();
      ++i;
      if (!served && stop_at_oom) break;
    }
  } catch (const std::exception& e) {
    measures_.events_done = i;
    const trace::Event& event = trace_.events[i];
    throw Error(fmt::format("events[{}] ({} of id {}, {} bytes): {}", i, trace::to_string(event.op),
                            event.id, event.size, e.what()));
  }
  const Clock::duration elapsed = Clock::now() - began;
  measures_.loop_ns += std::chrono::duration<double, std::nano>(elapsed).count();
  measures_.events_done = i;
}

}  // namespace cistern::replay::detail
