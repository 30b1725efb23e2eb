// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// BlockIndex: the free blocks of one pool, with an exact best fit in O(1) + O(log k).
//
// Layout (two-level segregated fit). Sizes map to bins: up to 32 KiB one bin per 512 bytes;
// above, 64 bins per power of two (each bin spans 1/64 of its octave); from 256 MiB up, 4 bins per
// power of two, so that cutting a request of up to an eighth of an address range of the engine
// (1 GiB) and giving it back leave the range's free block in its bin. A bin is half-open at the
// bottom, (lo, hi]: a size on a bin boundary (a power of two, 20 MiB) shares the bin of the sizes
// just below it, so that a whole segment and what is left of it after a small request was cut
// off stay in one bin, and the split and coalesce of a hot pair replace the block without
// touching the bitmaps. A two-level bitmap marks
// the non-empty bins: one bit per bin in `bins_used_`, one bit per 64-bin word in `words_used_`,
// so the first non-empty bin above any bin is found with two find-first-set operations.
//
// Inside a bin, blocks sit in a treap ordered by (size, address) whose priorities are a hash of
// the address (deterministic, no per-node state). So the best fit - the smallest block that is
// large enough, the lowest address among equals, PyTorch's order - is either the lower bound in
// the request's own bin or the minimum of the next non-empty bin. No list is ever scanned.
//
// Invariants (check()): bit b is set iff bin b is non-empty; every block in bin b maps to b; each
// treap is ordered by (size, address) and heap-ordered by priority; count() is the number of
// blocks held.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "block.hpp"
#include "debug_assert.hpp"
#include "hot.hpp"
#include "size_policy.hpp"

namespace cistern::detail {

class BlockIndex {
 public:
  static constexpr int kLinearShift = 9;       // exact bins of 512 bytes below kLinearLimit
  static constexpr int kSubBinBits = 6;        // 64 bins per power of two above it
  static constexpr int kLinearLimitLog2 = 15;  // 32 KiB
  static constexpr int kCoarseLog2 = 28;       // 4 bins per power of two from 256 MiB
  static constexpr int kCoarseSubBinBits = 2;
  static constexpr int kMaxLog2 = 57;  // sizes up to 2^57 bytes
  static constexpr int kFirstCoarseBin =
      (1 << kSubBinBits) + (kCoarseLog2 - kLinearLimitLog2) * (1 << kSubBinBits);
  static constexpr int kBins = kFirstCoarseBin + ((kMaxLog2 - kCoarseLog2) << kCoarseSubBinBits);
  static constexpr int kWords = (kBins + 63) / 64;
  /// The bins of the sizes whose `size - 1` has its leading bit at each position (an octave):
  /// the first, and the log2 of the step between bins (9 in the linear range, octave - 6 above
  /// it, octave - 2 from kCoarseLog2), so that bin_of and same_bin are a table lookup away.
  struct OctaveBins {
    int first;
    std::uint8_t step_log2;
    std::uint8_t mask;
  };
  static constexpr std::array<OctaveBins, 64> kOctaveBins = [] {
    std::array<OctaveBins, 64> table{};
    for (int octave = 0; octave < 64; ++octave) {
      OctaveBins& o = table[static_cast<std::size_t>(octave)];
      if (octave < kLinearLimitLog2) {
        o = {0, kLinearShift, (1 << (kLinearLimitLog2 - kLinearShift)) - 1};
      } else if (octave < kCoarseLog2) {
        o = {(1 << kSubBinBits) + ((octave - kLinearLimitLog2) << kSubBinBits),
             static_cast<std::uint8_t>(octave - kSubBinBits), (1 << kSubBinBits) - 1};
      } else {
        o = {kFirstCoarseBin + ((octave - kCoarseLog2) << kCoarseSubBinBits),
             static_cast<std::uint8_t>(octave - kCoarseSubBinBits), (1 << kCoarseSubBinBits) - 1};
      }
    }
    return table;
  }();

