// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The virtual-memory engine (vmm:True): pages mapped only where blocks are, shared by
// neighbours, reclaimed from cached free blocks of any pool before running out of memory,
// unmapped only after their users' work, given back by release_threshold and empty_cache; and
// every VMM call failing in turn leaves the allocator consistent and the device clean.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "allocator_fixture.hpp"
#include "cistern/errors.hpp"
#include "cistern/pytorch_snapshot.hpp"
#include "trace/readers.hpp"

namespace cistern::testing {
namespace {

constexpr std::size_t kPage = 2 * MiB;

class Engine : public AllocatorTest {
 protected:
  // Page-sized handles by default, so that every byte figure below is exact.
  void engine(const std::string& extra, std::size_t capacity) {
    make("vmm:True,small_handle_size_mb:2,large_handle_size_mb:2,max_handle_size_mb:2" +
             (extra.empty() ? std::string() : "," + extra),
         capacity);
    ASSERT_TRUE(alloc->uses_virtual_memory());
  }
  Stats stats() const { return alloc->stats(); }
};

TEST_F(Engine, IsOnByDefaultForSimDeviceAndOffWhenAsked) {
  SimDevice sim(sim_options(64 * MiB));
  EXPECT_TRUE(CachingAllocator(sim, Config()).uses_virtual_memory());
  EXPECT_FALSE(CachingAllocator(sim, Config::parse("vmm:False")).uses_virtual_memory());
  SimDeviceOptions no_vmm = sim_options(64 * MiB);
  no_vmm.virtual_memory = false;
  SimDevice plain(no_vmm);
  EXPECT_FALSE(CachingAllocator(plain, Config()).uses_virtual_memory());
  // expandable_segments asks for it but falls back where the device cannot map; vmm:True insists.
  EXPECT_FALSE(
      CachingAllocator(plain, Config::parse("expandable_segments:True")).uses_virtual_memory());
  EXPECT_THROW(CachingAllocator(plain, Config::parse("vmm:True")), InvalidArgument);
}

TEST_F(Engine, MapsOnlyThePagesABlockTouchesAndNeighboursShareThem) {
  engine("", 64 * MiB);
  // Two 3 MiB blocks cut from one 20 MiB segment: [0, 3) and [3, 6) MiB touch pages 0-1 and 1-2.
  void* a = alloc->allocate(3 * MiB, default_stream);
  void* b = alloc->allocate(3 * MiB, default_stream);
  EXPECT_EQ(addr(b), addr(a) + 3 * MiB);
  EXPECT_EQ(alloc->reserved_bytes(), 3 * kPage);
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(3 * kPage));
  EXPECT_EQ(stats().num_pages_mapped, 3);
  EXPECT_EQ(device->used_bytes(), 3 * kPage);
  // Small blocks share the small segment's single page.
  void* s1 = alloc->allocate(1000, default_stream);
  void* s2 = alloc->allocate(1000, default_stream);
  EXPECT_EQ(alloc->reserved_bytes(), 4 * kPage);
  EXPECT_EQ(stats().num_pages_mapped, 4);
  alloc->check();
  // Cached blocks keep their pages: freeing and allocating again makes no device call.
  alloc->deallocate(b, default_stream);
  const auto maps = device_calls(DeviceOp::map);
  void* again = alloc->allocate(3 * MiB, default_stream);
  EXPECT_EQ(again, b);
  EXPECT_EQ(device_calls(DeviceOp::map), maps);
  for (void* p : {a, again, s1, s2}) alloc->deallocate(p, default_stream);
}

// A best fit on unmapped pages gives way to a larger cached block on mapped ones: at the limit
// the best fit would take that block's very pages (an unmap and a map for nothing), and with
// room it would hold a page more.
TEST_F(Engine, PrefersACachedBlockOnMappedPagesToABestFitThatNeedsPages) {
  engine("", 18 * MiB);  // nine pages
  // One 20 MiB segment: a [0, 4), b [4, 8), c [8, 10), d [10, 18) MiB: pages 0-8 mapped, page 9
  // (under the free tail [18, 20)) not.
  void* a = alloc->allocate(4 * MiB, default_stream);
  void* b = alloc->allocate(4 * MiB, default_stream);
  void* c = alloc->allocate(2 * MiB, default_stream);
  void* d = alloc->allocate(8 * MiB, default_stream);
  ASSERT_EQ(addr(d), addr(a) + 10 * MiB);
  EXPECT_EQ(device->used_bytes(), 18 * MiB);
  alloc->deallocate(b, default_stream);  // cached on pages 2-3
  const auto maps = device_calls(DeviceOp::map);
  const auto unmaps = device_calls(DeviceOp::unmap);
  const auto creates = device_calls(DeviceOp::create_physical);
  // 2 MiB: the best fit is the unmapped tail (exactly 2 MiB); b's block serves it on page 2.
  void* e = alloc->allocate(2 * MiB, default_stream);
  EXPECT_EQ(e, b);
  EXPECT_EQ(device_calls(DeviceOp::map), maps);
  EXPECT_EQ(device_calls(DeviceOp::unmap), unmaps);
  EXPECT_EQ(device_calls(DeviceOp::create_physical), creates);
  EXPECT_EQ(stats().num_pages_reclaimed, 0);
  EXPECT_EQ(alloc->reserved_bytes(), 18 * MiB);
  alloc->check();
  // The other half of b's block, on page 3, serves the next one. The one after needs page 9, and
  // all nine pages the device has are under live blocks: out of memory.
  void* f = alloc->allocate(2 * MiB, default_stream);
  EXPECT_EQ(addr(f), addr(b) + 2 * MiB);
  EXPECT_THROW(alloc->allocate(2 * MiB, default_stream), OutOfMemory);
  alloc->check();
  for (void* p : {a, c, d, e, f}) alloc->deallocate(p, default_stream);
}

TEST_F(Engine, ReclaimsPagesOfOtherStreamsAndTheSmallPoolForOneRequest) {
  engine("", 8 * MiB);  // four pages
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* small = alloc->allocate(1000, s1);     // one page in s1's small pool
  void* large = alloc->allocate(6 * MiB, s1);  // three pages in s1's large pool
  EXPECT_EQ(device->used_bytes(), 8 * MiB);
  alloc->deallocate(small, s1);
  alloc->deallocate(large, s1);
  // Classic segments would leave s2 nothing: 8 MiB of s1's cache, none of it one free block.
  void* big = alloc->allocate(8 * MiB, s2);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(stats().num_pages_reclaimed, 4);
  EXPECT_EQ(stats().num_handles_created, 4);
  EXPECT_EQ(stats().num_ooms, 0);
  EXPECT_EQ(alloc->reserved_bytes(), 8 * MiB);
  EXPECT_EQ(stat(StatKind::reserved_bytes, StatPool::small_pool), 0);
  alloc->check();
  // And back: s1's request takes the pages of s2's freed block.
  alloc->deallocate(big, s2);
  void* back = alloc->allocate(4 * MiB, s1);
  EXPECT_NE(back, nullptr);
  EXPECT_EQ(stats().num_pages_reclaimed, 4 + 2);
  alloc->deallocate(back, s1);
}

TEST_F(Engine, OutOfMemoryOnlyWhenLiveBlocksLeaveNoPage) {
  engine("", 8 * MiB);
  void* a = alloc->allocate(1000, default_stream);
  void* b =
      alloc->allocate(5 * MiB, default_stream);  // pages 0-2 of a large segment: 4 pages in all
  EXPECT_THROW(alloc->allocate(kPage, default_stream), OutOfMemory);
  alloc->check();
  alloc->deallocate(a, default_stream);  // its page is reclaimable now
  void* c = alloc->allocate(kPage, default_stream);
  EXPECT_NE(c, nullptr);
  alloc->deallocate(b, default_stream);
  alloc->deallocate(c, default_stream);
}

// As PyTorch's: out of memory is reported with the cache emptied. A request larger than the
// device is refused without reserving address space for it or searching for pages (a fuzzed
// trace asking for terabytes took seconds per request before).
TEST_F(Engine, OutOfMemoryEmptiesTheCacheAndAnImpossibleRequestReservesNothing) {
  engine("", 8 * MiB);
  void* a = alloc->allocate(3 * MiB, default_stream);
  void* keep = alloc->allocate(1000, default_stream);
  alloc->deallocate(a, default_stream);  // two cached pages
  const auto reserves = device_calls(DeviceOp::reserve);
  EXPECT_THROW(alloc->allocate(std::size_t{3} << 40, default_stream), OutOfMemory);
  EXPECT_EQ(device_calls(DeviceOp::reserve), reserves);
  EXPECT_EQ(alloc->reserved_bytes(), kPage);  // only the live small block's page is left
  EXPECT_EQ(device->used_bytes(), kPage);
  alloc->check();
  // A request that could fit but does not, with the small page pinned: the same.
  void* b = alloc->allocate(4 * MiB, default_stream);
  alloc->deallocate(b, default_stream);
  EXPECT_THROW(alloc->allocate(7 * MiB, default_stream), OutOfMemory);
  EXPECT_EQ(alloc->reserved_bytes(), kPage);
  EXPECT_EQ(stats().num_ooms, 2);
  alloc->check();
  alloc->deallocate(keep, default_stream);
}

// The error's "largest free block" counts what a request could use without new pages: the
// free rest of the segment is 13 MiB of address space, of which 1 MiB lies on a mapped page.
TEST_F(Engine, TheLargestFreeBlockOfAnOutOfMemoryCountsMappedBytesOnly) {
  engine("", 8 * MiB);
  void* x = alloc->allocate(3 * MiB, default_stream);  // [0, 3) MiB of a 20 MiB segment
  void* y = alloc->allocate(4 * MiB, default_stream);  // [3, 7): pages 0-3 mapped, all 8 MiB
  try {
    alloc->allocate(6 * MiB, default_stream);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info().largest_free, 1 * MiB);
    EXPECT_EQ(e.info().reserved, 8 * MiB);
  }
  alloc->check();
  alloc->deallocate(x, default_stream);
  alloc->deallocate(y, default_stream);
}

