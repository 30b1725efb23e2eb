// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// RegionTable: the allocator-wide map from 2 MiB address region to the stream pools whose
// segments lie in it - the first half of finding any pointer.
//
// A free, `record_stream`, `allocation_size` or base-allocation lookup of a pointer reads the
// pointer's region here without any lock, locks the owner pool and looks in that pool's own map
// of its allocated blocks (StreamPool::find_allocated): O(1), and no lock but the owner's. The
// pool maps are the authority; this table only says where to look, so a reader that sees an entry
// a moment old (a segment taken over by another stream meanwhile) merely looks in the wrong pool,
// finds nothing and falls back to the global lock, under which the table is exact. That cannot
// happen for an allocated block: only whole free segments change pools.
//
// Writes happen when a segment is linked to or unlinked from a pool (created, released, taken
// over), always under the allocator's global lock. Pools live as long as the allocator, so an
// owner read here is never dangling.
//
// A region normally lies in one segment, or in segments of one pool. It can overlap several
// pools' segments when segments are smaller than a region or not aligned to one (a small
// `small_segment_size`, or a device that packs small allocations); each entry names two owners,
// and a region with more is marked crowded: its lookups scan every pool under the global lock.
//
// Layout: a radix tree over the 43-bit region number (three inner levels of 11 bits, leaves of
// 1,024 regions, 2 GiB of address space each), nodes made on first use and kept until the table
// dies, so that readers need no reclamation scheme.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "block.hpp"
#include "debug_assert.hpp"

namespace cistern::detail {

class StreamPool;

/// The pools a lookup must try for one address.
struct RegionOwners {
  StreamPool* pools[2] = {nullptr, nullptr};  ///< owners named in the entry (nullptr: none)
  bool crowded = false;  ///< more pools have segments here: scan them all (global lock)
};

class RegionTable {
 public:
  /// log2 of the region size (2 MiB: the driver's granularity, so a segment seldom shares one).
  static constexpr unsigned kRegionShift = 21;

  /// One region's owners. `pools` and `crowded` are read without a lock; the counts are the
  /// writers' (global lock) bookkeeping.
  struct Entry {
    std::atomic<StreamPool*> pools[2] = {};
    std::atomic<bool> crowded{false};
    std::uint32_t segments[2] = {0, 0};  ///< segments of pools[i] overlapping the region
    std::uint32_t others = 0;            ///< segments here of pools not named in `pools`
  };

  RegionTable() = default;
  RegionTable(const RegionTable&) = delete;
  RegionTable& operator=(const RegionTable&) = delete;

  /// The owners of the region of `addr` (no lock; see the file comment for what a reader may see).
  RegionOwners owners(std::uintptr_t addr) const noexcept {
    RegionOwners found;
    const Entry* e = find(addr >> kRegionShift);
    if (e == nullptr) return found;
    found.pools[0] = e->pools[0].load(std::memory_order_acquire);
    found.pools[1] = e->pools[1].load(std::memory_order_acquire);
    found.crowded = e->crowded.load(std::memory_order_acquire);
    return found;
  }

  /// Records `segment` as `pool`'s in every region it overlaps (global lock held).
  void add(const Segment& segment, StreamPool* pool);
  /// Forgets `segment` as `pool`'s (global lock held): the reverse of `add`.
  void remove(const Segment& segment, StreamPool* pool) noexcept;

  /// Calls f(region_number, entry) for every region any segment overlaps, in ascending order of
  /// region (global lock held).
  template <class F>
  void for_each(F&& f) const {
    std::vector<const Leaf*> ordered;
    ordered.reserve(leaves_.size());
    for (const auto& leaf : leaves_) ordered.push_back(leaf.get());
    std::sort(ordered.begin(), ordered.end(),
              [](const Leaf* a, const Leaf* b) { return a->first_region < b->first_region; });
    for (const Leaf* leaf : ordered) {
      for (std::size_t i = 0; i < kLeafSize; ++i) {
        const Entry& e = leaf->entries[i];
        if (e.segments[0] + e.segments[1] + e.others != 0) f(leaf->first_region + i, e);
      }
    }
  }

 private:
  static constexpr unsigned kLeafBits = 10;
  static constexpr unsigned kInnerBits = 11;
  static constexpr std::size_t kLeafSize = std::size_t{1} << kLeafBits;
  static constexpr std::size_t kInnerSize = std::size_t{1} << kInnerBits;
  static_assert(64 - kRegionShift == kLeafBits + 3 * kInnerBits, "the levels cover every region");

  struct Leaf {
    std::uint64_t first_region = 0;
    Entry entries[kLeafSize];
  };
  struct Lower {  // the level above the leaves
    std::atomic<Leaf*> children[kInnerSize] = {};
  };
  struct Middle {
    std::atomic<Lower*> children[kInnerSize] = {};
  };

  static std::size_t top_index(std::uint64_t region) noexcept {
    return static_cast<std::size_t>(region >> (kLeafBits + 2 * kInnerBits));
  }
  static std::size_t middle_index(std::uint64_t region) noexcept {
    return static_cast<std::size_t>(region >> (kLeafBits + kInnerBits)) & (kInnerSize - 1);
  }
  static std::size_t lower_index(std::uint64_t region) noexcept {
    return static_cast<std::size_t>(region >> kLeafBits) & (kInnerSize - 1);
  }
  static std::size_t leaf_index(std::uint64_t region) noexcept {
    return static_cast<std::size_t>(region) & (kLeafSize - 1);
  }

  const Entry* find(std::uint64_t region) const noexcept {
    const Middle* middle = top_[top_index(region)].load(std::memory_order_acquire);
    if (middle == nullptr) return nullptr;
    const Lower* lower = middle->children[middle_index(region)].load(std::memory_order_acquire);
    if (lower == nullptr) return nullptr;
    const Leaf* leaf = lower->children[lower_index(region)].load(std::memory_order_acquire);
    return leaf == nullptr ? nullptr : &leaf->entries[leaf_index(region)];
  }
  Entry& make(std::uint64_t region);  // the entry of `region`, its nodes created (global lock)
  /// Calls f(entries, n) for each leaf's run of the regions [first, last], whose nodes exist.
  template <class F>
  void for_each_leaf_run(std::uint64_t first, std::uint64_t last, F&& f) noexcept {
    for (std::uint64_t r = first; r <= last;) {
      const std::uint64_t leaf_last = std::min<std::uint64_t>(last, r | (kLeafSize - 1));
      const Entry* e = find(r);
      CISTERN_ASSERT_INTERNAL(e != nullptr);  // added with the segment: the entry exists
      f(const_cast<Entry*>(e), static_cast<std::size_t>(leaf_last - r + 1));
      r = leaf_last + 1;
    }
  }
  void add(Entry& e, StreamPool* pool) noexcept;
  void remove(Entry& e, StreamPool* pool) noexcept;

  std::atomic<Middle*> top_[kInnerSize] = {};
  // Every node made, owned here and freed with the table (writers only).
  std::vector<std::unique_ptr<Middle>> middles_;
  std::vector<std::unique_ptr<Lower>> lowers_;
  std::vector<std::unique_ptr<Leaf>> leaves_;
};

}  // namespace cistern::detail
