// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Call stacks of the plug-in's allocations (cistern.torch.record_history(stacks="python")).
//
// The framework calls `cistern_malloc` from C++ with no Python in between, so the stack must be
// taken by whoever can see it: the caller registers a hook (`cistern_set_stack_hook`), which the
// plug-in calls after each successful allocation, outside every lock; it returns the id of the
// caller's stack in the plug-in's table (`cistern_add_stack` adds one, once per distinct stack).
// The allocator's history is the core's and knows nothing of stacks, so the log keeps, per
// device, the newest (address, stack) pairs in allocation order - as many as the history keeps
// entries - and `attach` gives a copy of the history its stacks when a snapshot is written: the
// history's alloc entries and the log's pairs at one address come in the same order (an address is
// allocated again only after it was freed), so walking both from their newest pairs them up.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "cistern/plugin.h"
#include "cistern/pytorch_snapshot.hpp"
#include "cistern/stacks.hpp"

namespace cistern::plugin {

/// See the file comment. Thread-safe.
class StackLog {
 public:
  /// Sets (or, with null, clears) the hook; keeps the newest `max_entries` pairs per device.
  void set_hook(cistern_stack_hook hook, std::size_t max_entries);
  /// After an allocation of `ptr` on `device`: asks the hook for the stack and logs it. Never
  /// throws; one relaxed load when no hook is set.
  void note(int device, void* ptr) noexcept {
    const cistern_stack_hook hook = hook_.load(std::memory_order_acquire);
    if (hook != nullptr && ptr != nullptr) log(device, ptr, hook());
  }
  /// The id of the stack of these frames (innermost first), added if new.
  std::uint32_t add_stack(std::size_t count, const char* const* filenames,
                          const std::int64_t* lines, const char* const* names);
  /// Gives `record`'s history the logged stacks and `record.stacks` the table (see the file
  /// comment); frees carry their allocation's stack.
  void attach(DeviceRecord& record) const;
  /// Forgets the logged allocations (the allocators are gone); the hook and the table stay.
  void clear() noexcept;

 private:
  void log(int device, void* ptr, std::uint32_t stack) noexcept;

  std::atomic<cistern_stack_hook> hook_{nullptr};
  mutable std::mutex mutex_;  ///< guards everything below
  std::size_t max_entries_ = 0;
  StackTable table_;
  std::vector<std::deque<std::pair<std::uintptr_t, std::uint32_t>>> logs_;  ///< per device
};

/// The plug-in's one log.
StackLog& stack_log();

}  // namespace cistern::plugin
