// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// StreamPool: everything one stream owns - its segments, its cached blocks (small and large
// indexes), its allocated blocks (its own pointer map), its pending frees - behind one lock.
//
// The cache-hit path of the allocator is entirely inside one pool: find a block, split it,
// record it in the pool's map; free it, coalesce it, index it. A same-stream pair takes one lock
// each way, the pool's. Other threads find a pointer through the allocator's RegionTable, which
// names the pool whose segment holds it; linking and unlinking segments here keeps that table
// current. Nothing here calls the device except the event operations of pending frees. Methods
// marked "pool lock held" must be called with `mutex` locked; the allocator takes its global lock
// as well before it touches two pools or the device.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "block.hpp"
#include "block_index.hpp"
#include "cistern/types.hpp"
#include "debug_assert.hpp"
#include "history_log.hpp"
#include "hot.hpp"
#include "pool_stats.hpp"
#include "ptr_map.hpp"
#include "region_table.hpp"
#include "size_policy.hpp"
#include "spin_lock.hpp"

namespace cistern {
class Device;
}

namespace cistern::detail {

/// Recycles Block objects so the hot path never calls the system allocator.
class BlockArena {
 public:
  Block* make() {
    if (free_ == nullptr) grow();
    Block* b = free_;
    free_ = b->next;
    b->next = nullptr;
    return b;
  }
  void recycle(Block* b) noexcept {
    b->stream_uses.clear();
    b->prev = b->left = b->right = b->whole_prev = b->whole_next = nullptr;
    b->segment = nullptr;
    b->requested = 0;
    b->pending_events = 0;
    b->state = BlockState::free;
    b->counted_split = false;
    b->next = free_;
    free_ = b;
  }
  /// Recycles a free block just merged into its neighbour: a free block of a split segment,
  /// uncounted, already holds what `recycle` resets but its links.
  CISTERN_HOT void recycle_merged(Block* b) noexcept {
    CISTERN_ASSERT_INTERNAL(b->state == BlockState::free && b->requested == 0 &&
                            b->stream_uses.empty() && b->pending_events == 0 && !b->counted_split &&
                            b->whole_prev == nullptr && b->whole_next == nullptr);
    b->prev = b->left = b->right = nullptr;
    b->segment = nullptr;
    b->next = free_;
    free_ = b;
  }

 private:
  void grow();
  std::vector<std::unique_ptr<Block[]>> chunks_;
  Block* free_ = nullptr;
};

/// Pooled events (created once, reused), shared by all pools of an allocator.
class EventPool {
 public:
  explicit EventPool(Device& device) : device_(device) {}
  ~EventPool();
  /// An event ready to record; throws DeviceError when the device cannot create one.
  Event acquire();
  /// Returns an event for reuse.
  void release(Event event);

 private:
  Device& device_;
  std::mutex mutex_;
  std::vector<Event> free_;
};

/// A free that waits for an event recorded on another stream.
struct PendingFree {
  Event event;
  Block* block;
};

/// Pending frees of one use stream, in record order (completion is FIFO per stream).
struct PendingQueue {
  Stream stream;
  std::deque<PendingFree> entries;
};

class StreamPool {
 public:
  StreamPool(Stream stream, const SizePolicy& policy, const Config& config,
             std::atomic<SharedStats*>& shared, std::atomic<HistoryLog*>& history,
             RegionTable& regions);
  ~StreamPool();

  /// At most this many blocks of one size are parked; more are coalesced at once.
  static constexpr std::uint8_t kParkLimit = 32;

  const Stream stream;
  SpinLock mutex;

  // --- the hot path (pool lock held) -------------------------------------------------------------

