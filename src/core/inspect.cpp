// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Looking at the caching allocator: statistics, snapshots, and check(), which walks every
// structure and recomputes every counter from the blocks themselves.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "allocator_impl.hpp"

namespace cistern {

using detail::Block;
using State = detail::BlockState;
using detail::StreamPool;

// --- statistics -----------------------------------------------------------------------------------------

Stats CachingAllocator::Impl::stats() const {
  std::lock_guard<std::mutex> global(mutex_);
  AllPoolsLock locks(pools_, nullptr);
  Stats s;
  if (shared_.load(std::memory_order_relaxed) == nullptr) {
    if (!pools_.all().empty()) pools_.all().front()->stats().export_to(s);
  } else {
    // Current values and peaks are allocator-wide atomics; running sums add up over pools.
    for (const auto& pool : pools_.all()) {
      pool->publish_stats();
      pool->stats().add_sums_to(s);
    }
    shared_stats_.export_to(s);
  }
  counters_.export_to(s);
  s.num_vmm_fallbacks = vmm_note_.empty() ? 0 : 1;
  s.max_split_size =
      config_.max_split_size == SIZE_MAX ? -1 : static_cast<std::int64_t>(config_.max_split_size);
  return s;
}

void CachingAllocator::Impl::reset_peak_stats() {
  std::lock_guard<std::mutex> global(mutex_);
  AllPoolsLock locks(pools_, nullptr);
  for (const auto& pool : pools_.all()) {
    pool->publish_stats();
    pool->stats().reset_peaks();
  }
  shared_stats_.reset_peaks();
}

void CachingAllocator::Impl::reset_accumulated_stats() {
  std::lock_guard<std::mutex> global(mutex_);
  AllPoolsLock locks(pools_, nullptr);
  for (const auto& pool : pools_.all()) {
    pool->stats().reset_sums();
  }
  counters_ = detail::Counters{};
}

// --- snapshot -------------------------------------------------------------------------------------------

namespace {

cistern::BlockState snapshot_state(State state) {
  switch (state) {
    case State::allocated: return cistern::BlockState::active_allocated;
    case State::pending: return cistern::BlockState::active_pending_free;
    case State::free:
    case State::parked: break;
  }
  return cistern::BlockState::inactive;
}

// An expandable segment as PyTorch shows one: each run of mapped pages is a segment of its own
// (PyTorch's blocks never cover unmapped memory), with the blocks clipped to it; the pages of an
// allocated or pending block are always mapped, so only free blocks are ever clipped.
void add_expandable(const detail::Segment& s, const StreamPool& pool, int device, Snapshot& snap) {
  const std::size_t g = s.page_size;
  for (std::size_t i = 0; i < s.pages.size();) {
    if (s.pages[i] == detail::Segment::kNoPage) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < s.pages.size() && s.pages[j] != detail::Segment::kNoPage) ++j;
    const std::uintptr_t lo = s.base + i * g;
    const std::uintptr_t hi = s.base + j * g;
    SegmentInfo info;
    info.device = device;
    info.address = lo;
    info.total_size = hi - lo;
    info.stream = pool.stream;
    info.is_large = s.large;
    info.is_expandable = true;
    info.range_address = s.base;
    info.range_size = s.size;
    for (const Block* b = s.head; b != nullptr; b = b->next) {
      const std::uintptr_t start = std::max(b->addr, lo);
      const std::uintptr_t end = std::min(b->addr + b->size, hi);
      if (start >= end) continue;
      info.blocks.push_back({start, end - start, b->requested, snapshot_state(b->state)});
      if (b->state == State::allocated) info.allocated_size += b->size;
      if (b->state == State::allocated || b->state == State::pending) {
        info.active_size += b->size;
        info.requested_size += b->requested;
      }
    }
    snap.segments.push_back(std::move(info));
    i = j;
  }
}

}  // namespace

Snapshot CachingAllocator::Impl::snapshot() const {
  std::lock_guard<std::mutex> global(mutex_);
  AllPoolsLock locks(pools_, nullptr);
  Snapshot snap;
  for (const auto& pool : pools_.all()) {
    for (const detail::Segment* s = pool->segments(); s != nullptr; s = s->next) {
      if (s->expandable) {
        add_expandable(*s, *pool, device_.index(), snap);
        continue;
      }
      SegmentInfo info;
      info.device = device_.index();
      info.address = s->base;
      info.total_size = s->size;
      info.stream = pool->stream;
      info.is_large = s->large;
      for (const Block* b = s->head; b != nullptr; b = b->next) {
        info.blocks.push_back({b->addr, b->size, b->requested, snapshot_state(b->state)});
        if (b->state == State::allocated) info.allocated_size += b->size;
        if (b->state == State::allocated || b->state == State::pending) {
          info.active_size += b->size;
          info.requested_size += b->requested;
        }
      }
      snap.segments.push_back(std::move(info));
    }
  }
  std::sort(snap.segments.begin(), snap.segments.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.address < b.address; });
  return snap;
}