TEST_F(Engine, PendingFreesAreWaitedForBeforeGivingUp) {
  engine("", 4 * MiB);
  const Stream s1 = device->create_stream();
  void* a = alloc->allocate(4 * MiB, default_stream);
  alloc->record_stream(a, s1);
  device->launch(s1, 1000);
  alloc->deallocate(a, default_stream);  // pending until s1's work completes
  void* b = alloc->allocate(4 * MiB, s1);
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(stats().num_ooms, 0);
  EXPECT_GE(device->now(), 1000u);
  alloc->deallocate(b, s1);
}

TEST_F(Engine, APageIsUnmappedOnlyAfterItsLastUsersWorkCompletes) {
  engine("", 4 * MiB);
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* a = alloc->allocate(4 * MiB, s1);
  device->launch(s1, 5000);  // a kernel still using the block when it is freed
  alloc->deallocate(a, s1);  // cached at once (its own stream)
  ASSERT_FALSE(device->stream_idle(s1));
  const auto unmaps = device_calls(DeviceOp::unmap);
  void* b = alloc->allocate(4 * MiB, s2);  // needs a's pages
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(device->stream_idle(s1));  // waited for before the unmap
  EXPECT_GE(device->now(), 5000u);
  // a's two pages, side by side, go in one unmap call covering both mappings.
  EXPECT_EQ(device_calls(DeviceOp::unmap), unmaps + 1);
  EXPECT_EQ(stats().num_pages_unmapped, 2);
  EXPECT_EQ(stats().num_reclaim_syncs, 1);  // one wait for the pool, not one per page
  // An idle stream costs a query, no wait.
  alloc->deallocate(b, s2);
  void* c = alloc->allocate(4 * MiB, s1);
  EXPECT_EQ(stats().num_reclaim_syncs, 1);
  alloc->deallocate(c, s1);
}

