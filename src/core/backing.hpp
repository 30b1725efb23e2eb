// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The contract between the caching allocator and the memory behind its pools. A backing gets
// memory from the device for a pool that missed and gives it back: classic segments (cudaMalloc,
// segments.cpp) or the virtual-memory engine's mapped handles (vmm.cpp). The allocator's miss
// path (allocate_slow), the release of the cache, garbage collection, the oversize release and
// take-over are written once over this interface, in PyTorch's order; only what differs between
// the two kinds of memory is behind it.
//
// A backing sees only what BackingContext lends it - the device, the options and size policy,
// the pools, the reserved-memory account with its limit, the counters, the events to wait on a
// stream, and the history - never the allocator itself, and it reports a refusal of the device
// (Growth::refusal) and the releases the device failed (Releases) as values: what to do about
// them (fall back to classic segments, raise for empty_cache) is the allocator's. So a backing can
// be built and driven on its own (tests/test_backing.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cistern/config.hpp"
#include "cistern/device.hpp"
#include "cistern/stats.hpp"
#include "history_log.hpp"
#include "pool_table.hpp"
#include "size_policy.hpp"
#include "stream_pool.hpp"

namespace cistern::detail {

/// The allocator's event counters (stats(): num_alloc_retries, num_ooms, ...), written under the
/// global lock.
struct Counters {
  std::int64_t alloc_retries = 0;
  std::int64_t ooms = 0;
  std::int64_t sync_all_streams = 0;
  std::int64_t device_alloc = 0;  // segments created, or handles
  std::int64_t device_free = 0;   // segments released, or handles
  std::int64_t cross_stream_reuse = 0;
  std::int64_t pages_mapped = 0;  // granules
  std::int64_t pages_unmapped = 0;
  std::int64_t pages_reclaimed = 0;
  std::int64_t handles_created = 0;
  std::int64_t handles_released = 0;
  std::int64_t reclaim_syncs = 0;  // waits for a stream's work before unmapping
  std::int64_t handle_splits = 0;  // handles given back before a request took part of them
  std::int64_t oom_rescues = 0;    // requests the last resort served (Backing::last_resort)
  std::int64_t fine_cuts = 0;  // handles given back before a cut ending inside (Note [Fine cuts])

  /// Writes the counters into their Stats fields.
  void export_to(Stats& s) const noexcept {
    s.num_alloc_retries = alloc_retries;
    s.num_ooms = ooms;
    s.num_sync_all_streams = sync_all_streams;
    s.num_device_alloc = device_alloc;
    s.num_device_free = device_free;
    s.num_cross_stream_reuse = cross_stream_reuse;
    s.num_pages_mapped = pages_mapped;
    s.num_pages_unmapped = pages_unmapped;
    s.num_pages_reclaimed = pages_reclaimed;
    s.num_handles_created = handles_created;
    s.num_handles_released = handles_released;
    s.num_reclaim_syncs = reclaim_syncs;
    s.num_handle_splits = handle_splits;
    s.num_oom_rescues = oom_rescues;
    s.num_fine_cuts = fine_cuts;
  }
};

/// The memory held from the device (segments or handles, read without a lock) and the most the
/// allocator may hold: `allowed` from the memory fraction and the hard limit (SIZE_MAX: none),
/// `device_total` the device's size (0: unknown). Written under the global lock.
struct Reservation {
  std::atomic<std::size_t> held{0};
  std::size_t allowed = SIZE_MAX;
  std::size_t device_total = 0;
  /// The engine's: a pool whose blocks in use hold more than this is crowded, and a block cut to
  /// end inside a handle that goes on under the free rest gives that handle back first (Note
  /// [Fine cuts] in vmm.cpp). A third of what the engine can have - what it holds and the room
  /// the device and the limit leave - as of its last growth; SIZE_MAX before the first and with
  /// classic segments. Each pool keeps a copy for the cache-hit path (StreamPool::crowded).
  std::atomic<std::size_t> crowded_from{SIZE_MAX};

  std::size_t bytes() const noexcept { return held.load(std::memory_order_relaxed); }
  void add(std::size_t n) noexcept { held.fetch_add(n, std::memory_order_relaxed); }
  void sub(std::size_t n) noexcept { held.fetch_sub(n, std::memory_order_relaxed); }
  /// Whether holding `more` bytes would pass the limit.
  bool exceeds_limit(std::size_t more) const noexcept {
    return allowed != SIZE_MAX && bytes() + more > allowed;
  }
};

/// Where the allocator's history goes while it is being recorded (one relaxed load otherwise).
class HistorySink {
 public:
  explicit HistorySink(const std::atomic<HistoryLog*>& log) : log_(log) {}
  void record(HistoryEntry::Action action, std::uintptr_t addr, std::size_t size, Stream stream,
              bool reclaim = false) const {
    if (HistoryLog* log = log_.load(std::memory_order_relaxed)) {
      log->add(action, addr, size, stream, reclaim);
    }
  }

