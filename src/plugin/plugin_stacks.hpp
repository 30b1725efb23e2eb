// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Call stacks of the plug-in's allocations (cistern.torch.record_history(stacks="python" or
// "all")).
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
//
// Native frames (`cistern_set_native_stacks`, stacks="all"): the plug-in takes the allocating
// thread's return addresses itself (glibc's backtrace), drops the leading ones inside the plug-in
// (cistern's own frames) and, when the hook answered a Python stack, those from the first frame
// in the Python interpreter on, which that stack stands for - as PyTorch's "all" stacks put the
// Python frames where the interpreter's are. Each address is named once, through the dynamic
// symbol table (dladdr; demangled): the frame's filename is the shared object, its line 0 (no
// debug information is read), its name the function's or "0x<offset>" when the object exports
// none. A distinct (Python stack, addresses) pair is turned into a table stack once.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
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
  /// Starts or stops taking native frames (see the file comment); keeps the newest `max_entries`
  /// pairs per device.
  void set_native(bool on, std::size_t max_entries);
  /// After an allocation of `ptr` on `device`: takes the stack (the hook's, native frames) and
  /// logs it. Never throws; two relaxed loads when no stacks are taken.
  void note(int device, void* ptr) noexcept {
    const cistern_stack_hook hook = hook_.load(std::memory_order_acquire);
    const bool native = native_.load(std::memory_order_relaxed);
    if ((hook != nullptr || native) && ptr != nullptr) take(device, ptr, hook, native);
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
  /// Keeps the newest `max_entries` pairs per device from now on; mutex_ held.
  void keep_newest(std::size_t max_entries);
  void take(int device, void* ptr, cistern_stack_hook hook, bool native) noexcept;
  void log(int device, void* ptr, std::uint32_t stack) noexcept;
  /// The table stack of native return addresses `pcs` (innermost first) followed by the Python
  /// stack `python`; mutex_ held.
  std::uint32_t with_native(std::uint32_t python, void* const* pcs, int count);
  /// The table frame of return address `pc`; mutex_ held.
  std::uint32_t native_frame(std::uintptr_t pc);

  std::atomic<cistern_stack_hook> hook_{nullptr};
  std::atomic<bool> native_{false};
  mutable std::mutex mutex_;  ///< guards everything below
  std::size_t max_entries_ = 0;
  StackTable table_;
  std::vector<std::deque<std::pair<std::uintptr_t, std::uint32_t>>> logs_;  ///< per device
  std::unordered_map<std::uintptr_t, std::uint32_t> pc_frames_;   ///< return address -> frame
  std::unordered_map<std::string, std::uint32_t> native_stacks_;  ///< (Python id, pcs) -> stack
};

/// The plug-in's one log.
StackLog& stack_log();

}  // namespace cistern::plugin
