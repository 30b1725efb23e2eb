// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "region_table.hpp"

namespace cistern::detail {

namespace {

/// The first and last region numbers a segment overlaps.
std::uint64_t first_region(const Segment& s) noexcept {
  return s.base >> RegionTable::kRegionShift;
}
std::uint64_t last_region(const Segment& s) noexcept {
  return (s.base + s.size - 1) >> RegionTable::kRegionShift;
}

}  // namespace

// The nodes first (this may throw), then the counts: a failure leaves no region counted. Nodes
// are never freed before the table, so a segment added again (taken over by another pool) finds
// its nodes and cannot fail. Both walks go a leaf at a time (an engine range can cover a hundred
// thousand regions: one walk down the tree per leaf, not per region).
void RegionTable::add(const Segment& segment, StreamPool* pool) {
  CISTERN_ASSERT_INTERNAL(segment.size != 0 && pool != nullptr);
  const std::uint64_t first = first_region(segment);
  const std::uint64_t last = last_region(segment);
  for (std::uint64_t r = first; r <= last; r = (r | (kLeafSize - 1)) + 1) make(r);
  for_each_leaf_run(first, last, [&](Entry* run, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) add(run[i], pool);
  });
}

void RegionTable::remove(const Segment& segment, StreamPool* pool) noexcept {
  for_each_leaf_run(first_region(segment), last_region(segment), [&](Entry* run, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) remove(run[i], pool);
  });
}

// A pool already named counts one segment more; otherwise it takes a free name, or the region
// becomes crowded. A name is published only after its count is set, and a pool's name goes only
// when its count reaches zero, so a reader never misses a pool the writer knows to be there.
void RegionTable::add(Entry& e, StreamPool* pool) noexcept {
  for (int i = 0; i < 2; ++i) {
    if (e.pools[i].load(std::memory_order_relaxed) == pool) {
      ++e.segments[i];
      return;
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (e.segments[i] == 0) {
      e.segments[i] = 1;
      e.pools[i].store(pool, std::memory_order_release);
      return;
    }
  }
  ++e.others;
  e.crowded.store(true, std::memory_order_release);
}

void RegionTable::remove(Entry& e, StreamPool* pool) noexcept {
  for (int i = 0; i < 2; ++i) {
    if (e.pools[i].load(std::memory_order_relaxed) == pool) {
      if (--e.segments[i] == 0) e.pools[i].store(nullptr, std::memory_order_release);
      return;
    }
  }
  CISTERN_ASSERT_INTERNAL(e.others > 0);
  if (--e.others == 0) e.crowded.store(false, std::memory_order_release);
}

RegionTable::Entry& RegionTable::make(std::uint64_t region) {
  std::atomic<Middle*>& top = top_[top_index(region)];
  if (top.load(std::memory_order_relaxed) == nullptr) {
    middles_.push_back(std::make_unique<Middle>());
    top.store(middles_.back().get(), std::memory_order_release);
  }
  std::atomic<Lower*>& mid = top.load(std::memory_order_relaxed)->children[middle_index(region)];
  if (mid.load(std::memory_order_relaxed) == nullptr) {
    lowers_.push_back(std::make_unique<Lower>());
    mid.store(lowers_.back().get(), std::memory_order_release);
  }
  std::atomic<Leaf*>& low = mid.load(std::memory_order_relaxed)->children[lower_index(region)];
  if (low.load(std::memory_order_relaxed) == nullptr) {
    leaves_.push_back(std::make_unique<Leaf>());
    leaves_.back()->first_region = region & ~std::uint64_t{kLeafSize - 1};
    low.store(leaves_.back().get(), std::memory_order_release);
  }
  return low.load(std::memory_order_relaxed)->entries[leaf_index(region)];
}

}  // namespace cistern::detail
