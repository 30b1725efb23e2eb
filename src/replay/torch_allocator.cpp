// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// TorchAllocator: PyTorch's DeviceCachingAllocator, emulated (see torch_allocator.hpp).
//
// Written from the description of PyTorch's behaviour in
// ../shared/reference/pytorch-caching-allocator.md, not from its code. The names of the data
// structures and of the functions of `Impl` are PyTorch's, so that the two can be read side by
// side: Block, BlockPool, AllocParams; malloc, free, get_free_block, alloc_block,
// alloc_found_block, should_split, free_block, try_merge_blocks, release_available_cached_blocks,
// release_cached_blocks, release_blocks, release_block, garbage_collect_cached_blocks,
// process_events, insert_events, synchronize_and_free_events.
//
// Invariants (checked by `check()`):
// * the blocks of a segment tile it in address order through prev/next, all of one stream and
//   one pool; a segment is a block with no prev;
// * every block is in exactly one place: its pool's `blocks` set (free: not allocated, no
//   pending events, no stream uses) or `active_blocks` (allocated, or freed and waiting for
//   events); allocated blocks are also in `allocated_blocks`, by address;
// * two free neighbours never coexist (free_block merges them at once);
// * the statistics equal what the blocks say (`inactive_split` counts free blocks of split
//   segments, `requested_bytes` the callers' sizes of active blocks, ...).
#include "replay/torch_allocator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cistern/errors.hpp"
#include "core/size_policy.hpp"

namespace cistern::replay {
namespace {

/// Requests of this size or more fail at once ("more than 1EB").
constexpr std::uint64_t kOneExaByte = std::uint64_t{1} << 60;

struct BlockPool;
struct ExpandableSegment;

/// PyTorch's Block: a piece of a segment, free, allocated or pending.
struct Block {
  Block(Stream stream_, std::size_t size_, BlockPool* pool_, std::uintptr_t ptr_)
      : stream(stream_), size(size_), pool(pool_), ptr(ptr_) {}

  Stream stream;                   ///< the allocation stream (of the segment's pool)
  std::set<Stream> stream_uses;    ///< other streams that used it (record_stream)
  std::size_t size;                ///< block size
  std::size_t requested_size = 0;  ///< the caller's size, while allocated or pending
  BlockPool* pool;
  std::uintptr_t ptr;
  bool allocated = false;
  Block* prev = nullptr;  ///< neighbours inside the same segment
  Block* next = nullptr;
  int event_count = 0;             ///< outstanding events of stream uses
  std::int64_t gc_count_base = 0;  ///< the pool's get_free_block count when it was cached
  /// Expandable segments: whether pages back the block (unmapped blocks are address space
  /// only, kept in the pool's `unmapped` set), and the segment (null: a cudaMalloc segment).
  bool mapped = true;
  ExpandableSegment* expandable = nullptr;

  bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
  std::int64_t gc_count() const noexcept;
};

/// Free blocks ordered by (stream, size, address): lower_bound finds the best fit on a stream.
struct BlockComparatorSize {
  bool operator()(const Block* a, const Block* b) const noexcept {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

/// Unmapped ranges ordered by (stream, address): the lowest hole of a stream comes first.
struct BlockComparatorAddress {
  bool operator()(const Block* a, const Block* b) const noexcept {
    if (a->stream != b->stream) return a->stream < b->stream;
    return a->ptr < b->ptr;
  }
};

/// PyTorch's ExpandableSegment: one address reservation of 1.125 x the device's memory, backed
/// page by page (2 MiB in the small pool, the large segment size in the large pool) on demand.
struct ExpandableSegment {
  std::uintptr_t base = 0;
  std::size_t size = 0;  ///< reserved bytes, a whole number of pages
  std::size_t page = 0;
  std::map<std::size_t, PhysicalHandle> handles;  ///< by page index, while mapped (sparse:
                                                  ///< a reservation may span terabytes)
};

/// PyTorch's BlockPool: the free blocks of the small or the large pool, all streams.
struct BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}

  /// Caches a free block and starts its garbage-collection age.
  void insert_into_blocks(Block* block) {
    block->gc_count_base = get_free_blocks_call_count;
    blocks.insert(block);
  }

  std::set<Block*, BlockComparatorSize> blocks;
  std::set<Block*, BlockComparatorAddress> unmapped;  ///< expandable address space, no pages
  const bool is_small;
  std::int64_t get_free_blocks_call_count = 0;
};

std::int64_t Block::gc_count() const noexcept {
  return pool->get_free_blocks_call_count - gc_count_base;
}

/// One request on its way through malloc.
struct AllocParams {
  AllocParams(std::size_t size, Stream stream, BlockPool* pool_, std::size_t alloc_size_)
      : search_key(stream, size, pool_, 0), pool(pool_), alloc_size(alloc_size_) {}
  std::size_t size() const noexcept { return search_key.size; }
  Stream stream() const noexcept { return search_key.stream; }

  Block search_key;  ///< (stream, rounded size, address 0)
  BlockPool* pool;
  std::size_t alloc_size;  ///< the segment to obtain on a miss
  Block* block = nullptr;  ///< the result
  Status err = Status::ok;
};

std::uintptr_t address_of(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }
void* pointer_to(std::uintptr_t address) { return reinterpret_cast<void*>(address); }
std::int64_t signed_size(std::size_t bytes) { return static_cast<std::int64_t>(bytes); }

/// PyTorch's format_size: each unit up to and including its limit ("1024 bytes", "1024.00 KiB").
std::string format_size(std::uint64_t size) {
  const auto scaled = [size](std::uint64_t unit) {
    return static_cast<double>(size) / static_cast<double>(unit);
  };
  if (size <= KiB) return fmt::format("{} bytes", size);
  if (size <= MiB) return fmt::format("{:.2f} KiB", scaled(KiB));
  if (size <= GiB) return fmt::format("{:.2f} MiB", scaled(MiB));
  return fmt::format("{:.2f} GiB", scaled(GiB));
}

}  // namespace

// --- the allocator's state ----------------------------------------------------------------------

class TorchAllocator::Impl {
 public:
  Impl(Device& device, Config config) : device_(device), config_(std::move(config)) {
    config_.validate();
    stats_.max_split_size = static_cast<std::int64_t>(config_.max_split_size);  // SIZE_MAX: -1
    if (config_.memory_fraction < 1.0 || config_.memory_limit > 0) {
      set_memory_fraction(config_.memory_fraction);
    }
  }

  ~Impl() {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      release_cached_blocks();
    } catch (...) {  // the device failed: what it still holds is lost with it
    }
    for (const Event event : event_pool_) (void)device_.destroy_event(event);
    for (Block* block : all_blocks()) delete block;
  }

  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // --- the public operations, each under the lock ---------------------------------------------------

