// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Device memory for the caching allocator: obtaining segments, taking a cached segment over from
// another stream, and giving memory back (oversize release, garbage collection, the full
// release of the out-of-memory path and of empty_cache). Everything here runs under the global
// lock.
#include <fmt/format.h>

#include <algorithm>

#include "allocator_impl.hpp"
#include "device_call.hpp"

namespace cistern {

using detail::Block;
using detail::StreamPool;

namespace {

bool before(const Block* a, const Block* b) noexcept {
  return a->size != b->size ? a->size < b->size : a->addr < b->addr;
}

}  // namespace

// Pool lock held. A new segment's single free block (indexed), or nullptr when the device (or
// the configured limit) has no room. Other device failures throw with nothing changed.
Block* CachingAllocator::Impl::new_segment(StreamPool& pool, std::size_t size, bool small) {
  if (exceeds_limit(size)) return nullptr;
  void* ptr = nullptr;
  const Status status = device_.allocate(size, &ptr);
  if (status == Status::out_of_memory) return nullptr;
  detail::check_device(device_, status, DeviceOp::allocate);
  ++num_device_alloc_;
  reserved_.fetch_add(size, std::memory_order_relaxed);
  record(HistoryEntry::Action::segment_alloc, reinterpret_cast<std::uintptr_t>(ptr), size,
         pool.stream);
  return pool.add_new_segment(reinterpret_cast<std::uintptr_t>(ptr), size, !small);
}

// Pool lock held; `b` is a whole free segment. Returns it to the device; on failure it stays
// cached and the reason is kept in last_release_error_.
bool CachingAllocator::Impl::release_segment(StreamPool& pool, Block* b) {
  if (b->segment->expandable) return release_expandable(pool, b);
  const std::uintptr_t base = b->segment->base;
  const std::size_t size = b->segment->size;
  const Status status = device_.deallocate(reinterpret_cast<void*>(base));
  if (status != Status::ok) {
    last_release_error_ = fmt::format("{}: {}", to_string(status), device_.last_error());
    return false;
  }
  ++num_device_free_;
  reserved_.fetch_sub(size, std::memory_order_relaxed);
  record(HistoryEntry::Action::segment_free, base, size, pool.stream);
  delete pool.remove_whole_segment(b, /*count_as_freed=*/true);
  return true;
}

// Pool lock held. Moves the best-fitting whole free segment of another stream's pool into this
// one. The segment may still be in use by work already submitted to its stream, so this stream
// is first made to wait for that work with an event (on the device; the host does not block).
// `idle_only`: take only segments their pool has left unused for kTakeOverAge of its requests,
// so that two busy streams do not keep taking the same segment from each other; without it
// (the device is full) any whole free segment will do.
bool CachingAllocator::Impl::take_over_segment(StreamPool& pool, std::size_t size, bool small,
                                               bool idle_only) {
  Block* best = nullptr;
  StreamPool* owner = nullptr;
  std::unique_lock<detail::SpinLock> owner_lock;
  for (const auto& other : pools_.all()) {
    if (other.get() == &pool) continue;
    std::unique_lock<detail::SpinLock> lock(other->mutex);
    if (!idle_only) other->flush_parked();  // parked blocks keep segments from looking whole
    bool improved = false;
    for (Block* b = other->whole_free(small); b != nullptr; b = b->whole_next) {
      if (b->size < size || !policy_.may_serve(b->size, size)) continue;
      if (idle_only && other->lookups(small) - b->gc_base < kTakeOverAge) continue;
      if (best == nullptr || before(b, best)) {
        best = b;
        improved = true;
      }
    }
    if (improved) {
      owner = other.get();
      owner_lock = std::move(lock);  // releases the previous owner's lock
    }
  }
  if (best == nullptr) return false;

  Event event;
  try {
    event = events_.acquire();
  } catch (const DeviceError&) {
    return false;  // no event, no safe take-over; the device path follows
  }
  Status status = device_.record_event(event, owner->stream);
  if (status == Status::ok) status = device_.stream_wait_event(pool.stream, event);
  events_.release(event);
  if (status != Status::ok) return false;

  detail::Segment* segment = owner->remove_whole_segment(best, /*count_as_freed=*/false);
  owner_lock.unlock();
  pool.adopt_segment(segment);
  ++num_cross_stream_reuse_;
  return true;
}

// Pool lock held. PyTorch's release of oversize cached blocks (only with max_split_size): free
// the smallest whole oversize block of this pool that covers the request, or else the largest
// ones until they add up to it.
bool CachingAllocator::Impl::release_oversize(StreamPool& pool, std::size_t size) {
  if (config_.max_split_size == SIZE_MAX) return false;
  const std::size_t needed = std::max(size, config_.max_split_size);
  std::vector<Block*> oversize;
  for (Block* b = pool.whole_free(false); b != nullptr; b = b->whole_next) {
    if (policy_.is_oversize(b->size)) oversize.push_back(b);
  }
  std::sort(oversize.begin(), oversize.end(), before);
  const auto fit = std::find_if(oversize.begin(), oversize.end(),
                                [&](const Block* b) { return b->size >= needed; });
  if (fit != oversize.end()) return release_segment(pool, *fit);
  std::size_t released = 0;
  for (auto it = oversize.rbegin(); it != oversize.rend() && released < needed; ++it) {
    const std::size_t bytes = (*it)->size;
    if (release_segment(pool, *it)) released += bytes;
  }
  return released >= needed;
}

// Waits for every pending free of every pool, then returns every whole free segment to the
// device. `held`: a pool whose lock the caller holds. Returns how many releases failed.
std::size_t CachingAllocator::Impl::release_cache(const StreamPool* held) {
  AllPoolsLock locks(pools_, held);
  ++num_sync_all_streams_;
  for (const auto& pool : pools_.all()) {
    pool->synchronize_events(device_);
    pool->flush_parked();
  }
  std::size_t failures = 0;
  for (const auto& pool : pools_.all()) {
    for (const bool small : {true, false}) {
      Block* b = pool->whole_free(small);
      while (b != nullptr) {
        Block* next = b->whole_next;
        if (!release_segment(*pool, b)) ++failures;
        b = next;
      }
    }
  }
  return failures;
}

void CachingAllocator::Impl::empty_cache() {
  std::lock_guard<std::mutex> global(mutex_);
  std::size_t failures = release_cache(nullptr);
  if (vmm_) {
    // Every page left inside a cached free block of a split segment, then every handle unused.
    reclaim_pages(nullptr, SIZE_MAX, nullptr, 0, 0, Unmap::release);
    failures += release_unused_handles();
  }
  if (failures != 0) {
    throw DeviceError("deallocate",
                      fmt::format("cistern: empty_cache: {} segment(s) or handle(s) could not be "
                                  "returned to the device and stay cached; last failure: {}",
                                  failures, last_release_error_));
  }
}

// Pool `held` locked. PyTorch's garbage collection: when reserved memory is above the threshold
// fraction of the allowed maximum, free whole cached large segments that have gone unused the
// longest (age = lookups of their pool since they were cached), oldest-first by rounds of the
// average age, until back under the threshold.
void CachingAllocator::Impl::collect_garbage(const StreamPool* held) {
  if (allowed_ == SIZE_MAX) return;  // as in PyTorch, only with a fraction or a limit
  const auto threshold = static_cast<std::size_t>(config_.garbage_collection_threshold *
                                                  static_cast<double>(allowed_));
  if (reserved_bytes() <= threshold) return;
  const std::size_t target = reserved_bytes() - threshold;

  AllPoolsLock locks(pools_, held);
  struct Candidate {
    StreamPool* pool;
    Block* block;
    std::uint64_t age;
  };
  std::vector<Candidate> candidates;
  std::uint64_t total_age = 0;
  for (const auto& pool : pools_.all()) {
    for (Block* b = pool->whole_free(false); b != nullptr; b = b->whole_next) {
      const std::uint64_t age = pool->lookups(false) - b->gc_base;
      candidates.push_back({pool.get(), b, age});
      total_age += age;
    }
  }
  std::size_t reclaimed = 0;
  std::size_t left = candidates.size();
  while (reclaimed < target && left > 0) {
    const double average = static_cast<double>(total_age) / static_cast<double>(left);
    bool progress = false;
    for (Candidate& c : candidates) {
      if (c.block == nullptr || static_cast<double>(c.age) < average || reclaimed >= target)
        continue;
      const std::size_t bytes = c.block->size;
      if (release_segment(*c.pool, c.block)) reclaimed += bytes;
      total_age -= c.age;
      --left;
      c.block = nullptr;
      progress = true;
    }
    if (!progress) break;
  }
}

}  // namespace cistern
