// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Allocator::check: the invariants every allocator shows through its interface.
#include "cistern/allocator.hpp"

#include <fmt/format.h>

#include <cstdint>

#include "cistern/errors.hpp"

namespace cistern {
namespace {

[[noreturn]] void violated(const Allocator& allocator, const std::string& what) {
  throw InvariantViolation(fmt::format("{}::check: {}", allocator.name(), what));
}

// Blocks tile the segment in address order; returns the bytes of active_allocated blocks.
std::size_t check_segment(const Allocator& allocator, const SegmentInfo& segment) {
  std::uintptr_t expected = segment.address;
  std::size_t allocated = 0;
  for (const BlockInfo& b : segment.blocks) {
    if (b.address != expected || b.size == 0) {
      violated(allocator, fmt::format("segment {:#x}: block at {:#x} of {} bytes where {:#x} was "
                                      "expected",
                                      segment.address, b.address, b.size, expected));
    }
    if (b.state == BlockState::active_allocated) allocated += b.size;
    expected = b.address + b.size;
  }
  if (expected != segment.address + segment.total_size) {
    violated(allocator, fmt::format("segment {:#x}: blocks cover {} of {} bytes", segment.address,
                                    expected - segment.address, segment.total_size));
  }
  if (allocated != segment.allocated_size) {
    violated(allocator, fmt::format("segment {:#x}: allocated blocks hold {} bytes, the segment "
                                    "says {}",
                                    segment.address, allocated, segment.allocated_size));
  }
  return allocated;
}

void check_peaks(const Allocator& allocator, const Stats& stats) {
  for (int k = 0; k < kStatKinds; ++k) {
    for (int q = 0; q < kStatPools; ++q) {
      const Stat& s = stats.array[k][q];
      if (s.peak < s.current || s.current < 0) {
        violated(allocator,
                 fmt::format("{}.{}: current {} with peak {}", to_string(static_cast<StatKind>(k)),
                             to_string(static_cast<StatPool>(q)), s.current, s.peak));
      }
    }
  }
}

}  // namespace

void Allocator::check() const {
  const Snapshot snap = snapshot();
  const Stats stats = this->stats();
  std::uintptr_t end = 0;
  std::size_t reserved = 0;
  std::size_t allocated = 0;
  for (const SegmentInfo& segment : snap.segments) {
    if (segment.address < end) {
      violated(*this, fmt::format("segment {:#x} overlaps or precedes the one ending at {:#x}",
                                  segment.address, end));
    }
    end = segment.address + segment.total_size;
    reserved += segment.total_size;
    allocated += check_segment(*this, segment);
  }
  const auto stat = [&stats](StatKind kind) {
    return static_cast<std::size_t>(stats.get(kind, StatPool::all).current);
  };
  // Physical memory held may exceed the segments: a virtual-memory engine keeps unmapped pages.
  if (reserved != stat(StatKind::reserved_bytes) || reserved > reserved_bytes()) {
    violated(*this, fmt::format("segments hold {} bytes, reserved_bytes says {}, reserved_bytes() "
                                "{}",
                                reserved, stat(StatKind::reserved_bytes), reserved_bytes()));
  }
  if (allocated != stat(StatKind::allocated_bytes)) {
    violated(*this, fmt::format("allocated blocks hold {} bytes, allocated_bytes says {}",
                                allocated, stat(StatKind::allocated_bytes)));
  }
  check_peaks(*this, stats);
}

}  // namespace cistern