// --- check ------------------------------------------------------------------------------------------------

namespace {

[[noreturn]] void violated(const StreamPool& pool, const std::string& what) {
  throw InvariantViolation(
      fmt::format("cistern::check: pool of stream {:#x}: {}", pool.stream.handle, what));
}

void expect(bool ok, const StreamPool& pool, const char* what) {
  if (!ok) violated(pool, what);
}

// Recomputes the current value of every statistic from the blocks of one segment.
void count_segment(const detail::Segment& s, const detail::SizePolicy& policy, Stats& totals) {
  const bool small = !s.large;
  auto add = [&](StatKind kind, std::int64_t delta) {
    totals.get(kind, small ? StatPool::small_pool : StatPool::large_pool).current += delta;
    totals.get(kind, StatPool::all).current += delta;
  };
  add(StatKind::segment, 1);
  add(StatKind::reserved_bytes, static_cast<std::int64_t>(s.mapped_bytes()));
  if (policy.is_oversize(s.size)) totals.oversize_segments.current += 1;
  for (const Block* b = s.head; b != nullptr; b = b->next) {
    const auto size = static_cast<std::int64_t>(b->size);
    if (b->state == State::allocated) {
      add(StatKind::allocation, 1);
      add(StatKind::allocated_bytes, size);
      if (policy.is_oversize(b->size)) totals.oversize_allocations.current += 1;
    }
    if (b->state == State::allocated || b->state == State::pending) {
      add(StatKind::active, 1);
      add(StatKind::active_bytes, size);
      add(StatKind::requested_bytes, static_cast<std::int64_t>(b->requested));
    } else if (!b->is_whole_segment()) {
      add(StatKind::inactive_split, 1);
      add(StatKind::inactive_split_bytes, size);
    }
  }
}

// The blocks of a segment tile it, link both ways, belong to it, and never leave two free
// neighbours uncoalesced.
void check_segment(const StreamPool& pool, const detail::Segment& s) {
  expect(s.owner == &pool, pool, "segment owned by another pool");
  expect(s.head != nullptr && s.head->addr == s.base && s.head->prev == nullptr, pool,
         "segment head is not the block at its base");
  std::uintptr_t expected_addr = s.base;
  const Block* previous = nullptr;
  for (const Block* b = s.head; b != nullptr; b = b->next) {
    if (b->segment != &s)
      violated(pool, fmt::format("block {:#x} points to another segment", b->addr));
    if (b->addr != expected_addr) {
      violated(pool, fmt::format("gap or overlap at {:#x} in segment {:#x}", b->addr, s.base));
    }
    if (b->prev != previous) violated(pool, fmt::format("block {:#x}: prev link broken", b->addr));
    if (b->size == 0) violated(pool, fmt::format("block {:#x} has size 0", b->addr));
    if (previous != nullptr && previous->is_free() && b->is_free()) {
      violated(pool, fmt::format("free neighbours {:#x} and {:#x} not coalesced", previous->addr,
                                 b->addr));
    }
    expected_addr = b->addr + b->size;
    previous = b;
  }
  if (expected_addr != s.base + s.size) {
    violated(pool, fmt::format("blocks of segment {:#x} cover {} of {} bytes", s.base,
                               expected_addr - s.base, s.size));
  }
}

// Every block's state is reflected in exactly the structure that should hold it.
void check_block_membership(const StreamPool& pool, const Block* b) {
  switch (b->state) {
    case State::allocated:
      expect(pool.find_allocated(b->addr) == b, pool, "allocated block missing from the map");
      break;
    case State::pending:
      expect(b->pending_events > 0, pool, "pending block without events");
      expect(pool.find_allocated(b->addr) == nullptr, pool, "pending block still in the map");
      break;
    case State::free:
      expect(pool.index(!b->segment->large).contains(b), pool, "free block missing from index");
      expect(b->counted_split == !b->is_whole_segment(), pool,
             "free block's split accounting is stale");
      break;
    case State::parked:
      expect(!b->segment->large && !b->is_whole_segment() && b->counted_split, pool,
             "parked block is not a counted small block of a split segment");
      expect(pool.is_parked_here(b), pool, "parked block missing from its parking list");
      break;
  }
}

}  // namespace