  /// Hands out a parked small block of exactly `size`, or returns nullptr if none is parked.
  CISTERN_HOT void* take_parked(std::size_t size, std::size_t requested) {
    if (!park_small_blocks_) return nullptr;  // nothing is ever parked
    const std::size_t bin = size >> park_shift_;
    Block* b = parked_[bin];
    if (b == nullptr) return nullptr;
    CISTERN_ASSERT_INTERNAL(b->state == BlockState::parked && b->size == size);
    parked_[bin] = b->left;
    b->left = nullptr;
    --parked_count_[bin];
    ++lookups_[0];  // ages cached segments (take-over, garbage collection) by requests served
    uncount_split(b, true);
    hand_out(b, requested, true);
    after_hot_operation();
    return reinterpret_cast<void*>(b->addr);
  }

  /// The best cached block for a rounded size that the size policy lets serve it, or nullptr.
  CISTERN_HOT Block* find(std::size_t size, bool small) noexcept {
    ++lookups_[small ? 0 : 1];
    Block* b = index(small).best_fit(size);
    return (b != nullptr && policy_.may_serve(b->size, size)) ? b : nullptr;
  }

  /// Hands out the indexed block `b` for a request of `requested` bytes rounded to `size`,
  /// splitting off the rest when the policy says so.
  CISTERN_HOT void* take(Block* b, std::size_t size, std::size_t requested) {
    const bool small = !b->segment->large;
    CISTERN_ASSERT_INTERNAL(b->state == BlockState::free && b->size >= size && size >= requested);
    if (policy_.should_split(b->size, size, small, b->segment->expandable)) {
      split(b, size, small);
    } else {
      unindex(b, small);
    }
    hand_out(b, requested, small);
    after_hot_operation();
    return reinterpret_cast<void*>(b->addr);
  }

  /// Cuts the indexed free block `b` so that its last `size` bytes (less than b's) are a free
  /// block of their own; both stay indexed. Returns that block. For a request placed at the end
  /// of a free block (the engine's last resort); `rejoin` undoes it.
  Block* split_top(Block* b, std::size_t size, bool small) {
    CISTERN_ASSERT_INTERNAL(b->state == BlockState::free && size < b->size);
    const std::uint64_t age = b->gc_base;
    split(b, b->size - size, small);  // b: the lower part, out of the index; the top indexed
    index_block(b, small);
    b->gc_base = age;  // the lower part has been cached as long as the whole had
    return b->next;
  }
  /// Merges the indexed free block `b` with its free neighbours again (after split_top).
  void rejoin(Block* b, bool small) noexcept {
    unindex(b, small);
    coalesce(b, small);
  }

  /// Removes this pool's allocated block at `addr` from the pool's pointer map and returns it
  /// (nullptr if no block of this pool is allocated there): the first step of every free. Follow
  /// with `release`, or give it back with `restore`.
  CISTERN_HOT Block* extract_allocated(std::uintptr_t addr) noexcept {
    return allocated_.extract(addr);
  }
  /// Puts an extracted block back, unchanged.
  void restore(Block* b) { allocated_.insert(b->addr, b); }
  /// This pool's allocated block at `addr`, or nullptr.
  Block* find_allocated(std::uintptr_t addr) const noexcept { return allocated_.find(addr); }

  /// Frees an extracted block that no other stream uses: it is cached at once.
  CISTERN_HOT void release(Block* b) noexcept {
    CISTERN_ASSERT_INTERNAL(b->state == BlockState::allocated && b->segment->owner == this);
    const bool small = !b->segment->large;
    end_allocation(b, small);
    retire(b, small);
    after_hot_operation();
  }

  /// Ends the allocation of an extracted block without caching it: the caller makes it pending.
  void end_allocation(Block* b) noexcept {
    end_allocation(b, !b->segment->large);
    after_hot_operation();
  }

  /// Caches a pending block whose events have all completed: parks a small block, or coalesces
  /// it with its free neighbours and indexes it.
  void retire_pending(Block* b) {
    CISTERN_ASSERT_INTERNAL(b->state == BlockState::pending && b->pending_events == 0);
    if (HistoryLog* log = history_.load(std::memory_order_relaxed)) {
      log->add(HistoryEntry::Action::free_completed, b->addr, b->requested, stream);
    }
    const bool small = !b->segment->large;
    stats_.end_pending(small, static_cast<std::int64_t>(b->size),
                       static_cast<std::int64_t>(b->requested));
    retire(b, small);
    after_hot_operation();
  }

