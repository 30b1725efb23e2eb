// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// DeviceAllocator: what cistern's own allocators of one device offer beyond `Allocator` - the
// pointer queries, limits, history and configuration that the framework plug-ins, the snapshot
// writer and the replay use - and `make_allocator`, which picks the allocator a `Config` asks
// for: `CachingAllocator`, or `PassThroughAllocator` when `pass_through` is set.
//
//   cistern::SimDevice device;
//   std::unique_ptr<cistern::DeviceAllocator> allocator =
//       cistern::make_allocator(device, cistern::Config::from_env());  // CISTERN_NO_CACHING=1:
//                                                                      // pass-through
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cistern/allocator.hpp"
#include "cistern/config.hpp"
#include "cistern/device.hpp"
#include "cistern/history.hpp"

namespace cistern {

/// A cistern allocator for one device, built from a `Config`. Every method may be called from
/// any thread.
class DeviceAllocator : public Allocator {
 public:
  /// Zeroes the running sums (`allocated`/`freed`) and the `num_*` counters.
  virtual void reset_accumulated_stats() = 0;
  /// The size of the block that serves `ptr` (rounded), or throws `InvalidPointer`.
  virtual std::size_t allocation_size(void* ptr) const = 0;
  /// The caller's (unrounded) size of the live allocation at `ptr`, or nullopt when `ptr` is not
  /// a live allocation of this allocator (freed, interior, foreign). Frameworks that pass the
  /// size back on free (the plug-in's C ABI) validate it with this.
  virtual std::optional<std::size_t> requested_size(void* ptr) const noexcept = 0;
  /// The device allocation (segment) that holds the live allocation at `ptr`: its base address
  /// and size, as PyTorch's `getBaseAllocation`; throws `InvalidPointer` for a pointer that
  /// `allocate` did not return or that was freed.
  virtual std::pair<void*, std::size_t> base_allocation(void* ptr) const = 0;
  /// Bytes currently handed to callers, rounded (cheap).
  virtual std::size_t allocated_bytes() const noexcept = 0;
  /// Whether memory is mapped page by page through the device's virtual-memory calls.
  virtual bool uses_virtual_memory() const noexcept = 0;
  /// Why the virtual-memory engine is off where the options wanted it (the device has no virtual
  /// memory, or refused it at the engine's first growth), or "" when it is not.
  virtual std::string virtual_memory_note() const { return {}; }
  /// The configuration in use.
  virtual const Config& config() const noexcept = 0;
  /// The device.
  virtual Device& device() const noexcept = 0;
  /// Changes the allowed fraction of device memory (as `set_per_process_memory_fraction`);
  /// throws `InvalidArgument` outside (0, 1].
  virtual void set_memory_fraction(double fraction) = 0;
  /// Starts recording every allocator event (up to `max_entries`, oldest dropped first), or
  /// stops recording; starting again begins a new history.
  virtual void record_history(bool enabled, std::size_t max_entries = 1000000) = 0;
  /// The recorded events, oldest first (empty when recording was never started).
  virtual std::vector<HistoryEntry> history() const = 0;
};

/// The allocator `config` selects over `device` (which must outlive it): a
/// `PassThroughAllocator` when `config.pass_through` is set (`pass_through:True`,
/// CISTERN_NO_CACHING=1), else a `CachingAllocator`. Throws what their constructors throw.
std::unique_ptr<DeviceAllocator> make_allocator(Device& device, const Config& config);

}  // namespace cistern
