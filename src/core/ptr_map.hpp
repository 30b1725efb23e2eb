// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// PtrMap: address -> Block* for the allocated blocks of one pool.
//
// Open addressing with linear probing and backward-shift deletion (no tombstones), load factor
// at most 1/4, so a lookup touches one or two cache lines and never allocates. Keys are block
// addresses, multiples of 512, so the low bits are dropped before hashing. Key 0 marks an empty
// slot; no device returns address 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "block.hpp"
#include "debug_assert.hpp"

namespace cistern::detail {

class PtrMap {
 public:
  /// `capacity`: the initial slot count, a power of two (the map doubles it as it fills).
  explicit PtrMap(std::size_t capacity = 64) { rehash(capacity); }

  /// Adds `key -> block`; the key must not be present.
  inline __attribute__((always_inline)) void insert(std::uintptr_t key, Block* block) {
    CISTERN_ASSERT_INTERNAL(key != 0 && key % 512 == 0);
    if (size_ >= grow_at_) grow();
    std::size_t i = slot_of(key);
    while (slots_[i].key != 0) i = (i + 1) & mask_;
    slots_[i] = {key, block};
    ++size_;
  }

  /// The block at `key`, or nullptr.
  Block* find(std::uintptr_t key) const noexcept {
    for (std::size_t i = slot_of(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].block;
      if (slots_[i].key == 0) return nullptr;
    }
  }

  /// Removes `key`; returns whether it was present.
  bool erase(std::uintptr_t key) noexcept { return extract(key) != nullptr; }

  /// Removes `key` and returns its block, or nullptr if absent: one probe for find and erase.
  Block* extract(std::uintptr_t key) noexcept {
    return extract_if(key, [](const Block*) { return true; });
  }

  /// Removes `key` if `keep_out(block)` holds and returns the block; nullptr (nothing removed)
  /// if the key is absent or the predicate refuses: one probe for the test and the removal.
  template <class Pred>
  inline __attribute__((always_inline)) Block* extract_if(std::uintptr_t key,
                                                          Pred&& keep_out) noexcept {
    std::size_t i = slot_of(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return nullptr;
      i = (i + 1) & mask_;
    }
    Block* const found = slots_[i].block;
    if (!keep_out(static_cast<const Block*>(found))) return nullptr;
    erase_slot(i);
    return found;
  }

  /// Entries held.
  std::size_t size() const noexcept { return size_; }

  /// Calls f(key, block) for every entry.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].key != 0) f(slots_[i].key, slots_[i].block);
    }
  }

 private:
  struct Slot {
    std::uintptr_t key;
    Block* block;
  };

  std::size_t slot_of(std::uintptr_t key) const noexcept {
    return static_cast<std::size_t>(((key >> 9) * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  // Backward shift: pull later entries of the probe run into the hole when their home slot
  // allows, so that every remaining key stays reachable from its home slot.
  void erase_slot(std::size_t i) noexcept {
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const std::size_t home = slot_of(slots_[j].key);
      const bool movable = ((j - home) & mask_) >= ((j - hole) & mask_);
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = {0, nullptr};
    --size_;
  }

  __attribute__((noinline)) void grow() { rehash(capacity_ * 2); }

  void rehash(std::size_t capacity) {
    std::unique_ptr<Slot[]> old = std::move(slots_);
    const std::size_t old_capacity = capacity_;
    slots_ = std::make_unique<Slot[]>(capacity);
    for (std::size_t i = 0; i < capacity; ++i) slots_[i] = {0, nullptr};
    capacity_ = capacity;
    grow_at_ = capacity / 4;  // load factor at most 1/4: short probe runs for insert and extract
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(capacity));
    size_ = 0;
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].key != 0) insert(old[i].key, old[i].block);
    }
  }

  std::unique_ptr<Slot[]> slots_;
  std::size_t capacity_ = 0;
  std::size_t grow_at_ = 0;
  std::size_t mask_ = 0;
  unsigned shift_ = 0;
  std::size_t size_ = 0;
};

}  // namespace cistern::detail