  void* allocate(std::size_t bytes, Stream stream) {
    if (bytes == 0) return nullptr;
    if (bytes >= kOneExaByte) {
      OutOfMemoryInfo info;
      info.device = device_.index();
      info.requested = bytes;
      throw OutOfMemory(info, "CUDA out of memory. Tried to allocate more than 1EB memory.");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    Block* block = malloc(bytes, stream);
    allocated_blocks_.emplace(block->ptr, block);
    return pointer_to(block->ptr);
  }

  void deallocate(void* ptr, Stream stream) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    Block* block = get_allocated_block(ptr, "deallocate");
    allocated_blocks_.erase(block->ptr);
    // PyTorch's free takes no stream: freeing on another stream means that stream used it.
    if (stream != block->stream) block->stream_uses.insert(stream);
    free(block);
  }

  void record_stream(void* ptr, Stream stream) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    Block* block = get_allocated_block(ptr, "record_stream");
    // Uses on the allocation stream need no synchronisation.
    if (stream == block->stream) return;
    block->stream_uses.insert(stream);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached_blocks();
  }

  Stats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  std::size_t reserved_bytes() const noexcept { return reserved_.load(std::memory_order_relaxed); }

  void reset_peak_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& row : stats_.array) {
      for (Stat& stat : row) stat.peak = stat.current;
    }
    stats_.oversize_allocations.peak = stats_.oversize_allocations.current;
    stats_.oversize_segments.peak = stats_.oversize_segments.current;
  }

  void reset_accumulated_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& row : stats_.array) {
      for (Stat& stat : row) stat.allocated = stat.freed = 0;
    }
    for (Stat* stat : {&stats_.oversize_allocations, &stats_.oversize_segments}) {
      stat->allocated = stat->freed = 0;
    }
    stats_.num_alloc_retries = stats_.num_ooms = stats_.num_sync_all_streams = 0;
    stats_.num_device_alloc = stats_.num_device_free = 0;
  }

  void set_memory_fraction(double fraction) {
    MemoryInfo info;
    if (device_.memory_info(&info) != Status::ok) throw_device_error("memory_info");
    std::lock_guard<std::mutex> lock(mutex_);
    set_fraction_ = true;
    allowed_memory_maximum_ = static_cast<std::size_t>(fraction * static_cast<double>(info.total));
    if (config_.memory_limit > 0) {
      allowed_memory_maximum_ = std::min(allowed_memory_maximum_, config_.memory_limit);
    }
  }

  Snapshot snapshot() const;
  void check() const;
  void adopt_segment(void* ptr, std::size_t bytes, Stream stream, bool is_large);
  std::size_t expandable_reservation_bytes(bool is_large);
  void adopt_reservation(void* base, std::size_t bytes, Stream stream, bool is_large);
  void adopt_mapped(void* ptr, std::size_t bytes);
  void* place_block(void* ptr, std::size_t requested, std::size_t block_size, Stream stream);

  const Config& config() const noexcept { return config_; }
  int device_index() const noexcept { return device_.index(); }
  std::size_t round_size(std::size_t size) const noexcept { return sizes_.round(size); }
  std::size_t get_allocation_size(std::size_t size) const noexcept {
    return sizes_.segment_size(size);
  }

 private:
  // --- malloc --------------------------------------------------------------------------------------

  /// PyTorch's DeviceCachingAllocator::malloc: returns the block (not yet in allocated_blocks).
  Block* malloc(std::size_t orig_size, Stream stream) {
    process_events();
    const std::size_t size = round_size(orig_size);
    BlockPool& pool = get_pool(size);
    const std::size_t alloc_size = get_allocation_size(size);
    AllocParams params(size, stream, &pool, alloc_size);

    // First, try to get a block from the existing pool (PyTorch then runs the free-memory
    // callbacks and searches again; there are none here).
    bool block_found = get_free_block(params);
    if (!block_found) {
      // Garbage collection only runs with a memory fraction (issue #106660).
      if (set_fraction_ && config_.garbage_collection_threshold > 0.0) {
        garbage_collect_cached_blocks();
      }
      block_found = alloc_block(params, false) ||
                    (release_available_cached_blocks(params) && alloc_block(params, false)) ||
                    (release_cached_blocks() && alloc_block(params, true));
    }
    if (!block_found) out_of_memory(params, orig_size);
    const bool split_remainder = should_split(params.block, params.size());
    return alloc_found_block(params, orig_size, split_remainder);
  }

  BlockPool& get_pool(std::size_t size) noexcept {
    return size <= config_.small_size ? small_blocks_ : large_blocks_;
  }

  /// Best fit on the request's stream, with the oversize rules of max_split_size. Takes the
  /// block out of the pool (reached through `p.pool`, hence not const).
  bool get_free_block(AllocParams& p) {  // NOLINT(readability-make-member-function-const)
    BlockPool& pool = *p.pool;
    // The age of cached blocks is tracked only when garbage collection can run.
    if (set_fraction_ && config_.garbage_collection_threshold > 0.0) {
      ++pool.get_free_blocks_call_count;
    }
    auto it = pool.blocks.lower_bound(&p.search_key);
    if (it == pool.blocks.end() || (*it)->stream != p.stream()) return false;
    if ((*it)->expandable != nullptr) {
      // A block of an expandable segment ranks by the size it can grow to: its own size plus
      // the unmapped space after it. Walk on while a later candidate would grow to less.
      const auto expandable_size = [](const Block* b) {
        return b->size + (b->next != nullptr && !b->next->mapped ? b->next->size : 0);
      };
      auto next = std::next(it);
      while ((*it)->expandable != nullptr && next != pool.blocks.end() &&
             (*next)->stream == p.stream() && expandable_size(*next) < expandable_size(*it)) {
        it = next++;
      }
    }
    // Do not return an oversize block for a request below max_split_size.
    if (p.size() < config_.max_split_size && (*it)->size >= config_.max_split_size) return false;
    // An oversize block may serve a large request only if it is not much larger.
    if (p.size() >= config_.max_split_size &&
        (*it)->size >= p.size() + config_.max_non_split_rounding) {
      return false;
    }
    p.block = *it;
    pool.blocks.erase(it);
    return true;
  }

  /// Obtains a new segment of p.alloc_size; `is_retry` counts the flush-and-retry attempt.
  bool alloc_block(AllocParams& p, bool is_retry) {
    const std::size_t size = p.alloc_size;
    if (is_retry) ++stats_.num_alloc_retries;
    if (set_fraction_ && total_allocated_memory_ + size > allowed_memory_maximum_) {
      p.err = Status::out_of_memory;
      return false;
    }
    if (expandable_) {
      p.block = try_allocate_expandable_block(p.stream(), *p.pool, p.size());
      p.err = p.block != nullptr ? Status::ok : Status::out_of_memory;
      return p.block != nullptr;
    }
    void* ptr = nullptr;
    p.err = device_.allocate(size, &ptr);
    if (p.err == Status::out_of_memory) return false;
    if (p.err != Status::ok) throw_device_error("allocate");
    ++stats_.num_device_alloc;
    p.block = new_segment(ptr, size, p.stream(), *p.pool);
    return true;
  }

  /// The block of a new segment, counted in the statistics (not yet in a pool).
  Block* new_segment(void* ptr, std::size_t size, Stream stream, BlockPool& pool) {
    set_total_allocated_memory(total_allocated_memory_ + size);
    update_stat(StatKind::segment, pool, 1);
    update_stat(StatKind::reserved_bytes, pool, signed_size(size));
    if (size >= config_.max_split_size) stats_.oversize_segments.update(1);
    return new Block(stream, size, &pool, address_of(ptr));
  }

  bool should_split(const Block* block, std::size_t size) const noexcept {
    const std::size_t remaining = block->size - size;
    // With expandable segments on, every pool splits down to 512 bytes.
    if (block->pool->is_small || expandable_) {
      return remaining >= config_.min_block_size;
    }
    return size < config_.max_split_size && remaining > config_.small_size;
  }

  /// Hands out `params.block`, splitting the front off it when asked.
  Block* alloc_found_block(AllocParams& params, std::size_t orig_size, bool split_remainder) {
    const std::size_t size = params.size();
    BlockPool& pool = *params.pool;
    Block* block = params.block;
    const bool already_split = block->is_split();
    if (split_remainder) {
      // The front becomes the new block; the old Block object keeps the rest, cached.
      Block* remaining = block;
      block = new Block(params.stream(), size, &pool, remaining->ptr);
      block->prev = remaining->prev;
      if (block->prev != nullptr) block->prev->next = block;
      block->next = remaining;
      remaining->prev = block;
      remaining->ptr += size;
      remaining->size -= size;
      block->expandable = remaining->expandable;
      pool.insert_into_blocks(remaining);
      if (block->expandable != nullptr) {
        // inactive_split leaves expandable segments out: their free pages can always go.
      } else if (already_split) {
        // An inactive split block shrinks by `size`.
        update_stat(StatKind::inactive_split_bytes, pool, -signed_size(size));
      } else {
        // A whole segment becomes split: its rest is a new inactive split block.
        update_stat(StatKind::inactive_split_bytes, pool, signed_size(remaining->size));
        update_stat(StatKind::inactive_split, pool, 1);
      }
    } else if (already_split && block->expandable == nullptr) {
      // An inactive split block becomes active.
      update_stat(StatKind::inactive_split_bytes, pool, -signed_size(block->size));
      update_stat(StatKind::inactive_split, pool, -1);
    }
    block->allocated = true;
    block->requested_size = orig_size;
    active_blocks_.insert(block);
    count_allocation(*block);
    return block;
  }

  /// The statistics of a block becoming allocated (alloc_found_block's last step).
  void count_allocation(const Block& block) {
    const BlockPool& pool = *block.pool;
    update_stat(StatKind::allocation, pool, 1);
    update_stat(StatKind::allocated_bytes, pool, signed_size(block.size));
    update_stat(StatKind::active, pool, 1);
    update_stat(StatKind::active_bytes, pool, signed_size(block.size));
    update_stat(StatKind::requested_bytes, pool, signed_size(block.requested_size));
    if (block.size >= config_.max_split_size) stats_.oversize_allocations.update(1);
  }

  [[noreturn]] void out_of_memory(const AllocParams& params, std::size_t orig_size);

  // --- free ----------------------------------------------------------------------------------------

  /// PyTorch's free: the block stops being allocated; it is cached now, or once the events of
  /// its other streams complete.
  void free(Block* block) {
    block->allocated = false;
    const BlockPool& pool = *block->pool;
    update_stat(StatKind::allocation, pool, -1);
    update_stat(StatKind::allocated_bytes, pool, -signed_size(block->size));
    if (block->size >= config_.max_split_size) stats_.oversize_allocations.update(-1);
    if (!block->stream_uses.empty()) {
      insert_events(block);
    } else {
      free_block(block);
    }
  }

  /// Caches a block whose every use is complete, merged with its free neighbours.
  void free_block(Block* block) {
    const std::size_t original_block_size = block->size;
    const std::size_t requested_size = block->requested_size;
    BlockPool& pool = *block->pool;
    std::int64_t net_change_inactive_split_blocks = 0;
    std::int64_t net_change_inactive_split_size = 0;
    for (Block* candidate : std::array<Block*, 2>{block->prev, block->next}) {
      const std::size_t subsumed_size = try_merge_blocks(block, candidate, pool);
      if (subsumed_size > 0) {
        net_change_inactive_split_blocks -= 1;
        net_change_inactive_split_size -= signed_size(subsumed_size);
      }
    }
    active_blocks_.erase(block);
    block->requested_size = 0;
    pool.insert_into_blocks(block);
    if (block->is_split()) {
      net_change_inactive_split_blocks += 1;
      net_change_inactive_split_size += signed_size(block->size);
    }
    if (block->expandable == nullptr) {
      update_stat(StatKind::inactive_split, pool, net_change_inactive_split_blocks);
      update_stat(StatKind::inactive_split_bytes, pool, net_change_inactive_split_size);
    }
    update_stat(StatKind::active, pool, -1);
    update_stat(StatKind::active_bytes, pool, -signed_size(original_block_size));
    update_stat(StatKind::requested_bytes, pool, -signed_size(requested_size));
  }

  /// Merges `src` into `dst` if `src` is a free neighbour; returns the bytes taken over.
  std::size_t try_merge_blocks(Block* dst, Block* src, BlockPool& pool) {
    if (src == nullptr || src->allocated || src->event_count > 0 || !src->stream_uses.empty() ||
        src->mapped != dst->mapped) {
      return 0;
    }
    if (dst->prev == src) {
      dst->ptr = src->ptr;
      dst->prev = src->prev;
      if (dst->prev != nullptr) dst->prev->next = dst;
    } else {
      dst->next = src->next;
      if (dst->next != nullptr) dst->next->prev = dst;
    }
    const std::size_t subsumed_size = src->size;
    dst->size += subsumed_size;
    if (src->mapped) {
      pool.blocks.erase(src);
    } else {
      pool.unmapped.erase(src);
    }
    delete src;
    return subsumed_size;
  }

  // --- events of other streams (record_stream) ----------------------------------------------------

  /// Records one event per stream that used the block; the block is pending until they complete.
  void insert_events(Block* block) {
    const std::set<Stream> streams = std::move(block->stream_uses);
    block->stream_uses.clear();
    for (const Stream stream : streams) {
      const Event event = create_event_internal();
      if (device_.record_event(event, stream) != Status::ok) {
        event_pool_.push_back(event);
        throw_device_error("record_event");
      }
      ++block->event_count;
      cuda_events_[stream].emplace_back(event, block);
    }
  }

  /// Frees the blocks whose events have completed, stream by stream in FIFO order, stopping on
  /// each stream at its first event that is not ready.
  void process_events() {
    for (auto it = cuda_events_.begin(); it != cuda_events_.end();) {
      auto& queue = it->second;
      while (!queue.empty()) {
        const auto [event, block] = queue.front();
        const Status status = device_.query_event(event);
        if (status == Status::not_ready) break;
        if (status != Status::ok) throw_device_error("query_event");
        queue.pop_front();
        event_pool_.push_back(event);
        if (--block->event_count == 0) free_block(block);
      }
      it = queue.empty() ? cuda_events_.erase(it) : std::next(it);
    }
  }

  /// Waits for every outstanding event and frees the blocks they held.
  void synchronize_and_free_events() {
    ++stats_.num_sync_all_streams;
    for (auto& [stream, queue] : cuda_events_) {
      for (const auto& [event, block] : queue) {
        if (device_.synchronize_event(event) != Status::ok) throw_device_error("synchronize_event");
        event_pool_.push_back(event);
        if (--block->event_count == 0) free_block(block);
      }
    }
    cuda_events_.clear();
  }

  /// An event from the pool (PyTorch's EventPool), created on first need.
  Event create_event_internal() {
    if (!event_pool_.empty()) {
      const Event event = event_pool_.back();
      event_pool_.pop_back();
      return event;
    }
    Event event;
    if (device_.create_event(&event) != Status::ok) throw_device_error("create_event");
    return event;
  }

  // --- returning memory to the device ---------------------------------------------------------------

  /// With max_split_size: frees the smallest cached oversize segment of this stream that covers
  /// the request, or else oversize segments from the largest down until enough is freed.
  bool release_available_cached_blocks(const AllocParams& p) {
    if (config_.max_split_size == SIZE_MAX) return false;
    BlockPool& pool = *p.pool;
    Block key = p.search_key;
    key.size = std::max(key.size, config_.max_split_size);
    auto it = pool.blocks.lower_bound(&key);
    // Expandable blocks are never released here, only unmapped by release_cached_blocks.
    if (it != pool.blocks.end() && (*it)->stream == p.stream() && (*it)->expandable == nullptr) {
      release_block(*it);
      return true;
    }
    // No single block is large enough: free several, starting with the largest.
    if (it == pool.blocks.begin()) return false;
    std::size_t total_released = 0;
    --it;  // the largest block of the stream, if the stream has any
    while (total_released < key.size && (*it)->size >= config_.max_split_size &&
           (*it)->stream == p.stream()) {
      const auto cur = it;
      const bool is_first = cur == pool.blocks.begin();
      if (!is_first) --it;
      if ((*cur)->expandable == nullptr) {
        total_released += (*cur)->size;
        release_block(*cur);
      }
      if (is_first) break;
    }
    return total_released >= key.size;
  }

  /// Waits for pending frees, then returns every cached whole segment of both pools.
  bool release_cached_blocks() {
    synchronize_and_free_events();
    release_blocks(large_blocks_);
    release_blocks(small_blocks_);
    return true;
  }

  /// Returns every cached whole cudaMalloc segment, and unmaps the whole free pages of every
  /// cached block of an expandable segment (a segment left with no pages is released).
  void release_blocks(BlockPool& pool) {
    std::vector<Block*> to_unmap;
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* block = *it;
      ++it;
      if (block->expandable != nullptr) {
        to_unmap.push_back(block);  // unmapping changes the set: after the walk
      } else if (!block->is_split()) {
        release_block(block);
      }
    }
    for (Block* block : to_unmap) {
      unmap_block(block);
      if (!block->is_split()) release_expandable_segment(block);
    }
  }

  /// cudaFree of a cached whole segment.
  void release_block(Block* block) {
    if (block->is_split()) {
      throw InvariantViolation(
          fmt::format("torch: release_block({:#x}): the block is not a whole segment", block->ptr));
    }
    if (device_.deallocate(pointer_to(block->ptr)) != Status::ok) throw_device_error("deallocate");
    ++stats_.num_device_free;
    set_total_allocated_memory(total_allocated_memory_ - block->size);
    BlockPool& pool = *block->pool;
    update_stat(StatKind::segment, pool, -1);
    update_stat(StatKind::reserved_bytes, pool, -signed_size(block->size));
    if (block->size >= config_.max_split_size) stats_.oversize_segments.update(-1);
    pool.blocks.erase(block);
    delete block;
  }

  // --- expandable segments ----------------------------------------------------------------------

  /// Finds room for `size` bytes in an expandable segment of `stream` and maps what is missing:
  /// the lowest unmapped range that, with the free block just before it and the free or
  /// unmapped blocks after it, covers the request; a new segment when none does. Null when the
  /// device has no memory (or address space) left for it.
  Block* try_allocate_expandable_block(Stream stream, BlockPool& pool, std::size_t size) {
    Block* candidate = find_expandable_block(stream, pool, size);
    if (candidate == nullptr) return nullptr;
    // The candidate starts a run of free/unmapped blocks with room for `size`: unmapped, or
    // free followed by unmapped. Map from its start until the mapped block is large enough.
    if (!candidate->mapped && !map_block(candidate, std::min(candidate->size, size))) {
      return nullptr;
    }
    while (candidate->size < size) {
      Block* unmapped = candidate->next;
      // A reservation cut short by the simulated address space can end before the request.
      if (unmapped == nullptr || unmapped->mapped) return nullptr;
      if (!map_block(unmapped, std::min(size - candidate->size, unmapped->size))) return nullptr;
      candidate = unmapped;  // map_block merged it with the free block before it
    }
    pool.blocks.erase(candidate);
    return candidate;
  }

  Block* find_expandable_block(Stream stream, BlockPool& pool, std::size_t size) {
    const auto allocatable = [](const Block* b) {
      return b != nullptr && !b->allocated && b->event_count == 0 && b->stream_uses.empty();
    };
    const auto has_room = [&](const Block* b) {
      std::size_t bytes = 0;
      for (; bytes < size && allocatable(b); b = b->next) bytes += b->size;
      return bytes >= size;
    };
    Block key(stream, 0, &pool, 0);
    for (auto it = pool.unmapped.lower_bound(&key);
         it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
      Block* candidate = *it;
      // A free block just before the hole can be part of the allocation too.
      if (allocatable(candidate->prev)) candidate = candidate->prev;
      if (has_room(candidate)) return candidate;
    }
    return new_expandable_segment(stream, pool);
  }

  std::size_t page_size(const BlockPool& pool) const noexcept {
    return pool.is_small ? config_.small_segment_size : config_.large_segment_size;
  }

  /// The pages of a reservation: 1.125 x the device's memory, rounded up to whole pages.
  std::size_t reservation_pages(const BlockPool& pool) {
    MemoryInfo info;
    if (device_.memory_info(&info) != Status::ok) throw_device_error("memory_info");
    const std::size_t page = page_size(pool);
    return (info.total + info.total / 8 + page - 1) / page;
  }

  /// Reserves a new expandable segment: address space for 1.125 x the device's memory. A
  /// simulated device too large for its own address space (the unlimited probe of a capacity
  /// search) gets the largest half, quarter, ... of that which it can still reserve.
  Block* new_expandable_segment(Stream stream, BlockPool& pool) {
    const std::size_t page = page_size(pool);
    void* va = nullptr;
    for (std::size_t pages = reservation_pages(pool);; pages /= 2) {
      if (pages == 0) return nullptr;
      const Status status = device_.reserve(pages * page, 0, &va);
      if (status == Status::ok) return add_reservation(address_of(va), pages * page, stream, pool);
      if (status != Status::out_of_memory) throw_device_error("reserve");
    }
  }

  /// Takes [base, base + bytes), reserved on the device, as an expandable segment of `pool`:
  /// one unmapped block.
  Block* add_reservation(std::uintptr_t base, std::size_t bytes, Stream stream, BlockPool& pool) {
    auto segment = std::make_unique<ExpandableSegment>();
    segment->page = page_size(pool);
    segment->base = base;
    segment->size = bytes;
    Block* block = new Block(stream, segment->size, &pool, segment->base);
    block->mapped = false;
    block->expandable = segment.get();
    expandable_segments_.push_back(std::move(segment));
    pool.unmapped.insert(block);
    return block;
  }

  /// The unmapped block that holds [begin, end), or null.
  Block* find_unmapped_block_containing(std::uintptr_t begin, std::uintptr_t end) const {
    for (const BlockPool* pool : {&large_blocks_, &small_blocks_}) {
      for (Block* block : pool->unmapped) {
        if (block->ptr <= begin && end <= block->ptr + block->size) return block;
      }
    }
    return nullptr;
  }

  /// Cuts the unmapped block `block` at `at` (strictly inside it): `block` keeps the front, the
  /// returned new unmapped block the rest.
  Block* split_unmapped(Block* block, std::uintptr_t at) {
    BlockPool& pool = *block->pool;
    pool.unmapped.erase(block);
    Block* rest = new Block(block->stream, block->ptr + block->size - at, &pool, at);
    rest->mapped = false;
    rest->expandable = block->expandable;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = at - block->ptr;
    pool.unmapped.insert(block);
    pool.unmapped.insert(rest);
    return rest;
  }

  /// Maps the pages covering the first `size` bytes of the unmapped block `to_map` and caches
  /// them as a free block, merged with a free block before it. False when the device is full.
  bool map_block(Block* to_map, std::size_t size) {
    ExpandableSegment& segment = *to_map->expandable;
    const std::size_t first = (to_map->ptr - segment.base) / segment.page;
    const std::size_t pages = (size + segment.page - 1) / segment.page;
    for (std::size_t i = 0; i < pages; ++i) {
      PhysicalHandle handle;
      void* va = pointer_to(segment.base + (first + i) * segment.page);
      Status status = device_.create_physical(segment.page, &handle);
      if (status == Status::ok) {
        status = device_.map(va, handle);
        if (status != Status::ok) (void)device_.release_physical(handle);
      }
      if (status != Status::ok) {
        unmap_pages(segment, first, i);  // what this call mapped goes back
        if (status == Status::out_of_memory) return false;
        throw_device_error("map");
      }
      segment.handles.emplace(first + i, handle);
    }
    const std::size_t mapped = pages * segment.page;
    BlockPool& pool = *to_map->pool;
    pool.unmapped.erase(to_map);
    to_map->mapped = true;
    if (mapped < to_map->size) {
      // to_map -> rest (unmapped) -> to_map->next
      Block* rest = new Block(to_map->stream, to_map->size - mapped, &pool, to_map->ptr + mapped);
      rest->mapped = false;
      rest->expandable = to_map->expandable;
      rest->prev = to_map;
      rest->next = to_map->next;
      if (rest->next != nullptr) rest->next->prev = rest;
      to_map->next = rest;
      to_map->size = mapped;
      pool.unmapped.insert(rest);
    }
    try_merge_blocks(to_map, to_map->prev, pool);
    try_merge_blocks(to_map, to_map->next, pool);
    pool.insert_into_blocks(to_map);
    set_total_allocated_memory(total_allocated_memory_ + mapped);
    update_stat(StatKind::reserved_bytes, pool, signed_size(mapped));
    return true;
  }

  /// Unmaps the whole pages inside the free block `block` (after waiting for the device: an
  /// unmap does not wait for queued work); the ends that share a page with a neighbour stay.
  void unmap_block(Block* block) {
    ExpandableSegment& segment = *block->expandable;
    const std::uintptr_t begin =
        segment.base + (block->ptr - segment.base + segment.page - 1) / segment.page * segment.page;
    const std::uintptr_t end =
        segment.base + (block->ptr + block->size - segment.base) / segment.page * segment.page;
    if (begin >= end) return;
    if (device_.synchronize_device() != Status::ok) throw_device_error("synchronize_device");
    unmap_pages(segment, (begin - segment.base) / segment.page, (end - begin) / segment.page);
    BlockPool& pool = *block->pool;
    pool.blocks.erase(block);
    if (begin > block->ptr) {
      // prev -> before (free, mapped) -> block
      Block* before = new Block(block->stream, begin - block->ptr, &pool, block->ptr);
      before->expandable = block->expandable;
      before->prev = block->prev;
      if (before->prev != nullptr) before->prev->next = before;
      before->next = block;
      block->prev = before;
      pool.insert_into_blocks(before);
    }
    const std::uintptr_t block_end = block->ptr + block->size;
    if (end < block_end) {
      // block -> after (free, mapped) -> next
      Block* after = new Block(block->stream, block_end - end, &pool, end);
      after->expandable = block->expandable;
      after->next = block->next;
      if (after->next != nullptr) after->next->prev = after;
      after->prev = block;
      block->next = after;
      pool.insert_into_blocks(after);
    }
    block->ptr = begin;
    block->size = end - begin;
    block->mapped = false;
    try_merge_blocks(block, block->prev, pool);
    try_merge_blocks(block, block->next, pool);
    pool.unmapped.insert(block);
    set_total_allocated_memory(total_allocated_memory_ - (end - begin));
    update_stat(StatKind::reserved_bytes, pool, -signed_size(end - begin));
  }

  /// cuMemUnmap + cuMemRelease of `count` pages from page `first`.
  void unmap_pages(ExpandableSegment& segment, std::size_t first, std::size_t count) {
    auto it = segment.handles.lower_bound(first);
    while (it != segment.handles.end() && it->first < first + count) {
      if (device_.unmap(pointer_to(segment.base + it->first * segment.page), segment.page) !=
          Status::ok)
        throw_device_error("unmap");
      if (device_.release_physical(it->second) != Status::ok)
        throw_device_error("release_physical");
      it = segment.handles.erase(it);
    }
  }

  /// Returns the reservation of an expandable segment that has no pages left (`block` is all
  /// of it, unmapped).
  void release_expandable_segment(Block* block) {
    ExpandableSegment* segment = block->expandable;
    if (device_.release_reservation(pointer_to(segment->base), segment->size) != Status::ok)
      throw_device_error("release_reservation");
    block->pool->unmapped.erase(block);
    delete block;
    const auto owned = std::find_if(
        expandable_segments_.begin(), expandable_segments_.end(),
        [segment](const std::unique_ptr<ExpandableSegment>& s) { return s.get() == segment; });
    expandable_segments_.erase(owned);
  }

  /// Frees cached whole large segments older than the average until reserved memory is below
  /// garbage_collection_threshold x the allowed maximum; no synchronisation.
  void garbage_collect_cached_blocks() {
    const auto gc_threshold = static_cast<std::size_t>(
        config_.garbage_collection_threshold * static_cast<double>(allowed_memory_maximum_));
    if (total_allocated_memory_ <= gc_threshold) return;
    const std::size_t target_size = total_allocated_memory_ - gc_threshold;
    std::size_t gc_reclaimed = 0;
    std::int64_t total_age = 0;
    std::int64_t freeable_block_count = 0;
    for (const Block* block : large_blocks_.blocks) {
      if (!block->is_split() && block->expandable == nullptr) {
        total_age += block->gc_count();
        ++freeable_block_count;
      }
    }
    bool block_freed = true;
    while (gc_reclaimed < target_size && block_freed && freeable_block_count > 0) {
      // Blocks at least as old as the average go first, all of them in one pass.
      const double age_threshold =
          static_cast<double>(total_age) / static_cast<double>(freeable_block_count);
      block_freed = false;
      for (auto it = large_blocks_.blocks.begin(); it != large_blocks_.blocks.end();) {
        Block* block = *it;
        ++it;
        if (!block->is_split() && block->expandable == nullptr &&
            static_cast<double>(block->gc_count()) >= age_threshold) {
          block_freed = true;
          gc_reclaimed += block->size;
          total_age -= block->gc_count();
          --freeable_block_count;
          release_block(block);
        }
      }
    }
  }

  // --- helpers ----------------------------------------------------------------------------------------

  /// Updates statistic `kind` for "all" and for the pool's own class.
  void update_stat(StatKind kind, const BlockPool& pool, std::int64_t delta) noexcept {
    stats_.get(kind, StatPool::all).update(delta);
    stats_.get(kind, pool.is_small ? StatPool::small_pool : StatPool::large_pool).update(delta);
  }

  void set_total_allocated_memory(std::size_t bytes) noexcept {
    total_allocated_memory_ = bytes;
    reserved_.store(bytes, std::memory_order_relaxed);
  }

  Block* get_allocated_block(void* ptr, const char* operation) const {
    const auto found = allocated_blocks_.find(address_of(ptr));
    if (found == allocated_blocks_.end()) {
      throw InvalidPointer(fmt::format(
          "torch: {}({}): invalid device pointer: not allocated by this allocator, or already "
          "freed",
          operation, ptr));
    }
    return found->second;
  }

  [[noreturn]] void throw_device_error(const char* operation) const {
    throw DeviceError(operation, fmt::format("torch: device call {} failed: {}", operation,
                                             device_.last_error()));
  }

  /// Every block: the cached ones of both pools, the active ones and the unmapped ranges of
  /// expandable segments.
  std::vector<Block*> all_blocks() const {
    std::vector<Block*> blocks(active_blocks_.begin(), active_blocks_.end());
    for (const BlockPool* pool : {&large_blocks_, &small_blocks_}) {
      blocks.insert(blocks.end(), pool->blocks.begin(), pool->blocks.end());
      blocks.insert(blocks.end(), pool->unmapped.begin(), pool->unmapped.end());
    }
    return blocks;
  }

  /// The first block of every segment (an expandable segment's is its reservation's), by
  /// address.
  std::vector<Block*> segment_heads() const {
    std::vector<Block*> heads;
    for (Block* block : all_blocks()) {
      if (block->prev == nullptr) heads.push_back(block);
    }
    std::sort(heads.begin(), heads.end(),
              [](const Block* a, const Block* b) { return a->ptr < b->ptr; });
    return heads;
  }

  Block* find_free_block_containing(std::uintptr_t begin, std::uintptr_t end, Stream stream,
                                    const BlockPool& pool) const {
    for (Block* block : pool.blocks) {
      if (block->stream == stream && block->ptr <= begin && end <= block->ptr + block->size) {
        return block;
      }
    }
    return nullptr;
  }

  void check_segment(Block* head, Stats& expected, std::size_t& blocks_seen) const;
  void check_counts(const Stats& expected, std::size_t blocks_seen) const;

  Device& device_;
  Config config_;
  /// Expandable segments are on (PyTorch warns and goes without them on a device that has no
  /// virtual-memory API).
  const bool expandable_ = config_.expandable_segments && device_.supports_virtual_memory();
  detail::SizePolicy sizes_{config_};  // round_size and get_allocation_size
  mutable std::mutex mutex_;

  BlockPool large_blocks_{false};
  BlockPool small_blocks_{true};
  std::unordered_map<std::uintptr_t, Block*> allocated_blocks_;  // PyTorch shards it 67 ways
  std::unordered_set<Block*> active_blocks_;                     // allocated or pending
  std::map<Stream, std::deque<std::pair<Event, Block*>>> cuda_events_;
  std::vector<Event> event_pool_;
  std::vector<std::unique_ptr<ExpandableSegment>> expandable_segments_;

  Stats stats_;
  std::size_t total_allocated_memory_ = 0;  // reserved bytes
  std::atomic<std::size_t> reserved_{0};    // its copy for lock-free reads
  bool set_fraction_ = false;
  std::size_t allowed_memory_maximum_ = 0;
};

