// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CallCounters: SimDevice's per-operation call and failure counts, counted without a lock and
// without a cache line shared by every thread.
//
// Each thread counts into one of kShards shards (threads are dealt shards in turn, so up to
// kShards threads never share one); a read sums the shards. The sum is exact once the counted
// calls have returned; during concurrent calls it may miss the ones still in flight.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cistern/device.hpp"
#include "cistern/sim_device.hpp"

namespace cistern::detail {

class CallCounters {
 public:
  /// Counts a call of `op`.
  void count_call(DeviceOp op) noexcept {
    shard().calls[static_cast<std::size_t>(op)].fetch_add(1, std::memory_order_relaxed);
  }
  /// Counts a failed call of `op`.
  void count_failure(DeviceOp op) noexcept {
    shard().failures[static_cast<std::size_t>(op)].fetch_add(1, std::memory_order_relaxed);
  }
  /// The counts of all threads.
  SimCounters total() const noexcept {
    SimCounters sum;
    for (const Shard& s : shards_) {
      for (std::size_t op = 0; op < kDeviceOpCount; ++op) {
        sum.calls[op] += s.calls[op].load(std::memory_order_relaxed);
        sum.failures[op] += s.failures[op].load(std::memory_order_relaxed);
      }
    }
    return sum;
  }

 private:
  static constexpr unsigned kShards = 16;

  struct alignas(64) Shard {
    std::array<std::atomic<std::uint64_t>, kDeviceOpCount> calls{};
    std::array<std::atomic<std::uint64_t>, kDeviceOpCount> failures{};
  };

  /// The calling thread's shard (the same for every device: a thread counts in one place).
  Shard& shard() noexcept {
    // Constant-initialised, so a thread_local costs no guard; 0 means "not dealt yet".
    thread_local unsigned t_shard = 0;
    if (t_shard == 0) t_shard = next_shard().fetch_add(1, std::memory_order_relaxed) % kShards + 1;
    return shards_[t_shard - 1];
  }
  static std::atomic<unsigned>& next_shard() noexcept {
    static std::atomic<unsigned> next{0};
    return next;
  }

  std::array<Shard, kShards> shards_{};
};

}  // namespace cistern::detail
