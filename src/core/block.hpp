// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Blocks and segments, the allocator's model of device memory.
//
// A segment is one range obtained from the device. It is cut into blocks that tile it exactly,
// in address order, linked through `prev`/`next`. Every block is in one of three states:
//
//   allocated  handed to a caller; found through its pool's pointer map
//   pending    freed by the caller, but other streams may still use it: waits for events
//   free       cached and reusable; in its pool's block index (and, when it is a whole
//              segment, in the pool's list of whole free segments)
//   parked     cached and reusable, but only for a request of exactly its size: a small block
//              freed without coalescing, on its pool's parking list for that size (the
//              tcache idea: the next request of that size takes it back in a few instructions).
//              Parked blocks are coalesced ("flushed") before the allocator would obtain memory,
//              take a segment over, or release its cache, so parking never makes it grow.
//
// Invariants (verified by CachingAllocator::check):
//  * the blocks of a segment tile [base, base+size) with no gap and no overlap;
//  * no two neighbouring blocks are both free (free neighbours are always coalesced; a parked
//    block may neighbour a free one until it is flushed);
//  * a segment belongs to exactly one stream pool, and so do all its blocks;
//  * `head` is the block at `base`.
// A segment is a plain device allocation (classic) or, with the virtual-memory engine, a reserved
// address range whose pages are mapped on demand (expandable); blocks refer to addresses and
// sizes only, never to how the memory was obtained, so both share the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cistern/types.hpp"

namespace cistern::detail {

struct Segment;
class StreamPool;

enum class BlockState : std::uint8_t { free, allocated, pending, parked };

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // the caller's size while allocated or pending
  Block* prev = nullptr;      // neighbours in the segment, by address
  Block* next = nullptr;
  Segment* segment = nullptr;

  // Links of the free-block index (a treap per size bin) while the block is free; `left` also
  // links the parking list while the block is parked.
  Block* left = nullptr;
  Block* right = nullptr;
  // Links of the pool's list of whole free segments while the block is one.
  Block* whole_prev = nullptr;
  Block* whole_next = nullptr;

  std::vector<Stream> stream_uses;  // other streams recorded with record_stream
  std::uint64_t gc_base = 0;        // the pool's lookup count when the block was cached
  std::uint32_t pending_events = 0;
  std::uint16_t bin = 0;  // the index bin while free (its size may not change while indexed)
  BlockState state = BlockState::free;
  bool counted_split =
      false;  // counted in inactive_split (a free or parked block of a split segment)

  bool is_free() const noexcept { return state == BlockState::free; }
  bool is_whole_segment() const noexcept { return prev == nullptr && next == nullptr; }
};

struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  Block* head = nullptr;
  StreamPool* owner = nullptr;
  Segment* prev = nullptr;  // the owner pool's segment list
  Segment* next = nullptr;
  bool large = false;

  // The virtual-memory engine (vmm.cpp, handle_table.hpp): an expandable segment is a reserved
  // address range whose granules ("pages") are mapped only where blocks need them. `pages[i]`
  // names the slot of the handle mapped over granule i (the low 32 bits), with kCoarse set when
  // that handle spans several granules, or is kNoPage. Classic segments have no pages and
  // unmapped_pages == 0, so the cache-hit path tests one counter.
  static constexpr std::uint64_t kNoPage = ~std::uint64_t{0};
  static constexpr std::uint64_t kCoarse = std::uint64_t{1} << 62;
  std::vector<std::uint64_t> pages;
  std::size_t unmapped_pages = 0;
  std::size_t page_size = 0;
  bool expandable = false;

  /// Bytes of physical memory mapped into the segment (its size, for a classic one).
  std::size_t mapped_bytes() const noexcept {
    return expandable ? (pages.size() - unmapped_pages) * page_size : size;
  }
  /// Whether every page under [lo, hi), a range of this segment, is mapped (always, classic).
  bool pages_mapped(std::uintptr_t lo, std::uintptr_t hi) const noexcept {
    if (unmapped_pages == 0) return true;
    for (std::size_t i = (lo - base) / page_size; base + i * page_size < hi; ++i) {
      if (pages[i] == kNoPage) return false;
    }
    return true;
  }
};

}  // namespace cistern::detail
