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

#include <algorithm>
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
  // names the slot of the handle mapped over granule i (the low 32 bits), or is kNoPage. Classic
  // segments have no pages and unmapped_pages == 0, so the cache-hit path tests one counter.
  // kSpan is set when it reaches over more than one page of PyTorch's expandable segments'
  // grid (2 MiB small, 20 MiB large, from the segment's base): such a handle lies inside one
  // block that is not free, or under free blocks only (the page rule, vmm.cpp). kFine is set when
  // it was made near the limit: a block cut to end inside it, where it goes on under the rest of
  // the free block, gives it back first (Note [Fine cuts], vmm.cpp).
  static constexpr std::uint64_t kNoPage = ~std::uint64_t{0};
  static constexpr std::uint64_t kSpan = std::uint64_t{1} << 61;
  static constexpr std::uint64_t kFine = std::uint64_t{1} << 60;
  std::vector<std::uint64_t> pages;
  // Beside `pages`, one bit per granule, set where it is mapped, so that the cache-hit path tests
  // a block's granules a 64-bit word at a time.
  std::vector<std::uint64_t> mapped_bits;
  std::size_t unmapped_pages = 0;
  std::size_t spans = 0;  // mapped handles with kSpan (0 for a classic segment)
  std::size_t fines = 0;  // mapped handles with kFine (0 for a classic segment)
  std::size_t page_size = 0;
  unsigned page_shift = 0;  // log2(page_size)
  bool expandable = false;
  // Everything below this address is mapped (base + size for a classic segment): the cache-hit
  // path's test of a block on the part of a range that has been mapped from its start, which is
  // where blocks are cut, needs nothing else.
  std::uintptr_t mapped_end = 0;

  /// Bytes of physical memory mapped into the segment (its size, for a classic one).
  std::size_t mapped_bytes() const noexcept {
    return expandable ? (pages.size() - unmapped_pages) * page_size : size;
  }
  /// Recomputes mapped_end after granules were mapped or unmapped.
  void update_mapped_end() noexcept {
    std::size_t i = 0;
    while (i < pages.size() && pages[i] != kNoPage) ++i;
    mapped_end = base + i * page_size;
  }
  /// Sets what granule i of an expandable segment holds (a page id, or kNoPage), with its bit;
  /// the caller keeps unmapped_pages and mapped_end.
  void set_page(std::size_t i, std::uint64_t page) noexcept {
    pages[i] = page;
    const std::uint64_t bit = std::uint64_t{1} << (i & 63);
    if (page == kNoPage) {
      mapped_bits[i >> 6] &= ~bit;
    } else {
      mapped_bits[i >> 6] |= bit;
    }
  }
  /// The granules [first, last) that [lo, hi), a range of this segment, touches.
  std::size_t first_page(std::uintptr_t lo) const noexcept { return (lo - base) >> page_shift; }
  std::size_t end_page(std::uintptr_t hi) const noexcept {
    return (hi - base + page_size - 1) >> page_shift;
  }
  /// Whether every page under [lo, hi), a range of this segment, is mapped (always, classic).
  bool pages_mapped(std::uintptr_t lo, std::uintptr_t hi) const noexcept {
    if (unmapped_pages == 0) return true;
    return all_set(mapped_bits, first_page(lo), end_page(hi));
  }
  /// Whether cutting a block [lo, hi) from the free block [lo, end) must first give back the
  /// handle under the byte before `hi` (the cache-hit path asks only when spans or fines is not
  /// 0, or the pool is `crowded`): one with kSpan that goes on past `hi` (the page rule), or one
  /// with kFine - any handle, when `crowded` - that goes on past the granule `hi` ends in and lies
  /// inside the free block's whole granules (a fine cut). A handle covers adjacent granules, so
  /// the granules just outside tell where it ends.
  bool cut_needs_backing(std::uintptr_t lo, std::uintptr_t hi, std::uintptr_t end,
                         bool crowded) const noexcept {
    const std::size_t i = (hi - 1 - base) >> page_shift;
    const std::uint64_t page = pages[i];
    const bool fine = crowded || (page & kFine) != 0;
    if (page == kNoPage || ((page & kSpan) == 0 && !fine)) return false;
    const bool goes_on = i + 1 < pages.size() && pages[i + 1] == page;
    if ((page & kSpan) != 0 && (goes_on || ((hi - base) & (page_size - 1)) != 0)) return true;
    if (!fine || !goes_on) return false;
    const std::size_t first = (lo - base + page_size - 1) >> page_shift;  // the whole granules
    const std::size_t last = (end - base) >> page_shift;
    return first <= i && (first == 0 || pages[first - 1] != page) &&
           (last >= pages.size() || pages[last] != page);
  }
  /// cut_needs_backing behind the gate the cache-hit path writes out inline: only a split
  /// (`hi` before `end`) in a segment with kSpan or kFine handles, or of a crowded pool, can need
  /// a handle given back.
  bool split_needs_backing(std::uintptr_t lo, std::uintptr_t hi, std::uintptr_t end,
                           bool crowded) const noexcept {
    return hi != end && ((spans | fines) != 0 || crowded) &&
           cut_needs_backing(lo, hi, end, crowded);
  }
  /// The first mapped granule in [i, end), or `end`: a word of the bit vector at a time, so that
  /// a walk over the handles of a range as large as the device skips its unmapped stretches.
  std::size_t next_mapped(std::size_t i, std::size_t end) const noexcept {
    while (i < end) {
      const std::uint64_t word = mapped_bits[i >> 6] >> (i & 63);
      if (word != 0) return std::min(end, i + static_cast<std::size_t>(__builtin_ctzll(word)));
      i = (i | 63) + 1;
    }
    return end;
  }

 private:
  // Bits [first, last) of a bit vector, a word at a time.
  static std::uint64_t word_mask(std::size_t w, std::size_t first, std::size_t last) noexcept {
    const std::size_t lo = w == (first >> 6) ? (first & 63) : 0;
    const std::size_t hi = w == ((last - 1) >> 6) ? ((last - 1) & 63) + 1 : 64;
    const std::uint64_t upper = hi == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << hi) - 1;
    return upper & ~((std::uint64_t{1} << lo) - 1);
  }
  static bool all_set(const std::vector<std::uint64_t>& bits, std::size_t first,
                      std::size_t last) noexcept {
    for (std::size_t w = first >> 6; w <= (last - 1) >> 6; ++w) {
      const std::uint64_t mask = word_mask(w, first, last);
      if ((bits[w] & mask) != mask) return false;
    }
    return true;
  }
};

}  // namespace cistern::detail
