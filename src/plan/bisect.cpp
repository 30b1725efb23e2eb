// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The search's outer loop (see problem.hpp). A search asked for a placement within a tight
// capacity prunes far more than one asked merely to beat the best so far: most branches break
// the capacity at once. So the arena is minimised as a sequence of decision problems: the lower
// bound first (often it is the optimum), then capacities growing from it until one is met, then
// bisection between the highest capacity not met and the best arena found.
//
// Two searches answer those questions, each over half the budget: the search at a capacity
// (search.cpp), complete, whose exhausted trees prove capacities out of reach, and the improving
// search restricted to the lowest candidates (improve.cpp), which proves nothing but on some
// lists reaches the lower bound where the first does not. The second starts from what the first
// reached, so the planner keeps the better of the two.
#include <algorithm>
#include <functional>

#include "plan/problem.hpp"

namespace cistern::plan::detail {
namespace {

using Clock = std::chrono::steady_clock;

/// One question: a placement within `target`? Reports found placements to the bisection's
/// `on_solution`; `exhausted` proves none exists only for a complete search.
using Ask = std::function<SearchOutcome(std::uint64_t target, const SearchLimits& limits,
                                        const OnSolution& on_solution)>;

/// Bisects with one search between result-wide bounds: `lower` (proven) and `upper` (reached).
/// `complete`: an exhausted search proves its target out of reach.
void bisect_with(const Ask& ask, bool complete, std::uint64_t& lower, std::uint64_t& upper,
                 Clock::time_point deadline, std::uint64_t node_limit,
                 const OnSolution& on_solution, std::uint64_t& nodes) {
  std::uint64_t target = lower;
  std::uint64_t floor = lower;  // capacities below this are proven or given up
  bool proven_below = true;     // every capacity below `floor` is proven out of reach
  bool found_any = false;
  std::uint64_t step = std::max<std::uint64_t>(1, (upper - lower) / 64);
  std::uint64_t used = 0;
  while (floor < upper) {
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (node_limit != 0 && used >= node_limit) break;
    SearchLimits limits;
    limits.deadline = now + (deadline - now) / 3;
    if (node_limit != 0) limits.node_limit = std::max<std::uint64_t>(1, (node_limit - used) / 3);
    std::uint64_t found = upper;
    const SearchOutcome outcome =
        ask(target, limits, [&](const std::vector<std::uint64_t>& offsets, std::uint64_t arena) {
          found = std::min(found, arena);
          on_solution(offsets, arena);
        });
    used += outcome.nodes;
    if (found <= target) {
      upper = found;
      found_any = true;
    } else {
      floor = target + 1;
      proven_below = proven_below && complete && outcome.exhausted;
      if (proven_below) lower = std::max(lower, floor);
    }
    if (floor >= upper) break;
    if (found_any) {
      target = floor + (upper - 1 - floor) / 2;
    } else {
      target = std::min(upper - 1, floor + step - 1);
      step *= 2;
    }
  }
  nodes += used;
}

}  // namespace

Bisection bisect(const Problem& problem, std::uint64_t lower, std::uint64_t upper,
                 Clock::time_point deadline, std::uint64_t node_limit,
                 const OnSolution& on_solution) {
  const Ask at_capacity = [&](std::uint64_t target, const SearchLimits& limits,
                              const OnSolution& found) {
    return search(problem, target, limits, found);
  };
  const Ask improving = [&](std::uint64_t target, const SearchLimits& limits,
                            const OnSolution& found) {
    return improve(problem, target + 1, target, ImproveLimits{limits, true}, found);
  };
  Bisection result;
  const auto now = Clock::now();
  const auto half = now + (deadline - now) / 2;
  // Node limits split the same way (0: none, for both); a limit of 1 goes to the first.
  const std::uint64_t first_nodes =
      node_limit == 0 ? 0 : std::max<std::uint64_t>(1, node_limit / 2);
  bisect_with(at_capacity, true, lower, upper, half, first_nodes, on_solution, result.nodes);
  if (lower < upper && (node_limit == 0 || node_limit > first_nodes)) {
    bisect_with(improving, false, lower, upper, deadline, node_limit - first_nodes, on_solution,
                result.nodes);
  }
  result.proven = lower >= upper;
  return result;
}

}  // namespace cistern::plan::detail