  /// Coalesces and indexes every parked block (before the allocator grows or gives memory back).
  void flush_parked() noexcept;

  /// Publishes this pool's statistics to the allocator-wide ones now (see pool_stats.hpp).
  void publish_stats() noexcept {
    if (SharedStats* sh = shared()) stats_.publish(*sh);
  }

  // --- pending frees (pool lock held) ------------------------------------------------------------

  /// Makes an ended allocation wait for `events` (recorded on `streams`, same order).
  void make_pending(Block* b, const std::vector<Event>& events, const std::vector<Stream>& streams);
  /// The same for one event recorded on one stream (a free on another stream, nothing recorded):
  /// inline, as the common case of a cross-stream free - the stream's queue already exists.
  CISTERN_HOT void make_pending(Block* b, Event event, Stream user) {
    begin_pending(b, 1);
    enqueue(b, event, user);
  }
  /// Whether any free is pending.
  bool has_pending() const noexcept { return pending_count_ != 0; }
  /// Caches every pending block whose events have completed; their events become this pool's
  /// spares. Throws DeviceError (leaving the pool consistent) when a query fails.
  void process_events(Device& device);
  /// Waits for every pending event and caches the blocks. Throws DeviceError on failure.
  void synchronize_events(Device& device);
  /// Takes one of this pool's spare events (recorded and completed before); false if none.
  /// Frees on another stream cycle their events through the pool they free into, so that the
  /// cross-stream path needs neither the allocator-wide event pool nor its lock.
  bool take_spare_event(Event* event) noexcept {
    if (spare_events_.empty()) return false;
    *event = spare_events_.back();
    spare_events_.pop_back();
    return true;
  }
  /// Keeps an event for reuse by this pool.
  void keep_spare_event(Event event) { spare_events_.push_back(event); }
  /// Gives up every spare event (to the allocator's event pool, before the pool is destroyed).
  std::vector<Event> drain_spare_events() noexcept { return std::move(spare_events_); }

  // --- segments (pool lock and global lock held) -------------------------------------------------

  /// Adopts a new segment obtained from the device; returns its single free block (indexed).
  /// `page_size` != 0: an expandable segment (reserved address space, no page mapped yet).
  Block* add_new_segment(std::uintptr_t base, std::size_t size, bool large,
                         std::size_t page_size = 0);
  /// Counts pages mapped into (`bytes` > 0) or unmapped from one of this pool's expandable
  /// segments in its reserved bytes.
  void count_mapped(bool small, std::int64_t bytes) noexcept {
    if (bytes >= 0) {
      stats_.inc(StatKind::reserved_bytes, small, bytes);
    } else {
      stats_.dec(StatKind::reserved_bytes, small, -bytes);
    }
    publish_stats();
  }
  /// Removes a whole free segment's block from the cache and forgets the segment; returns it.
  /// `count_as_freed`: false when the segment moves to another pool.
  Segment* remove_whole_segment(Block* b, bool count_as_freed);
  /// Takes over a segment removed from another pool (its single block free).
  void adopt_segment(Segment* segment);
  /// Whole free segments of one kind (a list through whole_next).
  Block* whole_free(bool small) const noexcept { return whole_[small ? 0 : 1]; }
  /// The lookup count of a kind (ages of cached blocks for garbage collection).
  std::uint64_t lookups(bool small) const noexcept { return lookups_[small ? 0 : 1]; }

  /// Replaces the size policy (the allocator falling back from the engine to classic segments,
  /// before this pool holds any segment).
  void reset_policy(const SizePolicy& policy) noexcept {
    CISTERN_ASSERT_INTERNAL(segments_ == nullptr);
    policy_ = policy;
  }
  const SizePolicy& policy() const noexcept { return policy_; }

  // --- observation (pool lock held) --------------------------------------------------------------

