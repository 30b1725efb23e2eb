// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The search's outer loop (see problem.hpp). A search asked for an arena within a tight target
// prunes far more than one asked merely to beat the best so far: most branches break the target
// at once. Minimalloc's instances are solved this way, as decision problems at a capacity.
#include <algorithm>

#include "plan/problem.hpp"

namespace cistern::plan::detail {

namespace {

/// Bisects with one kind of search (see bisect). `complete`: an exhausted search proves that
/// the target is out of reach.
void bisect_with(const Problem& problem, std::uint64_t& lower, std::uint64_t& upper,
                 std::chrono::steady_clock::time_point deadline, std::uint64_t node_limit,
                 bool complete, const OnSolution& on_solution, Bisection& result) {
  std::uint64_t target = lower;  // the lower bound first: often it is the optimum
  std::uint64_t floor = lower;   // targets below this are known or assumed out of reach
  const std::uint64_t start_nodes = result.nodes;
  while (floor < upper) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    if (node_limit != 0 && result.nodes - start_nodes >= node_limit) break;
    SearchLimits limits;
    limits.deadline = now + (deadline - now) / 3;
    if (node_limit != 0) {
      limits.node_limit =
          std::max<std::uint64_t>(1, (node_limit - (result.nodes - start_nodes)) / 3);
    }
    limits.lowest_only = !complete;
    std::uint64_t found = upper;
    const SearchOutcome outcome =
        search(problem, target + 1, target, limits,
               [&](const std::vector<std::uint64_t>& offsets, std::uint64_t arena) {
                 found = arena;
                 on_solution(offsets, arena);
               });
    result.nodes += outcome.nodes;
    if (found <= target) {
      upper = found;
    } else if (outcome.exhausted) {
      floor = target + 1;
      if (complete) lower = floor;
    } else {
      floor = target + (upper - target) / 2 + 1;  // unknown: ask for less
    }
    target = floor + (upper - floor) / 2;
    if (floor >= upper) break;
  }
}

}  // namespace

Bisection bisect(const Problem& problem, std::uint64_t lower, std::uint64_t upper,
                 std::chrono::steady_clock::time_point deadline, std::uint64_t node_limit,
                 const OnSolution& on_solution) {
  Bisection result;
  // Half the budget to the narrow search, which finds good placements fast; the rest to the
  // complete one, which can also prove optimality.
  const auto now = std::chrono::steady_clock::now();
  const auto half = now + (deadline - now) / 2;
  bisect_with(problem, lower, upper, half, node_limit / 2, false, on_solution, result);
  bisect_with(problem, lower, upper, deadline, node_limit - node_limit / 2, true, on_solution,
              result);
  result.proven = lower >= upper;
  return result;
}

}  // namespace cistern::plan::detail
