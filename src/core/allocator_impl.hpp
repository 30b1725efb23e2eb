// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The implementation of CachingAllocator, shared by caching_allocator.cpp (the request paths),
// reclaim.cpp (taking over, releasing and collecting cached memory) and inspect.cpp (statistics,
// snapshots and the invariant checker).
//
// Locking. Each StreamPool has its own mutex; the cache-hit paths take only that one. `mutex_`
// (the global lock) is taken first by everything that calls the device for segments, touches
// more than one pool, or creates a pool; a thread holding several pool locks always holds the
// global lock, so pool locks never deadlock. Order: global, then pools (any order), then the
// event pool's mutex and the device's own lock, which are leaves.
// Finding a pointer: each pool maps its own allocated blocks, and the region table (written
// under the global lock, read without one) names the pools whose segments lie in the pointer's
// 2 MiB region. A free on the allocating stream looks in that stream's pool alone (one lock); a
// free on another stream, record_stream, allocation_size and base_allocation read the region
// table and lock the owner pool, one pool lock at a time, never the global lock unless the
// pointer is invalid (or its region is crowded by the segments of more than two pools).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "handle_table.hpp"
#include "history_log.hpp"
#include "pool_stats.hpp"
#include "region_table.hpp"
#include "size_policy.hpp"
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

class CachingAllocator::Impl {
 public:
  Impl(Device& device, Config config);
  ~Impl();

  void* allocate(std::size_t bytes, Stream stream);
  void deallocate(void* ptr, Stream stream);
  void record_stream(void* ptr, Stream stream);
  void empty_cache();
  Stats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  Snapshot snapshot() const;
  void check() const;
  std::size_t allocation_size(void* ptr) const;
  std::optional<std::size_t> requested_size(void* ptr) const noexcept;
  std::pair<void*, std::size_t> base_allocation(void* ptr) const;
  void set_memory_fraction(double fraction);
  void record_history(bool enabled, std::size_t max_entries);
  std::vector<HistoryEntry> history() const;

  std::size_t reserved_bytes() const noexcept { return reserved_.load(std::memory_order_relaxed); }
  std::size_t allocated_bytes() const noexcept;
  const Config& config() const noexcept { return config_; }
  Device& device() const noexcept { return device_; }
  /// Whether the virtual-memory engine is on.
  bool uses_vmm() const noexcept { return vmm_.load(std::memory_order_relaxed); }
  std::string virtual_memory_note() const {
    std::lock_guard<std::mutex> global(mutex_);
    return vmm_note_;
  }

 private:
  // Appends to the history when it is being recorded (one relaxed load otherwise).
  void record(HistoryEntry::Action action, std::uintptr_t addr, std::size_t size, Stream stream,
              bool reclaim = false) {
    if (detail::HistoryLog* log = history_.load(std::memory_order_relaxed)) {
      log->add(action, addr, size, stream, reclaim);
    }
  }

  detail::StreamPool& pool_for(Stream stream) {
    if (detail::StreamPool* pool = pools_.find(stream)) return *pool;
    return create_pool(stream);
  }
  detail::StreamPool& create_pool(Stream stream);

