// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Greedy by size (see problem.hpp). Finding the placed items that overlap an item in time is the
// cost that matters on large instances: placed items are filed in buckets of consecutive time
// sections, so a query reads only the buckets its lifetime spans instead of every placed item.
#include <algorithm>
#include <limits>
#include <numeric>

#include "plan/problem.hpp"

namespace cistern::plan::detail {
namespace {

/// The placed items, filed by the buckets of sections they span.
class TimeIndex {
 public:
  explicit TimeIndex(const Problem& problem) : items_(problem.items) {
    // Buckets of `width_` sections: wide enough that long-lived items are filed a bounded number
    // of times (at most about 64 entries per item on average), narrow enough that a bucket holds
    // little more than the items live at one instant.
    std::uint64_t span = 0;
    for (const Item& item : items_) span += item.last - item.first;
    width_ = 16;
    while (span / width_ > 64 * (items_.size() + 1)) width_ *= 2;
    buckets_.resize(problem.sections / width_ + 1);
    stamp_.assign(items_.size(), 0);
  }

  void add(std::uint32_t i) {
    for (std::uint32_t b = first_bucket(i); b <= last_bucket(i); ++b) buckets_[b].push_back(i);
  }

  /// The placed items overlapping item i in time, each once (unordered).
  const std::vector<std::uint32_t>& overlapping(std::uint32_t i) {
    ++query_;
    found_.clear();
    const Item& item = items_[i];
    for (std::uint32_t b = first_bucket(i); b <= last_bucket(i); ++b) {
      for (const std::uint32_t j : buckets_[b]) {
        if (stamp_[j] == query_) continue;
        stamp_[j] = query_;
        const Item& other = items_[j];
        if (other.first < item.last && item.first < other.last) found_.push_back(j);
      }
    }
    return found_;
  }

 private:
  std::uint32_t first_bucket(std::uint32_t i) const { return items_[i].first / width_; }
  std::uint32_t last_bucket(std::uint32_t i) const { return (items_[i].last - 1) / width_; }

  const std::vector<Item>& items_;
  std::uint32_t width_ = 16;
  std::vector<std::vector<std::uint32_t>> buckets_;
  std::vector<std::uint64_t> stamp_;
  std::uint64_t query_ = 0;
  std::vector<std::uint32_t> found_;
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
    for (const std::uint32_t j : index.overlapping(i)) {
      below.emplace_back(offsets[j], offsets[j] + items[j].size);
    }
    std::sort(below.begin(), below.end());
    offsets[i] = best_gap(below, items[i].size);
    index.add(i);
  }
  return offsets;
}

}  // namespace cistern::plan::detail