 private:
  const std::atomic<HistoryLog*>& log_;
};

/// What a backing gets from the allocator. Every use is under the allocator's global lock, and
/// with the lock of the pool a call names.
struct BackingContext {
  Device& device;
  const Config& config;
  const SizePolicy& policy;
  const PoolTable& pools;    // every pool (AllPoolsLock before looking into others)
  Reservation& reservation;  // what is held, and the limit
  Counters& counters;
  EventPool& events;  // to wait for a stream's work (wait_for_stream)
  HistorySink history;
};

/// Blocks until the work submitted to `stream` so far has completed, through an event that is
/// queried first (most reclaims find the stream idle and wait for nothing); counts the waits.
void wait_for_stream(const BackingContext& ctx, Stream stream);

/// What a growth came to: a free block that serves the request, or none - because the device or
/// the limit has no room (`refusal` empty), or because the device refused the engine at its first
/// growth (`refusal` says how: the allocator falls back to classic segments).
struct Growth {
  Block* block = nullptr;
  std::string refusal;
};

/// What giving memory back came to: how many releases the device refused (what they held stays
/// cached, or reserved) and why the last one was.
struct Releases {
  std::size_t failures = 0;
  std::string last_error;

  bool ok() const noexcept { return failures == 0; }
  Releases& operator+=(const Releases& other) {
    failures += other.failures;
    if (!other.last_error.empty()) last_error = other.last_error;
    return *this;
  }
  static Releases failed(std::string why) { return {1, std::move(why)}; }
};

/// How pools get memory from the device and give it back. Global lock held for every call, and
/// the lock of the pool passed.
class Backing {
 public:
  explicit Backing(const BackingContext& ctx) : ctx_(ctx) {}
  virtual ~Backing() = default;
  Backing(const Backing&) = delete;
  Backing& operator=(const Backing&) = delete;

  /// The cached block of `pool` that serves `size` without a device call, or nullptr.
  virtual Block* cached_fit(StreamPool& pool, std::size_t size, bool small) = 0;
  /// A free block that serves `size` on new device memory - a new segment, or (the engine) new
  /// handles mapped under the best fit. Takes nothing from cached blocks.
  virtual Growth grow(StreamPool& pool, std::size_t size, bool small) = 0;
  /// grow, after giving back memory that cached free blocks hold inside segments that stay (the
  /// engine: whole handles under free blocks of any pool, once their streams' work has
  /// completed). Classic segments hold nothing such: no block.
  virtual Growth reclaim_and_grow(StreamPool& pool, std::size_t size, bool small) = 0;
  /// Returns the whole free segment of `b` to the device; on a failure it stays cached.
  virtual Releases release_segment(StreamPool& pool, Block* b) = 0;
  /// After the whole free segments went back: gives back what cached free blocks of the
  /// remaining segments hold (the engine's handles under them). All pool locks held. `asked`: the
  /// program asked (empty_cache), rather than the allocator's out-of-memory path.
  virtual Releases release_rest(bool asked) = 0;
  /// The engine with a release threshold: gives unused memory above it back (no pool lock).
  virtual void trim() {}
  /// Garbage collection, after the whole free segments: gives back up to `bytes` more of what
  /// cached free blocks hold (the engine's handles under them). All pool locks held. Returns the
  /// bytes given back.
  virtual std::size_t collect(std::size_t /*bytes*/) { return 0; }
  /// The last step before an out-of-memory error, after the whole cache went back and the best
  /// fit still could not be backed: a free block of `pool` for `size` placed wherever the fewest
  /// granules are missing (the engine), mapped; nullptr when even there the device has no room.
  /// It runs only where the request would otherwise fail, so it changes no run that succeeds.
  virtual Block* last_resort(StreamPool& /*pool*/, std::size_t /*size*/, bool /*small*/) {
    return nullptr;
  }
  /// Checks the backing's own structures against the segments (inside check()); throws
  /// InvariantViolation.
  virtual void check(const std::vector<const Segment*>& segments) const = 0;

 protected:
  const BackingContext ctx_;
};

/// Classic segments (segments.cpp): the backing of vmm:False, and of a device without virtual
/// memory.
std::unique_ptr<Backing> make_segments(const BackingContext& ctx);
/// The virtual-memory engine (vmm.cpp).
std::unique_ptr<Backing> make_mapped_handles(const BackingContext& ctx);

}  // namespace cistern::detail