// --- out of memory ------------------------------------------------------------------------------------

void TorchAllocator::Impl::out_of_memory(const AllocParams& params, std::size_t orig_size) {
  MemoryInfo device_info;
  if (device_.memory_info(&device_info) != Status::ok) throw_device_error("memory_info");
  ++stats_.num_ooms;
  const auto allocated =
      static_cast<std::uint64_t>(stats_.get(StatKind::allocated_bytes, StatPool::all).current);
  const auto reserved =
      static_cast<std::uint64_t>(stats_.get(StatKind::reserved_bytes, StatPool::all).current);
  OutOfMemoryInfo info;
  info.device = device_.index();
  info.requested = orig_size;
  info.rounded = params.size();
  info.segment = params.alloc_size;
  info.allocated = allocated;
  info.reserved = reserved;
  info.cached = reserved - allocated;
  for (const BlockPool* pool : {&small_blocks_, &large_blocks_}) {
    for (const Block* block : pool->blocks) {
      info.largest_free = std::max<std::uint64_t>(info.largest_free, block->size);
    }
  }
  info.device_total = device_info.total;
  info.device_free = device_info.free;
  info.limit = set_fraction_ ? allowed_memory_maximum_ : 0;
  const std::string allowed_info =
      set_fraction_ ? format_size(allowed_memory_maximum_) + " allowed; " : std::string();
  throw OutOfMemory(
      info,
      fmt::format("CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of "
                  "which {} is free. {}Of the allocated memory {} is allocated by PyTorch, and {} "
                  "is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
                  "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
                  "fragmentation. See documentation for Memory Management "
                  "(https://docs.pytorch.org/docs/stable/notes/"
                  "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
                  format_size(params.alloc_size), device_.index(), format_size(device_info.total),
                  format_size(device_info.free), allowed_info, format_size(allocated),
                  format_size(reserved - allocated)));
}

