// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CallCounters: SimDevice's per-operation call and failure counts, counted without a lock,
// without an atomic read-modify-write and without a cache line shared by every thread.
//
// Counts are kept in kCounterShards shards, summed when read. A thread holds one shard of its
// own (the same index in every device) from its first count until it exits, and writes it with
// a plain load and store: no other thread writes there meanwhile. When every shard but the
// first is held, further threads count in the first one with atomic adds. A shard changes hands
// through an atomic bitmask (release when a thread returns it, acquire when the next takes it),
// so no count is lost. The sum is exact once the counted calls have returned; during concurrent
// calls it may miss the ones still in flight.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cistern/device.hpp"
#include "cistern/sim_device.hpp"

namespace cistern::detail {

/// Shards of every CallCounters; shard 0 is shared by the threads that hold none.
inline constexpr unsigned kCounterShards = 16;

/// The calling thread's shard until the thread has asked for one.
inline constexpr unsigned kNoCounterShard = ~0u;

/// The calling thread's shard: 1 to kCounterShards - 1 held by it alone, or 0 (shared).
inline thread_local unsigned t_counter_shard = kNoCounterShard;

/// Takes a free shard for the calling thread until it exits (0 if none is free).
unsigned lease_counter_shard() noexcept;

class CallCounters {
 public:
  /// Counts a call of `op`.
  void count_call(DeviceOp op) noexcept { count(&Shard::calls, op); }
  /// Counts a failed call of `op`.
  void count_failure(DeviceOp op) noexcept { count(&Shard::failures, op); }
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
  using Cells = std::array<std::atomic<std::uint64_t>, kDeviceOpCount>;
  struct alignas(64) Shard {
    Cells calls{};
    Cells failures{};
  };

  void count(Cells Shard::*which, DeviceOp op) noexcept {
    if (t_counter_shard == kNoCounterShard) t_counter_shard = lease_counter_shard();
    const unsigned shard = t_counter_shard;
    std::atomic<std::uint64_t>& cell = (shards_[shard].*which)[static_cast<std::size_t>(op)];
    if (shard == 0) {
      cell.fetch_add(1, std::memory_order_relaxed);
    } else {  // this thread's own shard
      cell.store(cell.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
  }

  std::array<Shard, kCounterShards> shards_{};
};

}  // namespace cistern::detail