  // Request paths (caching_allocator.cpp).
  void* allocate_block(std::size_t bytes, Stream stream);
  void* allocate_slow(detail::StreamPool& pool, std::size_t size, std::size_t bytes, bool small);
  void deallocate_slow(std::uintptr_t addr, Stream stream);
  /// The allocated block at `addr` with its owner pool's lock taken (the caller unlocks), or
  /// {nullptr, nullptr} if none of the pools to try has it: those the region table names, and,
  /// with `exact` (global lock held), every pool when the region is crowded. `take` removes the
  /// block from its pool's map (the first step of a free). Without `exact` no global lock is
  /// needed, and a miss is final only under it: the pointer may lie in a crowded region.
  std::pair<detail::StreamPool*, detail::Block*> lock_owner(std::uintptr_t addr, bool take,
                                                            bool exact) const noexcept;
  /// lock_owner without the global lock, then, on a miss, with it (taken for that look only):
  /// the owner pool, locked, and the block; {nullptr, nullptr} when `addr` is not allocated.
  std::pair<detail::StreamPool*, detail::Block*> lock_found(std::uintptr_t addr) const noexcept;
  /// lock_found; an invalid pointer throws InvalidPointer naming `what`.
  std::pair<detail::StreamPool*, detail::Block*> lock_allocated(std::uintptr_t addr,
                                                                const char* what) const;
  void free_block(detail::StreamPool& pool, detail::Block* b, Stream stream);
  void free_with_events(detail::StreamPool& pool, detail::Block* b, Stream stream);
  bool free_with_uses(detail::StreamPool& pool, detail::Block* b, Stream stream);
  bool free_after_one_stream(detail::StreamPool& pool, detail::Block* b, Stream stream);
  [[noreturn]] void throw_invalid_pointer(std::uintptr_t addr, const char* what) const;
  [[noreturn]] void throw_out_of_memory(detail::StreamPool& pool, std::size_t bytes,
                                        std::size_t size, std::size_t segment, bool small);
  [[noreturn]] void throw_impossible_size(std::size_t bytes);

  // How pools get memory from the device and give it back: classic segments or mapped handles.
  // The miss path (allocate_slow), the release of the cache, garbage collection, the oversize
  // release and take-over are written once over this interface, in PyTorch's order; only what
  // differs between the two kinds of memory is behind it. Global lock held for every call, and
  // the lock of the pool passed.
  class Backing {
   public:
    explicit Backing(Impl& a) : a_(a) {}
    virtual ~Backing() = default;
    Backing(const Backing&) = delete;
    Backing& operator=(const Backing&) = delete;
    /// The cached block of `pool` that serves `size` without a device call, or nullptr.
    virtual detail::Block* cached_fit(detail::StreamPool& pool, std::size_t size, bool small) = 0;
    /// A free block that serves `size` on new device memory - a new segment, or (the engine) new
    /// handles mapped under the best fit - or nullptr when the device or the limit has no room.
    /// Takes nothing from cached blocks.
    virtual detail::Block* grow(detail::StreamPool& pool, std::size_t size, bool small) = 0;
    /// grow, after giving back memory that cached free blocks hold inside segments that stay
    /// (the engine: whole handles under free blocks of any pool, once their streams' work has
    /// completed); nullptr when even that leaves no room. Classic segments hold nothing such.
    virtual detail::Block* reclaim_and_grow(detail::StreamPool& pool, std::size_t size,
                                            bool small) = 0;
    /// Returns the whole free segment of `b` to the device; false (kept cached, the reason in
    /// last_release_error_) on failure.
    virtual bool release_segment(detail::StreamPool& pool, detail::Block* b) = 0;
    /// After release_cache returned the whole free segments: gives back what cached free blocks
    /// of the remaining segments hold (the engine's handles under them). All pool locks held.
    /// `asked`: the program asked (empty_cache), rather than the allocator's out-of-memory path.
    /// Returns how many releases failed.
    virtual std::size_t release_rest(bool asked) = 0;
    /// The engine with a release threshold: gives unused memory above it back (global lock held,
    /// no pool lock).
    virtual void trim() {}
    /// Garbage collection, after the whole free segments: gives back up to `bytes` more of what
    /// cached free blocks hold (the engine's handles under them). All pool locks held. Returns
    /// the bytes given back.
    virtual std::size_t collect(std::size_t /*bytes*/) { return 0; }
    /// Checks the backing's own structures against the segments (inside check()).
    virtual void check(const std::vector<const detail::Segment*>& segments) const = 0;