// --- warm start -----------------------------------------------------------------------------------------

void TorchAllocator::Impl::adopt_segment(void* ptr, std::size_t bytes, Stream stream,
                                         bool is_large) {
  if (ptr == nullptr || bytes == 0 || bytes % config_.min_block_size != 0) {
    throw InvalidArgument(fmt::format(
        "torch: adopt_segment({}, {} bytes): needs a segment of a positive multiple of {} bytes",
        ptr, bytes, config_.min_block_size));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  BlockPool& pool = is_large ? large_blocks_ : small_blocks_;
  // Obtained before the window: counted in the reserved memory, not in num_device_alloc.
  pool.insert_into_blocks(new_segment(ptr, bytes, stream, pool));
}

std::size_t TorchAllocator::Impl::expandable_reservation_bytes(bool is_large) {
  if (!expandable_) return 0;
  const BlockPool& pool = is_large ? large_blocks_ : small_blocks_;
  return reservation_pages(pool) * page_size(pool);
}

void TorchAllocator::Impl::adopt_reservation(void* base, std::size_t bytes, Stream stream,
                                             bool is_large) {
  BlockPool& pool = is_large ? large_blocks_ : small_blocks_;
  if (!expandable_ || base == nullptr || bytes == 0 || bytes % page_size(pool) != 0) {
    throw InvalidArgument(fmt::format(
        "torch: adopt_reservation({}, {} bytes): needs expandable segments on and a positive "
        "multiple of the page ({} bytes)",
        base, bytes, page_size(pool)));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  add_reservation(address_of(base), bytes, stream, pool);
}

void TorchAllocator::Impl::adopt_mapped(void* ptr, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uintptr_t begin = address_of(ptr);
  Block* block = find_unmapped_block_containing(begin, begin + bytes);
  const std::size_t page = block == nullptr ? 0 : block->expandable->page;
  if (block == nullptr || bytes == 0 || (begin - block->expandable->base) % page != 0 ||
      bytes % page != 0) {
    throw InvalidArgument(fmt::format(
        "torch: adopt_mapped({}, {} bytes): the range is not whole pages of the unmapped space "
        "of an adopted reservation",
        ptr, bytes));
  }
  if (block->ptr < begin) block = split_unmapped(block, begin);
  if (begin + bytes < block->ptr + block->size) split_unmapped(block, begin + bytes);
  if (!map_block(block, bytes)) {
    throw InvalidArgument(fmt::format(
        "torch: adopt_mapped({}, {} bytes): the device has no memory for the pages", ptr, bytes));
  }
}

void* TorchAllocator::Impl::place_block(void* ptr, std::size_t requested, std::size_t block_size,
                                        Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t size = block_size == 0 ? round_size(requested) : block_size;
  const std::uintptr_t begin = address_of(ptr);
  // The block's pool is its segment's: the recorded state may have been rounded differently.
  Block* block = nullptr;
  if (requested > 0 && size >= requested && size % config_.min_block_size == 0) {
    block = find_free_block_containing(begin, begin + size, stream, small_blocks_);
    if (block == nullptr)
      block = find_free_block_containing(begin, begin + size, stream, large_blocks_);
  }
  if (block == nullptr) {
    throw InvalidArgument(fmt::format(
        "torch: place_block({}, requested {} bytes, block {} bytes, stream {}): the range is not "
        "inside one free block of a segment of that stream, or the block size is not a multiple "
        "of {} of at least the request",
        ptr, requested, size, stream.handle, config_.min_block_size));
  }
  BlockPool& pool = *block->pool;
  // inactive_split leaves expandable segments out.
  const auto count_inactive = [&](std::int64_t blocks, std::size_t bytes) {
    if (block->expandable != nullptr) return;
    update_stat(StatKind::inactive_split, pool, blocks);
    update_stat(StatKind::inactive_split_bytes, pool, blocks * signed_size(bytes));
  };
  // Take the free block out, cut it into [before][block][after], and cache the two free ends.
  pool.blocks.erase(block);
  if (block->is_split()) count_inactive(-1, block->size);
  if (block->ptr < begin) {
    Block* before = new Block(stream, begin - block->ptr, &pool, block->ptr);
    before->expandable = block->expandable;
    before->prev = block->prev;
    if (before->prev != nullptr) before->prev->next = before;
    before->next = block;
    block->prev = before;
    block->ptr = begin;
    block->size -= before->size;
    pool.insert_into_blocks(before);
    count_inactive(1, before->size);
  }
  if (block->size > size) {
    Block* after = new Block(stream, block->size - size, &pool, begin + size);
    after->expandable = block->expandable;
    after->next = block->next;
    if (after->next != nullptr) after->next->prev = after;
    after->prev = block;
    block->next = after;
    block->size = size;
    pool.insert_into_blocks(after);
    count_inactive(1, after->size);
  }
  block->allocated = true;
  block->requested_size = requested;
  active_blocks_.insert(block);
  allocated_blocks_.emplace(block->ptr, block);
  count_allocation(*block);
  return ptr;
}

// --- snapshot and check ------------------------------------------------------------------------------

Snapshot TorchAllocator::Impl::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Snapshot snapshot;
  // As PyTorch reports them: an expandable segment is one segment per run of mapped pages.
  std::vector<const Block*> heads;
  for (const Block* block : all_blocks()) {
    if (block->mapped && (block->prev == nullptr || !block->prev->mapped)) heads.push_back(block);
  }
  std::sort(heads.begin(), heads.end(),
            [](const Block* a, const Block* b) { return a->ptr < b->ptr; });
  for (const Block* head : heads) {
    SegmentInfo segment;
    segment.device = device_.index();
    segment.address = head->ptr;
    segment.stream = head->stream;
    segment.is_large = !head->pool->is_small;
    segment.is_expandable = head->expandable != nullptr;
    for (const Block* block = head; block != nullptr && block->mapped; block = block->next) {
      BlockInfo info;
      info.address = block->ptr;
      info.size = block->size;
      segment.total_size += block->size;
      if (block->allocated) {
        info.state = BlockState::active_allocated;
        segment.allocated_size += block->size;
      } else if (block->event_count > 0) {
        info.state = BlockState::active_pending_free;
      }
      if (info.state != BlockState::inactive) {
        info.requested_size = block->requested_size;
        segment.active_size += block->size;
        segment.requested_size += block->requested_size;
      }
      segment.blocks.push_back(info);
    }
    snapshot.segments.push_back(std::move(segment));
  }
  return snapshot;
}

namespace {

void require(bool condition, const std::string& what) {
  if (!condition) throw InvariantViolation("torch: " + what);
}

}  // namespace

/// Checks one segment's block list and adds what it holds to `expected`.
void TorchAllocator::Impl::check_segment(Block* head, Stats& expected,
                                         std::size_t& blocks_seen) const {
  const BlockPool& pool = *head->pool;
  const StatPool kind = pool.is_small ? StatPool::small_pool : StatPool::large_pool;
  const auto add = [&](StatKind stat, std::size_t delta) {
    expected.get(stat, StatPool::all).current += signed_size(delta);
    expected.get(stat, kind).current += signed_size(delta);
  };
  std::size_t segment_size = 0;
  bool previous_free = false;
  bool previous_unmapped = false;
  const bool expandable = head->expandable != nullptr;
  for (Block* block = head; block != nullptr; block = block->next) {
    ++blocks_seen;
    const std::string where = fmt::format("block {:#x} of segment {:#x}", block->ptr, head->ptr);
    require(block->expandable == head->expandable, where + " has another expandable segment");
    if (!block->mapped) {
      require(expandable && pool.unmapped.count(block) == 1 && pool.blocks.count(block) == 0 &&
                  !block->allocated && active_blocks_.count(block) == 0,
              where + " is unmapped but not filed as an unmapped range");
      require(block->next == nullptr ||
                  (block->next->prev == block && block->next->ptr == block->ptr + block->size),
              where + " is not followed by its next block");
      require(!previous_unmapped, where + " and the block before it are both unmapped");
      previous_unmapped = true;
      previous_free = false;
      continue;
    }
    previous_unmapped = false;
    segment_size += block->size;
    require(block->pool == &pool && block->stream == head->stream,
            where + " has another pool or stream than its segment");
    require(block->next == nullptr ||
                (block->next->prev == block && block->next->ptr == block->ptr + block->size),
            where + " is not followed by its next block");
    require(block->size > 0 && block->size % config_.min_block_size == 0,
            where + " has a bad size");
    const bool is_free = !block->allocated && block->event_count == 0;
    require(is_free == (pool.blocks.count(block) == 1),
            where + (is_free ? " is free but not cached" : " is cached but not free"));
    require(is_free == (active_blocks_.count(block) == 0), where + " is misfiled in active_blocks");
    require(block->allocated == (allocated_blocks_.count(block->ptr) == 1),
            where + " is misfiled in allocated_blocks");
    require(!(is_free && previous_free), where + " and the block before it are both free");
    previous_free = is_free;
    if (is_free) {
      require(block->stream_uses.empty(), where + " is free with stream uses");
      if (block->is_split() && !expandable) {
        add(StatKind::inactive_split, 1);
        add(StatKind::inactive_split_bytes, block->size);
      }
      continue;
    }
    add(StatKind::active, 1);
    add(StatKind::active_bytes, block->size);
    add(StatKind::requested_bytes, block->requested_size);
    if (block->allocated) {
      add(StatKind::allocation, 1);
      add(StatKind::allocated_bytes, block->size);
      if (block->size >= config_.max_split_size) ++expected.oversize_allocations.current;
    }
  }
  add(StatKind::reserved_bytes, segment_size);
  if (expandable) return;  // counted as mapped bytes only, never as segments
  add(StatKind::segment, 1);
  if (segment_size >= config_.max_split_size) ++expected.oversize_segments.current;
}

void TorchAllocator::Impl::check_counts(const Stats& expected, std::size_t blocks_seen) const {
  require(blocks_seen == all_blocks().size(), "a block is in no segment, or in two places");
  require(signed_size(total_allocated_memory_) ==
              expected.get(StatKind::reserved_bytes, StatPool::all).current,
          "total_allocated_memory differs from the segments' sizes");
  for (int kind = 0; kind < kStatKinds; ++kind) {
    for (int pool = 0; pool < kStatPools; ++pool) {
      const std::int64_t have = stats_.array[kind][pool].current;
      const std::int64_t want = expected.array[kind][pool].current;
      require(have == want, fmt::format("{}.{}.current is {}, the blocks say {}",
                                        to_string(static_cast<StatKind>(kind)),
                                        to_string(static_cast<StatPool>(pool)), have, want));
    }
  }
  require(stats_.oversize_allocations.current == expected.oversize_allocations.current,
          "oversize_allocations.current differs from the blocks");
  require(stats_.oversize_segments.current == expected.oversize_segments.current,
          "oversize_segments.current differs from the segments");
  std::unordered_map<const Block*, int> events;
  for (const auto& [stream, queue] : cuda_events_) {
    for (const auto& entry : queue) ++events[entry.second];
  }
  for (const Block* block : active_blocks_) {
    const auto found = events.find(block);
    require(block->event_count == (found == events.end() ? 0 : found->second),
            fmt::format("block {:#x}: event_count differs from its queued events", block->ptr));
  }
}

void TorchAllocator::Impl::check() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats expected;
  std::size_t blocks_seen = 0;
  for (Block* head : segment_heads()) check_segment(head, expected, blocks_seen);
  check_counts(expected, blocks_seen);
}

