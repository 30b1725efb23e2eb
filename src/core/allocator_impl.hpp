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

#include "backing.hpp"
#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "history_log.hpp"
#include "pool_stats.hpp"
#include "pool_table.hpp"
#include "region_table.hpp"
#include "size_policy.hpp"
#include "stream_pool.hpp"

namespace cistern {

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

  std::size_t reserved_bytes() const noexcept { return reservation_.bytes(); }
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
  void record(HistoryEntry::Action action, std::uintptr_t addr, std::size_t size, Stream stream) {
    detail::HistorySink(history_).record(action, addr, size, stream);
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

  // Device memory and reclamation common to both backings (reclaim.cpp); global lock held.
  bool take_over_segment(detail::StreamPool& pool, std::size_t size, bool small);
  bool release_oversize(detail::StreamPool& pool, std::size_t size);
  detail::Releases release_cache(const detail::StreamPool* held, bool asked = false);
  void collect_garbage(const detail::StreamPool* held);
  void update_allowed();
  /// What a backing is lent (backing.hpp).
  detail::BackingContext backing_context();
  /// Chooses the backing at construction: the engine where wanted and the device offers virtual
  /// memory, else classic segments (vmm_note_ says why).
  void choose_backing();
  /// The engine refused by the device at its first growth: classic segments from now on, once.
  void fall_back_to_segments(const std::string& why, const detail::StreamPool* held);
  /// backing_->grow, falling back to classic segments when the engine reports a refusal.
  detail::Block* grow(detail::StreamPool& pool, std::size_t size, bool small);
  /// backing_->reclaim_and_grow, falling back as grow does.
  detail::Block* reclaim_and_grow(detail::StreamPool& pool, std::size_t size, bool small);

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
  detail::Reservation reservation_;                    // held from the device, and the limit
  std::atomic<detail::HistoryLog*> history_{nullptr};  // non-null while recording
  std::vector<std::unique_ptr<detail::HistoryLog>> history_logs_;  // kept: readers may hold one
  detail::Counters counters_;                                      // under the global lock

  // The backing: classic segments or the virtual-memory engine.
  std::unique_ptr<detail::Backing> backing_;
  std::unique_ptr<detail::Backing> retired_backing_;  // the engine after a fallback (never used)
  std::atomic<bool> vmm_{false};    // the engine is on (fixed at its first growth at the latest)
  std::atomic<bool> trims_{false};  // the engine with a release threshold
  std::string vmm_note_;            // why the engine is off where it was wanted ("" if not)
};

}  // namespace cistern
