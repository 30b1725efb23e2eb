// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The search for a placement within a capacity (see problem.hpp).
//
// Canonical placements. Take any placement within the capacity and let every buffer fall as low
// as the others allow: each then rests at 0 or on top of another buffer. The search builds such
// placements bottom-up, in non-decreasing offset order. Its state is the skyline: per time
// section a floor, below which every buffer still to be placed there is known not to go. At each
// node it looks at the lowest floor f of the sections where buffers remain (the leftmost such
// section s, if several) and branches on what occupies offset f in section s:
//  - a buffer b live in s whose offset can be f (the highest floor over its lifetime is f). Since
//    s is the leftmost lowest section, b starts in s. Placing b raises its sections to f + size.
//  - nothing: then every buffer left in s goes higher, and the lowest of them, u, rests either on
//    a placed buffer (at the floor of one of u's sections, a floor above f) or on a buffer not yet
//    placed (at least f plus the smallest size left). So the floor of s rises to the lower of
//    those two bounds, and the search goes on. Every placement within the capacity is reached by
//    one path of these choices, so an exhausted search proves that none exists.
// Pruning: per section, the floor plus the sizes of the buffers left there must fit within the
// capacity (this also covers every single buffer left: its offset is at least the floor of each
// of its sections). Dominance: of the buffers that could go at f in s, only one of each (lifetime,
// size) is tried, since swapping two such buffers maps placements onto placements.
#include <algorithm>
#include <deque>
#include <limits>
#include <numeric>

#include "plan/problem.hpp"
#include "plan/skyline.hpp"

namespace cistern::plan::detail {
namespace {

constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();

class Search {
 public:
  Search(const Problem& problem, std::uint64_t capacity, const SearchLimits& limits,
         const OnSolution& on_solution)
      : items_(problem.items),
        skyline_(section_sums(problem)),
        capacity_(static_cast<std::int64_t>(capacity)),
        limits_(limits),
        on_solution_(on_solution),
        offsets_(items_.size(), 0),
        placed_(items_.size(), false),
        starting_(std::size_t{problem.sections} + 1),
        next_(std::size_t{problem.sections} + 1),
        candidates_(1) {
    // Candidates are tried longest-lived first (they constrain the most), then largest.
    std::vector<std::uint32_t> order(items_.size());
    std::iota(order.begin(), order.end(), 0U);
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      const Item& x = items_[a];
      const Item& y = items_[b];
      if (x.last - x.first != y.last - y.first) return x.last - x.first > y.last - y.first;
      if (x.size != y.size) return x.size > y.size;
      return a < b;
    });
    for (const std::uint32_t i : order) starting_[items_[i].first].push_back(i);
    by_size_ = order;
    std::stable_sort(by_size_.begin(), by_size_.end(), [&](std::uint32_t a, std::uint32_t b) {
      return items_[a].size < items_[b].size;
    });
  }

  SearchOutcome run() {
    descend(0);
    return SearchOutcome{!stopped_ && !found_, nodes_};
  }

 private:
  /// Whether to stop: a placement was found, or a limit is reached.
  bool out_of_budget() {
    if (stopped_ || found_) return true;
    ++nodes_;
    if (limits_.node_limit != 0 && nodes_ > limits_.node_limit) stopped_ = true;
    // Check the clock every 256 nodes: a node costs only O(log n) plus its candidates.
    if ((nodes_ & 255U) == 0 && std::chrono::steady_clock::now() >= limits_.deadline) {
      stopped_ = true;
    }
    return stopped_;
  }

  /// The smallest size among the buffers not yet placed.
  std::int64_t smallest_left() const {
    for (const std::uint32_t i : by_size_) {
      if (!placed_[i]) return static_cast<std::int64_t>(items_[i].size);
    }
    return kNone;
  }

  /// Raises every active section's floor to the lowest offset that any buffer left there can
  /// take (the highest floor over its lifetime), until nothing changes: space that no buffer
  /// left can use is wasted, and the section bound should see it.
  void propagate() {
    const auto sections = static_cast<std::uint32_t>(next_.size() - 1);
    for (bool changed = true; changed;) {
      changed = false;
      lowest_.clear();
      for (std::uint32_t i = 0; i < items_.size(); ++i) {
        if (!placed_[i])
          lowest_.emplace_back(skyline_.max_floor(items_[i].first, items_[i].last), i);
      }
      std::sort(lowest_.begin(), lowest_.end());
      // Paint each section with the lowest offset among its buffers: in increasing offset order,
      // skipping sections already painted (next_ links them to the next unpainted one).
      std::iota(next_.begin(), next_.end(), 0U);
      const auto find = [&](std::uint32_t t) {
        while (next_[t] != t) t = next_[t] = next_[next_[t]];
        return t;
      };
      for (const auto& [offset, i] : lowest_) {
        for (std::uint32_t t = find(items_[i].first); t < items_[i].last; t = find(t + 1)) {
          if (skyline_.max_floor(t, t + 1) < offset) {
            skyline_.place(t, t + 1, offset, 0);
            changed = true;
          }
          next_[t] = t + 1;
        }
      }
      (void)sections;
    }
  }

  void descend(std::size_t depth) {
    if (out_of_budget()) return;
    propagate();
    if (skyline_.section_bound() > capacity_) return;
    const auto [section, floor] = skyline_.lowest_active();
    if (floor == kNone) {
      found_ = true;
      on_solution_(offsets_, static_cast<std::uint64_t>(arena()));
      return;
    }
    if (candidates_.size() <= depth) candidates_.resize(depth + 1);
    std::vector<std::uint32_t>& tried = candidates_[depth];
    tried.clear();
    for (const std::uint32_t i : starting_[section]) {
      if (placed_[i]) continue;
      const Item& item = items_[i];
      if (skyline_.max_floor(item.first, item.last) != floor) continue;
      const bool same = std::any_of(tried.begin(), tried.end(), [&](std::uint32_t j) {
        return items_[j].last == item.last && items_[j].size == item.size;
      });
      if (same) continue;
      tried.push_back(i);
      const auto size = static_cast<std::int64_t>(item.size);
      const std::size_t mark = skyline_.mark();
      skyline_.place(item.first, item.last, floor + size, size);
      placed_[i] = true;
      offsets_[i] = static_cast<std::uint64_t>(floor);
      descend(depth + 1);
      placed_[i] = false;
      skyline_.undo_to(mark);
      if (out_of_budget()) return;
    }
    // Nothing at `floor` in `section`: raise it (see the file comment).
    const std::int64_t smallest = smallest_left();
    const std::int64_t raised =
        std::min(skyline_.lowest_active_above(floor), smallest == kNone ? kNone : floor + smallest);
    if (raised == kNone || raised > capacity_) return;
    const std::size_t mark = skyline_.mark();
    skyline_.place(section, section + 1, raised, 0);
    descend(depth + 1);
    skyline_.undo_to(mark);
  }

  std::int64_t arena() const {
    std::int64_t arena = 0;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      arena = std::max(arena, static_cast<std::int64_t>(offsets_[i] + items_[i].size));
    }
    return arena;
  }

  const std::vector<Item>& items_;
  Skyline skyline_;
  std::int64_t capacity_;
  SearchLimits limits_;
  const OnSolution& on_solution_;
  std::vector<std::uint64_t> offsets_;
  std::vector<bool> placed_;
  std::vector<std::vector<std::uint32_t>> starting_;  ///< per section, the items starting there
  std::vector<std::uint32_t> by_size_;                ///< all items, smallest first
  std::vector<std::uint32_t> next_;  ///< propagate: the next section not yet painted
  std::vector<std::pair<std::int64_t, std::uint32_t>> lowest_;  ///< propagate: (offset, item)
  /// Per depth, the buffers tried there (a deque: growing it keeps the lists above in place).
  std::deque<std::vector<std::uint32_t>> candidates_;
  std::uint64_t nodes_ = 0;
  bool stopped_ = false;
  bool found_ = false;
};

}  // namespace

SearchOutcome search(const Problem& problem, std::uint64_t capacity, const SearchLimits& limits,
                     const OnSolution& on_solution) {
  Search s(problem, capacity, limits, on_solution);
  return s.run();
}

}  // namespace cistern::plan::detail
