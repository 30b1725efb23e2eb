// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The leases of CallCounters' shards (see call_counters.hpp).
#include "sim/call_counters.hpp"

namespace cistern::detail {
namespace {

static_assert(kCounterShards <= 32, "one bit of g_held per shard");

/// Bit s: shard s is held. Shard 0 is never leased. Trivially destructible, so that threads
/// exiting during the process's shutdown can still return their shards.
std::atomic<std::uint32_t> g_held{1};

/// Returns the calling thread's shard when the thread exits; its later counts (from other
/// thread-local destructors) go to the shared shard.
struct Lease {
  unsigned shard = 0;
  Lease() = default;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() {
    t_counter_shard = 0;
    // Release: the next holder sees every count this thread stored.
    g_held.fetch_and(~(std::uint32_t{1} << shard), std::memory_order_release);
  }
};

}  // namespace

unsigned lease_counter_shard() noexcept {
  constexpr std::uint32_t all = kCounterShards == 32 ? ~0u : (1u << kCounterShards) - 1;
  std::uint32_t held = g_held.load(std::memory_order_relaxed);
  for (;;) {
    const std::uint32_t free = ~held & all;
    if (free == 0) return 0;
    const auto shard = static_cast<unsigned>(__builtin_ctz(free));
    // Acquire: this thread sees every count the shard's earlier holder stored.
    if (g_held.compare_exchange_weak(held, held | (1u << shard), std::memory_order_acquire,
                                     std::memory_order_relaxed)) {
      thread_local Lease lease;
      lease.shard = shard;
      return shard;
    }
  }
}

}  // namespace cistern::detail
