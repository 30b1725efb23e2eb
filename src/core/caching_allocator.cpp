// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CachingAllocator: construction and the request paths (allocate, deallocate, record_stream).
#include "cistern/caching_allocator.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "allocator_impl.hpp"
#include "device_call.hpp"
#include "memory_limit.hpp"

namespace cistern {

using detail::Block;
using detail::StreamPool;

namespace {

// mapped_for's test of an expandable segment with unmapped granules under the first `used` bytes
// of `b`, out of line so that the test of a fully mapped segment stays short.
__attribute__((noinline)) bool part_mapped(const Block& b, std::size_t used,
                                           bool crowded) noexcept {
  const detail::Segment& s = *b.segment;
  if (!s.expandable) return true;
  if (s.split_needs_backing(b.addr, b.addr + used, b.addr + b.size, crowded)) return false;
  return s.pages_mapped(b.addr, b.addr + used);
}

// Whether a split of the mapped block `b` after `used` bytes must first give a handle back (the
// slow path), out of line: only in an expandable segment with kSpan or kFine handles, or while
// the pool is crowded.
__attribute__((noinline)) bool cut_gives_back(const Block& b, std::size_t used,
                                              bool crowded) noexcept {
  const detail::Segment& s = *b.segment;
  return s.expandable && s.split_needs_backing(b.addr, b.addr + used, b.addr + b.size, crowded);
}

// Whether the cached block `b` can serve `size` on the hot path: always in a classic segment; in
// an expandable one, when the granules under the part handed out (the block, or its first `size`
// bytes when it is split: map_for's range) are all mapped, and a split never cuts a handle that
// reaches over several pages (the page rule: the slow path gives it back first) nor ends inside a
// handle made near the limit, or any handle while the pool is crowded, that goes on under the
// free rest (a fine cut). The rest of the segment does not matter, so the engine adds nothing to
// a hit on mapped memory but, on a split, a counter and the pool's bytes in use.
CISTERN_HOT bool mapped_for(const detail::SizePolicy& policy, const Block& b, std::size_t size,
                            bool small, const StreamPool& pool) noexcept {
  const detail::Segment& s = *b.segment;
  const std::size_t used = policy.should_split(b.size, size, small, s.expandable) ? size : b.size;
  if (b.addr + used <= s.mapped_end) {
    return used == b.size || ((s.spans | s.fines) == 0 && !pool.crowded()) ||
           !cut_gives_back(b, used, pool.crowded());
  }
  return part_mapped(b, used, pool.crowded());
}

}  // namespace

// --- PoolTable ----------------------------------------------------------------------------------------

void PoolTable::add(std::unique_ptr<StreamPool> pool) {
  StreamPool* raw = pool.get();
  all_.push_back(std::move(pool));
  if (all_.size() == 1) {
    first_stream_ = raw->stream.handle;
    first_.store(raw, std::memory_order_release);
  }
  std::size_t i = slot_of(raw->stream);
  for (std::size_t probes = 0; probes < kSlots; ++probes, i = (i + 1) & (kSlots - 1)) {
    if (slots_[i].load(std::memory_order_relaxed) == nullptr) {
      slots_[i].store(raw, std::memory_order_release);
      return;
    }
  }
  std::unique_lock<std::shared_mutex> lock(overflow_mutex_);
  overflow_.emplace(raw->stream.handle, raw);
}

StreamPool* PoolTable::find_overflow(Stream stream) const {
  std::shared_lock<std::shared_mutex> lock(overflow_mutex_);
  const auto it = overflow_.find(stream.handle);
  return it == overflow_.end() ? nullptr : it->second;
}

AllPoolsLock::AllPoolsLock(const PoolTable& pools, const StreamPool* held) {
  for (const auto& pool : pools.all()) {
    if (pool.get() == held) continue;
    pool->mutex.lock();
    locked_.push_back(&pool->mutex);
  }
}

AllPoolsLock::~AllPoolsLock() {
  for (detail::SpinLock* m : locked_) m->unlock();
}

// --- construction ---------------------------------------------------------------------------------------

CachingAllocator::Impl::Impl(Device& device, Config config)
    : device_(device), config_(std::move(config)), policy_(config_), events_(device) {
  config_.validate();
  if (config_.pass_through) {
    throw InvalidArgument(
        "cistern: CachingAllocator always caches; pass_through:True (CISTERN_NO_CACHING=1) is "
        "served by PassThroughAllocator - make_allocator(device, config) picks it");
  }
  MemoryInfo info;
  if (device_.memory_info(&info) == Status::ok) reservation_.device_total = info.total;
  update_allowed();
  choose_backing();
}

void CachingAllocator::Impl::choose_backing() {
  const bool supported = device_.supports_virtual_memory();
  if (config_.vmm == Config::Vmm::on && !supported) {
    throw InvalidArgument(fmt::format(
        "cistern: vmm:True, but device {} ({}) does not support virtual memory; use vmm:auto or "
        "vmm:False",
        device_.index(), device_.name()));
  }
  // expandable_segments:True asks for the engine as vmm:True does, but (as in PyTorch) falls
  // back to classic segments where the device cannot map pages.
  const bool wanted = config_.vmm != Config::Vmm::off;
  vmm_ = supported && wanted;
  if (wanted && !supported) {
    vmm_note_ =
        fmt::format("device {} ({}) has no virtual memory", device_.index(), device_.name());
  }
  backing_ = vmm_ ? detail::make_mapped_handles(backing_context())
                  : detail::make_segments(backing_context());
  if (vmm_) policy_ = policy_.for_engine();
  trims_ = vmm_ && config_.release_threshold != SIZE_MAX;
}

// Global lock held, no segment of the engine's yet. The device refused a virtual-memory call at
// the engine's first growth (MIG, vGPU, a driver without the API): classic segments from now on.
void CachingAllocator::Impl::fall_back_to_segments(const std::string& why, const StreamPool* held) {
  if (config_.vmm == Config::Vmm::on) {
    throw DeviceError("map", fmt::format("cistern: vmm:True, but device {} ({}) refused the "
                                         "virtual-memory engine: {}",
                                         device_.index(), device_.name(), why));
  }
  vmm_note_ = fmt::format(
      "device {} ({}) refused the virtual-memory engine at its first growth, "
      "so cistern uses cudaMalloc segments: {}",
      device_.index(), device_.name(), why);
  vmm_ = false;
  trims_ = false;
  // max_split_size is read under a pool's lock (a split, the oversize rules): every pool is
  // locked while it changes. The rounding, which the cache-hit path reads before it locks its
  // pool, is the same in both policies and is not written.
  AllPoolsLock locks(pools_, held);
  policy_.leave_engine(config_);
  for (const auto& pool : pools_.all()) pool->reset_policy(policy_);
  // Kept, not destroyed: this runs inside a call the engine made.
  retired_backing_ = std::move(backing_);
  backing_ = detail::make_segments(backing_context());
}

// The backing's grow, and the fallback to classic segments when the engine is refused at its first
// growth (the request is then served by a segment).
Block* CachingAllocator::Impl::grow(StreamPool& pool, std::size_t size, bool small) {
  const detail::Growth growth = backing_->grow(pool, size, small);
  if (growth.block != nullptr || growth.refusal.empty()) return growth.block;
  fall_back_to_segments(growth.refusal, &pool);
  return backing_->grow(pool, size, small).block;
}

Block* CachingAllocator::Impl::reclaim_and_grow(StreamPool& pool, std::size_t size, bool small) {
  const detail::Growth growth = backing_->reclaim_and_grow(pool, size, small);
  if (growth.block != nullptr || growth.refusal.empty()) return growth.block;
  fall_back_to_segments(growth.refusal, &pool);
  return backing_->grow(pool, size, small).block;
}

detail::BackingContext CachingAllocator::Impl::backing_context() {
  return {device_,      config_,   policy_, pools_,
          reservation_, counters_, events_, detail::HistorySink(history_)};
}

CachingAllocator::Impl::~Impl() {
  std::lock_guard<std::mutex> global(mutex_);
  try {
    release_cache(nullptr);
  } catch (const Error&) {
    // The device is failing (or, with CUDA, already shut down): what is left is its to reclaim.
  }
  // The pools' spare events go to the event pool, whose destructor destroys them.
  for (const auto& pool : pools_.all()) {
    for (Event e : pool->drain_spare_events()) events_.release(e);
  }
}

void CachingAllocator::Impl::update_allowed() {
  reservation_.allowed = detail::allowed_bytes(config_, reservation_.device_total);
}

void CachingAllocator::Impl::set_memory_fraction(double fraction) {
  detail::check_memory_fraction(fraction);
  std::lock_guard<std::mutex> global(mutex_);
  config_.memory_fraction = fraction;
  update_allowed();
}

StreamPool& CachingAllocator::Impl::create_pool(Stream stream) {
  std::lock_guard<std::mutex> global(mutex_);
  if (StreamPool* pool = pools_.find(stream)) return *pool;
  if (pools_.all().size() == 1) {
    // A second pool: from now on allocator-wide peaks need the shared counters. Seed them from
    // the first pool under its lock, so that no update of it is lost in between.
    StreamPool& first = *pools_.all().front();
    std::lock_guard<detail::SpinLock> lock(first.mutex);
    Stats first_stats;
    first.stats().export_to(first_stats);
    shared_stats_.seed(first_stats);
    first.stats().mark_published();
    shared_.store(&shared_stats_, std::memory_order_relaxed);
  }
  auto pool = std::make_unique<StreamPool>(stream, policy_, config_, shared_, history_, regions_);
  pool->set_crowded_from(reservation_.crowded_from.load(std::memory_order_relaxed));
  StreamPool& ref = *pool;
  pools_.add(std::move(pool));
  return ref;
}

std::size_t CachingAllocator::Impl::allocated_bytes() const noexcept {
  // Reading the list of pools needs the global lock; the per-pool mirrors need none.
  std::lock_guard<std::mutex> global(mutex_);
  std::int64_t total = 0;
  for (const auto& pool : pools_.all()) total += pool->allocated_bytes_relaxed();
  return static_cast<std::size_t>(total);
}

// --- allocate -------------------------------------------------------------------------------------------

void* CachingAllocator::Impl::allocate(std::size_t bytes, Stream stream) {
  void* p = allocate_block(bytes, stream);
  if (p != nullptr)
    record(HistoryEntry::Action::alloc, reinterpret_cast<std::uintptr_t>(p), bytes, stream);
  return p;
}

CISTERN_HOT void* CachingAllocator::Impl::allocate_block(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  if (bytes > detail::kMaxRequest) throw_impossible_size(bytes);
  StreamPool& pool = pool_for(stream);
  const std::size_t size = policy_.round(bytes);
  const bool small = policy_.is_small(size);
  {
    std::lock_guard<detail::SpinLock> lock(pool.mutex);
    if (pool.has_pending()) pool.process_events(device_);
    if (small) {
      if (void* p = pool.take_parked(size, bytes)) return p;
    }
    // A block with pages missing is mapped on the slow path.
    Block* b = pool.find(size, small);
    if (b != nullptr && mapped_for(policy_, *b, size, small, pool)) {
      return pool.take(b, size, bytes);
    }
  }
  return allocate_slow(pool, size, bytes, small);
}

// A miss: what PyTorch does, in its order, for classic segments and the engine alike (only how
// memory is obtained and given back differs: Backing), with two steps added - taking over a
// cached segment from another stream when the device has no room, and (the engine) reclaiming
// the memory under cached free blocks before releasing the whole cache.
void* CachingAllocator::Impl::allocate_slow(StreamPool& pool, std::size_t size, std::size_t bytes,
                                            bool small) {
  std::lock_guard<std::mutex> global(mutex_);
  std::lock_guard<detail::SpinLock> lock(pool.mutex);
  if (pool.has_pending()) pool.process_events(device_);
  if (small) {
    if (void* p = pool.take_parked(size, bytes)) return p;  // freed meanwhile
  }
  if (Block* b = backing_->cached_fit(pool, size, small)) return pool.take(b, size, bytes);
  // Coalesce what is parked before anything that would need more memory.
  pool.flush_parked();
  if (Block* b = backing_->cached_fit(pool, size, small)) return pool.take(b, size, bytes);
  if (config_.garbage_collection_threshold > 0.0) collect_garbage(&pool);
  if (Block* b = grow(pool, size, small)) return pool.take(b, size, bytes);
  // The device is full: a cached segment of another stream is better than freeing the cache.
  // Only then: while there is room, each stream keeps its own cache, so that streams in a steady
  // state never take memory from each other (nor order one after the other's work).
  if (config_.cross_stream_reuse && take_over_segment(pool, size, small)) {
    if (Block* b = backing_->cached_fit(pool, size, small)) return pool.take(b, size, bytes);
  }
  if (release_oversize(pool, size)) {
    if (Block* b = grow(pool, size, small)) return pool.take(b, size, bytes);
  }
  if (Block* b = reclaim_and_grow(pool, size, small)) return pool.take(b, size, bytes);
  // Last resort: wait for every pending free, return the whole cache to the device, retry.
  ++counters_.alloc_retries;
  release_cache(&pool);
  if (Block* b = backing_->cached_fit(pool, size, small)) return pool.take(b, size, bytes);
  if (Block* b = grow(pool, size, small)) return pool.take(b, size, bytes);
  // The best fit cannot be backed even now: any free block of the pool that can (Backing).
  if (Block* b = backing_->last_resort(pool, size, small)) return pool.take(b, size, bytes);
  throw_out_of_memory(pool, bytes, size, policy_.segment_size(size), small);
}

// --- deallocate -----------------------------------------------------------------------------------------

// Pool lock held; `b` extracted from the pointer map. Caches the block at once unless another
// stream may still use it.
CISTERN_HOT void CachingAllocator::Impl::free_block(StreamPool& pool, Block* b, Stream stream) {
  if (b->stream_uses.empty() && stream == pool.stream) {
    if (detail::HistoryLog* log = history_.load(std::memory_order_relaxed)) {
      log->add(HistoryEntry::Action::free_requested, b->addr, b->requested, stream);
      log->add(HistoryEntry::Action::free_completed, b->addr, b->requested, stream);
    }
    pool.release(b);
    return;
  }
  free_with_events(pool, b, stream);
}

// free_block's other case, out of line so that the same-stream free stays short: the block
// waits for events of other streams (or, if none can be recorded, for those streams now).
void CachingAllocator::Impl::free_with_events(StreamPool& pool, Block* b, Stream stream) {
  const std::uintptr_t addr = b->addr;
  const std::size_t requested = b->requested;
  // Freed on another stream, used by none: usually one event (free_after_one_stream).
  if ((b->stream_uses.empty() && free_after_one_stream(pool, b, stream)) ||
      free_with_uses(pool, b, stream)) {
    record(HistoryEntry::Action::free_requested, addr, requested, stream);
  } else {
    record(HistoryEntry::Action::free_requested, addr, requested, stream);
    record(HistoryEntry::Action::free_completed, addr, requested, stream);
  }
}

void CachingAllocator::Impl::deallocate(void* ptr, Stream stream) {
  if (ptr == nullptr) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  bool freed = false;
  if (StreamPool* pool = pools_.find(stream)) {  // the common case: freed on its own stream
    std::lock_guard<detail::SpinLock> lock(pool->mutex);
    if (Block* b = pool->extract_allocated(addr)) {
      free_block(*pool, b, stream);
      freed = true;
    }
  }
  // Another stream's block (the region table names its owner), or misuse.
  if (!freed) {
    auto [pool, b] = lock_owner(addr, /*take=*/true, /*exact=*/false);
    if (pool != nullptr) {
      std::lock_guard<detail::SpinLock> lock(pool->mutex, std::adopt_lock);
      free_block(*pool, b, stream);
      freed = true;
    }
  }
  if (!freed) deallocate_slow(addr, stream);
  // With a release threshold a free may give memory back (no pool lock may be held for that).
  if (trims_) {
    std::lock_guard<std::mutex> global(mutex_);  // backing_ is read and replaced under it
    backing_->trim();
  }
}

namespace {

// Locks `pool` and looks for its allocated block at `addr` (taking it out of the map if `take`);
// keeps the lock only when the block is there.
Block* lock_if_allocated(StreamPool& pool, std::uintptr_t addr, bool take) noexcept {
  pool.mutex.lock();
  Block* b = take ? pool.extract_allocated(addr) : pool.find_allocated(addr);
  if (b == nullptr) pool.mutex.unlock();
  return b;
}

}  // namespace

std::pair<StreamPool*, Block*> CachingAllocator::Impl::lock_owner(std::uintptr_t addr, bool take,
                                                                  bool exact) const noexcept {
  // Whatever the table says, the pool's own map decides: a pool found stale (its segment here
  // taken over meanwhile, which never happens to a segment with an allocated block) has no
  // block at `addr`.
  const detail::RegionOwners owners = regions_.owners(addr);
  for (StreamPool* pool : owners.pools) {
    if (pool == nullptr) continue;
    if (Block* b = lock_if_allocated(*pool, addr, take)) return {pool, b};
  }
  if (exact && owners.crowded) {
    for (const auto& pool : pools_.all()) {
      if (Block* b = lock_if_allocated(*pool, addr, take)) return {pool.get(), b};
    }
  }
  return {nullptr, nullptr};
}

std::pair<StreamPool*, Block*> CachingAllocator::Impl::lock_found(
    std::uintptr_t addr) const noexcept {
  if (auto found = lock_owner(addr, /*take=*/false, /*exact=*/false); found.first != nullptr) {
    return found;
  }
  std::lock_guard<std::mutex> global(mutex_);
  return lock_owner(addr, /*take=*/false, /*exact=*/true);
}

std::pair<StreamPool*, Block*> CachingAllocator::Impl::lock_allocated(std::uintptr_t addr,
                                                                      const char* what) const {
  const auto found = lock_found(addr);
  if (found.first == nullptr) {
    std::lock_guard<std::mutex> global(mutex_);  // the pool table may grow meanwhile
    throw_invalid_pointer(addr, what);
  }
  return found;
}

// Misuse, a pointer of a crowded region, or a block freed by another thread while this one
// looked for it: under the global lock, free it if it is still allocated, else say what the
// pointer is.
void CachingAllocator::Impl::deallocate_slow(std::uintptr_t addr, Stream stream) {
  std::lock_guard<std::mutex> global(mutex_);
  auto [pool, b] = lock_owner(addr, /*take=*/true, /*exact=*/true);
  if (pool == nullptr) throw_invalid_pointer(addr, "deallocate");
  std::lock_guard<detail::SpinLock> lock(pool->mutex, std::adopt_lock);
  free_block(*pool, b, stream);
}

// Pool lock held; `b` extracted. Records an event on every other stream that used the block (and
// on the freeing stream if it is not the block's own); the block is cached once they have all
// completed, and true is returned. If events cannot be recorded, waits for those streams now
// instead and caches the block at once (false); if even that fails, throws with the block still
// allocated. The events come from the pool's spares first: in a steady state this path allocates
// nothing and takes no lock but the pool's.
bool CachingAllocator::Impl::free_with_uses(StreamPool& pool, Block* b, Stream stream) {
  // Scratch lists, reused by every free of this thread (cleared first: a throw may leave them).
  thread_local std::vector<Stream> streams;
  thread_local std::vector<Event> recorded;
  streams.assign(b->stream_uses.begin(), b->stream_uses.end());
  recorded.clear();
  if (stream != pool.stream && std::find(streams.begin(), streams.end(), stream) == streams.end()) {
    streams.push_back(stream);
  }
  try {
    for (Stream s : streams) {
      Event event;
      if (!pool.take_spare_event(&event)) event = events_.acquire();
      recorded.push_back(event);
      detail::check_device(device_, device_.record_event(event, s), DeviceOp::record_event);
    }
  } catch (const DeviceError&) {
    for (Event e : recorded) events_.release(e);
    for (Stream s : streams) {
      const Status status = device_.synchronize_stream(s);
      if (status != Status::ok) {
        pool.restore(b);
        detail::throw_device_error(device_, status, DeviceOp::synchronize_stream);
      }
    }
    pool.release(b);
    return false;
  } catch (...) {  // out of host memory: give the block back to its owner untouched
    for (Event e : recorded) events_.release(e);
    pool.restore(b);
    throw;
  }
  pool.end_allocation(b);
  pool.make_pending(b, recorded, streams);
  return true;
}

// Pool lock held; `b` extracted, used by no stream but its own, freed on `stream` (another one):
// the common cross-stream free. With a spare event of the pool it records that one event and
// makes the block pending, with no scratch list and no lock; true if it did. Otherwise (no spare
// event, or the record failed) nothing has changed and free_with_uses takes the general path.
bool CachingAllocator::Impl::free_after_one_stream(StreamPool& pool, Block* b, Stream stream) {
  Event event;
  if (!pool.take_spare_event(&event)) return false;
  if (device_.record_event(event, stream) != Status::ok) {
    events_.release(event);  // the general path reports or works around the failure
    return false;
  }
  pool.end_allocation(b);
  pool.make_pending(b, event, stream);
  return true;
}

void CachingAllocator::Impl::record_stream(void* ptr, Stream stream) {
  auto [pool, b] = lock_allocated(reinterpret_cast<std::uintptr_t>(ptr), "record_stream");
  std::lock_guard<detail::SpinLock> lock(pool->mutex, std::adopt_lock);
  if (stream == pool->stream) return;  // the allocating stream is always waited for
  auto& uses = b->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
}

std::size_t CachingAllocator::Impl::allocation_size(void* ptr) const {
  auto [pool, b] = lock_allocated(reinterpret_cast<std::uintptr_t>(ptr), "allocation_size");
  std::lock_guard<detail::SpinLock> lock(pool->mutex, std::adopt_lock);
  return b->size;
}

std::optional<std::size_t> CachingAllocator::Impl::requested_size(void* ptr) const noexcept {
  auto [pool, b] = lock_found(reinterpret_cast<std::uintptr_t>(ptr));
  if (pool == nullptr) return std::nullopt;
  std::lock_guard<detail::SpinLock> lock(pool->mutex, std::adopt_lock);
  return b->requested;
}

std::pair<void*, std::size_t> CachingAllocator::Impl::base_allocation(void* ptr) const {
  auto [pool, b] = lock_allocated(reinterpret_cast<std::uintptr_t>(ptr), "base_allocation");
  std::lock_guard<detail::SpinLock> lock(pool->mutex, std::adopt_lock);
  return {reinterpret_cast<void*>(b->segment->base), b->segment->size};
}

// --- history --------------------------------------------------------------------------------------------

void CachingAllocator::Impl::record_history(bool enabled, std::size_t max_entries) {
  std::lock_guard<std::mutex> global(mutex_);
  if (!enabled) {
    history_.store(nullptr);
    return;
  }
  // Logs are kept until the allocator dies: a thread may still be appending to the old one.
  history_logs_.push_back(std::make_unique<detail::HistoryLog>(max_entries));
  history_.store(history_logs_.back().get());
}

std::vector<HistoryEntry> CachingAllocator::Impl::history() const {
  std::lock_guard<std::mutex> global(mutex_);
  return history_logs_.empty() ? std::vector<HistoryEntry>{} : history_logs_.back()->entries();
}

// --- errors ---------------------------------------------------------------------------------------------

// Global lock held. Says what the pointer is, as precisely as the segments allow.
void CachingAllocator::Impl::throw_invalid_pointer(std::uintptr_t addr, const char* what) const {
  for (const auto& pool : pools_.all()) {
    std::lock_guard<detail::SpinLock> lock(pool->mutex);
    for (const detail::Segment* s = pool->segments(); s != nullptr; s = s->next) {
      if (addr < s->base || addr >= s->base + s->size) continue;
      const Block* b = s->head;
      while (b->addr + b->size <= addr) b = b->next;
      if (b->addr == addr && b->state == detail::BlockState::pending) {
        throw InvalidPointer(fmt::format(
            "cistern: {}({:#x}): double free: the block was already freed and is waiting for "
            "other streams' work",
            what, addr));
      }
      if (b->addr == addr) {
        throw InvalidPointer(fmt::format(
            "cistern: {}({:#x}): double free: the block was already freed and is cached", what,
            addr));
      }
      throw InvalidPointer(fmt::format(
          "cistern: {}({:#x}): the pointer lies {} bytes inside the {} block at {:#x}; pass the "
          "pointer that allocate() returned",
          what, addr, addr - b->addr,
          b->state == detail::BlockState::allocated ? "allocated" : "free", b->addr));
    }
  }
  throw InvalidPointer(fmt::format(
      "cistern: {}({:#x}): not allocated by this allocator (device {}); was it allocated by "
      "another allocator, or on another device?",
      what, addr, device_.index()));
}

void CachingAllocator::Impl::throw_impossible_size(std::size_t bytes) {
  OutOfMemoryInfo info;
  info.device = device_.index();
  info.requested = bytes;
  {
    std::lock_guard<std::mutex> global(mutex_);
    ++counters_.ooms;
  }
  throw OutOfMemory(info, fmt::format("cistern: out of memory on device {}: tried to allocate "
                                      "{} bytes, more than any device has (the limit is {})",
                                      info.device, bytes, format_bytes(detail::kMaxRequest)));
}

// Global and pool lock held.
void CachingAllocator::Impl::throw_out_of_memory(StreamPool& pool, std::size_t bytes,
                                                 std::size_t size, std::size_t segment,
                                                 bool small) {
  ++counters_.ooms;
  OutOfMemoryInfo info;
  info.device = device_.index();
  info.requested = bytes;
  info.rounded = size;
  info.segment = segment;
  info.reserved = reserved_bytes();
  for (const auto& p : pools_.all()) {
    info.allocated += static_cast<std::uint64_t>(p->allocated_bytes_relaxed());
  }
  info.cached = info.reserved - info.allocated;
  info.largest_free = pool.largest_free(small);
  info.limit = reservation_.allowed == SIZE_MAX ? 0 : reservation_.allowed;
  MemoryInfo mem;
  if (device_.memory_info(&mem) == Status::ok) {
    info.device_total = mem.total;
    info.device_free = mem.free;
  }
  record(HistoryEntry::Action::oom, info.device_free, size, pool.stream);
  std::string message = fmt::format(
      "cistern: out of memory on device {}. Tried to allocate {} (a request of {} bytes, rounded "
      "to {}). The device has a total capacity of {} of which {} is free.",
      info.device, format_bytes(segment), bytes, format_bytes(size),
      format_bytes(info.device_total), format_bytes(info.device_free));
  if (info.limit != 0) {
    message += fmt::format(" cistern may reserve at most {} (memory fraction or limit).",
                           format_bytes(info.limit));
  }
  message += fmt::format(
      " Of the {} reserved by cistern, {} is allocated and {} is cached but cannot serve this "
      "request (the largest cached free block of its pool on this stream is {}).",
      format_bytes(info.reserved), format_bytes(info.allocated), format_bytes(info.cached),
      format_bytes(info.largest_free));
  if (info.cached * 4 > info.reserved) {
    message +=
        " Much reserved memory is unallocated (fragmentation): try "
        "CISTERN_ALLOC_CONF=max_split_size_mb:<MiB> so that large cached blocks are not cut "
        "for small requests, or free memory and call empty_cache() between phases.";
  } else {
    message +=
        " Nearly all reserved memory is in use: reduce the working set (for example the "
        "batch size) or free what is no longer needed.";
  }
  throw OutOfMemory(info, message);
}

// --- the public class -------------------------------------------------------------------------------------

CachingAllocator::CachingAllocator(Device& device, Config config)
    : impl_(std::make_unique<Impl>(device, std::move(config))) {}
CachingAllocator::~CachingAllocator() = default;

void* CachingAllocator::allocate(std::size_t bytes, Stream stream) {
  return impl_->allocate(bytes, stream);
}
void CachingAllocator::deallocate(void* ptr, Stream stream) { impl_->deallocate(ptr, stream); }
void CachingAllocator::record_stream(void* ptr, Stream stream) {
  impl_->record_stream(ptr, stream);
}
void CachingAllocator::empty_cache() { impl_->empty_cache(); }
Stats CachingAllocator::stats() const { return impl_->stats(); }
void CachingAllocator::reset_peak_stats() { impl_->reset_peak_stats(); }
void CachingAllocator::reset_accumulated_stats() { impl_->reset_accumulated_stats(); }
Snapshot CachingAllocator::snapshot() const { return impl_->snapshot(); }
int CachingAllocator::device_index() const noexcept { return impl_->device().index(); }
std::string CachingAllocator::name() const { return "cistern"; }
std::size_t CachingAllocator::allocation_size(void* ptr) const {
  return impl_->allocation_size(ptr);
}

std::optional<std::size_t> CachingAllocator::requested_size(void* ptr) const noexcept {
  return impl_->requested_size(ptr);
}
std::pair<void*, std::size_t> CachingAllocator::base_allocation(void* ptr) const {
  return impl_->base_allocation(ptr);
}
std::size_t CachingAllocator::reserved_bytes() const noexcept { return impl_->reserved_bytes(); }
std::size_t CachingAllocator::allocated_bytes() const noexcept { return impl_->allocated_bytes(); }
bool CachingAllocator::uses_virtual_memory() const noexcept { return impl_->uses_vmm(); }
std::string CachingAllocator::virtual_memory_note() const { return impl_->virtual_memory_note(); }
const Config& CachingAllocator::config() const noexcept { return impl_->config(); }
Device& CachingAllocator::device() const noexcept { return impl_->device(); }
void CachingAllocator::set_memory_fraction(double fraction) {
  impl_->set_memory_fraction(fraction);
}
void CachingAllocator::check() const { impl_->check(); }
void CachingAllocator::record_history(bool enabled, std::size_t max_entries) {
  impl_->record_history(enabled, max_entries);
}
std::vector<HistoryEntry> CachingAllocator::history() const { return impl_->history(); }

}  // namespace cistern