  /// Parked blocks (all sizes).
  std::size_t parked_count() const noexcept;
  /// Whether `b` is on the parking list of its size.
  bool is_parked_here(const Block* b) const noexcept;

  const PoolStats& stats() const noexcept { return stats_; }
  PoolStats& stats() noexcept { return stats_; }
  Segment* segments() const noexcept { return segments_; }
  std::size_t segment_count() const noexcept { return segment_count_; }
  const BlockIndex& index(bool small) const noexcept { return indexes_[small ? 0 : 1]; }
  /// Blocks of this pool that are allocated.
  std::size_t allocated_count() const noexcept { return allocated_count_; }
  /// Entries in the pool's pointer map (allocated_count() when consistent).
  std::size_t mapped_count() const noexcept { return allocated_.size(); }
  const std::vector<PendingQueue>& pending() const noexcept { return pending_; }
  std::size_t pending_count() const noexcept { return pending_count_; }
  /// allocated_bytes of this pool, readable without the lock.
  std::int64_t allocated_bytes_relaxed() const noexcept {
    return allocated_mirror_.load(std::memory_order_relaxed);
  }
  /// Whether the pool's blocks in use hold more than crowded_from (Note [Fine cuts] in vmm.cpp;
  /// Reservation::crowded_from). Under the pool lock.
  bool crowded() const noexcept {
    return allocated_mirror_.load(std::memory_order_relaxed) >
           crowded_from_.load(std::memory_order_relaxed);
  }
  /// Sets the engine's crowding threshold for this pool (Reservation::crowded_from), under the
  /// global lock.
  void set_crowded_from(std::size_t bytes) noexcept {
    crowded_from_.store(static_cast<std::int64_t>(std::min<std::size_t>(bytes, INT64_MAX)),
                        std::memory_order_relaxed);
  }
  /// The largest cached free block of a kind (0 if none); with the engine, the longest stretch
  /// of one that lies on mapped pages (address space alone serves nothing).
  std::size_t largest_free(bool small) const noexcept;

 private:
  BlockIndex& index(bool small) noexcept { return indexes_[small ? 0 : 1]; }
  SharedStats* shared() const noexcept { return shared_.load(std::memory_order_relaxed); }
  CISTERN_HOT void after_hot_operation() noexcept {
    SharedStats* sh = shared();
    if (sh != nullptr && (exact_peaks_ || stats_.due_for_publishing())) stats_.publish(*sh);
  }

  // Allocation bookkeeping: the pointer map and the statistics of a block handed out.
  CISTERN_HOT void hand_out(Block* b, std::size_t requested, bool small) {
    b->state = BlockState::allocated;
    b->requested = requested;
    allocated_.insert(b->addr, b);
    ++allocated_count_;
    const auto size = static_cast<std::int64_t>(b->size);
    stats_.inc(StatKind::allocation, small, 1);
    stats_.inc(StatKind::allocated_bytes, small, size);
    stats_.inc(StatKind::requested_bytes, small, static_cast<std::int64_t>(requested));
    if (stats_.any_pending()) stats_.track_activity_peaks();
    if (policy_.is_oversize(b->size)) stats_.add_oversize_allocations(1);
    mirror_allocated(size);
  }
  CISTERN_HOT void end_allocation(Block* b, bool small) noexcept {
    CISTERN_ASSERT_INTERNAL(b->state == BlockState::allocated && allocated_count_ > 0);
    const auto size = static_cast<std::int64_t>(b->size);
    stats_.dec(StatKind::allocation, small, 1);
    stats_.dec(StatKind::allocated_bytes, small, size);
    stats_.dec(StatKind::requested_bytes, small, static_cast<std::int64_t>(b->requested));
    if (policy_.is_oversize(b->size)) stats_.add_oversize_allocations(-1);
    mirror_allocated(-size);
    --allocated_count_;
  }
  // The activity statistics are derived (pool_stats.hpp): retiring changes none of them.
  CISTERN_HOT void retire(Block* b, bool small) noexcept {
    b->requested = 0;
    if (!b->stream_uses.empty()) b->stream_uses.clear();
    if (small && park_small_blocks_ && !b->is_whole_segment() && park(b)) return;
    b->state = BlockState::free;
    coalesce(b, small);
  }
  void mirror_allocated(std::int64_t delta) noexcept {
    allocated_mirror_.store(allocated_mirror_.load(std::memory_order_relaxed) + delta,
                            std::memory_order_relaxed);
  }
  CISTERN_HOT bool park(Block* b) noexcept {
    const std::size_t bin = b->size >> park_shift_;
    if (parked_count_[bin] >= kParkLimit) return false;
    if (parked_count_[bin]++ == 0 && !parked_listed_[bin]) {
      parked_listed_[bin] = 1;
      parked_bins_.push_back(static_cast<std::uint32_t>(bin));
    }
    b->state = BlockState::parked;
    b->left = parked_[bin];
    parked_[bin] = b;
    count_split(b, true);
    return true;
  }
  // inactive_split bookkeeping of a free or parked block of a split segment.
  CISTERN_HOT void count_split(Block* b, bool small) noexcept {
    b->counted_split = true;
    stats_.inc(StatKind::inactive_split, small, 1);
    stats_.inc(StatKind::inactive_split_bytes, small, static_cast<std::int64_t>(b->size));
  }
  CISTERN_HOT void uncount_split(Block* b, bool small) noexcept {
    b->counted_split = false;
    stats_.dec(StatKind::inactive_split, small, 1);
    stats_.dec(StatKind::inactive_split_bytes, small, static_cast<std::int64_t>(b->size));
  }