TEST_F(Engine, ReleaseThresholdGivesUnusedPagesBack) {
  engine("release_threshold_mb:2", 64 * MiB);
  void* a = alloc->allocate(8 * MiB, default_stream);
  void* b = alloc->allocate(1000, default_stream);
  EXPECT_EQ(alloc->reserved_bytes(), 5 * kPage);
  alloc->deallocate(a, default_stream);  // 8 MiB unused, 2 MiB allowed: 3 pages go back
  EXPECT_EQ(alloc->reserved_bytes(), 2 * kPage);
  EXPECT_EQ(device->used_bytes(), 2 * kPage);
  EXPECT_EQ(stats().num_handles_released, 3);
  alloc->check();
  alloc->deallocate(b, default_stream);  // 4 MiB unused, 2 MiB allowed: one page left
  EXPECT_EQ(alloc->reserved_bytes(), kPage);
  EXPECT_EQ(device->used_bytes(), kPage);
}

TEST_F(Engine, WithoutAThresholdCachedPagesStay) {
  engine("", 64 * MiB);
  void* a = alloc->allocate(8 * MiB, default_stream);
  alloc->deallocate(a, default_stream);
  EXPECT_EQ(alloc->reserved_bytes(), 4 * kPage);
}

TEST_F(Engine, EmptyCacheReturnsEveryUnusedPageAndHandle) {
  engine("", 64 * MiB);
  void* a = alloc->allocate(3 * MiB, default_stream);
  void* b = alloc->allocate(3 * MiB, default_stream);
  void* c = alloc->allocate(3 * MiB, default_stream);  // [0, 9) MiB: pages 0-4
  void* s = alloc->allocate(1000, default_stream);
  alloc->deallocate(a, default_stream);
  alloc->deallocate(c, default_stream);
  alloc->deallocate(s, default_stream);
  alloc->empty_cache();
  // b = [3, 6) MiB keeps pages 1 and 2 (each shared with a freed neighbour); the rest goes.
  EXPECT_EQ(alloc->reserved_bytes(), 2 * kPage);
  EXPECT_EQ(device->used_bytes(), 2 * kPage);
  EXPECT_EQ(device->live_physical(), 2u);
  EXPECT_EQ(stat(StatKind::segment), 1);  // the small segment's address range is released
  alloc->check();
  alloc->deallocate(b, default_stream);
  alloc->empty_cache();
  EXPECT_EQ(alloc->reserved_bytes(), 0u);
  EXPECT_EQ(device->used_bytes(), 0u);
  EXPECT_EQ(device->live_physical(), 0u);
  EXPECT_EQ(device->live_reservations(), 0u);
}

