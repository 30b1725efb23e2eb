// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The trace model: what every reader produces and the replay engine consumes.
//
// A trace is the allocation activity of one device: a sequence of events (allocate, free,
// program calls such as synchronisations and empty_cache) in the order the program issued them,
// plus what was already allocated when the recorded window opened. Allocations are named by an
// `id` that the reader assigns (formats that only know addresses - PyTorch snapshots, Kineto,
// RMM logs - get ids from the address's lifetime), so that replaying on another allocator,
// which places blocks elsewhere, needs no addresses.
//
// PyTorch snapshots also carry what PyTorch's allocator itself did: the segments it held, the
// block addresses it chose, its segment_alloc/segment_free events. Those are kept beside the
// events (`recorded`) for the warm start and for checking an emulation against PyTorch.
//
// Invariants (`Trace::check` verifies them; every reader guarantees them):
// - an id names one allocation in the whole trace: the ids of `live_before` and of alloc events
//   are all distinct, and an id is never reused after its free;
// - a free names an id that is live at that point (in `live_before` or allocated earlier, and not
//   yet freed), and carries that allocation's requested size and recorded address;
// - synchronize and empty_cache events have id, size and addr 0;
// - every stream index is below `streams.size()`; sizes are at most `max_allocation_size`, and
//   the live bytes (what `peak_live` adds up) stay below 2^64;
// - `live_before` is in address order;
// - positions in `recorded` (`before_event`, sample indices) are in order and inside the events.
//
// Readers number ids densely: `live_before` gets 0..L-1 in address order, allocations L, L+1, ...
// in event order.
//
// The free of a PyTorch snapshot is the program's free (`free_requested`): that is when the
// requested bytes stop being live, and it is the convention that reproduces the reference
// `peak_live` figures of ../shared/traces/README.md to the byte. When PyTorch could reuse the block
// only later (`free_completed` after other events, as with record_stream), the completion is kept
// in `recorded.deferred_frees`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cistern/stacks.hpp"

namespace cistern::trace {

/// The largest allocation size any reader accepts (64 PiB): larger sizes are corrupt input, and
/// keeping sizes below 2^56 lets sums of many of them fit in 64 bits.
inline constexpr std::uint64_t max_allocation_size = std::uint64_t{1} << 56;

/// What one event does.
enum class Op : std::uint8_t {
  alloc,        ///< allocate `size` bytes as allocation `id` on `stream`
  free,         ///< free allocation `id`, ordered on `stream`
  synchronize,  ///< the program waited for the device (all work so far completes)
  empty_cache,  ///< the program returned the allocator's cache (PyTorch's empty_cache())
};

/// The name of an op ("alloc", "free", ...).
const char* to_string(Op op) noexcept;

/// One event of a trace.
struct Event {
  Op op = Op::alloc;
  std::uint32_t stream = 0;  ///< index into Trace::streams
  std::uint64_t id = 0;      ///< allocation id (alloc/free)
  std::uint64_t size = 0;    ///< requested bytes (alloc; for free, the size freed if known)
  std::uint64_t addr = 0;    ///< the address the recording allocator used (0: not recorded)
  std::int64_t time = 0;     ///< recorded time in microseconds, or the event's position
};

/// A block allocated before the recorded window opened and live at its start.
struct LiveBlock {
  std::uint64_t id = 0;
  std::uint64_t size = 0;  ///< requested bytes
  std::uint64_t addr = 0;  ///< recorded address (0: not recorded)
  std::uint32_t stream = 0;
};

/// A segment the recording allocator held (PyTorch snapshots).
struct RecordedSegment {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint32_t stream = 0;
  bool is_large = true;
  bool is_expandable = false;
};

/// A segment event of the recording allocator inside the window (PyTorch's segment_alloc,
/// segment_free, segment_map, segment_unmap): its reserved memory over time.
struct RecordedSegmentEvent {
  enum class Kind : std::uint8_t { alloc, free, map, unmap };
  Kind kind = Kind::alloc;
  /// Happens just before events[before_event] (== events.size(): after the last event).
  std::size_t before_event = 0;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint32_t stream = 0;
  std::int64_t time = 0;
};

/// A free whose block the recording allocator could reuse only later than the program freed it
/// (PyTorch's `free_completed` separated from its `free_requested` by other events, as after
/// `record_stream`). Frees that completed at once (the usual case; every single-stream trace)
/// are not listed.
struct RecordedFreeCompletion {
  std::uint64_t id = 0;  ///< the freed allocation
  /// Completes just before events[before_event] (== events.size(): after the last event, or
  /// not within the window: still pending when the snapshot was taken).
  std::size_t before_event = 0;
  std::int64_t time = 0;
};

/// An allocation the recording allocator failed to serve (PyTorch's `oom` event, RMM's
/// `allocate failure`). The program saw an error there; the trace continues with whatever it did
/// next, so a replay that serves this request is doing better than the recorded run.
struct RecordedOom {
  std::size_t before_event = 0;   ///< happened just before events[before_event]
  std::uint64_t size = 0;         ///< PyTorch: the rounded request; RMM: the requested bytes
  std::uint64_t device_free = 0;  ///< what the device reported free (PyTorch; 0: not recorded)
  std::uint32_t stream = 0;
  std::int64_t time = 0;
};

/// What the recording allocator did, where the format says (PyTorch snapshots, Kineto, RMM).
struct Recorded {
  /// Segments held when the window opened (the warm start's cache).
  std::vector<RecordedSegment> initial_segments;
  /// Segment events inside the window, in order.
  std::vector<RecordedSegmentEvent> segment_events;
  /// Reserved bytes when the window opened and at its peak (PyTorch's own figure).
  std::optional<std::uint64_t> initial_reserved;
  std::optional<std::uint64_t> peak_reserved;
  /// Reserved bytes as the format records them (Kineto's Total Reserved): pairs (i, bytes) saying
  /// that after events[i] the figure was `bytes` and stayed so until the next sample. Kept only
  /// where the figure changed (and after the first event), with strictly increasing i. Empty for
  /// formats that do not record it; the replay engine reconstructs it from segment_events.
  std::vector<std::pair<std::size_t, std::uint64_t>> reserved_samples;
  /// The recording allocator's settings as key/value text (PyTorch's allocator_settings).
  std::vector<std::pair<std::string, std::string>> settings;
  /// Frees that completed later than requested, in order (see RecordedFreeCompletion).
  std::vector<RecordedFreeCompletion> deferred_frees;
  /// Allocations the recording allocator failed, in order.
  std::vector<RecordedOom> ooms;
  /// Where and why a replay cannot reproduce the recording exactly (a trace buffer that
  /// overflowed, a release the format does not explain, ...), one sentence each, for `cistern
  /// info` and the replay's report. Empty when the reader saw nothing of the kind.
  std::vector<std::string> notes;
  /// False for a PyTorch snapshot whose trace buffers hold no entry on any device
  /// (`device_traces == [[]]`): dumped without `_record_memory_history`, it has segments but no
  /// window to replay (require_history).
  bool has_history = true;
};

/// One device's allocation trace.
struct Trace {
  std::string source;  ///< the file it was read from
  std::string format;  ///< "pytorch", "lifetimes", "rmm", "kineto" or "cistern"
  int device = 0;
  std::vector<std::uint64_t> streams{0};  ///< recorded stream handles; events index into it
  std::vector<LiveBlock> live_before;     ///< allocated before the window, in address order
  std::vector<Event> events;
  Recorded recorded;
  /// The call stacks the recording gives (PyTorch snapshots' `frames`), interned.
  StackTable stacks;
  /// The stack of each allocation, by id (live_before and window alike): where the program
  /// allocated it. Empty when the recording has no frames; ids beyond its end have none (0).
  std::vector<std::uint32_t> alloc_stacks;

  /// The stack of allocation `id` (0: none recorded).
  std::uint32_t stack_of(std::uint64_t id) const noexcept {
    return id < alloc_stacks.size() ? alloc_stacks[id] : 0;
  }

  /// The exact physical lower bound: the maximum over time of live requested bytes, counting
  /// the blocks live before the window. An allocation stops being live at its free event.
  std::uint64_t peak_live() const;
  /// The number of alloc events (the README's "allocations" column; `live_before` not counted).
  std::size_t allocations() const;
  /// Verifies the invariants listed at the top of this header. Throws `cistern::InvalidArgument`
  /// naming `source` and the first offending element ("events[17]: free of id 5, which is not
  /// live").
  void check() const;
};

/// Throws `cistern::InvalidArgument` when `trace` has no recorded history to replay (a PyTorch
/// snapshot dumped without `_record_memory_history`, `Recorded::has_history`), with the calls
/// that record one. A replay of it would report "0 allocations" as if that were the workload.
void require_history(const Trace& trace);

}  // namespace cistern::trace