   protected:
    Impl& a_;
  };
  class Segments;       // classic segments (segments.cpp)
  class MappedHandles;  // the virtual-memory engine (vmm.cpp)
  std::unique_ptr<Backing> make_segments();
  std::unique_ptr<Backing> make_mapped_handles();

  // Device memory and reclamation common to both backings (reclaim.cpp); global lock held.
  bool take_over_segment(detail::StreamPool& pool, std::size_t size, bool small);
  bool release_oversize(detail::StreamPool& pool, std::size_t size);
  std::size_t release_cache(const detail::StreamPool* held, bool asked = false);
  void collect_garbage(const detail::StreamPool* held);
  bool exceeds_limit(std::size_t more) const noexcept {
    return allowed_ != SIZE_MAX && reserved_bytes() + more > allowed_;
  }
  void update_allowed();
  /// Blocks until the work submitted to `stream` so far has completed (an event queried first).
  void wait_for_stream(Stream stream);
  /// Chooses the backing at construction: the engine where wanted and the device offers virtual
  /// memory, else classic segments (vmm_note_ says why).
  void choose_backing();
  /// The engine refused by the device at its first growth: classic segments from now on, once.
  void fall_back_to_segments(const std::string& why, const detail::StreamPool* held);
  /// backing_->grow, falling back to classic segments when the engine reports a refusal.
  detail::Block* grow(detail::StreamPool& pool, std::size_t size, bool small);

  // Inspection helpers (inspect.cpp).
  void check_pool(const detail::StreamPool& pool, Stats& totals) const;
  void check_regions() const;

  Device& device_;
  Config config_;
  detail::SizePolicy policy_;
  detail::EventPool events_;
  mutable std::mutex mutex_;     // the global lock
  detail::RegionTable regions_;  // region -> owner pools (before pools_: outlives them)
  PoolTable pools_;
  mutable detail::SharedStats shared_stats_;           // written by publication, also from reads
  std::atomic<detail::SharedStats*> shared_{nullptr};  // set once a second pool exists
  std::atomic<std::size_t> reserved_{0};
  std::atomic<detail::HistoryLog*> history_{nullptr};              // non-null while recording
  std::vector<std::unique_ptr<detail::HistoryLog>> history_logs_;  // kept: readers may hold one
  std::size_t device_total_ = 0;
  std::size_t allowed_ = SIZE_MAX;  // reserved-memory limit from fraction and hard limit

  // Counters, under the global lock.
  std::int64_t num_alloc_retries_ = 0;
  std::int64_t num_ooms_ = 0;
  std::int64_t num_sync_all_streams_ = 0;
  std::int64_t num_device_alloc_ = 0;
  std::int64_t num_device_free_ = 0;
  std::int64_t num_cross_stream_reuse_ = 0;
  std::int64_t num_pages_mapped_ = 0;
  std::int64_t num_pages_unmapped_ = 0;
  std::int64_t num_pages_reclaimed_ = 0;
  std::int64_t num_handles_created_ = 0;
  std::int64_t num_handles_released_ = 0;
  std::int64_t num_reclaim_syncs_ = 0;
  std::int64_t num_handle_splits_ = 0;

  // The backing: classic segments or the virtual-memory engine.
  std::unique_ptr<Backing> backing_;
  std::unique_ptr<Backing> retired_backing_;  // the engine after a fallback (never used again)
  std::string refusal_;  // set by the engine when the device refused it at its first growth
  std::atomic<bool> vmm_{false};    // the engine is on (fixed at its first growth at the latest)
  std::atomic<bool> trims_{false};  // the engine with a release threshold
  // The engine near the limit: blocks on handles of several granules then take the slow path,
  // where such a handle, free but for the request, is given back and the request gets handles of
  // one granule (MappedHandles::cached_fit). Read without a lock on the hot path.
  std::atomic<bool> tight_{false};
  std::string vmm_note_;            // why the engine is off where it was wanted ("" if not)
  std::string last_release_error_;  // why the most recent segment release failed
};

}  // namespace cistern
