// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// BlockMap: the allocator-wide map from the address of every allocated block to its Block.
//
// One map for all streams' pools, as PyTorch keeps one, so that a free, `record_stream`,
// `allocation_size` or a base-allocation lookup finds any pointer in O(1) without the global
// lock, whichever stream allocated it (the block's segment names its owner pool). The map is
// split into shards by 2 MiB address region, each a PtrMap under its own spin lock, so that threads
// working on different streams seldom meet on a lock; a shard lock is a leaf (taken after a pool
// lock by hand-outs, alone by lookups) and is held only for one map operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "debug_assert.hpp"
#include "hot.hpp"
#include "ptr_map.hpp"
#include "spin_lock.hpp"

namespace cistern::detail {

class BlockMap {
 public:
  /// Adds `addr -> block`; the address must not be present.
  CISTERN_HOT void insert(std::uintptr_t addr, Block* block) {
    Shard& s = shard(addr);
    std::lock_guard<SpinLock> lock(s.mutex);
    CISTERN_ASSERT_INTERNAL(addr == block->addr && s.map.find(addr) == nullptr);
    s.map.insert(addr, block);
  }
  /// Removes `addr` and returns its block, or nullptr if it is not allocated.
  Block* extract(std::uintptr_t addr) noexcept {
    Shard& s = shard(addr);
    std::lock_guard<SpinLock> lock(s.mutex);
    return s.map.extract(addr);
  }
  /// Removes `addr` if its block belongs to a segment of `owner`, and returns the block; nullptr
  /// (and nothing removed) otherwise.
  CISTERN_HOT Block* extract_owned(std::uintptr_t addr, const StreamPool* owner) noexcept {
    Shard& s = shard(addr);
    std::lock_guard<SpinLock> lock(s.mutex);
    return s.map.extract_if(addr, [owner](const Block* b) { return b->segment->owner == owner; });
  }
  /// The block at `addr`, or nullptr. The block stays valid only while nothing frees it.
  Block* find(std::uintptr_t addr) const noexcept {
    Shard& s = shard(addr);
    std::lock_guard<SpinLock> lock(s.mutex);
    return s.map.find(addr);
  }
  /// Calls f(block) on the block at `addr` under its shard's lock, so that a concurrent free
  /// cannot end the allocation meanwhile; returns false if `addr` is not allocated.
  template <class F>
  bool with(std::uintptr_t addr, F&& f) const {
    Shard& s = shard(addr);
    std::lock_guard<SpinLock> lock(s.mutex);
    Block* b = s.map.find(addr);
    if (b == nullptr) return false;
    f(*b);
    return true;
  }
  /// Entries in all shards (each shard read under its lock; exact when nothing runs).
  std::size_t size() const noexcept {
    std::size_t n = 0;
    for (Shard& s : shards_) {
      std::lock_guard<SpinLock> lock(s.mutex);
      n += s.map.size();
    }
    return n;
  }

 private:
  // 1024 shards: with 64, two threads' working sets of a few dozen regions each covered every
  // shard, and on the mixed workloads the shard lines bounced between the cores on most
  // operations (mix_all, 2 threads: 2.3x one thread's time per pair; with 1024, 1.07x).
  static constexpr unsigned kShardBits = 10;
  static constexpr std::size_t kShards = std::size_t{1} << kShardBits;
  // Own cache line per shard: threads on different shards never write the same line.
  struct alignas(64) Shard {
    SpinLock mutex;
    PtrMap map{16};  // a small start: an allocator's empty map is about 320 KiB
  };
  Shard& shard(std::uintptr_t addr) const noexcept {
    // By 2 MiB region, not by block: the blocks of one region - of one pool's segment - share a
    // shard, so a thread that works in its own pool's segments touches few shards, and threads on
    // different streams seldom write the same shard's cache lines (by block, every thread's
    // blocks spread over all shards and the lines bounced between cores on every operation).
    return shards_[((addr >> kRegionShift) * 0x9E3779B97F4A7C15ull >> (64 - kShardBits))];
  }
  static constexpr unsigned kRegionShift = 21;

  mutable Shard shards_[kShards];
};

}  // namespace cistern::detail
