// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The CUDA graph pools of one device: PyTorch's private pools (CUDAGraph, MemPool ids) served by
// the plug-in with one cistern allocator per pool id, over the same device as the general
// allocator.
//
// Note [Graph pools]
// ~~~~~~~~~~~~~~~~~~
// PyTorch's caching allocator keeps a private pool per graph: while a pool is begun for a device
// with a stream filter (beginAllocateToPool), allocations on streams the filter accepts come from
// that pool; blocks freed during or after the capture go back to that pool only, because a
// replay of the graph still writes them; endAllocateToPool stops the routing; releasePool drops
// one use of the pool, and a pool nobody uses gives its memory back once nothing in it is live.
// Graphs that share a pool id (`pool=` in torch.cuda.graph, cudagraph trees) share its blocks.
//
// Here each pool is an allocator of its own: blocks never move between pools because allocators
// share nothing but the device. Each live allocation of a pool is remembered (pointer -> pool),
// so that its free, record_stream and base allocation reach the pool's allocator; the general
// allocator's pointer map is asked first, so that frees outside pools cost what they did. A pool
// whose uses have all been released is destroyed when its last live block is freed (at once if
// none is live); its counters then join `retired_`, so that the device's running sums go on.
// With no pool begun, routing is one relaxed load.
//
// Out of memory in a pool: outside capture, the general allocator's cache is emptied and the
// pool retries, as PyTorch frees its cached blocks before giving up. During a capture PyTorch
// never frees (cudaFree there would break the capture), and neither does cistern: the error says
// to empty the cache before capturing.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cistern/config.hpp"
#include "cistern/device.hpp"
#include "cistern/device_allocator.hpp"
#include "cistern/stats.hpp"
#include "plugin/capture_guard.hpp"

namespace cistern::plugin {

/// A pool id: PyTorch's MempoolId_t (graph-made ids are {id, 0}, graph_pool_handle() and MemPool
/// ids {0, id}; {0, 0} is the general pool and never a graph pool).
using PoolId = std::pair<unsigned long long, unsigned long long>;

/// Whether an allocation on a stream goes to the pool being begun.
using StreamFilter = std::function<bool(Stream)>;

/// See Note [Graph pools].
class GraphPools {
 public:
  /// Pools of `device` (the general allocator's device, which the pools share), each configured
  /// by `config`; `capture` says which streams are captured. All must outlive this.
  GraphPools(Device& device, const Config& config, const CaptureState& capture,
             DeviceAllocator& general);
  ~GraphPools();
  GraphPools(const GraphPools&) = delete;
  GraphPools& operator=(const GraphPools&) = delete;

  /// Routes allocations on streams `filter` accepts (every stream when empty) to pool `id`,
  /// creating it or adding a use. Throws `InvalidArgument` for {0, 0}.
  void begin(PoolId id, StreamFilter filter);
  /// Stops the routing that the newest `begin(id, ...)` started. Throws `InvalidArgument` if none.
  void end(PoolId id);
  /// Drops one use of pool `id`; with none left the pool is destroyed, its memory given back, as
  /// soon as nothing in it is live. Throws `InvalidArgument` for a pool with no use left.
  void release(PoolId id);

  /// Whether some pool is begun (one relaxed load).
  bool any_begun() const noexcept { return begun_.load(std::memory_order_relaxed) != 0; }
  /// Allocates from the newest begun pool whose filter accepts `stream`; nullopt when none does.
  /// Out of memory outside capture: empties the general allocator's cache and retries once.
  std::optional<void*> allocate(std::size_t size, Stream stream);
  /// Whether some pool block is live (one relaxed load).
  bool any_live() const noexcept { return live_.load(std::memory_order_relaxed) != 0; }
  /// The caller's size of `ptr` if it is a live pool allocation.
  std::optional<std::size_t> requested_size(void* ptr) const;
  /// Frees `ptr`, a live pool allocation of `size` bytes (checked: `SizeMismatch` otherwise,
  /// nothing freed); false when `ptr` is no pool's.
  bool deallocate(void* ptr, std::size_t size, Stream stream);
  /// Calls `use(allocator)` with the pool allocator holding the live `ptr`; false when none does.
  bool with_owner(void* ptr, const std::function<void(DeviceAllocator&)>& use);

  /// Empties the caches of pools that no graph uses any more (PyTorch's empty_cache frees only
  /// those: a pool in use keeps its memory for its graphs' replays).
  void empty_cache();
  /// The counters of every pool, present and destroyed, added up (peaks are the sum of each
  /// pool's peak: at least the true combined peak).
  Stats stats() const;
  /// The segments of every live pool.
  void add_segments(Snapshot& snapshot) const;
  /// Sets every pool's peaks to their current values.
  void reset_peak_stats();
  /// Zeroes every pool's running sums and num_* counters.
  void reset_accumulated_stats();
  /// Runs every pool allocator's invariant checker.
  void check() const;
  /// Pools that exist (tests).
  std::size_t pool_count() const;
  /// What an out-of-memory error in a pool during capture adds to its message.
  static const char* capture_oom_note() noexcept;

 private:
  struct Pool {
    PoolId id;
    std::unique_ptr<CaptureGuardDevice> device;
    std::unique_ptr<DeviceAllocator> allocator;
    int uses = 0;          ///< begins not yet released
    std::size_t live = 0;  ///< live allocations
  };
  struct Begun {
    PoolId id;
    StreamFilter filter;
  };
  Pool& find(PoolId id, const char* what);                         // mutex_ held
  void* allocate_in(Pool& pool, std::size_t size, Stream stream);  // mutex_ held
  void destroy_if_unused(PoolId id);                               // mutex_ held

  Device& device_;
  Config config_;
  const CaptureState& capture_;
  DeviceAllocator& general_;
  mutable std::mutex mutex_;
  std::map<PoolId, Pool> pools_;
  std::vector<Begun> begun_list_;  ///< newest last
  std::unordered_map<void*, Pool*> owners_;
  Stats retired_;
  std::atomic<std::size_t> begun_{0};
  std::atomic<std::size_t> live_{0};
};

/// Adds `add`'s counters to `total` (max_split_size is `total`'s).
void add_stats(Stats& total, const Stats& add);

}  // namespace cistern::plugin