  // Pending bookkeeping: the block's state and statistics, and one entry of a stream's queue.
  CISTERN_HOT void begin_pending(Block* b, std::size_t events) noexcept {
    b->state = BlockState::pending;
    b->pending_events = static_cast<std::uint32_t>(events);
    stats_.begin_pending(!b->segment->large, static_cast<std::int64_t>(b->size),
                         static_cast<std::int64_t>(b->requested));
  }
  CISTERN_HOT void enqueue(Block* b, Event event, Stream user) {
    PendingQueue* queue = nullptr;
    for (PendingQueue& q : pending_) {
      if (q.stream == user) {
        queue = &q;
        break;
      }
    }
    if (queue == nullptr) queue = &add_queue(user);  // the first free on `user`
    queue->entries.push_back(PendingFree{event, b});
    ++pending_count_;
  }
  PendingQueue& add_queue(Stream user);

  // Index bookkeeping: the block index, the whole-segment list and inactive_split. `small`: the
  // block's segment is not large (passed down rather than read again through b->segment, which
  // every store to a block makes the compiler reload).
  void index_block(Block* b, bool small) noexcept;
  void unindex(Block* b, bool small) noexcept;
  void list(Block* b, bool small) noexcept;    // index_block's bookkeeping beside the BlockIndex
  void unlist(Block* b, bool small) noexcept;  // unindex's bookkeeping beside the BlockIndex
  void split(Block* b, std::size_t size, bool small);
  void coalesce(Block* b, bool small) noexcept;
  void absorb(Block* into, Block* gone, bool small) noexcept;
  void join(Block* into, Block* gone) noexcept;
  void link_segment(Segment* s);  // throws (nothing linked) if the region table cannot grow
  void unlink_segment(Segment* s) noexcept;

