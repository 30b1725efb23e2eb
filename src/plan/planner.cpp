// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The planner's entry points (see planner.hpp): greedy by size, then the search, and in page mode
// the choice of the placement that touches the fewest pages.
#include "plan/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "cistern/errors.hpp"
#include "plan/problem.hpp"

namespace cistern::plan {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

void check_options(const Options& options) {
  if (!(options.time_limit_s >= 0) || !std::isfinite(options.time_limit_s)) {
    throw InvalidArgument(
        fmt::format("plan: time limit {} s must be a non-negative number", options.time_limit_s));
  }
  const std::uint64_t page = options.page_size;
  if (page != 0 && ((page & (page - 1)) != 0 || page < options.alignment)) {
    throw InvalidArgument(
        fmt::format("plan: page size {} is not a power of two of at least the alignment {}", page,
                    options.alignment));
  }
}

/// Greedy by size with every item of at least a page padded to whole pages: such items come
/// first in size order, so they all start on page boundaries and touch no page more than needed.
std::vector<std::uint64_t> page_aligned_greedy(detail::Problem problem, std::uint64_t page) {
  for (detail::Item& item : problem.items) {
    if (item.size >= page) item.size = (item.size + page - 1) / page * page;
  }
  return detail::greedy_by_size(problem);
}

/// The best placement so far, by arena, or in page mode by peak pages then arena.
class Best {
 public:
  Best(const std::vector<Buffer>& buffers, const Options& options)
      : buffers_(buffers), options_(options) {}

  void offer(const std::vector<std::uint64_t>& offsets, std::uint64_t arena) {
    const std::uint64_t pages =
        options_.page_size == 0
            ? 0
            : peak_pages(buffers_, offsets, options_.page_size, options_.alignment);
    const bool better = offsets_.empty() || pages < pages_ || (pages == pages_ && arena < arena_);
    if (!better) return;
    offsets_ = offsets;
    arena_ = arena;
    pages_ = pages;
  }

  std::vector<std::uint64_t> offsets_;
  std::uint64_t arena_ = 0;
  std::uint64_t pages_ = 0;

 private:
  const std::vector<Buffer>& buffers_;
  const Options& options_;
};

}  // namespace

Placement plan(const std::vector<Buffer>& buffers, const Options& options) {
  const Clock::time_point start = Clock::now();
  check_options(options);
  const detail::Problem problem = detail::normalise(buffers, options.alignment);
  Placement result;
  result.peak_live = detail::peak_live(problem);
  Best best(buffers, options);
  const std::vector<std::uint64_t> greedy = detail::greedy_by_size(problem);
  result.greedy_arena = detail::arena_of(problem, greedy);
  best.offer(greedy, result.greedy_arena);
  if (options.page_size != 0) {
    const std::vector<std::uint64_t> aligned = page_aligned_greedy(problem, options.page_size);
    best.offer(aligned, detail::arena_of(problem, aligned));
  }
  std::uint64_t best_arena = result.greedy_arena;
  const bool search = options.time_limit_s > 0 && buffers.size() <= options.search_max_buffers &&
                      best_arena > result.peak_live;
  if (search) {
    const detail::Bisection outcome = detail::bisect(
        problem, result.peak_live, best_arena, Clock::now() + seconds(options.time_limit_s),
        options.node_limit, [&](const std::vector<std::uint64_t>& offsets, std::uint64_t arena) {
          best_arena = std::min(best_arena, arena);
          best.offer(offsets, arena);
        });
    result.searched = true;
    result.nodes = outcome.nodes;
    result.optimal = outcome.proven;
  }
  result.optimal = result.optimal || best_arena == result.peak_live;
  result.offsets = std::move(best.offsets_);
  result.arena = best.arena_;
  result.peak_pages = best.pages_;
  // In page mode the chosen placement may have a larger arena than the smallest one found.
  if (result.arena != best_arena) result.optimal = false;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

std::uint64_t peak_live(const std::vector<Buffer>& buffers, std::uint64_t alignment) {
  return detail::peak_live(detail::normalise(buffers, alignment));
}

std::uint64_t peak_pages(const std::vector<Buffer>& buffers,
                         const std::vector<std::uint64_t>& offsets, std::uint64_t page_size,
                         std::uint64_t alignment) {
  if (page_size == 0 || (page_size & (page_size - 1)) != 0) {
    throw InvalidArgument(fmt::format("plan: page size {} is not a power of two", page_size));
  }
  const detail::Problem problem = detail::normalise(buffers, alignment);
  const std::uint64_t arena = detail::arena_of(problem, offsets);
  if (arena / page_size > (std::uint64_t{1} << 28)) {
    throw InvalidArgument(
        fmt::format("plan: page size {} is too small for an arena of {} bytes", page_size, arena));
  }
  // Sweep the sections: a page counts while any live item touches it.
  std::vector<std::vector<std::uint32_t>> starts(problem.sections + 1), ends(problem.sections + 1);
  for (std::uint32_t i = 0; i < problem.items.size(); ++i) {
    starts[problem.items[i].first].push_back(i);
    ends[problem.items[i].last].push_back(i);
  }
  std::vector<std::uint32_t> users(arena / page_size + 1, 0);
  std::uint64_t touched = 0;
  std::uint64_t peak = 0;
  const auto visit = [&](std::uint32_t i, bool add) {
    const std::uint64_t first = offsets[i] / page_size;
    const std::uint64_t last = (offsets[i] + problem.items[i].size - 1) / page_size;
    for (std::uint64_t p = first; p <= last; ++p) {
      if (add) touched += users[p]++ == 0 ? 1 : 0;
      else touched -= --users[p] == 0 ? 1 : 0;
    }
  };
  for (std::uint32_t s = 0; s <= problem.sections; ++s) {
    for (const std::uint32_t i : ends[s]) visit(i, false);
    for (const std::uint32_t i : starts[s]) visit(i, true);
    peak = std::max(peak, touched);
  }
  return peak;
}

}  // namespace cistern::plan
