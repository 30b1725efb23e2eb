// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Greedy by size (see problem.hpp). Finding the placed items that overlap an item in time, in
// offset order, is the cost that matters on large instances: placed items are filed in buckets of
// consecutive time sections (see TimeIndex), so a query reads only the buckets its lifetime spans,
// and each bucket is kept in offset order, so a query merges sorted runs instead of sorting.
//
// On the million-buffer instance of bench_plan the cost is memory latency, a cache miss per
// bucket read (perf: most samples on the first load of a bucket's entries), then the sort of the
// overlapping items: wide buckets (256 sections, each level 16 times wider) read a few more
// entries but far fewer buckets, and merging runs replaces the sort.
#include <algorithm>
#include <iterator>
#include <limits>
#include <numeric>

#include "plan/problem.hpp"

namespace cistern::plan::detail {
namespace {

/// A placed item's [offset, end) in the arena.
using Range = std::pair<std::uint64_t, std::uint64_t>;

/// The placed items, filed by time. Levels of buckets: level k cuts the sections into buckets
/// of 256 * 16^k, and an item goes to the lowest level whose buckets are at least as wide as its
/// lifetime, so it is filed in at most two buckets, and a query reads, per level, only the few
/// buckets its lifetime spans. Each entry carries what a query needs (lifetime and placement), so
/// a query reads its buckets front to back and never jumps into the item arrays. A bucket keeps
/// its entries in offset order.
class TimeIndex {
 public:
  explicit TimeIndex(const Problem& problem) {
    unsigned shift = kNarrowestShift;
    do {
      levels_.push_back(
          Level{shift, std::vector<std::vector<Entry>>((problem.sections >> shift) + 1)});
      shift += kLevelShift;
    } while ((std::uint64_t{1} << (shift - kLevelShift)) < problem.sections);
  }

  /// Files `item`, placed at `offset`.
  void add(const Item& item, std::uint64_t offset) {
    const Entry entry{item.first, item.last, offset, offset + item.size};
    Level& level = levels_[level_of(item)];
    for (std::uint32_t b = item.first >> level.shift; b <= (item.last - 1) >> level.shift; ++b) {
      std::vector<Entry>& bucket = level.buckets[b];
      const auto at =
          std::upper_bound(bucket.begin(), bucket.end(), offset,
                           [](std::uint64_t value, const Entry& e) { return value < e.offset; });
      bucket.insert(at, entry);
    }
  }

  /// Sets `out` to (offset, end) of every placed item overlapping `item` in time, each once, in
  /// offset order.
  void overlapping(const Item& item, std::vector<Range>& out) {
    out.clear();
    runs_.clear();
    for (const Level& level : levels_) {
      const std::uint32_t first = item.first >> level.shift;
      for (std::uint32_t b = first; b <= (item.last - 1) >> level.shift; ++b) {
        const std::size_t start = out.size();
        for (const Entry& e : level.buckets[b]) {
          // An entry filed in two of these buckets is taken from the first of them only.
          if (b != std::max(first, e.first >> level.shift)) continue;
          if (e.first < item.last && item.first < e.last) out.emplace_back(e.offset, e.end);
        }
        if (out.size() > start) runs_.push_back(start);
      }
    }
    merge_runs(out);
  }

 private:
  static constexpr unsigned kNarrowestShift = 8;  // buckets of 256 sections
  static constexpr unsigned kLevelShift = 4;      // each level's buckets 16 times wider

  /// Merges the sorted runs of `out` (starting at runs_) pairwise until one is left.
  void merge_runs(std::vector<Range>& out) {
    const auto by_offset = [](const Range& a, const Range& b) { return a.first < b.first; };
    while (runs_.size() > 1) {
      scratch_.clear();
      merged_runs_.clear();
      for (std::size_t r = 0; r < runs_.size(); r += 2) {
        const std::size_t end1 = r + 1 < runs_.size() ? runs_[r + 1] : out.size();
        const std::size_t end2 = r + 2 < runs_.size() ? runs_[r + 2] : out.size();
        merged_runs_.push_back(scratch_.size());
        std::merge(out.begin() + static_cast<std::ptrdiff_t>(runs_[r]),
                   out.begin() + static_cast<std::ptrdiff_t>(end1),
                   out.begin() + static_cast<std::ptrdiff_t>(end1),
                   out.begin() + static_cast<std::ptrdiff_t>(end2), std::back_inserter(scratch_),
                   by_offset);
      }
      out.swap(scratch_);
      runs_.swap(merged_runs_);
    }
  }

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
  std::vector<std::size_t> runs_;         ///< overlapping: where each sorted run starts
  std::vector<std::size_t> merged_runs_;  ///< merge_runs: the runs of the next round
  std::vector<Range> scratch_;            ///< merge_runs: the next round's ranges
};

/// The offset for an item of `size` among `below` (pairs offset, end sorted by offset): the
/// lowest-placed smallest gap that fits, else the top of them all.
std::uint64_t best_gap(const std::vector<Range>& below, std::uint64_t size) {
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
  std::vector<Range> below;
  for (const std::uint32_t i : order) {
    // Ties in offset may come in any order: best_gap takes the highest end among them.
    index.overlapping(items[i], below);
    offsets[i] = best_gap(below, items[i].size);
    index.add(items[i], offsets[i]);
  }
  return offsets;
}

}  // namespace cistern::plan::detail
