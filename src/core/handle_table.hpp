// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The virtual-memory engine's physical memory: every handle the allocator created, and where it
// is mapped.
//
// The driver maps a handle only whole, at offset 0 (CUDA_ERROR_NOT_SUPPORTED otherwise), and
// unmaps only whole mappings, so a handle is the unit of everything the engine does: it is
// created for a run of granules of one expandable segment, mapped there whole, and unmapped and
// released whole once every granule it covers lies inside a cached free block. A handle is kept
// only while it is mapped - creating one costs about as much as mapping one (11-12 us on an H200,
// vmm-and-planning.md section 4), and an unmapped handle could only ever serve a run of exactly its
// size - so the table holds no pool of unmapped handles; the one exception is a handle whose
// release failed, which stays (unplaced) until a later release succeeds.
// Segment::pages[i] names the slot of the handle mapped at granule i. Everything here runs under
// the allocator's global lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cistern/types.hpp"

namespace cistern::detail {

struct Segment;

/// One physical handle created by the engine.
struct HandleSlot {
  PhysicalHandle handle;       ///< with its size in bytes
  Segment* segment = nullptr;  ///< where it is mapped; nullptr: unmapped, its release to retry
  std::size_t first = 0;       ///< the first granule it covers in `segment`
  std::size_t granules = 0;    ///< its size in granules
  bool live = false;           ///< false: released, the slot is free for reuse
};

class HandleTable {
 public:
  /// Records a handle just created (not yet mapped); returns its slot.
  std::uint32_t add(PhysicalHandle handle, std::size_t granules) {
    std::uint32_t slot = 0;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    slots_[slot] = HandleSlot{handle, nullptr, 0, granules, true};
    ++live_;
    return slot;
  }
  /// Records that the handle of `slot` is mapped at granule `first` of `segment`.
  void place(std::uint32_t slot, Segment* segment, std::size_t first) noexcept {
    slots_[slot].segment = segment;
    slots_[slot].first = first;
  }
  /// Records that the handle of `slot` is no longer mapped anywhere.
  void unplace(std::uint32_t slot) noexcept { slots_[slot].segment = nullptr; }
  /// Forgets a released handle.
  void remove(std::uint32_t slot) {
    slots_[slot] = HandleSlot{};
    free_slots_.push_back(slot);
    --live_;
  }

  const HandleSlot& operator[](std::uint32_t slot) const noexcept { return slots_[slot]; }
  /// Every slot, live or not (index = slot).
  const std::vector<HandleSlot>& slots() const noexcept { return slots_; }
  /// Live handles (mapped, or awaiting a release that failed).
  std::size_t live() const noexcept { return live_; }

 private:
  std::vector<HandleSlot> slots_;
  std::vector<std::uint32_t> free_slots_;
  std::size_t live_ = 0;
};

}  // namespace cistern::detail