TEST_F(Engine, OneHandlePerGrowthMappedInOneRunAndNeverAboveTheSegments) {
  make("vmm:True", 256 * MiB);  // defaults: handles of at least 20 MiB / 2 MiB, one per growth
  alloc->record_history(true, 1000);
  void* a = alloc->allocate(3 * MiB, default_stream);
  // One 20 MiB handle for the 20 MiB segment, all of it mapped in one run (as a classic segment
  // comes whole), so that the segment's later blocks make no device call.
  EXPECT_EQ(alloc->reserved_bytes(), 20 * MiB);
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(device_calls(DeviceOp::create_physical), 1u);
  const auto maps = device_calls(DeviceOp::map);
  void* a2 = alloc->allocate(5 * MiB, default_stream);
  EXPECT_EQ(device_calls(DeviceOp::map), maps);
  // A 100 MiB request: its own segment, one 100 MiB handle, one run of 50 pages.
  void* b = alloc->allocate(100 * MiB, default_stream);
  EXPECT_EQ(alloc->reserved_bytes(), 120 * MiB);
  EXPECT_EQ(stats().num_handles_created, 2);
  EXPECT_EQ(stats().num_pages_mapped, 10 + 50);
  std::size_t runs = 0;
  for (const HistoryEntry& e : alloc->history()) {
    if (e.action != HistoryEntry::Action::segment_map) continue;
    EXPECT_EQ(e.size, runs == 0 ? 20 * MiB : 100 * MiB);
    ++runs;
  }
  EXPECT_EQ(runs, 2u);
  alloc->check();
  for (void* p : {a, a2, b}) alloc->deallocate(p, default_stream);
  // Free, all of it goes back in two handle releases.
  alloc->empty_cache();
  EXPECT_EQ(alloc->reserved_bytes(), 0u);
  EXPECT_EQ(stats().num_handles_released, 2);
  EXPECT_EQ(device->used_bytes(), 0u);
}

TEST_F(Engine, MaxHandleSizeCapsEachCreation) {
  make("vmm:True,max_handle_size_mb:40", 256 * MiB);
  void* b = alloc->allocate(100 * MiB, default_stream);  // 40 + 40 + 20 MiB
  EXPECT_EQ(stats().num_handles_created, 3);
  EXPECT_EQ(alloc->reserved_bytes(), 100 * MiB);
  alloc->check();
  alloc->deallocate(b, default_stream);
}

