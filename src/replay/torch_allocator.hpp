// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// TorchAllocator: an emulation of PyTorch's native CUDA caching allocator
// (`DeviceCachingAllocator`, 2024 code with the 2026 options), the baseline the replay engine
// compares policies against and checks against what PyTorch recorded.
//
// It follows ../shared/reference/pytorch-caching-allocator.md sections 1-6 literally, with
// PyTorch's data structures and order of operations, and shares nothing with cistern's own
// allocator but the option table (`Config`), the statistics struct and the size rounding:
//
// * sizes: `round_size` (512 B, or power-of-two divisions), `get_allocation_size` (2 MiB small
//   segments, `large_segment_size` for (1, 10) MiB, else 2 MiB multiples);
// * two `BlockPool`s (small <= 1 MiB, large), each a `std::set` of free blocks ordered by
//   (stream, size, address); best fit on the request's own stream only, no stealing between
//   streams; the oversize rules of `max_split_size` / `max_non_split_rounding`;
// * split the front off a free block when the rest is >= 512 B (small pool) or > 1 MiB and the
//   request is below `max_split_size` (large pool); merge with free neighbours of the same
//   segment on free;
// * `record_stream` adds uses; a free with uses records one event per stream and the block is
//   pending until `process_events` (at the start of every allocate) finds them complete;
// * on a miss: garbage collection (only with a memory fraction or limit and
//   `garbage_collection_threshold`), `alloc_block`, `release_available_cached_blocks` (only with
//   `max_split_size`), `release_cached_blocks` and a last `alloc_block` (the retry counted in
//   `num_alloc_retries`), then `OutOfMemory` with PyTorch's message;
// * statistics updated where PyTorch updates them (`inactive_split`, `requested_bytes`,
//   `oversize_*`, `num_*`).
//
// * `expandable_segments:True` (on a device with the virtual-memory API): one reservation of
//   1.125 x the device's memory per pool and stream, pages (2 MiB small, `large_segment_size`
//   large) mapped on demand at the lowest hole with room, best fit ranking a block by its size
//   plus the unmapped space after it, every pool splitting down to 512 bytes, neighbours merging
//   only when both are mapped or both unmapped, and whole free pages unmapped only by
//   `release_cached_blocks` (a reservation left without pages is released); garbage collection
//   and `release_available_cached_blocks` leave expandable blocks alone (PyTorch PR #134338).
//   Mapped bytes count as reserved; `inactive_split` and the segment count leave them out. A
//   snapshot shows one segment per run of mapped pages, as PyTorch's does. A warm start adopts
//   the recorded reservations at their inferred bases and maps the recorded ranges in them
//   (`adopt_reservation`, `adopt_mapped`; replay/warm_start.hpp).
//
// Differences from PyTorch, none of which shows in a replay: no CUDA graph or MemPool private
// pools, no free-memory callbacks, one plain
// mutex instead of a recursive mutex and a sharded pointer map, and `deallocate(ptr, s)` on a
// stream other than the block's own records a use of `s` first (PyTorch's free takes no stream).
// Memory limits: `memory_fraction` < 1 and `memory_limit` both set PyTorch's allowed maximum
// (the smaller wins).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "cistern/allocator.hpp"
#include "cistern/config.hpp"
#include "cistern/device.hpp"
#include "replay/warm_start.hpp"

namespace cistern::replay {

/// The emulation of PyTorch's native caching allocator. See the file comment.
class TorchAllocator final : public Allocator, public WarmStart {
 public:
  /// An allocator over `device`, which must outlive it, with PyTorch's options from `config`
  /// (`Config{}` is PyTorch's defaults). Throws `ConfigError` for an invalid configuration.
  explicit TorchAllocator(Device& device, Config config = Config{});
  /// Waits for pending frees and returns every cached whole segment to the device, as
  /// `empty_cache` does. Segments that still hold allocations are left to the device.
  ~TorchAllocator() override;

  void* allocate(std::size_t bytes, Stream stream) override;
  void deallocate(void* ptr, Stream stream) override;
  void record_stream(void* ptr, Stream stream) override;
  /// PyTorch's `empty_cache()`: `release_cached_blocks` (wait for every pending free, then
  /// return every cached block that is a whole segment).
  void empty_cache() override;
  Stats stats() const override;
  std::size_t reserved_bytes() const noexcept override;
  void reset_peak_stats() override;
  Snapshot snapshot() const override;
  int device_index() const noexcept override;
  /// "torch".
  std::string name() const override;

  // --- WarmStart ------------------------------------------------------------------------------------
  void adopt_segment(void* ptr, std::size_t bytes, Stream stream, bool is_large) override;
  std::size_t expandable_reservation_bytes(bool is_large) override;
  void adopt_reservation(void* base, std::size_t bytes, Stream stream, bool is_large) override;
  void adopt_mapped(void* ptr, std::size_t bytes) override;
  void* place_block(void* ptr, std::size_t requested, std::size_t block_size,
                    Stream stream) override;

  // --- PyTorch's other controls ---------------------------------------------------------------------
  /// `torch.cuda.set_per_process_memory_fraction(fraction)`: allowed maximum = fraction x total.
  void set_memory_fraction(double fraction);
  /// `reset_accumulated_memory_stats`: zeroes the running sums and the `num_*` counters.
  void reset_accumulated_stats();
  /// The configuration in use.
  const Config& config() const noexcept;
  /// PyTorch's `round_size`: the block size that serves a request of `bytes`.
  std::size_t round_size(std::size_t bytes) const noexcept;
  /// PyTorch's `get_allocation_size`: the segment obtained for a rounded size with no cached fit.
  std::size_t allocation_size(std::size_t rounded) const noexcept;

  /// Walks every segment, block, pool, event and statistic and verifies PyTorch's invariants
  /// (blocks tile their segment, no two free neighbours, pools hold exactly the free blocks,
  /// statistics agree with the blocks); throws `InvariantViolation` naming the first one broken.
  void check() const override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern::replay
