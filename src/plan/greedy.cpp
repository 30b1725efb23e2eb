// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Greedy by size (see problem.hpp). Finding the placed items that overlap an item in time is the
// cost that matters on large instances: placed items are filed in buckets of consecutive time
// sections (see TimeIndex), so a query reads only the buckets its lifetime spans.
#include <algorithm>
#include <limits>
#include <numeric>

#include "plan/problem.hpp"

namespace cistern::plan::detail {
namespace {

/// The placed items, filed by time. Levels of buckets: level k cuts the sections into buckets
/// of 16 * 4^k, and an item goes to the lowest level whose buckets are at least as wide as its
/// lifetime, so it is filed in at most two buckets, and a query reads, per level, only the few
/// buckets its lifetime spans. Each entry carries what a query needs (lifetime and placement), so
/// a query reads its buckets front to back and never jumps into the item arrays.
class TimeIndex {
 public:
  explicit TimeIndex(const Problem& problem) {
    unsigned shift = kNarrowestShift;
    do {
      levels_.push_back(
          Level{shift, std::vector<std::vector<Entry>>((problem.sections >> shift) + 1)});
      shift += 2;
    } while ((std::uint64_t{1} << (shift - 2)) < problem.sections);
  }

  /// Files `item`, placed at `offset`.
  void add(const Item& item, std::uint64_t offset) {
    const Entry entry{item.first, item.last, offset, offset + item.size};
    Level& level = levels_[level_of(item)];
    for (std::uint32_t b = item.first >> level.shift; b <= (item.last - 1) >> level.shift; ++b) {
      level.buckets[b].push_back(entry);
    }
  }

  /// Appends (offset, end) of every placed item overlapping `item` in time to `out`, each once.
  void overlapping(const Item& item, std::vector<std::pair<std::uint64_t, std::uint64_t>>& out) {
    for (const Level& level : levels_) {
      const std::uint32_t first = item.first >> level.shift;
      for (std::uint32_t b = first; b <= (item.last - 1) >> level.shift; ++b) {
        for (const Entry& e : level.buckets[b]) {
          // An entry filed in two of these buckets is taken from the first of them only.
          if (b != std::max(first, e.first >> level.shift)) continue;
          if (e.first < item.last && item.first < e.last) out.emplace_back(e.offset, e.end);
        }
      }
    }
  }

 private:
  static constexpr unsigned kNarrowestShift = 4;  // buckets of 16 sections

  struct Entry {
    std::uint32_t first;
    std::uint32_t last;
    std::uint64_t offset;
    std::uint64_t end;
  };
  struct Level {
    unsigned shift;  ///< buckets of 2^shift sections
    std::vector<std::vector<Entry>> buckets;
  };

  std::size_t level_of(const Item& item) const {
    std::size_t k = 0;
    while (k + 1 < levels_.size() &&
           (std::uint64_t{1} << levels_[k].shift) < item.last - item.first) {
      ++k;
    }
    return k;
  }

  std::vector<Level> levels_;
};

/// The offset for an item of `size` among `below` (pairs offset, end sorted by offset): the
/// lowest-placed smallest gap that fits, else the top of them all.
std::uint64_t best_gap(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& below,
                       std::uint64_t size) {
  std::uint64_t top = 0;
  std::uint64_t best = 0;
  std::uint64_t best_gap = std::numeric_limits<std::uint64_t>::max();
  for (const auto& [offset, end] : below) {
    if (offset > top && offset - top >= size && offset - top < best_gap) {
      best_gap = offset - top;
      best = top;
    }
    top = std::max(top, end);
  }
  return best_gap == std::numeric_limits<std::uint64_t>::max() ? top : best;
}

}  // namespace

std::vector<std::uint64_t> greedy_by_size(const Problem& problem) {
  const std::vector<Item>& items = problem.items;
  std::vector<std::uint32_t> order(items.size());
  std::iota(order.begin(), order.end(), 0U);
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    const Item& x = items[a];
    const Item& y = items[b];
    if (x.size != y.size) return x.size > y.size;
    if (x.last - x.first != y.last - y.first) return x.last - x.first > y.last - y.first;
    if (x.first != y.first) return x.first < y.first;
    return a < b;
  });
  std::vector<std::uint64_t> offsets(items.size(), 0);
  TimeIndex index(problem);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> below;
  for (const std::uint32_t i : order) {
    below.clear();
    index.overlapping(items[i], below);
    // Ties in offset may come in any order: best_gap takes the highest end among them.
    std::sort(below.begin(), below.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    offsets[i] = best_gap(below, items[i].size);
    index.add(items[i], offsets[i]);
  }
  return offsets;
}

}  // namespace cistern::plan::detail
