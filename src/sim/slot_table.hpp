// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// SlotTable: a growing array whose elements never move, read without a lock.
//
// SimDevice keeps its streams and events here so that the calls on them (record, query, wait,
// synchronise) find their slot with no lock while other threads create more. Slots live in chunks
// of doubling size (chunk k holds kFirstChunk << k slots), so an index maps to its chunk with one
// bit scan and a chunk, once published, stays where it is until the table is destroyed.
//
// Concurrency: `add` is serialised by the caller (SimDevice's lock); `find` and `size` may run
// concurrently with it and with each other. A slot's own fields must be atomics (or written only
// under the caller's lock) when several threads use the same slot.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <new>
#include <utility>

#include "core/size_policy.hpp"

namespace cistern::detail {

template <class Slot>
class SlotTable {
 public:
  /// Slots in the first chunk; chunk k holds kFirstChunk << k.
  static constexpr std::size_t kFirstChunk = 16;
  /// Chunks: room for kFirstChunk * (2^kChunks - 1) slots, more than memory could hold.
  static constexpr int kChunks = 40;

  SlotTable() = default;
  SlotTable(const SlotTable&) = delete;
  SlotTable& operator=(const SlotTable&) = delete;
  ~SlotTable() {
    for (std::atomic<Slot*>& chunk : chunks_) delete[] chunk.load(std::memory_order_relaxed);
  }

  /// The slot at `index`, or null if no slot was added there. Lock-free.
  Slot* find(std::size_t index) const noexcept {
    if (index >= size_.load(std::memory_order_acquire)) return nullptr;
    // The acquire above pairs with the release in `add`, which published the chunk first.
    const auto [chunk, offset] = locate(index);
    return chunks_[chunk].load(std::memory_order_relaxed) + offset;
  }

  /// Adds a value-initialised slot at index `size()` and returns that index. The caller
  /// serialises calls of `add`. Throws std::bad_alloc when memory or the table is exhausted.
  std::size_t add() {
    const std::size_t index = size_.load(std::memory_order_relaxed);
    const auto [chunk, offset] = locate(index);
    if (chunk >= kChunks) throw std::bad_alloc();
    if (offset == 0) {  // the first slot of a new chunk
      chunks_[chunk].store(new Slot[kFirstChunk << chunk](), std::memory_order_relaxed);
    }
    size_.store(index + 1, std::memory_order_release);
    return index;
  }

  /// Slots added so far. Lock-free.
  std::size_t size() const noexcept { return size_.load(std::memory_order_acquire); }

 private:
  /// The chunk of `index` and its offset there: chunk k starts at kFirstChunk * (2^k - 1).
  static std::pair<int, std::size_t> locate(std::size_t index) noexcept {
    const int chunk = log2_floor(index / kFirstChunk + 1);
    return {chunk, index - kFirstChunk * ((std::size_t{1} << chunk) - 1)};
  }

  std::array<std::atomic<Slot*>, kChunks> chunks_{};
  std::atomic<std::size_t> size_{0};
};

}  // namespace cistern::detail
