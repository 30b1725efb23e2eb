// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// PassThroughAllocator: no caching. Every request is one device allocation of the request's
// rounded size, returned to the device when it is freed - what PyTorch does under
// PYTORCH_NO_CUDA_MEMORY_CACHING=1 - so that tools such as compute-sanitizer see every
// allocation and every use after free. `make_allocator` returns one when the configuration sets
// `pass_through` (`pass_through:True`, CISTERN_NO_CACHING=1); the plug-in and the replay's
// `nocache` policy select it that way.
//
// Sizes are rounded as the caching allocator rounds them (`min_block_size`,
// `roundup_power2_divisions`), so that statistics and replays compare like with like; each
// allocation is its own segment (small or large pool by its rounded size). A free is ordered by
// the device itself (a device free waits for the work that may use the memory), so
// `record_stream` only validates its pointer. Statistics are exact; `empty_cache` has nothing to
// return. The memory fraction and `memory_limit_mb` bound the bytes held, as they bound the
// caching allocator's.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cistern/config.hpp"
#include "cistern/device.hpp"
#include "cistern/device_allocator.hpp"
#include "cistern/history.hpp"

namespace cistern {

/// The pass-through allocator. One instance serves one device; thread-safe (one lock).
class PassThroughAllocator final : public DeviceAllocator {
 public:
  /// An allocator over `device`, which must outlive it. Of `config` it uses the rounding options,
  /// `small_size`, `max_split_size` (the oversize statistics), `memory_fraction` and
  /// `memory_limit`; it validates the whole of it (`Config::validate`).
  explicit PassThroughAllocator(Device& device, Config config = Config());
  /// Allocations still live are left to the device.
  ~PassThroughAllocator() override;

  void* allocate(std::size_t bytes, Stream stream) override;
  void deallocate(void* ptr, Stream stream) override;
  void record_stream(void* ptr, Stream stream) override;
  void empty_cache() override;
  Stats stats() const override;
  std::size_t reserved_bytes() const noexcept override;
  void reset_peak_stats() override;
  Snapshot snapshot() const override;
  int device_index() const noexcept override;
  std::string name() const override;
  /// Verifies that the live allocations agree with every statistic and with the bytes held;
  /// throws `InvariantViolation` describing the first disagreement.
  void check() const override;

  void reset_accumulated_stats() override;
  std::size_t allocation_size(void* ptr) const override;
  std::optional<std::size_t> requested_size(void* ptr) const noexcept override;
  std::pair<void*, std::size_t> base_allocation(void* ptr) const override;
  std::size_t allocated_bytes() const noexcept override;
  bool uses_virtual_memory() const noexcept override { return false; }
  const Config& config() const noexcept override;
  Device& device() const noexcept override;
  void set_memory_fraction(double fraction) override;
  void record_history(bool enabled, std::size_t max_entries = 1000000) override;
  std::vector<HistoryEntry> history() const override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern
