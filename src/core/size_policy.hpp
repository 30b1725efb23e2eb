// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The size policy: how a request is rounded, which pool serves it, how large a segment is
// obtained for it, and when a cached block may be split or may serve a request. These are
// PyTorch's rules by default (see ../shared/reference/pytorch-caching-allocator.md, sections 1-2),
// parameterised by `Config`.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "cistern/config.hpp"

namespace cistern::detail {

/// Requests above this are impossible on any device (64 PiB); they fail before any rounding.
inline constexpr std::size_t kMaxRequest = std::size_t{1} << 56;

/// Rounds `x` up to a multiple of the power of two `to`.
constexpr std::size_t round_up(std::size_t x, std::size_t to) noexcept {
  return (x + to - 1) & ~(to - 1);
}

/// floor(log2(x)) for x > 0.
inline int log2_floor(std::uint64_t x) noexcept { return 63 - __builtin_clzll(x); }

/// The policy, precomputed from a `Config`.
///
/// It keeps its own copy of the size options rather than a pointer to the Config: every request
/// reads several of them (in round, may_serve, should_split, is_oversize), and a copy held by
/// value in the pool is one load each instead of two. The size options never change after an
/// allocator is built (set_memory_fraction changes only the limit).
class SizePolicy {
 public:
  explicit SizePolicy(const Config& config)
      : min_block_size_(config.min_block_size),
        small_size_(config.small_size),
        small_segment_size_(config.small_segment_size),
        min_large_alloc_(config.min_large_alloc),
        large_segment_size_(config.large_segment_size),
        round_large_(config.round_large),
        max_split_size_(config.max_split_size),
        max_non_split_rounding_(config.max_non_split_rounding),
        divisions_(config.roundup_power2_divisions) {
    for (const std::uint32_t d : divisions_) rounds_to_divisions_ |= d > 1;
  }

  /// The block size that serves a request of `bytes` (0 < bytes <= kMaxRequest).
  std::size_t round(std::size_t bytes) const noexcept {
    const std::size_t min_block = min_block_size_;
    if (bytes <= min_block) return min_block;
    if (!rounds_to_divisions_) return round_up(bytes, min_block);
    const std::uint32_t divisions = divisions_for(bytes);
    if (divisions > 1 && bytes > min_block * divisions) return round_to_division(bytes, divisions);
    return round_up(bytes, min_block);
  }

  /// Whether a rounded size is served from the small pool.
  bool is_small(std::size_t rounded) const noexcept { return rounded <= small_size_; }

  /// The segment obtained from the device for a rounded request that found no cached block.
  std::size_t segment_size(std::size_t rounded) const noexcept {
    if (is_small(rounded)) return small_segment_size_;
    if (rounded < min_large_alloc_) return large_segment_size_;
    return round_up(rounded, round_large_);
  }

  /// Whether a cached block of `block_size` may serve a request of rounded size `size`
  /// (the oversize rules of `max_split_size`).
  bool may_serve(std::size_t block_size, std::size_t size) const noexcept {
    if (size < max_split_size_) return block_size < max_split_size_;
    return block_size < size + max_non_split_rounding_;
  }

  /// Whether a block of `block_size` serving `size` is split, leaving the rest cached. A block of
  /// an expandable segment splits as a small one does, whatever max_split_size (as in PyTorch's
  /// expandable segments): its rest is address space, mapped only where a block is handed out, so
  /// that a large block keeping up to a MiB it does not use would hold that memory for nothing.
  bool should_split(std::size_t block_size, std::size_t size, bool small,
                    bool expandable) const noexcept {
    const std::size_t rest = block_size - size;
    if (small || expandable) return rest >= min_block_size_;
    return size < max_split_size_ && rest > small_size_;
  }

  /// Whether a block or segment counts as oversize.
  bool is_oversize(std::size_t size) const noexcept { return size >= max_split_size_; }
  /// Whether max_split_size limits anything (it is set).
  bool limits_splits() const noexcept { return max_split_size_ != SIZE_MAX; }

  /// The policy of the virtual-memory engine: the same but for max_split_size, which it ignores -
  /// the memory a large free block does not use goes back handle by handle, so no block needs to
  /// be kept from being cut (and a reserved range, mostly unmapped, must be cut to be used).
  SizePolicy for_engine() const noexcept {
    SizePolicy engine = *this;
    engine.max_split_size_ = SIZE_MAX;
    return engine;
  }
  /// Classic segments' policy again, from the engine's (the only field they differ in), without
  /// writing the rounding that the cache-hit path reads with no lock.
  void leave_engine(const Config& config) noexcept { max_split_size_ = config.max_split_size; }

 private:
  // PyTorch's interval index: floor(log2(bytes)) - 20, clamped to the table.
  std::uint32_t divisions_for(std::size_t bytes) const noexcept {
    int index = log2_floor(bytes) - 20;
    if (index < 0) index = 0;
    if (index >= kRoundupIntervals) index = kRoundupIntervals - 1;
    return divisions_[static_cast<std::size_t>(index)];
  }

  // Rounds up to the next of `divisions` equal steps between two powers of two; powers of two
  // are kept as they are.
  static std::size_t round_to_division(std::size_t bytes, std::uint32_t divisions) noexcept {
    if ((bytes & (bytes - 1)) == 0) return bytes;
    const std::size_t floor2 = std::size_t{1} << log2_floor(bytes);
    const std::size_t step = floor2 >> log2_floor(divisions);
    if (step == 0) return floor2 << 1;
    return round_up(bytes, step);
  }

  std::size_t min_block_size_;
  std::size_t small_size_;
  std::size_t small_segment_size_;
  std::size_t min_large_alloc_;
  std::size_t large_segment_size_;
  std::size_t round_large_;
  std::size_t max_split_size_;
  std::size_t max_non_split_rounding_;
  std::array<std::uint32_t, kRoundupIntervals> divisions_;
  bool rounds_to_divisions_ = false;  // some interval has roundup_power2_divisions > 1
};

}  // namespace cistern::detail
