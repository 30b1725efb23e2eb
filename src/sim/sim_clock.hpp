// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// SimClock: SimDevice's virtual clock, its streams and its events.
//
// The clock is a count of simulated nanoseconds. A stream's `done_at` is the time at which all
// work submitted to it completes; an event's `ready_at` is the time at which the work it captured
// completes (0 if never recorded: complete, as in CUDA). Work is done when the clock has reached
// its time.
//
// Every field is an atomic and every stream and event lives in a `SlotTable` slot of its own
// cache line, so that recording, querying and waiting take no lock: threads that drive their
// own streams and events (an allocator's cross-stream frees) share no written cache line. Only
// creating and destroying an event, and creating a stream, must be serialised by the caller
// (SimDevice's lock).
//
// Handles: a stream's handle is its index (0, the default stream, always exists). An event's
// handle is its slot's index + 1 in the low 32 bits and the slot's generation in the high 32
// bits, so that a destroyed event's handle stays unknown after its slot is reused.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cistern/types.hpp"
#include "sim/slot_table.hpp"

namespace cistern::detail {

/// The outcome of a clock operation; SimDevice turns the last two into error statuses.
enum class ClockAnswer { ok, not_ready, unknown_event, unknown_stream };

class SimClock {
 public:
  /// Bits of an event handle that hold its slot's index + 1; the generation is above them.
  static constexpr int kIndexBits = 32;
  static constexpr std::uintptr_t kIndexMask = (std::uintptr_t{1} << kIndexBits) - 1;
  static_assert(sizeof(std::uintptr_t) >= 8, "event handles hold an index and a generation");

  SimClock();

  // --- lock-free (the calls of an allocator's cross-stream free are inline) ------------------------

  /// The simulated time.
  std::uint64_t now() const noexcept { return now_.load(std::memory_order_acquire); }
  /// Advances the simulated time by `ns`.
  void advance(std::uint64_t ns) noexcept { now_.fetch_add(ns, std::memory_order_acq_rel); }
  /// Whether `stream` exists; `*done_at` receives its completion time if so.
  bool stream_done_at(Stream stream, std::uint64_t* done_at) const noexcept {
    const std::atomic<std::uint64_t>* cell = find_stream(stream);
    if (cell == nullptr) return false;
    *done_at = cell->load(std::memory_order_acquire);
    return true;
  }
  /// Submits `duration_ns` of work to `stream`, starting when its earlier work is done (or now).
  /// False if the stream does not exist.
  bool launch(Stream stream, std::uint64_t duration_ns) noexcept;

  /// Captures the work submitted to `stream` so far in `event`.
  ClockAnswer record(Event event, Stream stream) noexcept {
    EventSlot* slot = find_event(event);
    if (slot == nullptr) return ClockAnswer::unknown_event;
    std::uint64_t done_at = 0;
    if (!stream_done_at(stream, &done_at)) return ClockAnswer::unknown_stream;
    slot->ready_at.store(std::max(now(), done_at), std::memory_order_release);
    return ClockAnswer::ok;
  }
  /// `ok` if the event's work is complete, `not_ready` if not.
  ClockAnswer query(Event event) const noexcept {
    const EventSlot* slot = find_event(event);
    if (slot == nullptr) return ClockAnswer::unknown_event;
    const std::uint64_t ready_at = slot->ready_at.load(std::memory_order_acquire);
    return now() >= ready_at ? ClockAnswer::ok : ClockAnswer::not_ready;
  }
  /// Advances the clock to the event's completion.
  ClockAnswer synchronize_event(Event event) noexcept;
  /// Makes later work on `stream` start no earlier than the event's completion (the clock is
  /// unchanged: a device-side wait).
  ClockAnswer stream_wait(Stream stream, Event event) noexcept;
  /// Advances the clock to the stream's completion.
  ClockAnswer synchronize_stream(Stream stream) noexcept;
  /// Advances the clock to the completion of every stream.
  void synchronize_all() noexcept;

  // --- serialised by the caller --------------------------------------------------------------------

  /// A new stream, numbered after the last one. Throws std::bad_alloc.
  Stream create_stream();
  /// A new event, never recorded. Throws std::bad_alloc.
  Event create_event();
  /// Destroys an event; false if it is unknown (never created, or destroyed already).
  bool destroy_event(Event event);
  /// Events created and not destroyed.
  std::size_t live_events() const noexcept { return live_events_; }

 private:
  /// One cache line per stream: a thread that launches on its stream writes no other's line.
  struct alignas(64) StreamSlot {
    std::atomic<std::uint64_t> done_at{0};
  };
  /// One cache line per event, for the same reason: records write `ready_at`.
  struct alignas(64) EventSlot {
    std::atomic<std::uintptr_t> handle{0};  ///< the live event's handle; 0 while free
    std::atomic<std::uint64_t> ready_at{0};
    std::uint32_t generation = 0;  ///< of the slot's next event (caller's lock)
  };

  std::atomic<std::uint64_t>* find_stream(Stream stream) const noexcept {
    StreamSlot* slot = streams_.find(stream.handle);
    return slot == nullptr ? nullptr : &slot->done_at;
  }
  EventSlot* find_event(Event event) const noexcept {
    // Handle 0 wraps to an index past any table: unknown, as it should be.
    EventSlot* slot = events_.find((event.handle & kIndexMask) - 1);
    if (slot == nullptr || slot->handle.load(std::memory_order_acquire) != event.handle) {
      return nullptr;
    }
    return slot;
  }
  /// Raises `cell` to at least `value`.
  static void raise(std::atomic<std::uint64_t>& cell, std::uint64_t value) noexcept;

  alignas(64) std::atomic<std::uint64_t> now_{0};
  SlotTable<StreamSlot> streams_;
  SlotTable<EventSlot> events_;
  std::vector<std::uint32_t> free_events_;  // indices of destroyed events' slots (caller's lock)
  std::size_t live_events_ = 0;             // (caller's lock)
};

}  // namespace cistern::detail