TEST_F(Engine, SnapshotAndHistoryDescribeExpandableSegments) {
  engine("", 64 * MiB);
  alloc->record_history(true, 1000);
  void* a = alloc->allocate(3 * MiB, default_stream);
  const Snapshot snap = alloc->snapshot();
  // Only the mapped pages show, as in PyTorch: 4 MiB holding the block and 1 MiB free.
  ASSERT_EQ(snap.segments.size(), 1u);
  EXPECT_TRUE(snap.segments[0].is_expandable);
  EXPECT_EQ(snap.segments[0].address, addr(a));
  EXPECT_EQ(snap.segments[0].total_size, 2 * kPage);
  ASSERT_EQ(snap.segments[0].blocks.size(), 2u);
  EXPECT_EQ(snap.segments[0].blocks[0].size, 3 * MiB);
  EXPECT_EQ(snap.segments[0].blocks[1].size, 1 * MiB);
  EXPECT_EQ(snap.segments[0].blocks[1].state, BlockState::inactive);
  // Both pages in one map_run, recorded as one segment_map of the range (as PyTorch records one
  // per expansion); each page stays a mapping of its own, and the two are unmapped together.
  const auto history = alloc->history();
  std::size_t maps = 0;
  for (const HistoryEntry& e : history) {
    EXPECT_NE(e.action, HistoryEntry::Action::segment_alloc);
    if (e.action == HistoryEntry::Action::segment_map) {
      EXPECT_EQ(e.size, 2 * kPage);
      EXPECT_EQ(e.addr, addr(a));
      ++maps;
    }
  }
  EXPECT_EQ(maps, 1u);
  EXPECT_EQ(device_calls(DeviceOp::map), 2u);  // SimDevice maps a run piece by piece
  alloc->deallocate(a, default_stream);
  alloc->empty_cache();
  std::size_t unmaps = 0;
  for (const HistoryEntry& e : alloc->history()) {
    if (e.action != HistoryEntry::Action::segment_unmap) continue;
    ++unmaps;
    EXPECT_FALSE(e.reclaim) << "empty_cache() gives the pages back";
    EXPECT_EQ(e.addr, addr(a));
    EXPECT_EQ(e.size, 2 * kPage);  // one unmap of the run, one event
  }
  EXPECT_EQ(unmaps, 1u);
  EXPECT_EQ(stats().num_pages_unmapped, 2);
}

// A history with maps, reclaim's unmaps and a segment left partly mapped reads back through the
// PyTorch-format writer and reader: the reader rebuilds the memory held before the window (none)
// from the final snapshot and the segment_map / segment_unmap events.
TEST_F(Engine, PyTorchSnapshotWithMapsAndUnmapsReadsBack) {
  engine("", 8 * MiB);
  alloc->record_history(true, 1000);
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* a = alloc->allocate(3 * MiB, s1);
  void* b = alloc->allocate(3 * MiB, s1);  // pages 0-2 of s1's segment
  alloc->deallocate(a, s1);                // page 0 is free; page 1 stays (shared with b)
  void* c = alloc->allocate(4 * MiB, s2);  // needs 2 pages: 1 new, 1 reclaimed from a
  EXPECT_EQ(stats().num_pages_reclaimed, 1);
  const trace::Trace t = trace::read_trace_bytes(pytorch_snapshot_pickle(*alloc), "engine.pickle");
  // alloc a, alloc b, free a, alloc c: the reclaim's unmap carries cistern's reclaim frame, so
  // the reader does not take it for a release (empty_cache) as it would PyTorch's unmaps.
  ASSERT_EQ(t.events.size(), 4u);
  EXPECT_EQ(t.events[3].op, trace::Op::alloc);
  EXPECT_EQ(t.events[3].size, 4 * MiB);
  const std::vector<HistoryEntry> history = alloc->history();
  const auto unmap = std::find_if(history.begin(), history.end(), [](const HistoryEntry& e) {
    return e.action == HistoryEntry::Action::segment_unmap;
  });
  ASSERT_NE(unmap, history.end());
  EXPECT_TRUE(unmap->reclaim);
  EXPECT_EQ(t.recorded.initial_reserved, std::optional<std::uint64_t>(0));
  std::size_t maps = 0;
  std::size_t unmaps = 0;
  for (const trace::RecordedSegmentEvent& e : t.recorded.segment_events) {
    if (e.kind == trace::RecordedSegmentEvent::Kind::map) ++maps;
    if (e.kind == trace::RecordedSegmentEvent::Kind::unmap) ++unmaps;
  }
  EXPECT_EQ(maps, 3u);  // one per run: a's two pages, b's third, c's two
  EXPECT_EQ(unmaps, 1u);
  alloc->deallocate(b, s1);
  alloc->deallocate(c, s2);
}

