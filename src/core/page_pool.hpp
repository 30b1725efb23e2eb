// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The virtual-memory engine's physical memory: the handles the allocator created and the pool
// of their pages that are mapped nowhere.
//
// A page is one granule of one handle, named by (handle slot, index in the handle) packed in a
// 64-bit id (Segment::pages holds these ids). A handle goes back to the device only when every
// one of its pages is in the pool; `reserved_bytes` is the sum of the live handles' sizes.
// Everything here runs under the allocator's global lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cistern/types.hpp"

namespace cistern::detail {

/// Packs and unpacks page ids.
inline std::uint64_t page_id(std::uint32_t slot, std::uint32_t index) noexcept {
  return (std::uint64_t{slot} << 32) | index;
}
inline std::uint32_t page_slot(std::uint64_t id) noexcept {
  return static_cast<std::uint32_t>(id >> 32);
}
inline std::uint32_t page_index(std::uint64_t id) noexcept {
  return static_cast<std::uint32_t>(id & 0xffffffffu);
}

/// One physical handle created by the engine.
struct HandleSlot {
  PhysicalHandle handle;
  std::size_t pages = 0;   ///< its size in pages
  std::size_t pooled = 0;  ///< of them, unmapped and in the pool
  bool live = false;       ///< false: released, the slot is free for reuse
};

class PagePool {
 public:
  /// Adds a handle of `pages` pages (all unmapped); returns its slot.
  std::uint32_t add_handle(PhysicalHandle handle, std::size_t pages) {
    std::uint32_t slot = 0;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(handles_.size());
      handles_.emplace_back();
    }
    handles_[slot] = HandleSlot{handle, pages, 0, true};
    for (std::size_t i = pages; i > 0; --i) put(page_id(slot, static_cast<std::uint32_t>(i - 1)));
    return slot;
  }

  /// Whether the pool holds no page.
  bool empty() const noexcept { return free_.empty(); }
  /// Pages in the pool.
  std::size_t size() const noexcept { return free_.size(); }
  /// Takes a page out of the pool (not empty).
  std::uint64_t take() {
    const std::uint64_t id = free_.back();
    free_.pop_back();
    --handles_[page_slot(id)].pooled;
    return id;
  }
  /// Returns an unmapped page to the pool.
  void put(std::uint64_t id) {
    free_.push_back(id);
    ++handles_[page_slot(id)].pooled;
  }

  /// Removes from the pool the pages of every handle that lies entirely in it and returns those
  /// handles' slots (the caller releases them, then calls `forget`).
  std::vector<std::uint32_t> unused_handles() const {
    std::vector<std::uint32_t> slots;
    for (std::uint32_t s = 0; s < handles_.size(); ++s) {
      if (handles_[s].live && handles_[s].pooled == handles_[s].pages) slots.push_back(s);
    }
    return slots;
  }
  /// Forgets a released handle whose pages are all in the pool.
  void forget(std::uint32_t slot) {
    free_.erase(std::remove_if(free_.begin(), free_.end(),
                               [slot](std::uint64_t id) { return page_slot(id) == slot; }),
                free_.end());
    handles_[slot].live = false;
    handles_[slot].pooled = 0;
    free_slots_.push_back(slot);
  }

  const HandleSlot& handle(std::uint32_t slot) const noexcept { return handles_[slot]; }
  const std::vector<HandleSlot>& handles() const noexcept { return handles_; }
  const std::vector<std::uint64_t>& pooled_pages() const noexcept { return free_; }

 private:
  std::vector<HandleSlot> handles_;
  std::vector<std::uint32_t> free_slots_;
  std::vector<std::uint64_t> free_;  // unmapped pages; taken from the back
};

}  // namespace cistern::detail
