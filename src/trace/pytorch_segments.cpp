// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "trace/pytorch_segments.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "cistern/errors.hpp"

namespace cistern::trace::detail {
namespace {

std::uint64_t end_of(const RecordedSegment& segment) { return segment.addr + segment.size; }

bool fits_in_address_space(std::uint64_t addr, std::uint64_t size) {
  return size <= std::numeric_limits<std::uint64_t>::max() - addr;
}

}  // namespace

void SegmentHistory::fail(const std::string& where, const std::string& problem) const {
  throw InvalidArgument(fmt::format("{}: {}: {}", name_, where, problem));
}

std::string SegmentHistory::event_place(std::size_t position) const {
  return fmt::format("device_traces[{}][{}]", device_, position);
}

void SegmentHistory::insert(const RecordedSegment& segment, const std::string& where) {
  if (segment.size == 0) fail(where, "a segment of 0 bytes");
  if (!fits_in_address_space(segment.addr, segment.size)) {
    fail(where, fmt::format("segment {:#x} + {} bytes wraps the address space", segment.addr,
                            segment.size));
  }
  const auto next = held_.lower_bound(segment.addr);
  const bool overlaps_next = next != held_.end() && next->first < end_of(segment);
  const bool overlaps_previous =
      next != held_.begin() && end_of(std::prev(next)->second) > segment.addr;
  if (overlaps_next || overlaps_previous) {
    fail(where, fmt::format("segment at {:#x} of {} bytes overlaps a segment held at that time",
                            segment.addr, segment.size));
  }
  held_.emplace_hint(next, segment.addr, segment);
}

void SegmentHistory::add_final(const RecordedSegment& segment, std::size_t index) {
  insert(segment, fmt::format("segments[{}]", index));
}

SegmentHistory::Held::iterator SegmentHistory::containing(std::uint64_t addr, std::uint64_t size) {
  auto at = held_.upper_bound(addr);
  if (at == held_.begin()) return held_.end();
  --at;
  const bool inside = fits_in_address_space(addr, size) && addr + size <= end_of(at->second);
  return inside ? at : held_.end();
}

void SegmentHistory::undo_alloc(const RecordedSegmentEvent& event, std::size_t position) {
  const auto at = held_.find(event.addr);
  if (at == held_.end() || at->second.is_expandable) {
    fail(event_place(position),
         fmt::format("segment_alloc at {:#x}, which is neither in the final segments nor freed "
                     "later in the window",
                     event.addr));
  }
  if (at->second.size != event.size) {
    fail(event_place(position), fmt::format("segment_alloc of {} bytes at {:#x}, but the segment "
                                            "there later has {} bytes",
                                            event.size, event.addr, at->second.size));
  }
  held_.erase(at);
}

void SegmentHistory::undo_free(const RecordedSegmentEvent& event, std::size_t position) {
  RecordedSegment segment;
  segment.addr = event.addr;
  segment.size = event.size;
  segment.stream = event.stream;
  segment.is_large = event.size > small_segment_bytes;
  insert(segment, event_place(position));
}

void SegmentHistory::undo_map(const RecordedSegmentEvent& event, std::size_t position) {
  const auto at = containing(event.addr, event.size);
  if (at == held_.end() || !at->second.is_expandable || event.size == 0) {
    fail(event_place(position),
         fmt::format("segment_map of {} bytes at {:#x}, which is not inside an expandable segment "
                     "held later",
                     event.size, event.addr));
  }
  const RecordedSegment whole = at->second;
  held_.erase(at);
  if (whole.addr < event.addr) {
    RecordedSegment left = whole;
    left.size = event.addr - whole.addr;
    held_.emplace(left.addr, left);
  }
  if (event.addr + event.size < end_of(whole)) {
    RecordedSegment right = whole;
    right.addr = event.addr + event.size;
    right.size = end_of(whole) - right.addr;
    held_.emplace(right.addr, right);
  }
}

void SegmentHistory::undo_unmap(const RecordedSegmentEvent& event, std::size_t position) {
  RecordedSegment range;
  range.addr = event.addr;
  range.size = event.size;
  range.stream = event.stream;
  range.is_large = event.size > small_segment_bytes;
  range.is_expandable = true;
  // The pages rejoin the range they were cut from: take its pool from a touching neighbour.
  const auto next = held_.lower_bound(event.addr);
  if (next != held_.end() && next->second.is_expandable && next->first == event.addr + event.size) {
    range.is_large = next->second.is_large;
  } else if (next != held_.begin() && std::prev(next)->second.is_expandable &&
             end_of(std::prev(next)->second) == event.addr) {
    range.is_large = std::prev(next)->second.is_large;
  }
  insert(range, event_place(position));
  merge_neighbours(held_.find(range.addr));
}

void SegmentHistory::merge_neighbours(Held::iterator at) {
  const auto joinable = [](const RecordedSegment& a, const RecordedSegment& b) {
    return a.is_expandable && b.is_expandable && end_of(a) == b.addr && a.stream == b.stream &&
           a.is_large == b.is_large;
  };
  if (at != held_.begin() && joinable(std::prev(at)->second, at->second)) {
    const auto previous = std::prev(at);
    previous->second.size += at->second.size;
    held_.erase(at);
    at = previous;
  }
  const auto next = std::next(at);
  if (next != held_.end() && joinable(at->second, next->second)) {
    at->second.size += next->second.size;
    held_.erase(next);
  }
}

void SegmentHistory::undo(const RecordedSegmentEvent& event, std::size_t position) {
  using Kind = RecordedSegmentEvent::Kind;
  switch (event.kind) {
    case Kind::alloc: return undo_alloc(event, position);
    case Kind::free: return undo_free(event, position);
    case Kind::map: return undo_map(event, position);
    case Kind::unmap: return undo_unmap(event, position);
  }
}

void SegmentHistory::rebuild(Recorded& recorded, const std::vector<std::size_t>& positions) {
  const std::vector<RecordedSegmentEvent>& events = recorded.segment_events;
  for (std::size_t i = events.size(); i-- > 0;) undo(events[i], positions[i]);

  recorded.initial_segments.clear();
  std::uint64_t reserved = 0;
  for (const auto& [addr, segment] : held_) {
    recorded.initial_segments.push_back(segment);
    reserved += segment.size;  // held segments do not overlap, so the sum fits
  }
  recorded.initial_reserved = reserved;
  std::uint64_t peak = reserved;
  using Kind = RecordedSegmentEvent::Kind;
  for (const RecordedSegmentEvent& event : events) {
    // The undo pass proved the events consistent, so these never wrap.
    const bool grows = event.kind == Kind::alloc || event.kind == Kind::map;
    reserved = grows ? reserved + event.size : reserved - event.size;
    peak = std::max(peak, reserved);
  }
  recorded.peak_reserved = peak;
}

}  // namespace cistern::trace::detail
