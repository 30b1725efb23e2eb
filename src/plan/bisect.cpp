// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The search's outer loop (see problem.hpp). A search asked for a placement within a tight
// capacity prunes far more than one asked merely to beat the best so far: most branches break
// the capacity at once. So the arena is minimised as a sequence of decision problems: the lower
// bound first (often it is the optimum), then capacities growing from it until one is met, then
// bisection between the highest capacity not met and the best arena found.
#include <algorithm>

#include "plan/problem.hpp"

namespace cistern::plan::detail {

Bisection bisect(const Problem& problem, std::uint64_t lower, std::uint64_t upper,
                 std::chrono::steady_clock::time_point deadline, std::uint64_t node_limit,
                 const OnSolution& on_solution) {
  Bisection result;
  std::uint64_t target = lower;
  std::uint64_t floor = lower;  // capacities below this are proven or given up
  bool proven_below = true;     // every capacity below `floor` is proven out of reach
  bool found_any = false;
  std::uint64_t step = std::max<std::uint64_t>(1, (upper - lower) / 64);
  while (floor < upper) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    if (node_limit != 0 && result.nodes >= node_limit) break;
    SearchLimits limits;
    limits.deadline = now + (deadline - now) / 3;
    if (node_limit != 0)
      limits.node_limit = std::max<std::uint64_t>(1, (node_limit - result.nodes) / 3);
    std::uint64_t found = upper;
    const SearchOutcome outcome =
        search(problem, target, limits,
               [&](const std::vector<std::uint64_t>& offsets, std::uint64_t arena) {
                 found = arena;
                 on_solution(offsets, arena);
               });
    result.nodes += outcome.nodes;
    if (found <= target) {
      upper = found;
      found_any = true;
    } else {
      floor = target + 1;
      proven_below = proven_below && outcome.exhausted;
      if (proven_below) lower = floor;
    }
    if (floor >= upper) break;
    if (found_any) {
      target = floor + (upper - 1 - floor) / 2;
    } else {
      target = std::min(upper - 1, floor + step - 1);
      step *= 2;
    }
  }
  result.proven = lower >= upper;
  return result;
}

}  // namespace cistern::plan::detail