  BlockIndex() {
    roots_.fill(nullptr);
    bins_used_.fill(0);
  }

  /// Adds a free block.
  void insert(Block* block) noexcept;
  /// Removes a block that is in the index.
  void remove(Block* block) noexcept;
  /// Removes `old` (in the index, with its key unchanged) and adds `fresh`: what remove and
  /// insert do, without a search when `old` is alone in its bin (a split or coalesce of the
  /// only cached block of a size range, the common case of a hot pair).
  CISTERN_HOT void replace(Block* old, Block* fresh) noexcept;
  /// The smallest block of at least `size` (lowest address among equals), or nullptr.
  CISTERN_HOT Block* best_fit(std::size_t size) const noexcept;
  /// Blocks held.
  std::size_t count() const noexcept { return count_; }
  /// Whether `block` is in the index (by search).
  bool contains(const Block* block) const noexcept;
  /// Verifies the invariants; returns a description of the first broken one, or nullptr.
  const char* check() const noexcept;
  /// Calls f(block) for every block, in bin order.
  template <class F>
  void for_each(F&& f) const {
    for (int bin = 0; bin < kBins; ++bin) visit(roots_[static_cast<std::size_t>(bin)], f);
  }

  /// Calls f(block) for the blocks of the bins from `size`'s on, in bin order (ascending sizes:
  /// a bin's treap in order, then the next bin), until f returns true; returns that block, or
  /// nullptr when f accepted none.
  template <class F>
  Block* find_from(std::size_t size, F&& f) const {
    for (int bin = bin_of(size); bin >= 0; bin = next_used_bin(bin)) {
      if (Block* found = visit_until(roots_[static_cast<std::size_t>(bin)], f)) return found;
    }
    return nullptr;
  }

  /// The bin of a size.
  static int bin_of(std::size_t size) noexcept;
  /// Whether two sizes share a bin: bin_of(a) == bin_of(b), in fewer instructions.
  static bool same_bin(std::size_t a, std::size_t b) noexcept;

 private:
  template <class F>
  static void visit(Block* node, F& f) {
    visit_until(node, [&f](Block* b) {
      f(b);
      return false;
    });
  }

  // In order; stops at the first block f accepts and returns it (nullptr: none). An explicit
  // stack: a treap's depth is logarithmic in expectation, but never trust that.
  template <class F>
  static Block* visit_until(Block* node, F&& f) {
    Block* stack[128];
    int depth = 0;
    while (node != nullptr || depth > 0) {
      while (node != nullptr) {
        if (depth == 128) {  // pathological depth: recursion on this subtree
          if (Block* found = visit_until(node, f)) return found;
          node = nullptr;
          break;
        }
        stack[depth++] = node;
        node = node->left;
      }
      if (depth == 0) break;
      node = stack[--depth];
      if (f(node)) return node;
      node = node->right;
    }
    return nullptr;
  }

  inline int next_used_bin(int after) const noexcept;
  static inline Block* minimum(Block* tree) noexcept;
  static inline Block* lower_bound(Block* tree, std::size_t size) noexcept;
  void replace_slow(Block* old, Block* fresh) noexcept;  // replace, but for the common case
  void mark(int bin) noexcept;
  void unmark(int bin) noexcept;