  SizePolicy policy_;  // a copy: one load per size rule on the hot path
  std::atomic<SharedStats*>& shared_;
  std::atomic<HistoryLog*>& history_;
  BlockIndex indexes_[2];  // small, large
  Block* whole_[2] = {nullptr, nullptr};
  RegionTable& regions_;  // the allocator's map of regions to pools (segment links update it)
  PtrMap allocated_;      // this pool's allocated blocks by address
  std::size_t allocated_count_ = 0;
  std::vector<PendingQueue> pending_;
  std::size_t pending_count_ = 0;
  std::vector<Event> spare_events_;  // completed events, reused by frees into this pool
  Segment* segments_ = nullptr;
  std::size_t segment_count_ = 0;
  std::uint64_t lookups_[2] = {0, 0};
  PoolStats stats_;
  BlockArena arena_;
  const bool park_small_blocks_;
  const bool exact_peaks_;
  // Parking lists, one per exact small size (size >> park_shift_), linked through Block::left.
  unsigned park_shift_;
  std::vector<Block*> parked_;
  std::vector<std::uint8_t> parked_count_;
  std::vector<std::uint8_t> parked_listed_;  // the bin is in parked_bins_
  std::vector<std::uint32_t> parked_bins_;   // bins that may hold parked blocks
  std::atomic<std::int64_t> allocated_mirror_{0};
  std::atomic<std::int64_t> crowded_from_{INT64_MAX};
};

// --- the block bookkeeping of the hot path, inline -------------------------------------------------
// Every pair of a cache hit splits and coalesces: these run inside allocate and deallocate
// rather than as calls (a call and its register saves cost as much as the work).

CISTERN_HOT void StreamPool::list(Block* b, bool small) noexcept {
  CISTERN_ASSERT_INTERNAL(small == !b->segment->large);
  b->gc_base = lookups_[small ? 0 : 1];
  if (!b->is_whole_segment()) {
    count_split(b, small);
    return;
  }
  Block*& head = whole_[small ? 0 : 1];
  b->whole_prev = nullptr;
  b->whole_next = head;
  if (head != nullptr) head->whole_prev = b;
  head = b;
}

CISTERN_HOT void StreamPool::unlist(Block* b, bool small) noexcept {
  CISTERN_ASSERT_INTERNAL(small == !b->segment->large);
  if (b->counted_split) {
    uncount_split(b, small);
    return;
  }
  Block*& head = whole_[small ? 0 : 1];
  if (b->whole_prev != nullptr) b->whole_prev->whole_next = b->whole_next;
  else head = b->whole_next;
  if (b->whole_next != nullptr) b->whole_next->whole_prev = b->whole_prev;
  b->whole_prev = b->whole_next = nullptr;
}

// Cuts the indexed free block `b` to `size` and takes it out of the index; the rest becomes a
// new free block right after it, indexed in b's place (BlockIndex::replace: usually no search).
CISTERN_HOT void StreamPool::split(Block* b, std::size_t size, bool small) {
  Block* rest = arena_.make();
  rest->addr = b->addr + size;
  rest->size = b->size - size;
  rest->segment = b->segment;
  rest->prev = b;
  rest->next = b->next;
  if (b->next != nullptr) b->next->prev = rest;
  b->next = rest;
  unlist(b, small);
  index(small).replace(b, rest);  // b still has its old size (its index key)
  b->size = size;
  list(rest, small);
}

// The block list and sizes of absorb; leaves `gone` itself (its index key) untouched.
CISTERN_HOT void StreamPool::join(Block* into, Block* gone) noexcept {
  if (gone->addr < into->addr) {
    into->addr = gone->addr;
    into->prev = gone->prev;
    if (into->prev != nullptr) into->prev->next = into;
    else into->segment->head = into;
  } else {
    into->next = gone->next;
    if (into->next != nullptr) into->next->prev = into;
  }
  into->size += gone->size;
}

CISTERN_HOT void StreamPool::coalesce(Block* b, bool small) noexcept {
  Block* prev = b->prev != nullptr && b->prev->is_free() ? b->prev : nullptr;
  Block* next = b->next != nullptr && b->next->is_free() ? b->next : nullptr;
  if ((prev == nullptr) == (next == nullptr)) {  // no free neighbour, or two
    if (prev != nullptr) absorb(b, prev, small);
    if (next != nullptr) absorb(b, next, small);
    index_block(b, small);
    return;
  }
  // One free neighbour (the common case): the merged block takes its place in the index.
  Block* gone = prev != nullptr ? prev : next;
  unlist(gone, small);
  join(b, gone);
  index(small).replace(gone, b);
  arena_.recycle_merged(gone);
  list(b, small);
}

}  // namespace cistern::detail