// --- TorchAllocator -----------------------------------------------------------------------------------

TorchAllocator::TorchAllocator(Device& device, Config config)
    : impl_(std::make_unique<Impl>(device, std::move(config))) {}

TorchAllocator::~TorchAllocator() = default;

void* TorchAllocator::allocate(std::size_t bytes, Stream stream) {
  return impl_->allocate(bytes, stream);
}
void TorchAllocator::deallocate(void* ptr, Stream stream) { impl_->deallocate(ptr, stream); }
void TorchAllocator::record_stream(void* ptr, Stream stream) { impl_->record_stream(ptr, stream); }
void TorchAllocator::empty_cache() { impl_->empty_cache(); }
Stats TorchAllocator::stats() const { return impl_->stats(); }
std::size_t TorchAllocator::reserved_bytes() const noexcept { return impl_->reserved_bytes(); }
void TorchAllocator::reset_peak_stats() { impl_->reset_peak_stats(); }
Snapshot TorchAllocator::snapshot() const { return impl_->snapshot(); }
int TorchAllocator::device_index() const noexcept { return impl_->device_index(); }
std::string TorchAllocator::name() const { return "torch"; }

void TorchAllocator::adopt_segment(void* ptr, std::size_t bytes, Stream stream, bool is_large) {
  impl_->adopt_segment(ptr, bytes, stream, is_large);
}
std::size_t TorchAllocator::expandable_reservation_bytes(bool is_large) {
  return impl_->expandable_reservation_bytes(is_large);
}
void TorchAllocator::adopt_reservation(void* base, std::size_t bytes, Stream stream,
                                       bool is_large) {
  impl_->adopt_reservation(base, bytes, stream, is_large);
}
void TorchAllocator::adopt_mapped(void* ptr, std::size_t bytes) { impl_->adopt_mapped(ptr, bytes); }
void* TorchAllocator::place_block(void* ptr, std::size_t requested, std::size_t block_size,
                                  Stream stream) {
  return impl_->place_block(ptr, requested, block_size, stream);
}

void TorchAllocator::set_memory_fraction(double fraction) { impl_->set_memory_fraction(fraction); }
void TorchAllocator::reset_accumulated_stats() { impl_->reset_accumulated_stats(); }
const Config& TorchAllocator::config() const noexcept { return impl_->config(); }
std::size_t TorchAllocator::round_size(std::size_t bytes) const noexcept {
  return impl_->round_size(bytes);
}
std::size_t TorchAllocator::allocation_size(std::size_t rounded) const noexcept {
  return impl_->get_allocation_size(rounded);
}
void TorchAllocator::check() const { impl_->check(); }

}  // namespace cistern::replay
