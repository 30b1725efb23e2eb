// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// What the miss path does with cached memory, for both backings (segments.cpp, vmm.cpp): taking a
// cached segment over from another stream, and giving memory back (oversize release, garbage
// collection, the full release of the out-of-memory path and of empty_cache). Everything here
// runs under the global lock.
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

// Pool lock held; the device has no room for the request. Moves the best-fitting whole free
// segment of another stream's pool into this one. The segment may still be in use by work already
// submitted to its stream, so this stream is first made to wait for that work with an event (on
// the device; the host does not block).
bool CachingAllocator::Impl::take_over_segment(StreamPool& pool, std::size_t size, bool small) {
  Block* best = nullptr;
  StreamPool* owner = nullptr;
  std::unique_lock<detail::SpinLock> owner_lock;
  for (const auto& other : pools_.all()) {
    if (other.get() == &pool) continue;
    std::unique_lock<detail::SpinLock> lock(other->mutex);
    other->flush_parked();  // parked blocks keep segments from looking whole
    bool improved = false;
    for (Block* b = other->whole_free(small); b != nullptr; b = b->whole_next) {
      if (b->size < size || !policy_.may_serve(b->size, size)) continue;
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
  ++counters_.cross_stream_reuse;
  return true;
}

// Pool lock held. PyTorch's release of oversize cached blocks (only with max_split_size): free
// the smallest whole oversize block of this pool that covers the request, or else the largest
// ones until they add up to it.
bool CachingAllocator::Impl::release_oversize(StreamPool& pool, std::size_t size) {
  if (!policy_.limits_splits()) return false;  // not set, or the engine (which ignores it)
  const std::size_t needed = std::max(size, config_.max_split_size);
  std::vector<Block*> oversize;
  for (Block* b = pool.whole_free(false); b != nullptr; b = b->whole_next) {
    if (policy_.is_oversize(b->size)) oversize.push_back(b);
  }
  std::sort(oversize.begin(), oversize.end(), before);
  const auto fit = std::find_if(oversize.begin(), oversize.end(),
                                [&](const Block* b) { return b->size >= needed; });
  if (fit != oversize.end()) return backing_->release_segment(pool, *fit).ok();
  std::size_t released = 0;
  for (auto it = oversize.rbegin(); it != oversize.rend() && released < needed; ++it) {
    const std::size_t bytes = (*it)->size;
    if (backing_->release_segment(pool, *it).ok()) released += bytes;
  }
  return released >= needed;
}

// Waits for every pending free of every pool, then returns every whole free segment to the
// device, and what the backing holds under the cached free blocks of the others (the engine's
// handles; PyTorch unmaps the free pages of its expandable segments here too). `held`: a pool
// whose lock the caller holds. Returns the releases that failed.
detail::Releases CachingAllocator::Impl::release_cache(const StreamPool* held, bool asked) {
  AllPoolsLock locks(pools_, held);
  ++counters_.sync_all_streams;
  for (const auto& pool : pools_.all()) {
    pool->synchronize_events(device_);
    pool->flush_parked();
  }
  detail::Releases releases;
  for (const auto& pool : pools_.all()) {
    for (const bool small : {true, false}) {
      Block* b = pool->whole_free(small);
      while (b != nullptr) {
        Block* next = b->whole_next;
        releases += backing_->release_segment(*pool, b);
        b = next;
      }
    }
  }
  releases += backing_->release_rest(asked);
  return releases;
}

void CachingAllocator::Impl::empty_cache() {
  std::lock_guard<std::mutex> global(mutex_);
  const detail::Releases releases = release_cache(nullptr, /*asked=*/true);
  if (!releases.ok()) {
    throw DeviceError("deallocate",
                      fmt::format("cistern: empty_cache: {} segment(s) or handle(s) could not be "
                                  "returned to the device and stay cached; last failure: {}",
                                  releases.failures, releases.last_error));
  }
}

// Pool `held` locked. PyTorch's garbage collection: when reserved memory is above the threshold
// fraction of the allowed maximum, free whole cached large segments that have gone unused the
// longest (age = lookups of their pool since they were cached), oldest-first by rounds of the
// average age, until back under the threshold; then, with the engine, handles under cached free
// blocks (largest first) for what is still above it.
void CachingAllocator::Impl::collect_garbage(const StreamPool* held) {
  const std::size_t allowed = reservation_.allowed;
  if (allowed == SIZE_MAX) return;  // as in PyTorch, only with a fraction or a limit
  const auto threshold =
      static_cast<std::size_t>(config_.garbage_collection_threshold * static_cast<double>(allowed));
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
      // The memory it holds: an expandable segment's block is its whole address range, of which
      // only the mapped part was reserved memory.
      const std::size_t bytes = c.block->segment->mapped_bytes();
      if (backing_->release_segment(*c.pool, c.block).ok()) reclaimed += bytes;
      total_age -= c.age;
      --left;
      c.block = nullptr;
      progress = true;
    }
    if (!progress) break;
  }
  // The engine: handles under free blocks of the segments that stay (cached memory there is
  // not a whole segment, so PyTorch's rounds above never reach it).
  if (reclaimed < target) backing_->collect(target - reclaimed);
}

namespace detail {

void wait_for_stream(const BackingContext& ctx, Stream stream) {
  Event event;
  try {
    event = ctx.events.acquire();
  } catch (const DeviceError&) {
    ++ctx.counters.reclaim_syncs;
    check_device(ctx.device, ctx.device.synchronize_stream(stream), DeviceOp::synchronize_stream);
    return;
  }
  Status status = ctx.device.record_event(event, stream);
  if (status == Status::ok) status = ctx.device.query_event(event);
  if (status == Status::not_ready) {
    ++ctx.counters.reclaim_syncs;
    status = ctx.device.synchronize_event(event);
  }
  ctx.events.release(event);
  if (status != Status::ok) {
    // Unmapping without knowing the work is done would be unsafe: fall back to the stream.
    ++ctx.counters.reclaim_syncs;
    check_device(ctx.device, ctx.device.synchronize_stream(stream), DeviceOp::synchronize_stream);
  }
}

}  // namespace detail

}  // namespace cistern