void CachingAllocator::Impl::check_pool(const StreamPool& pool, Stats& totals) const {
  Stats expected;
  std::size_t segments = 0;
  std::size_t allocated = 0;
  std::size_t free_blocks[2] = {0, 0};  // small, large
  std::size_t whole[2] = {0, 0};
  std::size_t parked = 0;
  std::map<const Block*, std::uint32_t> pending_blocks;
  for (const detail::Segment* s = pool.segments(); s != nullptr; s = s->next) {
    ++segments;
    check_segment(pool, *s);
    count_segment(*s, pool.policy(), expected);
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      check_block_membership(pool, b);
      const int kind = s->large ? 1 : 0;
      if (b->state == State::allocated) ++allocated;
      if (b->state == State::pending) pending_blocks[b] = b->pending_events;
      if (b->state == State::parked) ++parked;
      if (b->is_free()) ++free_blocks[kind];
      if (b->is_free() && b->is_whole_segment()) ++whole[kind];
    }
  }
  expect(segments == pool.segment_count(), pool, "segment count disagrees with the list");
  expect(parked == pool.parked_count(), pool, "parking lists hold blocks not parked here");
  expect(allocated == pool.allocated_count(), pool, "allocated-block count disagrees");
  if (pool.mapped_count() != allocated) {
    violated(pool, fmt::format("the pointer map holds {} blocks but the segments {} allocated ones",
                               pool.mapped_count(), allocated));
  }
  for (const bool small : {true, false}) {
    const detail::BlockIndex& index = pool.index(small);
    if (const char* problem = index.check()) violated(pool, problem);
    expect(index.count() == free_blocks[small ? 0 : 1], pool, "index count disagrees");
    std::size_t listed = 0;
    for (const Block* b = pool.whole_free(small); b != nullptr; b = b->whole_next) {
      expect(b->is_free() && b->is_whole_segment() && b->segment->large == !small, pool,
             "whole-segment list holds a block that is not a whole free segment");
      ++listed;
    }
    expect(listed == whole[small ? 0 : 1], pool, "whole-segment list misses segments");
  }
  std::size_t queued = 0;
  for (const detail::PendingQueue& queue : pool.pending()) {
    for (const detail::PendingFree& entry : queue.entries) {
      auto it = pending_blocks.find(entry.block);
      expect(it != pending_blocks.end() && it->second > 0, pool,
             "pending queue refers to a block that is not pending");
      --it->second;
      ++queued;
    }
  }
  expect(queued == pool.pending_count(), pool, "pending count disagrees with the queues");
  for (const auto& entry : pending_blocks) {
    expect(entry.second == 0, pool, "a pending block's event count disagrees with the queues");
  }
  const detail::PoolStats& actual = pool.stats();
  for (int k = 0; k < kStatKinds; ++k) {
    for (int q = 0; q < kStatPools; ++q) {
      const auto kind = static_cast<StatKind>(k);
      const auto which = static_cast<StatPool>(q);
      if (actual.current(kind, which) != expected.array[k][q].current) {
        violated(pool, fmt::format("{}.{}.current is {} but the blocks say {}", to_string(kind),
                                   to_string(which), actual.current(kind, which),
                                   expected.array[k][q].current));
      }
      totals.array[k][q].current += expected.array[k][q].current;
    }
  }
  expect(actual.oversize_allocations() == expected.oversize_allocations.current, pool,
         "oversize_allocations.current disagrees with the blocks");
  expect(actual.oversize_segments() == expected.oversize_segments.current, pool,
         "oversize_segments.current disagrees with the segments");
  totals.oversize_allocations.current += expected.oversize_allocations.current;
  totals.oversize_segments.current += expected.oversize_segments.current;
  expect(pool.allocated_bytes_relaxed() ==
             expected.get(StatKind::allocated_bytes, StatPool::all).current,
         pool, "allocated-bytes mirror disagrees");
}

