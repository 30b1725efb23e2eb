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

#include "cistern/config.hpp"
#include "cistern/device.hpp"
#include "cistern/device_allocator.hpp"
#include "cistern/history.hpp"

namespace cistern {

/// The caching allocator. One instance serves one device.
class CachingAllocator final : public DeviceAllocator {
 public:
  /// An allocator over `device`, which must outlive it, with the options `config` (the defaults
  /// unless given; pass `Config::from_env()` to honour CISTERN_ALLOC_CONF). It always caches:
  /// a `config` with `pass_through` set throws `InvalidArgument` (`PassThroughAllocator` serves
  /// it; `make_allocator` picks the right one).
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

  void reset_accumulated_stats() override;
  std::size_t allocation_size(void* ptr) const override;
  /// As `DeviceAllocator::requested_size`: O(1), no global lock, one probe of the pointer map.
  std::optional<std::size_t> requested_size(void* ptr) const noexcept override;
  /// As `DeviceAllocator::base_allocation`: O(1), no global lock.
  std::pair<void*, std::size_t> base_allocation(void* ptr) const override;
  /// Bytes currently held from the device (one atomic load).
  std::size_t reserved_bytes() const noexcept override;
  std::size_t allocated_bytes() const noexcept override;
  /// Whether the virtual-memory engine is on (the `vmm` option and the device decide). With it,
  /// `reserved_bytes()` is the physical memory held (handles, mapped or not) and the
  /// `reserved_bytes` statistic the part mapped into segments, as PyTorch counts expandable ones.
  bool uses_virtual_memory() const noexcept override;
  /// Why the engine is off although wanted ("" if not): the device has no virtual memory, or it
  /// refused a virtual-memory call at the engine's first growth - the allocator then serves
  /// classic segments from that request on, once and for good (`num_vmm_fallbacks` is 1).
  std::string virtual_memory_note() const override;
  const Config& config() const noexcept override;
  Device& device() const noexcept override;
  void set_memory_fraction(double fraction) override;
  void record_history(bool enabled, std::size_t max_entries = 1000000) override;
  std::vector<HistoryEntry> history() const override;

  /// Walks every segment, block, index and counter and verifies every invariant; throws
  /// `InvariantViolation` describing the first one broken. Takes every lock.
  void check() const override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern
