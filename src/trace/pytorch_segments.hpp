// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The segments PyTorch held when a snapshot's window opened. A snapshot records the segments
// held at its end and the segment events of the window; undoing those events from the last to
// the first gives the segments at the start (the warm start's cache), and replaying them forward
// from there gives PyTorch's reserved bytes over the window.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trace/trace.hpp"

namespace cistern::trace::detail {

/// PyTorch's small pool allocates only segments of this size (kSmallBuffer); its large pool
/// never does (20 MiB, or 10 MiB and more rounded to 2 MiB), which is how the pool of a segment
/// known only from a segment event is told.
inline constexpr std::uint64_t small_segment_bytes = std::uint64_t{2} << 20;

/// Rebuilds the segments held before a window from those held after it.
class SegmentHistory {
 public:
  /// `name` and `device` label messages.
  SegmentHistory(const std::string& name, int device) : name_(name), device_(device) {}

  /// A segment of the final `segments` list (index `index`). Throws if it overlaps another.
  void add_final(const RecordedSegment& segment, std::size_t index);

  /// Undoes `recorded.segment_events` (read from `device_traces[device][positions[i]]`) to fill
  /// `recorded.initial_segments` (address order), `initial_reserved` and `peak_reserved`.
  /// Throws naming the event when the events do not fit the final segments (a segment allocated
  /// twice, freed while not held, a map outside an expandable segment, ...).
  void rebuild(Recorded& recorded, const std::vector<std::size_t>& positions);

 private:
  using Held = std::map<std::uint64_t, RecordedSegment>;  ///< by address

  void undo(const RecordedSegmentEvent& event, std::size_t position);
  void undo_alloc(const RecordedSegmentEvent& event, std::size_t position);
  void undo_free(const RecordedSegmentEvent& event, std::size_t position);
  void undo_map(const RecordedSegmentEvent& event, std::size_t position);
  void undo_unmap(const RecordedSegmentEvent& event, std::size_t position);
  /// Inserts `segment`, throwing if it overlaps a held one.
  void insert(const RecordedSegment& segment, const std::string& where);
  /// The held segment that contains [addr, addr + size), or end().
  Held::iterator containing(std::uint64_t addr, std::uint64_t size);
  /// Merges the expandable range at `at` with expandable neighbours it touches.
  void merge_neighbours(Held::iterator at);
  [[noreturn]] void fail(const std::string& where, const std::string& problem) const;
  std::string event_place(std::size_t position) const;

  const std::string& name_;
  int device_;
  Held held_;
};

}  // namespace cistern::trace::detail