// Every VMM call site failing in turn (each call of each operation in a scenario that maps,
// reclaims across streams, and empties the cache): the failing operation throws or reports out
// of memory, check() holds after every step, and once the faults are cleared everything can be
// freed and returned, leaving the device empty.
TEST(EngineFaults, EveryFailingDeviceCallLeavesTheAllocatorConsistentAndNothingLeaked) {
  const DeviceOp ops[] = {DeviceOp::reserve,
                          DeviceOp::release_reservation,
                          DeviceOp::create_physical,
                          DeviceOp::release_physical,
                          DeviceOp::map,
                          DeviceOp::unmap,
                          DeviceOp::record_event,
                          DeviceOp::query_event,
                          DeviceOp::synchronize_event};
  std::size_t failures_seen = 0;
  for (const DeviceOp op : ops) {
    for (std::uint64_t nth = 1; nth <= 12; ++nth) {
      for (const Status status : {Status::out_of_memory, Status::device_error}) {
        SCOPED_TRACE(
            fmt::format("{} call {} fails with {}", to_string(op), nth, to_string(status)));
        SimDevice device(sim_options(12 * MiB));
        const Stream s1 = device.create_stream();
        const Stream s2 = device.create_stream();
        std::vector<std::pair<void*, Stream>> live;
        {
          CachingAllocator alloc(device, Config::parse("vmm:True,large_handle_size_mb:4"));
          device.fail_nth(op, nth, status);
          auto step = [&](auto&& action) {
            try {
              action();
            } catch (const Error&) {
              ++failures_seen;
            }
            alloc.check();
          };
          step([&] { live.emplace_back(alloc.allocate(7 * MiB, s1), s1); });
          step([&] { live.emplace_back(alloc.allocate(1000, s1), s1); });
          device.launch(s1, 100);
          step([&] {
            while (!live.empty()) {
              alloc.deallocate(live.back().first, live.back().second);
              live.pop_back();
            }
          });
          step([&] { live.emplace_back(alloc.allocate(10 * MiB, s2), s2); });  // reclaims
          step([&] { live.emplace_back(alloc.allocate(2 * MiB, s1), s1); });
          step([&] { alloc.empty_cache(); });
          device.clear_faults();
          for (const auto& [p, s] : live) alloc.deallocate(p, s);
          alloc.empty_cache();
          alloc.check();
          EXPECT_EQ(alloc.reserved_bytes(), 0u);
        }
        EXPECT_EQ(device.used_bytes(), 0u);
        EXPECT_EQ(device.live_physical(), 0u);
        EXPECT_EQ(device.live_reservations(), 0u);
      }
    }
  }
  EXPECT_GT(failures_seen, 0u);
}

// A failure part way through a multi-page map leaves none of the block's pages mapped.
TEST(EngineFaults, AFailedMapPartWayLeavesNothingMapped) {
  SimDevice device(sim_options(64 * MiB));
  CachingAllocator alloc(device, Config::parse("vmm:True,large_handle_size_mb:2"));
  device.fail_nth(DeviceOp::map, 3, Status::device_error);
  EXPECT_THROW(alloc.allocate(10 * MiB, default_stream), DeviceError);
  alloc.check();
  EXPECT_EQ(alloc.stats().get(StatKind::reserved_bytes, StatPool::all).current, 0);
  EXPECT_EQ(device.counters().of(DeviceOp::unmap), 2u);
  void* p = alloc.allocate(10 * MiB, default_stream);
  alloc.check();
  alloc.deallocate(p, default_stream);
}

}  // namespace
}  // namespace cistern::testing