  std::array<Block*, kBins> roots_;
  std::array<std::uint64_t, kWords> bins_used_;
  std::uint64_t words_used_ = 0;
  std::size_t count_ = 0;
  static_assert(kWords <= 64, "the second bitmap level must fit one word");
};

// Inline: every split and coalesce of the hot path computes bins and flips bitmap bits. Bins are
// those of size - 1 (sizes are at least 512): monotonic, so best fit stays exact.
inline int BlockIndex::bin_of(std::size_t size) noexcept {
  const std::size_t below = size - 1;
  if (below < (std::size_t{1} << kLinearLimitLog2)) return static_cast<int>(below >> kLinearShift);
  const OctaveBins& o = kOctaveBins[static_cast<std::size_t>(log2_floor(below))];
  return o.first + static_cast<int>((below >> o.step_log2) & o.mask);
}

// Two sizes share a bin when their `size - 1` agree above the bin's step: bit 9 and up in the
// linear range, bit octave - 6 and up above it (the octave's leading bit and the six bits of the
// sub-bin), bit octave - 2 and up from kCoarseLog2. A different octave differs in a bit above the
// step of either, so one shift - the step of `a`'s bin - decides. Sizes are at least 512, so
// `a - 1` has a leading bit.
inline bool BlockIndex::same_bin(std::size_t a, std::size_t b) noexcept {
  const std::size_t below_a = a - 1;
  return ((below_a ^ (b - 1)) >>
          kOctaveBins[static_cast<std::size_t>(log2_floor(below_a))].step_log2) == 0;
}

// Inline, as the rest of the hot path: the common case of replace (old alone in its bin, fresh
// in the same bin) and the best-fit search.
CISTERN_HOT void BlockIndex::replace(Block* old, Block* fresh) noexcept {
  const int bin = old->bin;
  Block*& root = roots_[static_cast<std::size_t>(bin)];
  CISTERN_ASSERT_INTERNAL(same_bin(old->size, fresh->size) == (bin_of(fresh->size) == bin));
  if (root == old && old->left == nullptr && old->right == nullptr &&
      same_bin(old->size, fresh->size)) {
    fresh->bin = old->bin;  // alone, and the bin stays the same: fresh takes the root
    fresh->left = fresh->right = nullptr;
    root = fresh;
    return;
  }
  replace_slow(old, fresh);
}

CISTERN_HOT Block* BlockIndex::best_fit(std::size_t size) const noexcept {
  const int bin = bin_of(size);
  if (Block* root = roots_[static_cast<std::size_t>(bin)]) {
    if (Block* found = lower_bound(root, size)) return found;
  }
  const int next = next_used_bin(bin);
  return next < 0 ? nullptr : minimum(roots_[static_cast<std::size_t>(next)]);
}

inline Block* BlockIndex::minimum(Block* tree) noexcept {
  while (tree->left != nullptr) tree = tree->left;
  return tree;
}

// The first node with size >= `size` in (size, address) order.
inline Block* BlockIndex::lower_bound(Block* tree, std::size_t size) noexcept {
  Block* found = nullptr;
  while (tree != nullptr) {
    if (tree->size >= size) {
      found = tree;
      tree = tree->left;
    } else {
      tree = tree->right;
    }
  }
  return found;
}

inline int BlockIndex::next_used_bin(int after) const noexcept {
  const int first = after + 1;
  if (first >= kBins) return -1;
  const int word = first >> 6;
  const std::uint64_t in_word =
      bins_used_[static_cast<std::size_t>(word)] & (~std::uint64_t{0} << (first & 63));
  if (in_word != 0) return (word << 6) + __builtin_ctzll(in_word);
  const std::uint64_t later_words =
      word + 1 < 64 ? words_used_ & (~std::uint64_t{0} << (word + 1)) : 0;
  if (later_words == 0) return -1;
  const int w = __builtin_ctzll(later_words);
  return (w << 6) + __builtin_ctzll(bins_used_[static_cast<std::size_t>(w)]);
}

inline void BlockIndex::mark(int bin) noexcept {
  bins_used_[static_cast<std::size_t>(bin >> 6)] |= std::uint64_t{1} << (bin & 63);
  words_used_ |= std::uint64_t{1} << (bin >> 6);
}

inline void BlockIndex::unmark(int bin) noexcept {
  auto& word = bins_used_[static_cast<std::size_t>(bin >> 6)];
  word &= ~(std::uint64_t{1} << (bin & 63));
  if (word == 0) words_used_ &= ~(std::uint64_t{1} << (bin >> 6));
}

}  // namespace cistern::detail
