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

/// PyTorch's BlockPool: the free blocks of the small or the large pool, all streams.
struct BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}

  /// Caches a free block and starts its garbage-collection age.
  void insert_into_blocks(Block* block) {
    block->gc_count_base = get_free_blocks_call_count;
    blocks.insert(block);
  }

  std::set<Block*, BlockComparatorSize> blocks;
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
    const auto it = pool.blocks.lower_bound(&p.search_key);
    if (it == pool.blocks.end() || (*it)->stream != p.stream()) return false;
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
    if (block->pool->is_small) return remaining >= config_.min_block_size;
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
      pool.insert_into_blocks(remaining);
      if (already_split) {
        // An inactive split block shrinks by `size`.
        update_stat(StatKind::inactive_split_bytes, pool, -signed_size(size));
      } else {
        // A whole segment becomes split: its rest is a new inactive split block.
        update_stat(StatKind::inactive_split_bytes, pool, signed_size(remaining->size));
        update_stat(StatKind::inactive_split, pool, 1);
      }
    } else if (already_split) {
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
    update_stat(StatKind::inactive_split, pool, net_change_inactive_split_blocks);
    update_stat(StatKind::inactive_split_bytes, pool, net_change_inactive_split_size);
    update_stat(StatKind::active, pool, -1);
    update_stat(StatKind::active_bytes, pool, -signed_size(original_block_size));
    update_stat(StatKind::requested_bytes, pool, -signed_size(requested_size));
  }

  /// Merges `src` into `dst` if `src` is a free neighbour; returns the bytes taken over.
  std::size_t try_merge_blocks(Block* dst, Block* src, BlockPool& pool) {
    if (src == nullptr || src->allocated || src->event_count > 0 || !src->stream_uses.empty()) {
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
    pool.blocks.erase(src);
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
    if (it != pool.blocks.end() && (*it)->stream == p.stream()) {
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
      total_released += (*cur)->size;
      release_block(*cur);
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

  void release_blocks(BlockPool& pool) {
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* block = *it;
      ++it;
      if (!block->is_split()) release_block(block);
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
      if (!block->is_split()) {
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
        if (!block->is_split() && static_cast<double>(block->gc_count()) >= age_threshold) {
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

  /// Every block: the cached ones of both pools and the active ones.
  std::vector<Block*> all_blocks() const {
    std::vector<Block*> blocks(active_blocks_.begin(), active_blocks_.end());
    blocks.insert(blocks.end(), large_blocks_.blocks.begin(), large_blocks_.blocks.end());
    blocks.insert(blocks.end(), small_blocks_.blocks.begin(), small_blocks_.blocks.end());
    return blocks;
  }

  /// The first block of every segment, by address.
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
  detail::SizePolicy sizes_{config_};  // round_size and get_allocation_size
  mutable std::mutex mutex_;

  BlockPool large_blocks_{false};
  BlockPool small_blocks_{true};
  std::unordered_map<std::uintptr_t, Block*> allocated_blocks_;  // PyTorch shards it 67 ways
  std::unordered_set<Block*> active_blocks_;                     // allocated or pending
  std::map<Stream, std::deque<std::pair<Event, Block*>>> cuda_events_;
  std::vector<Event> event_pool_;

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
  // Take the free block out, cut it into [before][block][after], and cache the two free ends.
  pool.blocks.erase(block);
  if (block->is_split()) {
    update_stat(StatKind::inactive_split, pool, -1);
    update_stat(StatKind::inactive_split_bytes, pool, -signed_size(block->size));
  }
  if (block->ptr < begin) {
    Block* before = new Block(stream, begin - block->ptr, &pool, block->ptr);
    before->prev = block->prev;
    if (before->prev != nullptr) before->prev->next = before;
    before->next = block;
    block->prev = before;
    block->ptr = begin;
    block->size -= before->size;
    pool.insert_into_blocks(before);
    update_stat(StatKind::inactive_split, pool, 1);
    update_stat(StatKind::inactive_split_bytes, pool, signed_size(before->size));
  }
  if (block->size > size) {
    Block* after = new Block(stream, block->size - size, &pool, begin + size);
    after->next = block->next;
    if (after->next != nullptr) after->next->prev = after;
    after->prev = block;
    block->next = after;
    block->size = size;
    pool.insert_into_blocks(after);
    update_stat(StatKind::inactive_split, pool, 1);
    update_stat(StatKind::inactive_split_bytes, pool, signed_size(after->size));
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
  for (const Block* head : segment_heads()) {
    SegmentInfo segment;
    segment.device = device_.index();
    segment.address = head->ptr;
    segment.stream = head->stream;
    segment.is_large = !head->pool->is_small;
    for (const Block* block = head; block != nullptr; block = block->next) {
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
  for (Block* block = head; block != nullptr; block = block->next) {
    ++blocks_seen;
    segment_size += block->size;
    const std::string where = fmt::format("block {:#x} of segment {:#x}", block->ptr, head->ptr);
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
      if (block->is_split()) {
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
  add(StatKind::segment, 1);
  add(StatKind::reserved_bytes, segment_size);
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
