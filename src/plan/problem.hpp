// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The planner's internal form of a problem: lifetimes compressed to time sections, sizes rounded
// up to the alignment. Section s is the interval between the s-th and (s+1)-th distinct time
// point of the input, so two buffers overlap in time exactly when their section ranges intersect.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "plan/planner.hpp"

namespace cistern::plan::detail {

/// One buffer over sections [first, last), `size` already aligned.
struct Item {
  std::uint32_t first = 0;
  std::uint32_t last = 0;
  std::uint64_t size = 0;
};

/// A normalised problem (see the file comment).
struct Problem {
  std::vector<Item> items;
  std::uint32_t sections = 0;
};

/// Validates `buffers` and normalises them. Throws InvalidArgument naming the first bad buffer.
Problem normalise(const std::vector<Buffer>& buffers, std::uint64_t alignment);

/// Per section, the summed sizes of the items live there.
std::vector<std::int64_t> section_sums(const Problem& problem);

/// max over sections of the summed sizes of the items live there.
std::uint64_t peak_live(const Problem& problem);

/// max over items of offset + size.
std::uint64_t arena_of(const Problem& problem, const std::vector<std::uint64_t>& offsets);

/// Greedy by size: largest first (ties: longer lifetime, earlier start, input order), each into
/// the smallest gap that fits among the placed items overlapping it in time, else on top.
std::vector<std::uint64_t> greedy_by_size(const Problem& problem);

/// Limits of one search.
struct SearchLimits {
  std::chrono::steady_clock::time_point deadline;
  std::uint64_t node_limit = 0;  ///< 0: none
};

/// What the search did.
struct SearchOutcome {
  bool exhausted = false;  ///< no placement within the capacity exists (proven)
  std::uint64_t nodes = 0;
};

/// Called with the placement the search finds and its arena.
using OnSolution = std::function<void(const std::vector<std::uint64_t>& offsets, std::uint64_t)>;

/// The canonical depth-first search (see search.cpp): looks for a placement whose arena is at
/// most `capacity` and reports it through `on_solution`.
SearchOutcome search(const Problem& problem, std::uint64_t capacity, const SearchLimits& limits,
                     const OnSolution& on_solution);

/// Limits of the improving search.
struct ImproveLimits {
  SearchLimits search;
  /// Only the items whose offset would be the lowest of all are tried next (a far narrower tree
  /// that still holds good placements, but not all: an exhausted search then proves nothing).
  bool lowest_only = false;
};

/// The improving search (see improve.cpp): looks for arenas below `best_arena` (strictly), stops
/// at `lower_bound`, and reports each improvement through `on_solution`. `exhausted`: the tree
/// was visited to its end (with `lowest_only`, that proves nothing).
SearchOutcome improve(const Problem& problem, std::uint64_t best_arena, std::uint64_t lower_bound,
                      const ImproveLimits& limits, const OnSolution& on_solution);

/// What the bisection found.
struct Bisection {
  bool proven = false;  ///< the best arena reported is optimal
  std::uint64_t nodes = 0;
};

/// Searches for the smallest arena between `lower` (no smaller arena exists) and `upper` (an
/// arena already reached) by asking the search, one target at a time, for a placement within
/// the target: a found placement lowers `upper`, an exhausted search raises `lower` above the
/// target, a search out of its share of the budget sends the next target higher. Each target
/// gets a third of the time and nodes left. Improvements go to `on_solution`.
Bisection bisect(const Problem& problem, std::uint64_t lower, std::uint64_t upper,
                 std::chrono::steady_clock::time_point deadline, std::uint64_t node_limit,
                 const OnSolution& on_solution);

}  // namespace cistern::plan::detail
