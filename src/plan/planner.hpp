// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Planned placement: given buffers whose sizes and lifetimes are known ahead of time (a lifetime
// list, one recorded step of a training loop), assign each an offset in one arena so that no two
// buffers live at the same time overlap, and make the arena as small as possible.
//
//   std::vector<plan::Buffer> buffers = plan::buffers_of(trace);
//   plan::Placement p = plan::plan(buffers, {/*time_limit_s=*/5});
//   // p.offsets[i] for buffers[i]; p.arena >= p.peak_live, the lower bound
//
// Two stages. Greedy by size (Pisarchyk & Lee): largest buffer first, each into the smallest gap
// that fits among the already placed buffers whose lifetimes overlap its own, else on top. Then a
// search in the spirit of MiniMalloc, which decides whether the buffers fit within a capacity:
// depth-first over canonical placements, built bottom-up - at each node, offset f of the
// leftmost time section whose floor f is the lowest either takes one of the buffers that can sit
// there (one of each size and lifetime), or stays empty and the floor rises - with every floor
// raised to the lowest offset any buffer left there can take, and a branch cut as soon as some
// section's floor plus the sizes still to be placed there exceeds the capacity (see search.cpp).
// The arena is minimised by asking for the lower bound (peak live) first, then for capacities
// growing from it, then bisecting between the highest capacity not met and the best arena found;
// a search that exhausts its tree proves that capacity out of reach. A second strategy gets the
// other half of the budget and starts from what the first reached: a search that places one
// buffer per node, always among those that can go lowest, pruned by the skyline's lower bound
// (improve.cpp); it proves nothing but reaches the peak live on lists where the first does not. The
// search visits placements in a fixed order, so that for a given input and node limit the result is
// the same on every machine; a time limit only decides where that fixed walk stops.
#pragma once

#include <cstdint>
#include <vector>

namespace cistern::plan {

/// One buffer: `size` bytes live during the half-open interval [lower, upper) of some clock
/// (steps, event positions). Two buffers overlap in time when their intervals intersect.
struct Buffer {
  std::uint64_t lower = 0;
  std::uint64_t upper = 0;
  std::uint64_t size = 0;
};

/// How to plan.
struct Options {
  /// Seconds the improvement search may take after the greedy placement (0: greedy only).
  double time_limit_s = 1;
  /// Search nodes the improvement search may visit (0: no limit). Unlike the time limit, the
  /// same on every machine: tests use it.
  std::uint64_t node_limit = 0;
  /// Every offset is a multiple of this (a power of two); sizes are rounded up to it.
  std::uint64_t alignment = 1;
  /// >0: the arena is backed by virtual-memory pages of this size (a power of two, e.g. 2 MiB)
  /// mapped where live buffers need them, so the figure that counts is `peak_pages`: of the
  /// placements found, the one touching the fewest pages at its peak is returned.
  std::uint64_t page_size = 0;
  /// The search is skipped for more buffers than this (greedy only): its nodes cost O(n log n).
  std::size_t search_max_buffers = 20000;
};

/// A planned placement.
struct Placement {
  std::vector<std::uint64_t> offsets;  ///< offsets[i]: where buffers[i] starts in the arena
  std::uint64_t arena = 0;             ///< max over buffers of offset + (aligned) size
  std::uint64_t peak_live = 0;         ///< the lower bound: max live (aligned) bytes at one time
  std::uint64_t greedy_arena = 0;      ///< what greedy by size alone reached
  std::uint64_t peak_pages = 0;        ///< page mode: max pages touched by live buffers at once
  bool optimal = false;     ///< the arena is proven minimal (lower bound met, or search exhausted)
  bool searched = false;    ///< the improvement search ran
  std::uint64_t nodes = 0;  ///< search nodes visited
  double seconds = 0;       ///< wall time of the whole planning
};

/// Plans `buffers`. Throws `cistern::InvalidArgument` naming the first bad buffer (empty
/// lifetime, size 0, sizes whose sum does not fit in 63 bits) or a bad option.
Placement plan(const std::vector<Buffer>& buffers, const Options& options = {});

/// The lower bound: the maximum over time of the summed sizes (rounded up to `alignment`) of the
/// buffers live at that time.
std::uint64_t peak_live(const std::vector<Buffer>& buffers, std::uint64_t alignment = 1);

/// The maximum over time of the number of distinct `page_size` pages that live buffers touch,
/// with buffer i at offsets[i] (size rounded up to `alignment`).
std::uint64_t peak_pages(const std::vector<Buffer>& buffers,
                         const std::vector<std::uint64_t>& offsets, std::uint64_t page_size,
                         std::uint64_t alignment = 1);

}  // namespace cistern::plan
