// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The improving search (see problem.hpp): the planner's second strategy beside the search at a
// capacity (search.cpp). Where that one decides, at the lowest open section, what occupies its
// floor, this one places one buffer per node, each at the highest floor over its lifetime, in
// non-decreasing offset order, and prunes with the skyline's bound against the best arena so far.
// On some lists (tiny_bert) it reaches the lower bound where the search at a capacity does not
// within the same time, and the other way round on others (resnet50): the planner runs both.
//
// Why canonical placements suffice: take any feasible placement and let every buffer fall as low
// as the others allow; each then rests at 0 or on a buffer below it. Placing the buffers one by
// one in order of (offset, rank), each at the highest floor over its own sections, rebuilds that
// placement exactly. So the search only ever places a buffer at the skyline over its lifetime,
// in non-decreasing offset order (equal offsets: increasing rank), and still reaches every arena
// that any placement reaches.
#include <algorithm>
#include <numeric>

#include "plan/problem.hpp"
#include "plan/skyline.hpp"

namespace cistern::plan::detail {
namespace {

/// A buffer that may be placed next, at `offset`.
struct Candidate {
  std::int64_t offset;
  std::uint32_t item;
};

class Improve {
 public:
  Improve(const Problem& problem, std::uint64_t best_arena, std::uint64_t lower_bound,
          const ImproveLimits& limits, const OnSolution& on_solution)
      : items_(problem.items),
        skyline_(section_sums(problem)),
        best_(static_cast<std::int64_t>(best_arena)),
        lower_bound_(static_cast<std::int64_t>(lower_bound)),
        limits_(limits),
        on_solution_(on_solution),
        offsets_(items_.size(), 0),
        candidates_(items_.size() + 1) {
    unplaced_.resize(items_.size());
    std::iota(unplaced_.begin(), unplaced_.end(), 0U);
    // Items are tried largest first at equal offsets; this order also ranks them for ties.
    std::vector<std::uint32_t> order(items_.size());
    std::iota(order.begin(), order.end(), 0U);
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      const Item& x = items_[a];
      const Item& y = items_[b];
      if (x.size != y.size) return x.size > y.size;
      if (x.last - x.first != y.last - y.first) return x.last - x.first > y.last - y.first;
      return a < b;
    });
    rank_.resize(items_.size());
    for (std::uint32_t r = 0; r < order.size(); ++r) rank_[order[r]] = r;
  }

  SearchOutcome run() {
    if (best_ > lower_bound_) descend(0, 0, -1);
    return SearchOutcome{!stopped_, nodes_};
  }

 private:
  /// Whether to stop: a limit is reached, or the best arena meets the lower bound.
  bool out_of_budget() {
    if (stopped_ || best_ <= lower_bound_) return true;
    ++nodes_;
    if (limits_.search.node_limit != 0 && nodes_ > limits_.search.node_limit) stopped_ = true;
    // A node costs O(n log n), far more than reading the clock.
    if (std::chrono::steady_clock::now() >= limits_.search.deadline) stopped_ = true;
    return stopped_;
  }

  /// Every unplaced item that may come next in canonical order after (level, last_rank).
  /// Returns false if some unplaced item can no longer fit below the best arena: floors and the
  /// level only rise, so it never will, and the whole branch is dead.
  bool gather(std::vector<Candidate>& out, std::int64_t level, std::int64_t last_rank) {
    out.clear();
    for (const std::uint32_t i : unplaced_) {
      const Item& item = items_[i];
      const std::int64_t offset = skyline_.max_floor(item.first, item.last);
      if (std::max(offset, level) + static_cast<std::int64_t>(item.size) >= best_) return false;
      if (offset < level || (offset == level && rank_[i] < last_rank)) continue;
      out.push_back(Candidate{offset, i});
    }
    std::sort(out.begin(), out.end(), [&](const Candidate& a, const Candidate& b) {
      return a.offset != b.offset ? a.offset < b.offset : rank_[a.item] < rank_[b.item];
    });
    if (limits_.lowest_only && !out.empty()) {
      const std::int64_t lowest = out.front().offset;
      out.erase(std::find_if(out.begin(), out.end(),
                             [&](const Candidate& c) { return c.offset != lowest; }),
                out.end());
    }
    return true;
  }

  void descend(std::size_t depth, std::int64_t level, std::int64_t last_rank) {
    if (out_of_budget()) return;
    if (unplaced_.empty()) {
      record();
      return;
    }
    // No buffer left starts below `level`: the skyline's bound at that level must beat the best.
    if (skyline_.bound(level) >= best_) return;
    std::vector<Candidate>& candidates = candidates_[depth];
    if (!gather(candidates, level, last_rank)) return;
    // Deeper levels use their own lists (candidates_[depth + 1], ...): this one stays intact.
    for (const Candidate candidate : candidates) {
      const Item& item = items_[candidate.item];
      const auto size = static_cast<std::int64_t>(item.size);
      if (candidate.offset + size >= best_) continue;
      const std::size_t mark = skyline_.mark();
      skyline_.place(item.first, item.last, candidate.offset + size, size);
      const std::size_t position = take(candidate.item);
      offsets_[candidate.item] = static_cast<std::uint64_t>(candidate.offset);
      descend(depth + 1, candidate.offset, rank_[candidate.item]);
      give_back(candidate.item, position);
      skyline_.undo_to(mark);
      if (out_of_budget()) return;
    }
  }

  /// Removes item i from the unplaced list; returns where it was (for give_back).
  std::size_t take(std::uint32_t i) {
    const auto it = std::find(unplaced_.begin(), unplaced_.end(), i);
    const auto position = static_cast<std::size_t>(it - unplaced_.begin());
    std::swap(unplaced_[position], unplaced_.back());
    unplaced_.pop_back();
    return position;
  }

  void give_back(std::uint32_t i, std::size_t position) {
    unplaced_.push_back(i);
    std::swap(unplaced_[position], unplaced_.back());
  }

  void record() {
    std::int64_t arena = 0;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      arena = std::max(arena, static_cast<std::int64_t>(offsets_[i] + items_[i].size));
    }
    if (arena >= best_) return;
    best_ = arena;
    on_solution_(offsets_, static_cast<std::uint64_t>(arena));
  }

  const std::vector<Item>& items_;
  Skyline skyline_;
  std::int64_t best_;
  std::int64_t lower_bound_;
  ImproveLimits limits_;
  const OnSolution& on_solution_;
  std::vector<std::uint64_t> offsets_;
  std::vector<std::uint32_t> unplaced_;
  std::vector<std::int64_t> rank_;
  std::vector<std::vector<Candidate>> candidates_;  ///< one list per depth, reused
  std::uint64_t nodes_ = 0;
  bool stopped_ = false;
};

}  // namespace

SearchOutcome improve(const Problem& problem, std::uint64_t best_arena, std::uint64_t lower_bound,
                      const ImproveLimits& limits, const OnSolution& on_solution) {
  Improve s(problem, best_arena, lower_bound, limits, on_solution);
  return s.run();
}

}  // namespace cistern::plan::detail
