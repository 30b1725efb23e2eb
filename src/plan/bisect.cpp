// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The search's outer loop (see problem.hpp). A search asked for an arena within a tight target
// prunes far more than one asked merely to beat the best so far: most branches break the target
// at once. Minimalloc's instances are solved this way, as decision problems at a capacity.
#include <algorithm>

#include "plan/problem.hpp"

namespace cistern::plan::detail {

Bisection bisect(const Problem& problem, std::uint64_t lower, std::uint64_t upper,
                 std::chrono::steady_clock::time_point deadline, std::uint64_t node_limit,
                 const OnSolution& on_solution) {
  Bisection result;
  std::uint64_t target = lower;  // the lower bound first: often it is the optimum
  while (lower < upper) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    if (node_limit != 0 && result.nodes >= node_limit) break;
    SearchLimits limits;
    limits.deadline = now + (deadline - now) / 3;
    if (node_limit != 0)
      limits.node_limit = std::max<std::uint64_t>(1, (node_limit - result.nodes) / 3);
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
      target = lower + (upper - lower) / 2;
    } else if (outcome.exhausted) {
      lower = target + 1;
      target = lower + (upper - lower) / 2;
    } else {
      target += (upper - target) / 2;  // unknown: ask for less
      if (target + 1 >= upper) break;
    }
  }
  result.proven = lower >= upper;
  return result;
}

}  // namespace cistern::plan::detail