// The region table names, for every region, the pools whose segments overlap it, so that a lookup
// finds every allocated block: the counts add up to the segments there, a named pool has at
// least its count of segments there, and a pool not named is reachable through `crowded`. No
// region without a segment is counted.
//
// An engine range covers thousands of regions, so this sweeps the counted regions, which come in
// ascending order, over the segments' spans sorted by their first region, rather than building a
// map per region; only the spans over the current region are held (segments are disjoint: only a
// few share a boundary region).
void CachingAllocator::Impl::check_regions() const {
  auto fail = [](std::uint64_t region, const std::string& what) {
    throw InvariantViolation(fmt::format("cistern::check: region table, region {:#x}: {}",
                                         region << detail::RegionTable::kRegionShift, what));
  };
  struct Span {
    std::uint64_t first;
    std::uint64_t last;
    const StreamPool* pool;
  };
  std::vector<Span> spans;
  for (const auto& pool : pools_.all()) {
    for (const detail::Segment* s = pool->segments(); s != nullptr; s = s->next) {
      spans.push_back({s->base >> detail::RegionTable::kRegionShift,
                       (s->base + s->size - 1) >> detail::RegionTable::kRegionShift, pool.get()});
    }
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.first < b.first; });
  std::size_t expected = 0;  // regions the segments overlap, each once
  std::uint64_t next_uncounted = 0;
  for (const Span& span : spans) {
    const std::uint64_t from = std::max(span.first, next_uncounted);
    if (span.last >= from) {
      expected += static_cast<std::size_t>(span.last - from + 1);
      next_uncounted = span.last + 1;
    }
  }
  std::size_t counted = 0;
  std::size_t entered = 0;
  std::vector<Span> here;  // the spans over the region
  std::vector<std::pair<const StreamPool*, std::uint32_t>> owners;
  regions_.for_each([&](std::uint64_t r, const detail::RegionTable::Entry& e) {
    ++counted;
    const std::size_t held = here.size();
    while (entered < spans.size() && spans[entered].first <= r) here.push_back(spans[entered++]);
    const bool grew = here.size() != held;
    here.erase(
        std::remove_if(here.begin(), here.end(), [r = r](const Span& s) { return s.last < r; }),
        here.end());
    if (here.empty()) fail(r, "counted, but no segment lies in it");
    if (grew || here.size() != held) {  // else the owners are the previous region's
      owners.clear();
      for (const Span& s : here) {
        auto own = std::find_if(owners.begin(), owners.end(),
                                [&](const auto& o) { return o.first == s.pool; });
        if (own == owners.end()) {
          owners.emplace_back(s.pool, 1);
        } else {
          ++own->second;
        }
      }
    }
    const auto total = static_cast<std::uint32_t>(here.size());
    if (e.segments[0] + e.segments[1] + e.others != total) {
      fail(r, fmt::format("counts {} segments but {} lie in it",
                          e.segments[0] + e.segments[1] + e.others, total));
    }
    const StreamPool* named[2] = {e.pools[0].load(), e.pools[1].load()};
    for (int i = 0; i < 2; ++i) {
      if ((named[i] == nullptr) != (e.segments[i] == 0)) fail(r, "an owner without segments");
      if (named[i] == nullptr) continue;
      const auto own = std::find_if(owners.begin(), owners.end(),
                                    [&](const auto& o) { return o.first == named[i]; });
      if (own == owners.end() || own->second < e.segments[i]) {
        fail(r, "names a pool with fewer segments in it than counted");
      }
    }
    if (named[0] != nullptr && named[0] == named[1]) fail(r, "names one pool twice");
    if (e.crowded.load() != (e.others != 0)) fail(r, "crowded flag disagrees with the counts");
    for (const auto& owner : owners) {
      if (owner.first != named[0] && owner.first != named[1] && !e.crowded.load()) {
        fail(r, fmt::format("the pool of stream {:#x} has a segment here but cannot be found",
                            owner.first->stream.handle));
      }
    }
  });
  if (counted != expected) {
    throw InvariantViolation(
        fmt::format("cistern::check: region table counts {} regions but the segments overlap {}",
                    counted, expected));
  }
}

void CachingAllocator::Impl::check() const {
  std::lock_guard<std::mutex> global(mutex_);
  AllPoolsLock locks(pools_, nullptr);
  Stats totals;
  std::vector<const detail::Segment*> expandable;
  for (const auto& pool : pools_.all()) {
    check_pool(*pool, totals);
    pool->publish_stats();
    for (const detail::Segment* s = pool->segments(); s != nullptr; s = s->next) {
      if (s->expandable) expandable.push_back(s);
    }
  }
  check_regions();
  const std::int64_t reserved = totals.get(StatKind::reserved_bytes, StatPool::all).current;
  // Reserved memory is what the backing holds: segments, or the engine's handles.
  backing_->check(expandable);
  if (!vmm_ && static_cast<std::int64_t>(reserved_bytes()) != reserved) {
    throw InvariantViolation(fmt::format("cistern::check: reserved counter {} but segments hold {}",
                                         reserved_bytes(), reserved));
  }
  if (shared_.load(std::memory_order_relaxed) != nullptr) {
    Stats shared;
    shared_stats_.export_to(shared);
    for (int k = 0; k < kStatKinds; ++k) {
      for (int q = 0; q < kStatPools; ++q) {
        if (shared.array[k][q].current != totals.array[k][q].current ||
            shared.array[k][q].peak < shared.array[k][q].current) {
          throw InvariantViolation(fmt::format(
              "cistern::check: allocator-wide {}.{} is {} (peak {}) but the pools hold {}",
              to_string(static_cast<StatKind>(k)), to_string(static_cast<StatPool>(q)),
              shared.array[k][q].current, shared.array[k][q].peak, totals.array[k][q].current));
        }
      }
    }
  }
}

}  // namespace cistern
