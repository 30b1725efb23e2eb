// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Allocator statistics under PyTorch's key names, and snapshots of segments and blocks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cistern/types.hpp"

namespace cistern {

/// One statistic: its current value, the peak since the last reset, and the running sums of
/// increases and decreases (PyTorch's `Stat`).
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  /// Adds `delta` (may be negative) and updates peak and sums.
  void update(std::int64_t delta) noexcept {
    current += delta;
    if (current > peak) peak = current;
    if (delta > 0) allocated += delta;
    if (delta < 0) freed -= delta;
  }
  friend bool operator==(const Stat& a, const Stat& b) noexcept {
    return a.current == b.current && a.peak == b.peak && a.allocated == b.allocated &&
           a.freed == b.freed;
  }
};

/// The pool a statistic is broken down by: all, small (<= 1 MiB requests), large.
enum class StatPool : int { all = 0, small_pool = 1, large_pool = 2 };
inline constexpr int kStatPools = 3;

/// The array statistics, each kept for all / small_pool / large_pool.
enum class StatKind : int {
  allocation,            ///< allocated blocks (count)
  segment,               ///< device segments (count)
  active,                ///< allocated or pending blocks (count)
  inactive_split,        ///< free blocks inside partly used segments (count)
  allocated_bytes,       ///< bytes of allocated blocks (rounded sizes)
  reserved_bytes,        ///< bytes held from the device
  active_bytes,          ///< bytes of active blocks
  inactive_split_bytes,  ///< bytes of inactive split blocks
  requested_bytes,       ///< callers' unrounded sizes of active blocks
};
inline constexpr int kStatKinds = 9;

/// PyTorch's key for a statistic kind, e.g. "allocated_bytes".
const char* to_string(StatKind kind) noexcept;
/// "all", "small_pool" or "large_pool".
const char* to_string(StatPool pool) noexcept;

/// All statistics of one allocator (`torch.cuda.memory_stats()` equivalent).
///
/// Current values and running sums are always exact. Peaks are exact while the allocator serves
/// one stream, and with several streams when `exact_peaks` is set. By default, with several
/// streams, each stream's pool publishes its changes to the allocator-wide figures in batches (so
/// that threads on different streams do not write the same memory on every operation), and an
/// allocator-wide peak can then be off by up to the unpublished change of each of the other
/// streams, either way: per stream, at most 256 blocks and at most that stream's reserved bytes.
struct Stats {
  Stat array[kStatKinds][kStatPools];       ///< indexed by StatKind, StatPool
  Stat oversize_allocations;                ///< allocated blocks >= max_split_size
  Stat oversize_segments;                   ///< segments >= max_split_size
  std::int64_t num_alloc_retries = 0;       ///< flush-the-cache-and-retry attempts
  std::int64_t num_ooms = 0;                ///< out-of-memory errors reported
  std::int64_t num_sync_all_streams = 0;    ///< waits on every outstanding event
  std::int64_t num_device_alloc = 0;        ///< device allocations (segments and maps)
  std::int64_t num_device_free = 0;         ///< device frees (segments and unmaps)
  std::int64_t num_cross_stream_reuse = 0;  ///< segments taken over from another stream's pool
  // The virtual-memory engine (zero without it).
  std::int64_t num_pages_mapped = 0;      ///< pages mapped into expandable segments
  std::int64_t num_pages_unmapped = 0;    ///< pages unmapped (reclaim, release, empty_cache)
  std::int64_t num_pages_reclaimed = 0;   ///< pages taken from cached free blocks for a request
  std::int64_t num_handles_created = 0;   ///< physical handles created
  std::int64_t num_handles_released = 0;  ///< physical handles returned to the device
  std::int64_t num_reclaim_syncs = 0;     ///< waits for a stream's work before unmapping
  /// Handles reaching over several pages (max_handle_size_mb above a page) given back before a
  /// smaller block took part of them (the page rule).
  std::int64_t num_handle_splits = 0;
  /// Requests served where an out-of-memory error was due: the whole cache had gone back and the
  /// best fit still needed more memory than the device had, but another free range of the pool
  /// (or its end) needed few enough granules.
  std::int64_t num_oom_rescues = 0;
  /// Handles given back before a block cut from the free block over them ended inside them, so
  /// that the rest of the free block could go back whatever that block does (fine cuts): handles
  /// made near the limit, and any handle while the stream's blocks in use held more than a third
  /// of what the engine can have.
  std::int64_t num_fine_cuts = 0;
  /// 1 when the engine was wanted but the device has no virtual memory or refused it at its
  /// first growth, so that classic segments serve instead (`virtual_memory_note()` says why).
  std::int64_t num_vmm_fallbacks = 0;
  std::int64_t max_split_size = -1;  ///< the configured value; -1 when unlimited

  /// One array statistic.
  Stat& get(StatKind kind, StatPool pool) noexcept {
    return array[static_cast<int>(kind)][static_cast<int>(pool)];
  }
  const Stat& get(StatKind kind, StatPool pool) const noexcept {
    return array[static_cast<int>(kind)][static_cast<int>(pool)];
  }

  /// The statistics flattened with dots, exactly as `torch.cuda.memory_stats()` names them:
  /// "allocated_bytes.all.current", "num_ooms", "max_split_size", ...
  std::map<std::string, std::int64_t> flatten() const;
};

/// State of one block in a snapshot (PyTorch's names).
enum class BlockState : int {
  active_allocated,     ///< handed to a caller
  active_pending_free,  ///< freed, waiting for events of other streams
  inactive,             ///< free, cached
};
/// "active_allocated", "active_pending_free" or "inactive".
const char* to_string(BlockState state) noexcept;

/// One block of a segment in a snapshot.
struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;            ///< block size (rounded)
  std::size_t requested_size = 0;  ///< caller's size (0 when free)
  BlockState state = BlockState::inactive;
};

/// One device segment in a snapshot, with its blocks in address order.
struct SegmentInfo {
  int device = 0;
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;  ///< bytes of active_allocated blocks
  std::size_t active_size = 0;     ///< bytes of allocated or pending blocks
  std::size_t requested_size = 0;  ///< callers' sizes of active blocks
  Stream stream;                   ///< the stream whose pool owns the segment
  bool is_large = false;           ///< large pool ("large") or small pool ("small")
  bool is_expandable = false;
  /// For an expandable segment (a run of mapped pages), the address range it was reserved in:
  /// its base and size (0 for a classic segment).
  std::uintptr_t range_address = 0;
  std::size_t range_size = 0;
  std::vector<BlockInfo> blocks;
};

/// Every segment, sorted by address.
struct Snapshot {
  std::vector<SegmentInfo> segments;
};

}  // namespace cistern
