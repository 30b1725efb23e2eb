// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The virtual-memory engine: segments are reserved address ranges (expandable segments) placed
// and cut by the same best fit as classic ones, and physical memory is granule-sized pages mapped
// only where a block is handed out. A cached free block keeps its pages, so a steady state makes
// no device calls. When a request needs pages and no handle can be created (the device or the
// configured limit is full), pages lying entirely inside cached free blocks - of any pool - are
// unmapped and mapped where they are needed (reclaim). A page is unmapped only once the work of
// its pool's stream has completed: one event per pool, queried first and waited for only if
// still running. Everything here runs under the global lock.
#include <fmt/format.h>

#include <algorithm>

#include "allocator_impl.hpp"
#include "device_call.hpp"

namespace cistern {

using detail::Block;
using detail::Segment;
using detail::StreamPool;

namespace {

std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

void* address(const Segment& seg, std::size_t page) {
  return reinterpret_cast<void*>(seg.base + page * seg.page_size);
}

/// Calls f(i, j) for each longest run [i, j) of pages of `seg` within [first, end) that are all
/// mapped (`mapped`) or all unmapped, in address order: one device call serves each run. Stops
/// and returns false as soon as f does. f may change the pages of the run it is given.
template <class F>
bool for_each_run(const Segment& seg, std::size_t first, std::size_t end, bool mapped, F&& f) {
  const auto in_run = [&](std::size_t i) { return (seg.pages[i] != Segment::kNoPage) == mapped; };
  for (std::size_t i = first; i < end;) {
    if (!in_run(i)) {
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    while (j < end && in_run(j)) ++j;
    if (!f(i, j)) return false;
    i = j;
  }
  return true;
}

}  // namespace

std::size_t CachingAllocator::Impl::handle_size(bool large) const noexcept {
  return round_up(large ? config_.large_handle_size : config_.small_handle_size, page_size_);
}

// --- allocation -------------------------------------------------------------------------------------------

// Pool lock held. Hands out the best fit (mapping its pages), else a new expandable segment. Short
// of pages even after reclaim, waits for every pending free (they may cover pages) and tries
// once more; out of memory only when the live blocks leave no page to take. As PyTorch's, the
// cache is empty when out of memory is reported: every unused handle has gone back.
void* CachingAllocator::Impl::allocate_engine(StreamPool& pool, std::size_t size, std::size_t bytes,
                                              bool small) {
  // A request the device or the limit could never back skips the search for pages (reserving
  // its address space, scanning every pool) and goes straight to the release and the error.
  const std::size_t pages_bytes = round_up(size, page_size_);
  const bool possible =
      (device_total_ == 0 || pages_bytes <= device_total_) && pages_bytes <= allowed_;
  // Parked blocks are coalesced first: reclaim must not merge a block it is mapping.
  pool.flush_parked();
  if (possible) {
    if (void* p = take_mapped(pool, size, bytes, small)) return p;
  }
  // As PyTorch before it reports out of memory: wait for every pending free and return every
  // whole cached segment (its pages go to the page pool), then try once more.
  ++num_alloc_retries_;
  release_cache(&pool);
  if (possible) {
    if (void* p = take_mapped(pool, size, bytes, small)) return p;
  }
  release_unused_handles();
  throw_out_of_memory(pool, bytes, size, policy_.segment_size(size), small);
}

// Pool lock held. The best cached block (or a new segment's) with its pages mapped, or nullptr
// when the pages cannot be had. When the best fit lacks pages, the smallest block that can
// serve the request on pages already mapped is taken instead: the best fit would take pages -
// new ones, or near the limit the very pages of that mapped block, unmapped and mapped again -
// where the other needs none (address space is plentiful, pages are not).
void* CachingAllocator::Impl::take_mapped(StreamPool& pool, std::size_t size, std::size_t bytes,
                                          bool small) {
  Block* b = pool.find(size, small);
  if (b != nullptr && !b->segment->pages_mapped(b->addr, b->addr + used_part(*b, size, small))) {
    if (Block* mapped = smallest_mapped_fit(pool, size, small)) b = mapped;
  }
  if (b == nullptr) b = new_expandable_segment(pool, policy_.segment_size(size), small);
  if (b == nullptr || !map_for(pool, b, size, small)) return nullptr;
  return pool.take(b, size, bytes);
}

// The part of the free block `b` a request of `size` occupies: all of it, or its first `size`
// bytes when it is split (map_for's range).
std::size_t CachingAllocator::Impl::used_part(const Block& b, std::size_t size,
                                              bool small) const noexcept {
  return policy_.should_split(b.size, size, small) ? size : b.size;
}

// Pool lock held. The smallest cached block that may serve `size` with every page under its
// used part mapped, or nullptr. A scan of the pool's free blocks: only a request whose best fit
// lacks pages - one that would otherwise call the device - pays for it.
Block* CachingAllocator::Impl::smallest_mapped_fit(const StreamPool& pool, std::size_t size,
                                                   bool small) const {
  Block* best = nullptr;
  pool.index(small).for_each([&](Block* c) {
    if (c->size < size || (best != nullptr && c->size >= best->size)) return;
    if (!policy_.may_serve(c->size, size)) return;
    if (c->segment->pages_mapped(c->addr, c->addr + used_part(*c, size, small))) best = c;
  });
  return best;
}

// Pool lock held. A new expandable segment (address space only), or nullptr when the device has
// no address space left.
Block* CachingAllocator::Impl::new_expandable_segment(StreamPool& pool, std::size_t size,
                                                      bool small) {
  const std::size_t reserved = round_up(size, page_size_);
  void* va = nullptr;
  const Status status = device_.reserve(reserved, 0, &va);
  if (status == Status::out_of_memory) return nullptr;
  detail::check_device(device_, status, DeviceOp::reserve);
  reserved_va_ += reserved;
  return pool.add_new_segment(reinterpret_cast<std::uintptr_t>(va), reserved, !small, page_size_);
}

// Pool lock held; `b` free and indexed. Maps the pages the block will occupy when handed out for
// `size`; pooled pages to spare (a new handle larger than the need) go into the split-off rest
// in the same map_run, as a classic segment is mapped whole, so that later blocks cut from it
// make no device call.
bool CachingAllocator::Impl::map_for(StreamPool& pool, Block* b, std::size_t size, bool small) {
  Segment& seg = *b->segment;
  if (seg.unmapped_pages == 0) return true;
  const std::size_t used = used_part(*b, size, small);
  return map_range(pool, seg, b->addr, b->addr + used, b->addr + b->size);
}

// Maps every unmapped page of `seg` that [lo, hi) touches, and as many more of [hi, limit) -
// free space of the same block - as the page pool has to spare once those are had: each run of
// adjacent pages in one map_run (a cuMemMap per page, one cuMemSetAccess per run), every page a
// mapping of its own so that reclaim can unmap it alone. False (nothing changed) when no page
// can be had; a failing map unmaps what this call mapped and throws.
bool CachingAllocator::Impl::map_range(StreamPool& pool, Segment& seg, std::uintptr_t lo,
                                       std::uintptr_t hi, std::uintptr_t limit) {
  const std::size_t first = (lo - seg.base) / seg.page_size;
  std::size_t last = (hi - seg.base + seg.page_size - 1) / seg.page_size;
  std::size_t missing = 0;
  for (std::size_t i = first; i < last; ++i) missing += seg.pages[i] == Segment::kNoPage ? 1 : 0;
  if (missing == 0) return true;
  if (!obtain_pages(pool, seg, missing, lo, hi)) return false;
  const std::size_t end = (limit - seg.base + seg.page_size - 1) / seg.page_size;
  for (std::size_t spare = page_pool_.size() - missing; last < end && spare > 0; ++last) {
    spare -= seg.pages[last] == Segment::kNoPage ? 1 : 0;
  }
  std::vector<PageRun> mapped;
  std::vector<PhysicalHandle> pieces;
  return for_each_run(seg, first, last, /*mapped=*/false, [&](std::size_t i, std::size_t j) {
    if (!map_run_of(pool, seg, i, j, pieces)) {
      unmap_mapped_now(pool, seg, mapped);
      return false;
    }
    mapped.push_back({i, j});
    return true;
  });
}

// Maps pages [first, end) of `seg`, all unmapped, with pages from the pool (which holds enough)
// in one map_run. False (the pages back in the pool) when the device is out of memory; throws
// on any other failure.
bool CachingAllocator::Impl::map_run_of(StreamPool& pool, Segment& seg, std::size_t first,
                                        std::size_t end, std::vector<PhysicalHandle>& pieces) {
  pieces.clear();
  std::vector<std::uint64_t> ids;
  ids.reserve(end - first);
  for (std::size_t i = first; i < end; ++i) {
    const std::uint64_t id = page_pool_.take();
    ids.push_back(id);
    pieces.push_back(page_pool_.handle(detail::page_slot(id)).handle);
  }
  const Status status = device_.map_run(address(seg, first), pieces.data(), pieces.size());
  if (status != Status::ok) {
    for (auto id = ids.rbegin(); id != ids.rend(); ++id) page_pool_.put(*id);
    if (status == Status::out_of_memory) return false;
    detail::throw_device_error(device_, status, DeviceOp::map);
  }
  for (std::size_t i = first; i < end; ++i) seg.pages[i] = ids[i - first];
  const std::size_t bytes = (end - first) * seg.page_size;
  seg.unmapped_pages -= end - first;
  pool.count_mapped(!seg.large, static_cast<std::int64_t>(bytes));
  num_pages_mapped_ += static_cast<std::int64_t>(end - first);
  record(HistoryEntry::Action::segment_map, reinterpret_cast<std::uintptr_t>(address(seg, first)),
         bytes, pool.stream);
  return true;
}

// Undoes the maps of a failed map_range (those pages were never handed out, nothing ran on them),
// one unmap per run it mapped.
void CachingAllocator::Impl::unmap_mapped_now(StreamPool& pool, Segment& seg,
                                              const std::vector<PageRun>& runs) {
  for (const PageRun& r : runs) unmap_pages(pool, seg, r.first, r.end, Unmap::reclaim);
}

// Makes the page pool hold `n` pages: new handles first, then pages reclaimed from cached free
// blocks (never from [lo, hi) of `seg`, which is being mapped).
bool CachingAllocator::Impl::obtain_pages(const StreamPool& pool, const Segment& seg, std::size_t n,
                                          std::uintptr_t lo, std::uintptr_t hi) {
  std::size_t ceiling = SIZE_MAX;  // handle sizes the device has refused are not asked again
  while (page_pool_.size() < n) {
    const std::size_t deficit = n - page_pool_.size();
    if (create_handle(seg, deficit, ceiling)) continue;
    if (reclaim_pages(&pool, deficit, &seg, lo, hi, Unmap::reclaim) == 0) return false;
  }
  return true;
}

// Creates one handle for `seg`'s kind: as large as the deficit and at least the configured
// handle size - one creation per growth, as a classic allocator makes one cudaMalloc per segment
// (creation is the expensive call) - capped by `max_handle_size` (auto: no cap, or the
// configured size with a release threshold, so that memory can go back in those steps: a handle
// returns whole). The size never takes the handles held above the address space of the
// segments, so the engine never holds more than classic segments placed the same way would.
// Refused, it tries the deficit, then one page; `ceiling` (lowered to what the device reports
// free) keeps the sizes refused out of later tries. False when the device or the limit has room
// for none.
bool CachingAllocator::Impl::create_handle(const Segment& seg, std::size_t deficit,
                                           std::size_t& ceiling) {
  // Address space not backed: every unmapped page of every segment, less the pooled pages; at
  // least the deficit, as the pages to map are unmapped and the pool holds fewer than them.
  const std::size_t held = reserved_bytes();
  const std::size_t unbacked = reserved_va_ > held ? reserved_va_ - held : 0;
  const std::size_t needed = deficit * page_size_;
  const std::size_t unit = handle_size(seg.large);
  std::size_t cap = config_.release_threshold == SIZE_MAX ? SIZE_MAX : unit;
  if (config_.max_handle_size != 0)
    cap = std::max(unit, round_up(config_.max_handle_size, page_size_));
  const std::size_t preferred =
      std::max(page_size_, std::min({std::max(needed, unit), cap, unbacked}));
  // Ask the device what it has free first (cudaMemGetInfo): a creation the device refuses costs
  // as much as one it grants, and near the limit most would be refused.
  MemoryInfo info;
  if (device_.memory_info(&info) == Status::ok) {
    ceiling = std::min(ceiling, info.free / page_size_ * page_size_);
  }
  // The driver maps a handle only whole: until the engine places whole handles, every handle is
  // one page, so that any page can be mapped and unmapped alone.
  (void)preferred;
  const std::size_t sizes[] = {page_size_};
  std::size_t tried = 0;
  for (const std::size_t bytes : sizes) {
    if (bytes == tried || bytes > ceiling || exceeds_limit(bytes)) continue;
    tried = bytes;
    PhysicalHandle handle;
    const Status status = device_.create_physical(bytes, &handle);
    if (status == Status::out_of_memory) {
      ceiling = bytes - page_size_;
      continue;
    }
    detail::check_device(device_, status, DeviceOp::create_physical);
    page_pool_.add_handle(handle, bytes / page_size_);
    reserved_.fetch_add(bytes, std::memory_order_relaxed);
    ++num_handles_created_;
    ++num_device_alloc_;
    return true;
  }
  return false;
}

// --- reclaim ----------------------------------------------------------------------------------------------

namespace {

/// A run of mapped pages [first, end) of `seg` lying entirely inside one cached free block of
/// the pool `pool` (an index into the pool table).
struct FreeRun {
  std::size_t pool;
  Segment* seg;
  std::size_t first;
  std::size_t end;
};

/// Up to `want` mapped pages lying entirely inside cached free blocks, skipping [lo, hi) of
/// `keep`, as runs grouped by pool. All pool locks held. The longest runs of adjacent free pages
/// are taken first: a run goes in one unmap call, and the pages of a large cached block serve
/// only the rare large request, where the few pages under a small block serve the frequent small
/// ones (taken, each would have to be mapped again on its block's next use).
std::vector<FreeRun> free_runs(const std::vector<std::unique_ptr<StreamPool>>& pools,
                               std::size_t want, const Segment* keep, std::uintptr_t lo,
                               std::uintptr_t hi) {
  std::vector<FreeRun> runs;
  for (std::size_t p = 0; p < pools.size(); ++p) {
    for (Segment* seg = pools[p]->segments(); seg != nullptr; seg = seg->next) {
      if (!seg->expandable || seg->unmapped_pages == seg->pages.size()) continue;
      const std::size_t g = seg->page_size;
      // The pages of `keep` that [lo, hi) touches are out of bounds (none elsewhere).
      const std::size_t kept_first = seg == keep ? (lo - seg->base) / g : 0;
      const std::size_t kept_end = seg == keep ? (hi - seg->base + g - 1) / g : 0;
      const auto add = [&](std::size_t i, std::size_t j) {
        runs.push_back({p, seg, i, j});
        return true;
      };
      for (const Block* b = seg->head; b != nullptr; b = b->next) {
        if (!b->is_free()) continue;
        const std::size_t first = (b->addr - seg->base + g - 1) / g;
        const std::size_t end = (b->addr + b->size - seg->base) / g;
        for_each_run(*seg, first, std::min(end, kept_first), /*mapped=*/true, add);
        for_each_run(*seg, std::max(first, kept_end), end, /*mapped=*/true, add);
      }
    }
  }
  // Longest first; ties in address order, so that the choice does not depend on the sort.
  std::stable_sort(runs.begin(), runs.end(), [](const FreeRun& a, const FreeRun& b) {
    return a.end - a.first > b.end - b.first;
  });
  std::size_t pages = 0;
  std::size_t taken = 0;
  for (; taken < runs.size() && pages < want; ++taken) {
    FreeRun& r = runs[taken];
    r.end = r.first + std::min(r.end - r.first, want - pages);  // want may be SIZE_MAX
    pages += r.end - r.first;
  }
  runs.resize(taken);
  // Grouped by pool (one wait per pool), each segment's runs in address order.
  std::sort(runs.begin(), runs.end(), [](const FreeRun& a, const FreeRun& b) {
    return a.pool != b.pool ? a.pool < b.pool
           : a.seg != b.seg ? a.seg->base < b.seg->base
                            : a.first < b.first;
  });
  return runs;
}

std::size_t pages_of(const std::vector<FreeRun>& runs) {
  std::size_t pages = 0;
  for (const FreeRun& r : runs) pages += r.end - r.first;
  return pages;
}

}  // namespace

// Unmaps up to `want` pages lying entirely inside cached free blocks of any pool into the page
// pool, skipping [lo, hi) of `keep`. `held`: the pool whose lock the caller holds (nullptr:
// none). Each pool whose pages are taken has its stream's work waited for first (once).
std::size_t CachingAllocator::Impl::reclaim_pages(const StreamPool* held, std::size_t want,
                                                  const Segment* keep, std::uintptr_t lo,
                                                  std::uintptr_t hi, Unmap why) {
  AllPoolsLock locks(pools_, held);
  for (const auto& pool : pools_.all()) {
    if (pool.get() != held) pool->flush_parked();  // the held pool's were flushed by its caller
  }
  const std::vector<FreeRun> victims = free_runs(pools_.all(), want, keep, lo, hi);
  const StreamPool* waited = nullptr;
  for (const FreeRun& r : victims) {
    StreamPool& pool = *pools_.all()[r.pool];
    if (&pool != waited) {  // victims are grouped by pool
      wait_for_stream(pool.stream);
      waited = &pool;
    }
    // One unmap per run: a cuMemUnmap may cover several whole mappings side by side.
    unmap_pages(pool, *r.seg, r.first, r.end, why);
  }
  const std::size_t pages = pages_of(victims);
  num_pages_reclaimed_ += static_cast<std::int64_t>(pages);
  return pages;
}

// Blocks until the work submitted to `stream` so far has completed, through an event that is
// queried first (most reclaims find the stream idle and wait for nothing).
void CachingAllocator::Impl::wait_for_stream(Stream stream) {
  Event event;
  try {
    event = events_.acquire();
  } catch (const DeviceError&) {
    ++num_reclaim_syncs_;
    detail::check_device(device_, device_.synchronize_stream(stream), DeviceOp::synchronize_stream);
    return;
  }
  Status status = device_.record_event(event, stream);
  if (status == Status::ok) status = device_.query_event(event);
  if (status == Status::not_ready) {
    ++num_reclaim_syncs_;
    status = device_.synchronize_event(event);
  }
  events_.release(event);
  if (status != Status::ok) {
    // Unmapping without knowing the work is done would be unsafe: fall back to the stream.
    ++num_reclaim_syncs_;
    detail::check_device(device_, device_.synchronize_stream(stream), DeviceOp::synchronize_stream);
  }
}

// Lock of `pool` held; pages [first, end) of `seg` are mapped and their users have completed.
// Unmaps them into the page pool in one call - each page stays a mapping of its own, and one
// unmap covers the run of them (on a failure nothing is unmapped) - recorded as one
// segment_unmap, as PyTorch records the unmap of several handles of an expandable segment.
void CachingAllocator::Impl::unmap_pages(StreamPool& pool, Segment& seg, std::size_t first,
                                         std::size_t end, Unmap why) {
  const std::size_t bytes = (end - first) * seg.page_size;
  detail::check_device(device_, device_.unmap(address(seg, first), bytes), DeviceOp::unmap);
  for (std::size_t i = first; i < end; ++i) {
    CISTERN_ASSERT_INTERNAL(seg.pages[i] != Segment::kNoPage);
    page_pool_.put(seg.pages[i]);
    seg.pages[i] = Segment::kNoPage;
  }
  seg.unmapped_pages += end - first;
  pool.count_mapped(!seg.large, -static_cast<std::int64_t>(bytes));
  num_pages_unmapped_ += static_cast<std::int64_t>(end - first);
  record(HistoryEntry::Action::segment_unmap, reinterpret_cast<std::uintptr_t>(address(seg, first)),
         bytes, pool.stream, why == Unmap::reclaim);
}

// --- giving memory back -----------------------------------------------------------------------------------

// Lock of `pool` held; `b` a whole free expandable segment. Unmaps its pages (after its stream's
// work) and releases the address range; false (kept, reason in last_release_error_) on failure.
bool CachingAllocator::Impl::release_expandable(StreamPool& pool, Block* b) {
  Segment& seg = *b->segment;
  try {
    if (seg.unmapped_pages != seg.pages.size()) wait_for_stream(pool.stream);
    for_each_run(seg, 0, seg.pages.size(), /*mapped=*/true, [&](std::size_t i, std::size_t j) {
      unmap_pages(pool, seg, i, j, Unmap::release);
      return true;
    });
  } catch (const DeviceError& e) {
    last_release_error_ = e.what();
    return false;
  }
  const Status status = device_.release_reservation(reinterpret_cast<void*>(seg.base), seg.size);
  if (status != Status::ok) {
    last_release_error_ = fmt::format("{}: {}", to_string(status), device_.last_error());
    return false;
  }
  reserved_va_ -= seg.size;
  delete pool.remove_whole_segment(b, /*count_as_freed=*/true);
  return true;
}

// Releases every handle whose pages are all unmapped; returns how many releases failed.
std::size_t CachingAllocator::Impl::release_unused_handles() {
  std::size_t failures = 0;
  for (const std::uint32_t slot : page_pool_.unused_handles()) {
    const detail::HandleSlot& h = page_pool_.handle(slot);
    const std::size_t bytes = h.pages * page_size_;
    const Status status = device_.release_physical(h.handle);
    if (status != Status::ok) {
      last_release_error_ = fmt::format("{}: {}", to_string(status), device_.last_error());
      ++failures;
      continue;
    }
    page_pool_.forget(slot);
    reserved_.fetch_sub(bytes, std::memory_order_relaxed);
    ++num_handles_released_;
    ++num_device_free_;
  }
  return failures;
}

// No lock held. With a release threshold: when the unused physical memory may exceed it, unmap
// pages of cached free blocks and return the handles left entirely unused.
void CachingAllocator::Impl::trim_to_threshold() {
  std::lock_guard<std::mutex> global(mutex_);
  std::size_t allocated = 0;
  for (const auto& pool : pools_.all()) {
    allocated += static_cast<std::size_t>(pool->allocated_bytes_relaxed());
  }
  // Unused memory is at most reserved - allocated: under the threshold, nothing to look at.
  if (reserved_bytes() <= allocated + config_.release_threshold) return;
  release_unused_handles();
  // Exactly: pooled pages, and mapped pages entirely inside cached free blocks.
  std::size_t unused = page_pool_.size() * page_size_;
  {
    AllPoolsLock locks(pools_, nullptr);
    unused += pages_of(free_runs(pools_.all(), SIZE_MAX, nullptr, 0, 0)) * page_size_;
  }
  if (unused <= config_.release_threshold) return;
  const std::size_t excess = unused - config_.release_threshold;
  reclaim_pages(nullptr, (excess + page_size_ - 1) / page_size_, nullptr, 0, 0, Unmap::reclaim);
  release_unused_handles();
}

}  // namespace cistern
