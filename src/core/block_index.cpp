// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "block_index.hpp"

#include "size_policy.hpp"

namespace cistern::detail {
namespace {

// Treap priority: a multiplicative hash of the address, so that priorities are deterministic
// and need no storage. Addresses are unique, so ties are broken by address.
inline std::uint64_t priority(const Block* b) noexcept {
  return (static_cast<std::uint64_t>(b->addr) >> 9) * 0x9E3779B97F4A7C15ull;
}

inline bool higher_priority(const Block* a, const Block* b) noexcept {
  const std::uint64_t pa = priority(a);
  const std::uint64_t pb = priority(b);
  return pa != pb ? pa > pb : a->addr < b->addr;
}

// The (size, address) order of the treaps.
inline bool key_less(const Block* a, const Block* b) noexcept {
  return a->size != b->size ? a->size < b->size : a->addr < b->addr;
}

// Splits `tree` into the nodes ordered before `key` (into *lo) and the rest (into *hi).
void split(Block* tree, const Block* key, Block** lo, Block** hi) noexcept {
  while (tree != nullptr) {
    if (key_less(tree, key)) {
      *lo = tree;
      lo = &tree->right;
      tree = tree->right;
    } else {
      *hi = tree;
      hi = &tree->left;
      tree = tree->left;
    }
  }
  *lo = nullptr;
  *hi = nullptr;
}

// Joins two treaps where every node of `a` is ordered before every node of `b`.
Block* merge(Block* a, Block* b) noexcept {
  Block* root = nullptr;
  Block** link = &root;
  while (a != nullptr && b != nullptr) {
    if (higher_priority(a, b)) {
      *link = a;
      link = &a->right;
      a = a->right;
    } else {
      *link = b;
      link = &b->left;
      b = b->left;
    }
  }
  *link = a != nullptr ? a : b;
  return root;
}

}  // namespace

void BlockIndex::insert(Block* block) noexcept {
  const int bin = bin_of(block->size);
  block->bin = static_cast<std::uint16_t>(bin);
  Block** link = &roots_[static_cast<std::size_t>(bin)];
  if (*link == nullptr) mark(bin);
  // Descend while the nodes outrank the new one, then split the subtree below around it.
  while (*link != nullptr && higher_priority(*link, block)) {
    link = key_less(block, *link) ? &(*link)->left : &(*link)->right;
  }
  split(*link, block, &block->left, &block->right);
  *link = block;
  ++count_;
}

void BlockIndex::remove(Block* block) noexcept {
  const int bin = block->bin;
  Block** link = &roots_[static_cast<std::size_t>(bin)];
  while (*link != block) link = key_less(block, *link) ? &(*link)->left : &(*link)->right;
  *link = merge(block->left, block->right);
  block->left = block->right = nullptr;
  if (roots_[static_cast<std::size_t>(bin)] == nullptr) unmark(bin);
  --count_;
}

void BlockIndex::replace_slow(Block* old, Block* fresh) noexcept {
  const int bin = old->bin;
  Block*& root = roots_[static_cast<std::size_t>(bin)];
  if (root != old || old->left != nullptr || old->right != nullptr) {
    remove(old);
    insert(fresh);
    return;
  }
  const int fresh_bin = bin_of(fresh->size);
  root = nullptr;
  unmark(bin);
  Block*& fresh_root = roots_[static_cast<std::size_t>(fresh_bin)];
  if (fresh_root != nullptr) {
    --count_;
    insert(fresh);
    return;
  }
  fresh->bin = static_cast<std::uint16_t>(fresh_bin);  // alone in an empty bin
  fresh->left = fresh->right = nullptr;
  fresh_root = fresh;
  mark(fresh_bin);
}

bool BlockIndex::contains(const Block* block) const noexcept {
  const Block* node = roots_[static_cast<std::size_t>(bin_of(block->size))];
  while (node != nullptr && node != block) node = key_less(block, node) ? node->left : node->right;
  return node == block;
}

const char* BlockIndex::check() const noexcept {
  std::size_t seen = 0;
  for (int bin = 0; bin < kBins; ++bin) {
    const Block* root = roots_[static_cast<std::size_t>(bin)];
    const bool marked = (bins_used_[static_cast<std::size_t>(bin >> 6)] >> (bin & 63)) & 1;
    if (marked != (root != nullptr)) return "bitmap bit disagrees with bin occupancy";
    const bool word_marked = (words_used_ >> (bin >> 6)) & 1;
    if (marked && !word_marked) return "second-level bitmap misses a used word";
    const char* problem = nullptr;
    const Block* previous = nullptr;
    auto check_node = [&](Block* b) {
      ++seen;
      if (problem != nullptr) return;
      if (bin_of(b->size) != bin || b->bin != bin) problem = "block sits in the wrong bin";
      else if (!b->is_free()) problem = "indexed block is not free";
      else if (previous != nullptr && !key_less(previous, b)) problem = "treap order broken";
      else if ((b->left && higher_priority(b->left, b)) ||
               (b->right && higher_priority(b->right, b)))
        problem = "treap heap order broken";
      previous = b;
    };
    visit(const_cast<Block*>(root), check_node);
    if (problem != nullptr) return problem;
  }
  for (int w = 0; w < kWords; ++w) {
    if (((words_used_ >> w) & 1) != (bins_used_[static_cast<std::size_t>(w)] != 0))
      return "second-level bitmap bit disagrees with its word";
  }
  return seen == count_ ? nullptr : "block count disagrees with the treaps";
}

}  // namespace cistern::detail
