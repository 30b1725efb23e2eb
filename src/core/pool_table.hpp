// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The allocator's pools, one per stream: a lock-free lookup for the request paths, and the lock
// of all of them for what touches more than one (reclaim, release, statistics).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "stream_pool.hpp"

namespace cistern {

/// Lock-free lookup of the pool of a stream; pools are only ever added (under the global lock).
class PoolTable {
 public:
  /// The pool of `stream`, or nullptr if none exists yet.
  detail::StreamPool* find(Stream stream) const noexcept {
    // Most processes allocate on one stream: its pool is found without hashing. The stream is
    // compared with a copy kept here, not with first->stream, which shares a cache line with that
    // pool's lock: threads on other streams would otherwise pull the line from its owner.
    detail::StreamPool* first = first_.load(std::memory_order_acquire);
    if (first != nullptr && first_stream_ == stream.handle) return first;
    std::size_t i = slot_of(stream);
    for (std::size_t probes = 0; probes < kSlots; ++probes, i = (i + 1) & (kSlots - 1)) {
      detail::StreamPool* pool = slots_[i].load(std::memory_order_acquire);
      if (pool == nullptr) return nullptr;
      if (pool->stream == stream) return pool;
    }
    return find_overflow(stream);
  }
  /// Adds a pool (global lock held).
  void add(std::unique_ptr<detail::StreamPool> pool);
  /// Every pool, in creation order (global lock held).
  const std::vector<std::unique_ptr<detail::StreamPool>>& all() const noexcept { return all_; }

 private:
  static constexpr std::size_t kSlots = 256;
  static std::size_t slot_of(Stream s) noexcept {
    return static_cast<std::size_t>((s.handle * 0x9E3779B97F4A7C15ull) >> 56) & (kSlots - 1);
  }
  detail::StreamPool* find_overflow(Stream stream) const;

  std::atomic<detail::StreamPool*> first_{nullptr};  // the pool created first
  std::uintptr_t first_stream_ = 0;  // its stream's handle, written before first_ is published
  std::atomic<detail::StreamPool*> slots_[kSlots] = {};
  std::vector<std::unique_ptr<detail::StreamPool>> all_;
  mutable std::shared_mutex overflow_mutex_;
  std::unordered_map<std::uintptr_t, detail::StreamPool*> overflow_;
};

/// Holds the locks of every pool except one already held (global lock held).
class AllPoolsLock {
 public:
  AllPoolsLock(const PoolTable& pools, const detail::StreamPool* held);
  ~AllPoolsLock();
  AllPoolsLock(const AllPoolsLock&) = delete;
  AllPoolsLock& operator=(const AllPoolsLock&) = delete;

 private:
  std::vector<detail::SpinLock*> locked_;
};

}  // namespace cistern
