// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// SimClock: streams and events on a virtual clock, without a lock (see sim_clock.hpp).
//
// Memory order: a handle is published with a release store and found with an acquire load, so
// that a thread that finds an event sees it reset; times are read with acquire and written with
// release or read-modify-write, which keeps each cell's history in one order (coherence) and
// makes a time seen by one thread through a lock or a handle visible to the next.
#include "sim/sim_clock.hpp"

#include <algorithm>
#include <new>

namespace cistern::detail {
namespace {

std::uintptr_t event_handle(std::size_t index, std::uint32_t generation) {
  return (std::uintptr_t{generation} << SimClock::kIndexBits) | (index + 1);
}

}  // namespace

SimClock::SimClock() { create_stream(); }  // the default stream, handle 0

void SimClock::raise(std::atomic<std::uint64_t>& cell, std::uint64_t value) noexcept {
  std::uint64_t seen = cell.load(std::memory_order_acquire);
  while (seen < value && !cell.compare_exchange_weak(seen, value, std::memory_order_acq_rel)) {
  }
}

// --- streams -------------------------------------------------------------------------------------

bool SimClock::launch(Stream stream, std::uint64_t duration_ns) noexcept {
  std::atomic<std::uint64_t>* cell = find_stream(stream);
  if (cell == nullptr) return false;
  std::uint64_t seen = cell->load(std::memory_order_acquire);
  while (!cell->compare_exchange_weak(seen, std::max(now(), seen) + duration_ns,
                                      std::memory_order_acq_rel)) {
  }
  return true;
}

ClockAnswer SimClock::synchronize_stream(Stream stream) noexcept {
  std::uint64_t done_at = 0;
  if (!stream_done_at(stream, &done_at)) return ClockAnswer::unknown_stream;
  raise(now_, done_at);
  return ClockAnswer::ok;
}

void SimClock::synchronize_all() noexcept {
  const std::size_t count = streams_.size();
  std::uint64_t latest = 0;
  for (std::size_t i = 0; i < count; ++i) {
    latest = std::max(latest, streams_.find(i)->done_at.load(std::memory_order_acquire));
  }
  raise(now_, latest);
}

Stream SimClock::create_stream() { return Stream{streams_.add()}; }

// --- events --------------------------------------------------------------------------------------

ClockAnswer SimClock::synchronize_event(Event event) noexcept {
  const EventSlot* slot = find_event(event);
  if (slot == nullptr) return ClockAnswer::unknown_event;
  raise(now_, slot->ready_at.load(std::memory_order_acquire));
  return ClockAnswer::ok;
}

ClockAnswer SimClock::stream_wait(Stream stream, Event event) noexcept {
  const EventSlot* slot = find_event(event);
  if (slot == nullptr) return ClockAnswer::unknown_event;
  std::atomic<std::uint64_t>* done_at = find_stream(stream);
  if (done_at == nullptr) return ClockAnswer::unknown_stream;
  raise(*done_at, slot->ready_at.load(std::memory_order_acquire));
  return ClockAnswer::ok;
}

Event SimClock::create_event() {
  std::size_t index = 0;
  if (free_events_.empty()) {
    if (events_.size() >= kIndexMask) throw std::bad_alloc();  // the index must fit its bits
    index = events_.add();
  } else {
    index = free_events_.back();
    free_events_.pop_back();
  }
  EventSlot& slot = *events_.find(index);
  const std::uintptr_t handle = event_handle(index, slot.generation++);
  slot.ready_at.store(0, std::memory_order_relaxed);  // never recorded: complete
  slot.handle.store(handle, std::memory_order_release);
  ++live_events_;
  return Event{handle};
}

bool SimClock::destroy_event(Event event) {
  EventSlot* slot = find_event(event);
  if (slot == nullptr) return false;
  // The push may throw: before anything changes.
  free_events_.push_back(static_cast<std::uint32_t>((event.handle & kIndexMask) - 1));
  slot->handle.store(0, std::memory_order_release);
  --live_events_;
  return true;
}

}  // namespace cistern::detail
