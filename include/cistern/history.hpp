// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The allocator's event history: what it did, in order, as PyTorch's memory history records
// it (`torch.cuda.memory._record_memory_history`). Off by default; when on, every operation
// appends one entry (under a lock of its own: recording is for debugging and traces, not for
// the fast path). The native trace writer and the PyTorch-format snapshot writer read it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cistern/types.hpp"

namespace cistern {

/// One recorded allocator event.
struct HistoryEntry {
  /// PyTorch's action names.
  enum class Action : std::uint8_t {
    alloc,           ///< a block handed out; size = the caller's size
    free_requested,  ///< the caller freed it; size = the caller's size
    free_completed,  ///< the block became reusable (after other streams' events)
    segment_alloc,   ///< a segment obtained from the device; size = segment size
    segment_free,    ///< a segment returned to the device
    oom,             ///< an allocation failed; size = the rounded request, addr = device free bytes
    segment_map,     ///< pages mapped into an expandable segment; addr, size = the range
    segment_unmap,   ///< pages unmapped from an expandable segment
  };
  Action action = Action::alloc;
  /// The call stack of the allocation the entry concerns (alloc, free_requested, free_completed:
  /// the allocation's, as PyTorch records them), an id into the `StackTable` that travels with the
  /// history (`DeviceRecord::stacks`, cistern/stacks.hpp); 0: none recorded. The allocator itself
  /// records none: the plug-in and the replay fill it in.
  std::uint32_t stack = 0;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  Stream stream;
  std::uint64_t time_us = 0;   ///< microseconds since the Unix epoch (as PyTorch's time_us)
  std::uint64_t sequence = 0;  ///< position in the history (gap-free while nothing is dropped)
  /// segment_unmap only: the allocator unmapped the pages on its own account - to map their
  /// memory elsewhere for an allocation (cistern's reclaim), to undo a map that failed, or to
  /// trim its cache to `release_threshold` - not in `empty_cache()`, garbage collection or the
  /// out-of-memory path's release. A replay of the same allocator does it again by itself, so a
  /// snapshot reader must not take it for an `empty_cache()` of the program. The PyTorch snapshot
  /// writer marks such an entry with one frame named `kReclaimFrame`. PyTorch never sets it.
  bool reclaim = false;
};

/// The name of the frame that marks a reclaim's segment_unmap in a PyTorch snapshot (file
/// "cistern", line 0): PyTorch's memory viewer shows it as the event's stack.
inline constexpr const char* kReclaimFrame = "cistern::reclaim";

/// PyTorch's name of an action ("alloc", "free_requested", ...).
const char* to_string(HistoryEntry::Action action) noexcept;

}  // namespace cistern
