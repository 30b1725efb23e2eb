// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CachingAllocator: cistern's caching device-memory allocator.
//
// Requests are rounded (PyTorch's size policy by default), served from per-stream pools of
// cached blocks with an exact best fit (smallest block, then lowest address) found through a
// two-level segregated-fit bitmap index, split when the rest is worth keeping, and coalesced
// with free neighbours when freed; on one stream every placement is PyTorch's. Optionally
// (`park_small_blocks`), a freed small block (<= 1 MiB) is parked for the next request of exactly
// its size and coalesced only before the allocator would grow: faster, at some memory cost. A miss
// first tries to take over a whole cached segment from another stream's pool (ordering the stream
// after that pool's work with an event), then asks the device for a new segment; when the device is
// full it waits for pending frees, returns the cache to the device, and retries before it reports
// `OutOfMemory`.
//
// Thread-safety: every method may be called from any thread. Each stream pool has its own lock,
// so threads working on different streams do not serialise on the cache-hit path; misses, frees
// that touch another stream's pool, and reclamation take a global lock as well.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cistern/allocator.hpp"
#include "cistern/config.hpp"
#include "cistern/device.hpp"
#include "cistern/history.hpp"

namespace cistern {

/// The caching allocator. One instance serves one device.
class CachingAllocator final : public Allocator {
 public:
  /// An allocator over `device`, which must outlive it, with the options `config` (the defaults
  /// unless given; pass `Config::from_env()` to honour CISTERN_ALLOC_CONF).
  explicit CachingAllocator(Device& device, Config config = Config());
  /// Returns every cached segment to the device. Blocks still allocated are left to the device
  /// (and reported by `check()` before destruction, if asked).
  ~CachingAllocator() override;

  void* allocate(std::size_t bytes, Stream stream) override;
  void deallocate(void* ptr, Stream stream) override;
  void record_stream(void* ptr, Stream stream) override;
  void empty_cache() override;
  Stats stats() const override;
  void reset_peak_stats() override;
  Snapshot snapshot() const override;
  int device_index() const noexcept override;
  std::string name() const override;

  /// Zeroes the running sums (`allocated`/`freed`) and the `num_*` counters.
  void reset_accumulated_stats();
  /// The size of the block that serves `ptr` (rounded), or throws `InvalidPointer`.
  std::size_t allocation_size(void* ptr) const;
  /// The caller's (unrounded) size of the live allocation at `ptr`, or nullopt when `ptr` is not
  /// an allocation of this allocator that is live (freed, interior, foreign). O(1), no global
  /// lock: one probe of the pointer map. Frameworks that pass the size back on free (the
  /// plug-in's C ABI) validate it with this.
  std::optional<std::size_t> requested_size(void* ptr) const noexcept;
  /// The device allocation (segment) that holds the allocated block at `ptr`: its base address
  /// and size, as PyTorch's `getBaseAllocation`. O(1), no global lock; throws `InvalidPointer`
  /// for a pointer that `allocate` did not return or that was freed.
  std::pair<void*, std::size_t> base_allocation(void* ptr) const;
  /// Bytes currently held from the device (one atomic load).
  std::size_t reserved_bytes() const noexcept override;
  /// Bytes currently handed to callers, rounded (cheap).
  std::size_t allocated_bytes() const noexcept;
  /// Whether the virtual-memory engine is on (the `vmm` option and the device decide). With it,
  /// `reserved_bytes()` is the physical memory held (handles, mapped or not) and the
  /// `reserved_bytes` statistic the part mapped into segments, as PyTorch counts expandable ones.
  bool uses_virtual_memory() const noexcept;
  /// The configuration in use.
  const Config& config() const noexcept;
  /// The device.
  Device& device() const noexcept;
  /// Changes the allowed fraction of device memory (as `set_per_process_memory_fraction`).
  void set_memory_fraction(double fraction);

  /// Starts recording every allocator event (up to `max_entries`, oldest dropped first), or
  /// stops recording; starting again begins a new history.
  void record_history(bool enabled, std::size_t max_entries = 1000000);
  /// The recorded events, oldest first (empty when recording was never started).
  std::vector<HistoryEntry> history() const;

  /// Walks every segment, block, index and counter and verifies every invariant; throws
  /// `InvariantViolation` describing the first one broken. Takes every lock.
  void check() const override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern
