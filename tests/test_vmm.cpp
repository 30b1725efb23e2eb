// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The virtual-memory engine (vmm:True): whole physical handles mapped only where blocks are,
// shared by neighbours, one per growth with room to spare and one per granule near the limit,
// reclaimed whole from cached free blocks of any pool before running out of memory, unmapped only
// after their users' work, given back by release_threshold and empty_cache; a device that refuses
// the engine at its first growth gets classic segments instead; and every VMM call failing in turn
// leaves the allocator consistent and the device clean. SimDevice refuses what the CUDA driver
// refuses (a map of part of a handle, an unmap that cuts a mapping), so every test here would
// fail on such a call.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "allocator_fixture.hpp"
#include "cistern/errors.hpp"
#include "cistern/pytorch_snapshot.hpp"
#include "trace/readers.hpp"

namespace cistern::testing {
namespace {

constexpr std::size_t kPage = 2 * MiB;

// The device's memory calls so far: handles created, maps and unmaps.
std::uint64_t memory_calls(const SimDevice& device) {
  return device.counters().of(DeviceOp::create_physical) + device.counters().of(DeviceOp::map) +
         device.counters().of(DeviceOp::unmap);
}

// Cuts 5 MiB from the free 20 MiB block at `b` (on `stream`) and checks the cut: where it
// `gives_back` (a fine cut), the handle it ends inside goes back and the block's granules and the
// handle's rest are mapped again - one unmap, three creations and three maps - with as much
// memory held as before; else no call. The same requests twice more then make no call: they are
// cut where the handles now end. Returns the 5 MiB block.
void* cut_5_of_20(CachingAllocator& alloc, const SimDevice& device, void* b, bool gives_back,
                  Stream stream = default_stream) {
  const std::size_t reserved = alloc.reserved_bytes();
  const std::int64_t fine_cuts = alloc.stats().num_fine_cuts + (gives_back ? 1 : 0);
  const auto before = memory_calls(device);
  void* c = alloc.allocate(5 * MiB, stream);
  EXPECT_EQ(c, b);
  EXPECT_EQ(alloc.stats().num_fine_cuts, fine_cuts);
  EXPECT_EQ(memory_calls(device) - before, gives_back ? 7u : 0u);
  EXPECT_EQ(alloc.reserved_bytes(), reserved);
  alloc.check();
  const auto settled = memory_calls(device);
  for (int pass = 0; pass < 2; ++pass) {
    alloc.deallocate(c, stream);
    EXPECT_EQ(alloc.allocate(20 * MiB, stream), b);
    alloc.deallocate(b, stream);
    EXPECT_EQ(alloc.allocate(5 * MiB, stream), c);
  }
  EXPECT_EQ(memory_calls(device), settled);
  EXPECT_EQ(alloc.stats().num_fine_cuts, fine_cuts);
  return c;
}

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

// Near the limit (less room left than 8 times what is mapped), a growth maps only the granules its
// block touches.
TEST_F(Engine, NearTheLimitMapsOnlyThePagesABlockTouchesAndNeighboursShareThem) {
  engine("", 24 * MiB);
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

// Which block serves a request never depends on what is mapped: the best fit, mapped where it
// lacks pages, even when a larger cached block lies on mapped pages. (Taking the mapped block
// saves a growth once, but a later pass of the same requests then finds its blocks elsewhere than
// the first did and maps them there: test_vmm_guarantee.cpp, SteadyState.)
TEST_F(Engine, ServesTheBestFitWhateverIsMapped) {
  engine("", 1 * GiB);                                  // handles of one 2 MiB granule
  void* x = alloc->allocate(30 * MiB, default_stream);  // [0, 30) MiB
  void* y = alloc->allocate(2 * MiB, default_stream);   // [30, 32)
  void* z = alloc->allocate(40 * MiB, default_stream);  // [32, 72)
  void* w = alloc->allocate(2 * MiB, default_stream);   // [72, 74)
  ASSERT_EQ(addr(z), addr(x) + 32 * MiB);
  alloc->deallocate(x, default_stream);
  alloc->empty_cache();                  // x's 15 handles go back: [0, 30) is address space only
  alloc->deallocate(z, default_stream);  // [32, 72) cached on its 20 handles
  EXPECT_EQ(alloc->reserved_bytes(), 44 * MiB);
  const auto creates = device_calls(DeviceOp::create_physical);
  // 30 MiB: the best fit is x's place, which lacks 15 granules; z's mapped block would serve it
  // with no call, but the best fit is mapped.
  void* again = alloc->allocate(30 * MiB, default_stream);
  EXPECT_EQ(again, x);
  EXPECT_EQ(device_calls(DeviceOp::create_physical) - creates, 15u);
  EXPECT_EQ(alloc->reserved_bytes(), 74 * MiB);
  alloc->check();
  for (void* p : {again, y, w}) alloc->deallocate(p, default_stream);
}

// A block of an expandable segment splits whenever 512 B or more are left, as PyTorch's do under
// expandable segments; a classic segment's large block keeps a rest of up to 1 MiB.
TEST_F(Engine, BlocksSplitAsInPyTorchsExpandableSegments) {
  for (const bool vmm : {true, false}) {
    SCOPED_TRACE(vmm ? "engine" : "classic segments");
    if (vmm) {
      engine("", 1 * GiB);
    } else {
      make("", 1 * GiB);
    }
    void* a = alloc->allocate(5 * MiB, default_stream);
    void* pin = alloc->allocate(5 * MiB, default_stream);  // right after a: a's block stays 5 MiB
    ASSERT_EQ(addr(pin), addr(a) + 5 * MiB);
    alloc->deallocate(a, default_stream);
    const std::int64_t before = allocated();
    void* b = alloc->allocate(4 * MiB + 512 * KiB, default_stream);  // 512 KiB left
    EXPECT_EQ(b, a);
    EXPECT_EQ(allocated() - before, static_cast<std::int64_t>(vmm ? 4 * MiB + 512 * KiB : 5 * MiB));
    alloc->check();
    alloc->deallocate(b, default_stream);
    alloc->deallocate(pin, default_stream);
  }
}

TEST_F(Engine, TakesOverOtherStreamsSegmentsAndReclaimsTheSmallPoolForOneRequest) {
  engine("", 8 * MiB);  // four pages
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* small = alloc->allocate(1000, s1);     // one page in s1's small pool
  void* large = alloc->allocate(6 * MiB, s1);  // three pages in s1's large pool
  EXPECT_EQ(device->used_bytes(), 8 * MiB);
  alloc->deallocate(small, s1);
  alloc->deallocate(large, s1);
  // Classic segments would leave s2 nothing: 8 MiB of s1's cache, none of it one free block.
  // s2 takes s1's large segment over (its three pages stay mapped: no device call) and the
  // small pool's page is reclaimed for the fourth: unmapped there and mapped again here (a handle
  // of the size the growth needs is not released and created anew).
  void* big = alloc->allocate(8 * MiB, s2);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(stats().num_cross_stream_reuse, 1);
  EXPECT_EQ(stats().num_pages_reclaimed, 1);
  EXPECT_EQ(stats().num_handles_created, 4);
  EXPECT_EQ(stats().num_handles_released, 0);
  EXPECT_EQ(stats().num_ooms, 0);
  EXPECT_EQ(alloc->reserved_bytes(), 8 * MiB);
  EXPECT_EQ(stat(StatKind::reserved_bytes, StatPool::small_pool), 0);
  alloc->check();
  // And back: s1 takes s2's freed segment over, pages and all.
  alloc->deallocate(big, s2);
  void* back = alloc->allocate(4 * MiB, s1);
  EXPECT_NE(back, nullptr);
  EXPECT_EQ(stats().num_cross_stream_reuse, 2);
  EXPECT_EQ(stats().num_pages_reclaimed, 1);
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

TEST_F(Engine, AHandleIsUnmappedOnlyAfterItsLastUsersWorkCompletes) {
  engine("", 8 * MiB);
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* a = alloc->allocate(4 * MiB, s1);   // granules 0-1 of s1's segment
  void* a2 = alloc->allocate(4 * MiB, s1);  // granules 2-3: the segment cannot be taken over
  device->launch(s1, 5000);                 // a kernel still using a when it is freed
  alloc->deallocate(a, s1);                 // cached at once (its own stream)
  ASSERT_FALSE(device->stream_idle(s1));
  const auto unmaps = device_calls(DeviceOp::unmap);
  void* b = alloc->allocate(4 * MiB, s2);  // needs a's granules
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(device->stream_idle(s1));  // waited for before the unmap
  EXPECT_GE(device->now(), 5000u);
  // a's two handles, side by side, go in one unmap call covering both mappings.
  EXPECT_EQ(device_calls(DeviceOp::unmap), unmaps + 1);
  EXPECT_EQ(stats().num_pages_unmapped, 2);
  EXPECT_EQ(stats().num_reclaim_syncs, 1);  // one wait for the pool, not one per handle
  // An idle stream costs a query, no wait.
  alloc->deallocate(a2, s1);
  alloc->deallocate(b, s2);
  void* c = alloc->allocate(8 * MiB, s2);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(stats().num_reclaim_syncs, 1);
  alloc->deallocate(c, s2);
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

// deallocate() has freed the block before the release threshold gives memory back: an unmap the
// device fails there leaves the handles mapped under the free block - the next free gives them
// back - and does not make deallocate() throw, so that a caller who takes a throw for "not freed"
// does not free twice.
TEST_F(Engine, AFailedUnmapAtTheReleaseThresholdLeavesTheFreeDone) {
  engine("release_threshold_mb:2", 256 * MiB);
  void* p = alloc->allocate(64 * MiB, default_stream);
  void* q = alloc->allocate(1000, default_stream);
  device->fail_nth(DeviceOp::unmap, 1, Status::device_error);
  EXPECT_NO_THROW(alloc->deallocate(p, default_stream));
  EXPECT_FALSE(alloc->requested_size(p).has_value());
  alloc->check();
  EXPECT_EQ(alloc->reserved_bytes(), 64 * MiB + kPage);  // nothing went back
  EXPECT_EQ(stats().num_handles_released, 0);
  EXPECT_THROW(alloc->deallocate(p, default_stream), InvalidPointer);
  device->clear_faults();
  alloc->deallocate(q, default_stream);  // the next trim gives back all but 2 MiB
  alloc->check();
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

// Far from the limit a growth maps as expandable segments do: handles inside the 20 MiB pages of
// their grid (the page rule), the last page mapped to its end - the granule the next block shares
// with the request included - and a growth's run of them mapped in one call. (Near the limit that
// granule is a handle of its own: EngineHandles, NearTheLimitTheSharedLastGranule...)
TEST_F(Engine, FarFromTheLimitAGrowthMapsWholePagesInOneRun) {
  make("vmm:True", 8 * GiB);  // defaults; plenty of room
  alloc->record_history(true, 1000);
  // 3 MiB: page 0 whole, one handle; the next 5 MiB block lies on it and makes no call.
  void* a = alloc->allocate(3 * MiB, default_stream);
  EXPECT_EQ(alloc->reserved_bytes(), 20 * MiB);
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(device_calls(DeviceOp::create_physical), 1u);
  void* a2 = alloc->allocate(5 * MiB, default_stream);  // [3, 8) MiB
  EXPECT_EQ(addr(a2), addr(a) + 3 * MiB);
  EXPECT_EQ(stats().num_handles_created, 1);
  // 100 MiB right after them, [8, 108) MiB: pages 1-5 (to 120 MiB), a handle each.
  void* b = alloc->allocate(100 * MiB, default_stream);
  EXPECT_EQ(addr(b), addr(a) + 8 * MiB);
  EXPECT_EQ(alloc->reserved_bytes(), 120 * MiB);
  EXPECT_EQ(stats().num_handles_created, 6);
  EXPECT_EQ(stats().num_pages_mapped, 60);
  std::vector<std::size_t> runs;
  for (const HistoryEntry& e : alloc->history()) {
    if (e.action == HistoryEntry::Action::segment_map) runs.push_back(e.size);
  }
  EXPECT_EQ(runs, (std::vector<std::size_t>{20 * MiB, 100 * MiB}));
  // The next 12 MiB lies on page 5's mapped rest: no call.
  void* c = alloc->allocate(12 * MiB, default_stream);
  EXPECT_EQ(addr(c), addr(a) + 108 * MiB);
  EXPECT_EQ(stats().num_handles_created, 6);
  alloc->check();
  for (void* p : {a, a2, b, c}) alloc->deallocate(p, default_stream);
  alloc->empty_cache();
  EXPECT_EQ(alloc->reserved_bytes(), 0u);
  EXPECT_EQ(stats().num_handles_released, 6);
  EXPECT_EQ(device->used_bytes(), 0u);
}

// Where "far" ends: a growth is far from the limit while the room left after it is at least 8
// times all that is reserved with it. On 1 GiB, a 100 MiB block (920 MiB left >= 8 x 104) and a
// 3 MiB block are far, the 3 MiB block's page mapped to its end; the next 3 MiB growth
// (900 MiB left < 8 x 124) is near: the two granules it touches, the shared one on its own.
TEST_F(Engine, AGrowthIsFarFromTheLimitWhileTheRoomLeftIsEightTimesWhatIsReserved) {
  make("vmm:True", 1 * GiB);
  void* a = alloc->allocate(100 * MiB, default_stream);  // [0, 100) MiB: pages 0-4
  EXPECT_EQ(alloc->reserved_bytes(), 100 * MiB);
  void* b = alloc->allocate(3 * MiB, default_stream);  // [100, 103): page 5 whole
  EXPECT_EQ(alloc->reserved_bytes(), 120 * MiB);
  EXPECT_EQ(stats().num_handles_created, 6);
  void* c = alloc->allocate(17 * MiB, default_stream);  // [103, 120): on page 5, no call
  EXPECT_EQ(addr(c), addr(b) + 3 * MiB);
  EXPECT_EQ(stats().num_handles_created, 6);
  void* d = alloc->allocate(3 * MiB, default_stream);  // [120, 123): granules 60 and 61
  EXPECT_EQ(addr(d), addr(a) + 120 * MiB);
  EXPECT_EQ(alloc->reserved_bytes(), 124 * MiB);
  EXPECT_EQ(stats().num_handles_created, 8);
  alloc->check();
  for (void* p : {a, b, c, d}) alloc->deallocate(p, default_stream);
  alloc->empty_cache();
  EXPECT_EQ(alloc->reserved_bytes(), 0u);
}

// Which handles a reclaim takes when no single one covers the need: the largest first, and of one
// size the one whose free block has been cached longest (least recently used), a free block's top
// first (requests are cut from a free block's start). On 28 MiB with one-granule handles, three
// free blocks - low, mid and high in the range, mid cached before the others - and a growth that
// lacks two granules: they come from mid's top, in one unmap (lowest first would take low's,
// highest first high's).
TEST_F(Engine, AReclaimTakesTheLongestCachedHandlesFirstAndABlocksTopFirst) {
  engine("", 28 * MiB);
  alloc->record_history(true, 1000);
  void* low = alloc->allocate(4 * MiB, default_stream);   // [0, 4) MiB
  void* s1 = alloc->allocate(2 * MiB, default_stream);    // [4, 6)
  void* mid = alloc->allocate(6 * MiB, default_stream);   // [6, 12)
  void* s2 = alloc->allocate(2 * MiB, default_stream);    // [12, 14)
  void* high = alloc->allocate(4 * MiB, default_stream);  // [14, 18)
  void* s3 = alloc->allocate(2 * MiB, default_stream);    // [18, 20)
  void* c = alloc->allocate(2 * MiB, default_stream);     // [20, 22)
  void* s4 = alloc->allocate(2 * MiB, default_stream);    // [22, 24)
  ASSERT_EQ(addr(s4), addr(low) + 22 * MiB);
  ASSERT_EQ(alloc->reserved_bytes(), 24 * MiB);
  ASSERT_EQ(stats().num_handles_created, 12);
  alloc->deallocate(mid, default_stream);
  alloc->deallocate(c, default_stream);
  void* c2 = alloc->allocate(2 * MiB, default_stream);  // c's block again: a request goes by
  ASSERT_EQ(c2, c);
  alloc->deallocate(low, default_stream);  // both cached after mid
  alloc->deallocate(high, default_stream);
  // 8 MiB at [24, 32): 4 granules, room for 2; 7 one-granule handles lie under free blocks.
  void* d = alloc->allocate(8 * MiB, default_stream);
  EXPECT_EQ(addr(d), addr(low) + 24 * MiB);
  std::vector<std::pair<std::uintptr_t, std::size_t>> unmaps;
  for (const HistoryEntry& e : alloc->history()) {
    if (e.action == HistoryEntry::Action::segment_unmap) unmaps.emplace_back(e.addr, e.size);
  }
  EXPECT_EQ(unmaps,
            (std::vector<std::pair<std::uintptr_t, std::size_t>>{{addr(mid) + 2 * MiB, 4 * MiB}}));
  EXPECT_EQ(stats().num_pages_unmapped, 2);
  EXPECT_EQ(alloc->reserved_bytes(), 28 * MiB);
  EXPECT_EQ(device->used_bytes(), 28 * MiB);
  alloc->check();
  // low's and high's blocks are still mapped: 4 MiB requests there make no call.
  const auto creates = device_calls(DeviceOp::create_physical);
  const auto maps = device_calls(DeviceOp::map);
  void* low2 = alloc->allocate(4 * MiB, default_stream);
  void* high2 = alloc->allocate(4 * MiB, default_stream);
  EXPECT_EQ(low2, low);
  EXPECT_EQ(high2, high);
  EXPECT_EQ(device_calls(DeviceOp::create_physical), creates);
  EXPECT_EQ(device_calls(DeviceOp::map), maps);
  for (void* p : {low2, high2, s1, s2, s3, c2, s4, d}) alloc->deallocate(p, default_stream);
  alloc->empty_cache();
  EXPECT_EQ(alloc->reserved_bytes(), 0u);
  EXPECT_EQ(device->used_bytes(), 0u);
}

// The last resort: where the best fit cannot be backed even after the whole cache went back,
// the request goes to the free block, start or end, where the fewest granules are missing. Here
// the other free block's mapped ends lie on page handles that blocks in use share; another
// process takes every byte the device has left, so both requests would be out of memory on the
// best fit.
TEST_F(Engine, WhereTheBestFitCannotBeBackedTheFreeBlockMissingTheFewestGranulesServes) {
  make("vmm:True", 1 * GiB);  // defaults; far from the limit, growths map whole 20 MiB pages
  void* x = alloc->allocate(30 * MiB, default_stream);  // [0, 30) MiB: pages 0 and 1, to 40 MiB
  void* y = alloc->allocate(8 * MiB, default_stream);   // [30, 38): on page 1, no call
  ASSERT_EQ(addr(y), addr(x) + 30 * MiB);
  ASSERT_EQ(alloc->reserved_bytes(), 40 * MiB);
  alloc->deallocate(x, default_stream);
  alloc->empty_cache();  // page 0 goes back; page 1 stays under y: [20, 30) and [38, 40) mapped
  ASSERT_EQ(alloc->reserved_bytes(), 20 * MiB);
  void* other = nullptr;  // another process takes the rest of the device
  ASSERT_EQ(device->allocate(device->capacity() - device->used_bytes(), &other), Status::ok);
  const auto maps = device_calls(DeviceOp::map);
  // 10 MiB: the best fit is [0, 30) (5 granules at its start, none free); its end is mapped.
  void* a = alloc->allocate(10 * MiB, default_stream);
  EXPECT_EQ(addr(a), addr(x) + 20 * MiB);
  // 2 MiB: the best fit is [0, 20) (a granule); the start of [38, ...) is mapped.
  void* b = alloc->allocate(2 * MiB, default_stream);
  EXPECT_EQ(addr(b), addr(x) + 38 * MiB);
  EXPECT_EQ(device_calls(DeviceOp::map), maps);
  EXPECT_EQ(stats().num_oom_rescues, 2);
  EXPECT_EQ(stats().num_ooms, 0);
  alloc->check();
  // Nothing is left mapped anywhere: a third request is out of memory.
  EXPECT_THROW(alloc->allocate(2 * MiB, default_stream), OutOfMemory);
  EXPECT_EQ(stats().num_oom_rescues, 2);
  alloc->check();
  ASSERT_EQ(device->deallocate(other), Status::ok);
  for (void* p : {a, b, y}) alloc->deallocate(p, default_stream);
  alloc->empty_cache();
  EXPECT_EQ(alloc->reserved_bytes(), 0u);
  EXPECT_EQ(device->used_bytes(), 0u);
}

TEST_F(Engine, MaxHandleSizeCapsEachCreation) {
  make("vmm:True,max_handle_size_mb:40", 8 * GiB);
  void* b = alloc->allocate(100 * MiB, default_stream);  // 40 + 40 + 20 MiB
  EXPECT_EQ(stats().num_handles_created, 3);
  EXPECT_EQ(alloc->reserved_bytes(), 100 * MiB);
  alloc->check();
  alloc->deallocate(b, default_stream);
}

TEST_F(Engine, SnapshotAndHistoryDescribeExpandableSegments) {
  engine("", 24 * MiB);  // near the limit: only the two granules the block touches
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

// A failure part way through a map of several handles leaves none of them mapped or held.
TEST(EngineFaults, AFailedMapPartWayLeavesNothingMapped) {
  SimDevice device(sim_options(16 * MiB));  // near the limit: growths map only what blocks touch
  CachingAllocator alloc(device,
                         Config::parse("vmm:True,large_handle_size_mb:2,max_handle_size_mb:2"));
  void* first = alloc.allocate(2 * MiB, default_stream);  // a first growth: no fallback from now
  alloc.deallocate(first, default_stream);
  device.fail_nth(DeviceOp::map, 3, Status::device_error);
  const auto unmaps = device.counters().of(DeviceOp::unmap);
  const auto used = device.used_bytes();
  EXPECT_THROW(alloc.allocate(10 * MiB, default_stream), DeviceError);
  alloc.check();
  EXPECT_EQ(alloc.stats().get(StatKind::reserved_bytes, StatPool::all).current,
            static_cast<std::int64_t>(2 * MiB));
  // SimDevice maps a run handle by handle: the two mapped before the failure go in one unmap.
  EXPECT_EQ(device.counters().of(DeviceOp::unmap), unmaps + 1);
  EXPECT_EQ(device.used_bytes(), used);
  void* p = alloc.allocate(10 * MiB, default_stream);
  alloc.check();
  alloc.deallocate(p, default_stream);
}

// A failed map part way whose undo fails too (the one unmap over the mapped handles): the default
// map_run undoes them one by one, so the engine, which releases the run's handles, forgets no
// mapping - the range goes back and the memory with it.
TEST(EngineFaults, AFailedUndoOfAFailedMapIsRetriedMappingByMapping) {
  SimDevice device(sim_options(1 * GiB));
  CachingAllocator alloc(device, Config::parse("vmm:True,small_handle_size_mb:2,"
                                               "large_handle_size_mb:2,max_handle_size_mb:2"));
  device.fail_nth(DeviceOp::map, 2, Status::device_error);    // the run's second handle
  device.fail_nth(DeviceOp::unmap, 1, Status::device_error);  // the undo of the first
  EXPECT_THROW(alloc.allocate(4 * MiB, default_stream), DeviceError);
  device.clear_faults();
  alloc.check();
  EXPECT_EQ(alloc.reserved_bytes(), 0u);
  EXPECT_EQ(device.used_bytes(), 0u);
  EXPECT_NO_THROW(alloc.empty_cache());
  EXPECT_EQ(device.live_reservations(), 0u);
  void* p = alloc.allocate(4 * MiB, default_stream);
  alloc.check();
  alloc.deallocate(p, default_stream);
}

// A device that refuses the engine at its first growth (CUDA_ERROR_NOT_SUPPORTED from cuMemMap or
// cuMemCreate: MIG, vGPU) gets classic segments, once and for good, and the allocator says so. A
// refusal later, or with vmm:True, is an error.
TEST(EngineFallback, ARefusedFirstMapFallsBackToSegmentsOnceAndSaysSo) {
  for (const DeviceOp op : {DeviceOp::map, DeviceOp::create_physical, DeviceOp::reserve}) {
    SCOPED_TRACE(to_string(op));
    SimDevice device(sim_options(64 * MiB));
    CachingAllocator alloc(device, Config());
    ASSERT_TRUE(alloc.uses_virtual_memory());
    EXPECT_EQ(alloc.virtual_memory_note(), "");
    device.fail_nth(op, 1, Status::not_supported);
    void* a = alloc.allocate(3 * MiB, default_stream);
    ASSERT_NE(a, nullptr);
    EXPECT_FALSE(alloc.uses_virtual_memory());
    EXPECT_NE(alloc.virtual_memory_note().find("refused the virtual-memory engine"),
              std::string::npos)
        << alloc.virtual_memory_note();
    EXPECT_EQ(alloc.stats().num_vmm_fallbacks, 1);
    EXPECT_EQ(alloc.stats().flatten().at("num_vmm_fallbacks"), 1);
    // Served by a 20 MiB classic segment; nothing of the engine is left on the device.
    EXPECT_EQ(device.counters().of(DeviceOp::allocate), 1u);
    EXPECT_EQ(alloc.reserved_bytes(), 20 * MiB);
    EXPECT_EQ(device.live_reservations(), 0u);
    EXPECT_EQ(device.live_physical(), 0u);
    alloc.check();
    void* b = alloc.allocate(30 * MiB, default_stream);
    EXPECT_EQ(device.counters().of(DeviceOp::allocate), 2u);
    alloc.deallocate(a, default_stream);
    alloc.deallocate(b, default_stream);
    alloc.empty_cache();
    EXPECT_EQ(device.used_bytes(), 0u);
  }
}

TEST(EngineFallback, ARefusalAfterTheFirstGrowthOrUnderVmmTrueIsAnError) {
  {
    SimDevice device(sim_options(64 * MiB));
    CachingAllocator alloc(device, Config());
    void* a = alloc.allocate(3 * MiB, default_stream);
    device.fail_nth(DeviceOp::map, 1, Status::not_supported);
    EXPECT_THROW(alloc.allocate(30 * MiB, default_stream), DeviceError);
    EXPECT_TRUE(alloc.uses_virtual_memory());
    EXPECT_EQ(alloc.stats().num_vmm_fallbacks, 0);
    alloc.check();
    alloc.deallocate(a, default_stream);
  }
  {
    SimDevice device(sim_options(64 * MiB));
    CachingAllocator alloc(device, Config::parse("vmm:True"));
    device.fail_nth(DeviceOp::map, 1, Status::not_supported);
    try {
      alloc.allocate(3 * MiB, default_stream);
      FAIL() << "expected DeviceError";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("vmm:True"), std::string::npos) << e.what();
    }
    alloc.check();
    EXPECT_EQ(device.live_physical(), 0u);
    EXPECT_EQ(device.live_reservations(), 0u);
  }
  {  // A device without virtual memory: classic segments from the start, and the note says why.
    SimDeviceOptions options = sim_options(64 * MiB);
    options.virtual_memory = false;
    SimDevice device(options);
    CachingAllocator alloc(device, Config());
    EXPECT_FALSE(alloc.uses_virtual_memory());
    EXPECT_NE(alloc.virtual_memory_note().find("no virtual memory"), std::string::npos);
    EXPECT_EQ(alloc.stats().num_vmm_fallbacks, 1);
    EXPECT_TRUE(CachingAllocator(device, Config::parse("vmm:False")).virtual_memory_note().empty());
  }
}

// How handles follow the room left: at most a 20 MiB page each (the page rule), and near the
// limit (a 32nd of the room left after a growth is less than a granule) at most six per run of
// granules, so that what a free block covers can go back in small pieces.
TEST(EngineHandles, HandlesGetSmallerAsTheRoomRunsOut) {
  SimDevice device(sim_options(256 * MiB));
  CachingAllocator alloc(device, Config());
  // 200 MiB (100 granules over ten pages) leave 56 MiB: six pieces of 17 granules would do, but
  // no handle reaches past its page: ten of a page each, mapped in one run.
  void* a = alloc.allocate(200 * MiB, default_stream);
  EXPECT_EQ(alloc.stats().num_handles_created, 10);
  EXPECT_EQ(device.live_physical(), 10u);
  EXPECT_EQ(device.counters().of(DeviceOp::map), 10u);  // one map_run: a map per handle
  // 20 MiB more, one page (10 granules), leave 36 MiB: one granule at most, six per run: five
  // of 2.
  void* b = alloc.allocate(20 * MiB, default_stream);
  EXPECT_EQ(alloc.stats().num_handles_created, 15);
  EXPECT_EQ(alloc.reserved_bytes(), 220 * MiB);
  alloc.check();
  alloc.deallocate(a, default_stream);
  alloc.deallocate(b, default_stream);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().num_handles_released, 15);
  EXPECT_EQ(device.used_bytes(), 0u);
}

// A handle goes back only whole: one under a live block stays, whatever lies free beside it.
TEST(EngineHandles, AHandleUnderALiveBlockIsNeverUnmapped) {
  SimDevice device(sim_options(8 * GiB));
  CachingAllocator alloc(device, Config());
  alloc.deallocate(alloc.allocate(20 * MiB, default_stream), default_stream);  // one 20 MiB page
  void* a = alloc.allocate(3 * MiB, default_stream);  // on that handle: no call
  EXPECT_EQ(alloc.reserved_bytes(), 20 * MiB);
  EXPECT_EQ(alloc.stats().num_handles_created, 1);
  alloc.set_memory_fraction(static_cast<double>(32 * MiB) / static_cast<double>(8 * GiB));
  const Stream s1 = device.create_stream();
  // 16 MiB on another stream: 12 MiB are left under the 32 MiB limit, and the 17 MiB free beside
  // `a` lie on a's handle.
  EXPECT_THROW(alloc.allocate(16 * MiB, s1), OutOfMemory);
  EXPECT_EQ(device.counters().of(DeviceOp::unmap), 0u);
  EXPECT_EQ(alloc.reserved_bytes(), 20 * MiB);
  alloc.check();
  alloc.deallocate(a, default_stream);  // now the whole handle is free: 16 MiB fit
  const auto calls = memory_calls(device);
  void* b = alloc.allocate(16 * MiB, s1);
  ASSERT_NE(b, nullptr);
  // s1 takes over the default stream's cached range, and the request lies on its free handle.
  EXPECT_EQ(alloc.stats().num_cross_stream_reuse, 1);
  EXPECT_EQ(alloc.reserved_bytes(), 20 * MiB);
  EXPECT_EQ(memory_calls(device), calls);
  alloc.check();
  alloc.deallocate(b, s1);
}

// Near the limit, a request cut from a free block keeps the page handle under it, as expandable
// segments keep their page: no call now, and none when the same requests come again. (Giving the
// handle back to map the request on a granule, as the engine once did after a reclaim, pinned less
// but made the next large request map it again: a training step under pressure paid for both, step
// after step.) What the handle pins beside the request is what expandable segments' page would.
TEST(EngineHandles, NearTheLimitASmallRequestTakesPartOfAFreePageHandleWithNoCall) {
  SimDevice device(sim_options(8 * GiB));
  CachingAllocator alloc(device, Config());
  const Stream s1 = device.create_stream();
  void* a = alloc.allocate(20 * MiB, default_stream);  // a 20 MiB handle, granules 0-9
  void* c = alloc.allocate(20 * MiB, s1);              // a 20 MiB handle in s1's range
  EXPECT_EQ(alloc.reserved_bytes(), 40 * MiB);
  alloc.deallocate(a, default_stream);
  alloc.deallocate(c, s1);
  alloc.set_memory_fraction(static_cast<double>(40 * MiB) / static_cast<double>(8 * GiB));
  // 30 MiB on the default stream: granules 10-14 are missing and the limit is reached, so s1's
  // free handle is reclaimed.
  void* e = alloc.allocate(30 * MiB, default_stream);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(alloc.stats().num_pages_reclaimed, 10);
  alloc.deallocate(e, default_stream);
  const auto calls = memory_calls(device);
  // 2 MiB, then 6 MiB, on the default pool's free 20 MiB handle: no call, nothing given back.
  void* f = alloc.allocate(2 * MiB, default_stream);
  void* g = alloc.allocate(6 * MiB, default_stream);
  EXPECT_EQ(f, e);
  EXPECT_EQ(static_cast<char*>(g), static_cast<char*>(f) + 2 * MiB);
  EXPECT_EQ(memory_calls(device), calls);
  EXPECT_EQ(alloc.stats().num_handle_splits, 0);
  alloc.check();
  // Freed and asked again: the same blocks, still no call.
  alloc.deallocate(g, default_stream);
  alloc.deallocate(f, default_stream);
  EXPECT_EQ(alloc.allocate(2 * MiB, default_stream), f);
  EXPECT_EQ(alloc.allocate(6 * MiB, default_stream), g);
  EXPECT_EQ(memory_calls(device), calls);
  alloc.check();
  alloc.deallocate(f, default_stream);
  alloc.deallocate(g, default_stream);
}

// Near the limit, a request that ends inside a granule gets that granule as a handle of its own:
// the next block cut from the rest shares it, and once the first is freed, every other handle
// under it can go back while the second lives.
TEST(EngineHandles, NearTheLimitTheSharedLastGranuleOfARequestIsAHandleOfItsOwn) {
  SimDevice device(sim_options(1 * GiB));
  CachingAllocator alloc(device, Config());
  void* a = alloc.allocate(400 * MiB, default_stream);
  const std::int64_t created = alloc.stats().num_handles_created;
  const std::size_t reserved = alloc.reserved_bytes();
  // 39 MiB (19.5 granules over two pages) leave about 584 MiB: handles of at most 9 granules
  // and never past a page, no extension over the rest of the block (the request is longer than
  // that), and the 20th granule, half used, alone: 9 + 1 + 9 + 1.
  void* b = alloc.allocate(39 * MiB, default_stream);
  EXPECT_EQ(alloc.stats().num_handles_created - created, 4);
  EXPECT_EQ(alloc.reserved_bytes() - reserved, 40 * MiB);
  // 1.5 MiB more, cut from the rest of the block: on b's last granule and the next one (the
  // growth's share of the room is under a granule: no extension).
  void* c = alloc.allocate(3 * MiB / 2, default_stream);
  EXPECT_EQ(static_cast<char*>(c), static_cast<char*>(b) + 39 * MiB);
  EXPECT_EQ(alloc.stats().num_handles_created - created, 5);
  EXPECT_EQ(alloc.reserved_bytes() - reserved, 42 * MiB);
  alloc.deallocate(b, default_stream);
  // b's three other handles go back; the granule it shared with c stays (were it the end of a
  // handle of several, all of them would).
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().num_handles_released, 3);
  EXPECT_EQ(alloc.reserved_bytes() - reserved, 4 * MiB);
  alloc.check();
  alloc.deallocate(c, default_stream);
  alloc.deallocate(a, default_stream);
  alloc.empty_cache();
  EXPECT_EQ(device.used_bytes(), 0u);
}

// Near the limit, the extension a growth maps past the request's last granule is a handle of its
// own, apart from that granule and from the block's others (Note [The shared granule]): a block
// cut from the extension and freed while the first lives leaves nothing of it pinned. (On one
// handle with the block's end, the extension stayed mapped under the live block: a training
// step's optimizer state, cut from freed activations, needed more than PyTorch's own segments.)
TEST(EngineHandles, NearTheLimitAGrowthsExtensionIsAHandleOfItsOwn) {
  SimDevice device(sim_options(8 * GiB));
  CachingAllocator alloc(device, Config());
  // 1,540 MiB (770 granules, 77 pages) leave 6.5 GiB: not far from the limit (a growth is far
  // while the room left is eight times what is reserved).
  void* a = alloc.allocate(1540 * MiB, default_stream);
  const std::int64_t created = alloc.stats().num_handles_created;
  const std::size_t reserved = alloc.reserved_bytes();
  // 3 MiB at granule 770, a page's start: granule 770 inside the block, 771 half used and shared
  // with the next block, and one granule of extension (a 1024th of the room left, about 6 MiB,
  // reaches three granules from the request's start): three handles of one granule.
  void* b = alloc.allocate(3 * MiB, default_stream);
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 1540 * MiB);
  EXPECT_EQ(alloc.stats().num_handles_created - created, 3);
  EXPECT_EQ(alloc.reserved_bytes() - reserved, 6 * MiB);
  // 1.5 MiB cut from the rest: on b's last granule and the extension, no call.
  const auto creates = device.counters().of(DeviceOp::create_physical);
  void* c = alloc.allocate(3 * MiB / 2, default_stream);
  EXPECT_EQ(static_cast<char*>(c), static_cast<char*>(b) + 3 * MiB);
  EXPECT_EQ(device.counters().of(DeviceOp::create_physical), creates);
  // c freed while b lives: the extension lies under free blocks only and goes back; b's two
  // granules stay.
  alloc.deallocate(c, default_stream);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().num_handles_released, 1);
  EXPECT_EQ(alloc.reserved_bytes() - reserved, 4 * MiB);
  alloc.check();
  alloc.deallocate(b, default_stream);
  alloc.deallocate(a, default_stream);
  alloc.empty_cache();
  EXPECT_EQ(device.used_bytes(), 0u);
}

// Note [Fine cuts]: near the limit, a block cut from a free block to end inside a handle made near
// the limit, where the handle goes on under the free rest, gives that handle back first; the
// block's granules and the handle's rest are mapped again on handles of their own, so that with
// the block live the rest can go back. Far from the limit the page rule alone holds.
TEST(EngineHandles, NearTheLimitACutInsideAFineHandleGivesItBackFirst) {
  for (const bool near : {true, false}) {
    SCOPED_TRACE(near ? "4 GiB device" : "64 GiB device");
    SimDevice device(sim_options(near ? 4 * GiB : 64 * GiB));
    CachingAllocator alloc(device, Config());
    // Granules [0, 1024). On the 4 GiB device the 20 MiB at granule 1024 are mapped with 2 GiB
    // left, less than twice the 2 GiB held: their handles, [1024, 1030) to the page's end and
    // [1030, 1034), are fine. On the 64 GiB device both growths are far from the limit and map
    // as expandable segments do: the last page of the 2 GiB, [1020, 1030), to its end, then
    // [1030, 1040).
    void* a = alloc.allocate(2 * GiB, default_stream);
    void* b = alloc.allocate(20 * MiB, default_stream);
    ASSERT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 2 * GiB);
    alloc.deallocate(b, default_stream);
    // 5 MiB cut from the free 20 MiB ends in granule 1026. Near: [1024, 1030) given back, then
    // [1024, 1026), [1026, 1027) and [1027, 1030) created and mapped.
    void* c = cut_5_of_20(alloc, device, b, /*gives_back=*/near);
    // With c live, the cache gives back all but c's 3 granules near the limit; far from it, c's
    // page handle stays whole, shared with a (the page rule: what expandable segments' page holds).
    alloc.empty_cache();
    EXPECT_EQ(alloc.reserved_bytes(), 2 * GiB + (near ? 6 : 12) * MiB);
    alloc.check();
    alloc.deallocate(c, default_stream);
    alloc.deallocate(a, default_stream);
    alloc.empty_cache();
    EXPECT_EQ(device.used_bytes(), 0u);
  }
}

// A handle made with room is given back at a cut that ends inside it only while the pool is
// crowded: its blocks in use hold more than a third of what the engine can have. What is cached
// does not count, so that a later pass, which holds the cache the first left but the same blocks
// in use at each request, cuts as the first did (Note [Fine cuts]).
TEST(EngineHandles, AHandleMadeWithRoomIsGivenBackAtACutOnlyWhileThePoolIsCrowded) {
  for (const bool crowded : {false, true}) {
    SCOPED_TRACE(crowded ? "2 GiB of 4 GiB in use" : "2 GiB of 4 GiB cached");
    SimDevice device(sim_options(4 * GiB));
    CachingAllocator alloc(device, Config());
    // Far from the limit: b's growth maps its page, granules [0, 10), as one handle.
    void* b = alloc.allocate(20 * MiB, default_stream);
    void* a = alloc.allocate(2 * GiB, default_stream);
    alloc.deallocate(b, default_stream);
    if (!crowded) alloc.deallocate(a, default_stream);  // held, not in use
    // Near the limit either way (2 GiB left, less than twice the 2 GiB held). 5 MiB, the best
    // fit's start, ends in granule 2 of [0, 10). Crowded: [0, 10) given back, then [0, 2), [2, 3)
    // and [3, 10) created and mapped. Not crowded: served where it is.
    void* c = cut_5_of_20(alloc, device, b, /*gives_back=*/crowded);
    // With c live, the cache keeps c's 3 granules where the cut was fine, its whole page (the page
    // rule's bound, what expandable segments' page holds) where it was not.
    alloc.empty_cache();
    EXPECT_EQ(alloc.reserved_bytes(), (crowded ? 2 * GiB : 0) + (crowded ? 6 : 20) * MiB);
    alloc.check();
    alloc.deallocate(c, default_stream);
    if (crowded) alloc.deallocate(a, default_stream);
    alloc.empty_cache();
    EXPECT_EQ(device.used_bytes(), 0u);
  }
}

// A pool made after the engine's first growth takes the engine's crowding threshold with it:
// its own first growths, which leave the threshold as it was, do not set it.
TEST(EngineHandles, APoolMadeAfterTheFirstGrowthKnowsWhenItIsCrowded) {
  SimDevice device(sim_options(4 * GiB));
  CachingAllocator alloc(device, Config());
  void* first = alloc.allocate(MiB, default_stream);  // the first growth, on the first pool
  const Stream side = device.create_stream();
  void* b = alloc.allocate(20 * MiB, side);  // far from the limit: its page as one handle
  void* a = alloc.allocate(2 * GiB, side);
  alloc.deallocate(b, side);
  // 2 GiB of 4 GiB in use on this stream: crowded.
  void* c = cut_5_of_20(alloc, device, b, /*gives_back=*/true, side);
  for (void* p : {c, a}) alloc.deallocate(p, side);
  alloc.deallocate(first, default_stream);
  alloc.empty_cache();
  EXPECT_EQ(device.used_bytes(), 0u);
}

// Random requests on several streams near the limit, check() after every step: SimDevice refuses
// any map of part of a handle and any unmap that cuts a mapping, so none is ever made.
TEST(EngineHandles, RandomWorkNearTheLimitOnlyEverMapsAndUnmapsWholeHandles) {
  for (const char* conf : {"", "large_handle_size_mb:4", "max_handle_size_mb:8"}) {
    SCOPED_TRACE(conf);
    SimDevice device(sim_options(256 * MiB));
    CachingAllocator alloc(device, Config::parse(conf));
    const Stream streams[] = {default_stream, device.create_stream(), device.create_stream()};
    std::mt19937_64 rng(42);
    std::vector<std::pair<void*, Stream>> live;
    std::size_t ooms = 0;
    for (int step = 0; step < 3000; ++step) {
      if (!live.empty() && (rng() % 100 < 45 || live.size() > 60)) {
        const std::size_t i = rng() % live.size();
        alloc.deallocate(live[i].first, live[i].second);
        live[i] = live.back();
        live.pop_back();
      } else {
        const std::size_t kind = rng() % 10;
        const std::size_t bytes = kind < 5   ? 1 + rng() % MiB
                                  : kind < 9 ? MiB + rng() % (12 * MiB)
                                             : 12 * MiB + rng() % (40 * MiB);
        const Stream s = streams[rng() % 3];
        try {
          live.emplace_back(alloc.allocate(bytes, s), s);
        } catch (const OutOfMemory&) {
          ++ooms;
        }
      }
      if (step % 7 == 0) alloc.check();
    }
    alloc.check();
    for (DeviceOp op : {DeviceOp::map, DeviceOp::unmap, DeviceOp::release_physical}) {
      EXPECT_EQ(device.counters().failed(op), 0u) << to_string(op);
    }
    EXPECT_GT(alloc.stats().num_pages_reclaimed, 0);
    EXPECT_GT(ooms, 0u);  // it did run at the limit
    for (const auto& [p, s] : live) alloc.deallocate(p, s);
    alloc.empty_cache();
    EXPECT_EQ(device.used_bytes(), 0u);
    EXPECT_EQ(device.live_physical(), 0u);
  }
}

// --- the options that live on the miss path, under the engine -------------------------------------

// Garbage collection: above the threshold, whole free segments go first (PyTorch's rounds); what
// is still above it goes as handles under cached free blocks of the segments that stay.
TEST(EngineOptions, GarbageCollectionGivesBackHandlesUnderFreeBlocks) {
  for (const bool collect : {false, true}) {
    SCOPED_TRACE(collect ? "garbage_collection_threshold:0.5" : "no garbage collection");
    SimDevice device(sim_options(1 * GiB));
    CachingAllocator alloc(device,
                           Config::parse(std::string("vmm:True,memory_limit_mb:100") +
                                         (collect ? ",garbage_collection_threshold:0.5" : "")));
    void* keep = alloc.allocate(2 * MiB, default_stream);  // keeps the range from being whole
    void* a = alloc.allocate(30 * MiB, default_stream);
    void* b = alloc.allocate(30 * MiB, default_stream);
    alloc.deallocate(a, default_stream);
    alloc.deallocate(b, default_stream);
    const std::size_t cached = alloc.reserved_bytes();
    EXPECT_GT(cached, 50 * MiB);
    // A miss on another stream: with collection, the handles under a's and b's free block go
    // until reserved memory is back under 50 MiB, before the request grows.
    const Stream s1 = device.create_stream();
    void* c = alloc.allocate(8 * MiB, s1);
    if (collect) {
      EXPECT_GT(alloc.stats().num_handles_released, 0);
      EXPECT_LE(alloc.reserved_bytes(), 50 * MiB + 8 * MiB + 2 * MiB);
    } else {
      EXPECT_EQ(alloc.stats().num_handles_released, 0);
      EXPECT_EQ(alloc.reserved_bytes(), cached + 8 * MiB);
    }
    alloc.check();
    alloc.deallocate(c, s1);
    alloc.deallocate(keep, default_stream);
  }
}

// Garbage collection counts a whole free range it releases by the memory mapped in it, not by its
// address space (twice the device): releasing another stream's range that held 4 MiB leaves
// reserved memory above the threshold, and the collection goes on to the handles under the
// default stream's free blocks.
TEST(EngineOptions, GarbageCollectionCountsAWholeFreeRangeByTheMemoryItHeld) {
  SimDevice device(sim_options(1 * GiB));
  CachingAllocator alloc(device, Config::parse("vmm:True,memory_limit_mb:100,"
                                               "garbage_collection_threshold:0.5"));
  const Stream s2 = device.create_stream();
  void* other = alloc.allocate(4 * MiB, s2);
  alloc.deallocate(other, s2);  // s2's range: whole, free, 4 MiB mapped
  void* keep = alloc.allocate(2 * MiB, default_stream);
  void* a = alloc.allocate(30 * MiB, default_stream);
  void* b = alloc.allocate(30 * MiB, default_stream);
  alloc.deallocate(a, default_stream);
  alloc.deallocate(b, default_stream);
  const std::size_t ranges = device.live_reservations();
  ASSERT_GT(alloc.reserved_bytes(), 60 * MiB);
  const Stream s1 = device.create_stream();
  void* c = alloc.allocate(8 * MiB, s1);
  EXPECT_EQ(device.live_reservations(), ranges);     // s2's range went back, s1's came
  EXPECT_GT(alloc.stats().num_handles_released, 2);  // more than s2's 4 MiB
  EXPECT_LE(alloc.reserved_bytes(), 50 * MiB + 8 * MiB + 2 * MiB);
  alloc.check();
  alloc.deallocate(c, s1);
  alloc.deallocate(keep, default_stream);
}

// Cross-stream reuse: a stream that misses takes another stream's whole cached segment over,
// handles and all, ordered after that stream's work, before it asks the device.
TEST(EngineOptions, WhenTheDeviceIsFullAWholeCachedSegmentIsTakenOver) {
  SimDevice device(sim_options(2 * MiB));
  CachingAllocator alloc(device, Config::parse("vmm:True"));
  const Stream s1 = device.create_stream();
  const Stream s2 = device.create_stream();
  void* a = alloc.allocate(4096, s1);
  alloc.deallocate(a, s1);
  void* b = alloc.allocate(4096, s2);
  EXPECT_EQ(a, b);
  const Stats s = alloc.stats();
  EXPECT_EQ(s.num_cross_stream_reuse, 1);
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.num_handles_released, 0);
  EXPECT_EQ(device.counters().of(DeviceOp::stream_wait_event), 1u);
  alloc.check();
  alloc.deallocate(b, s2);
}

// max_split_size is classic segments' remedy: the engine gives a large free block's unused memory
// back handle by handle, so it cuts the block as best fit says (and its statistic still reports
// the value).
TEST(EngineOptions, MaxSplitSizeIsForClassicSegmentsOnly) {
  for (const char* conf : {"vmm:True,max_split_size_mb:40", "vmm:False,max_split_size_mb:40"}) {
    SCOPED_TRACE(conf);
    SimDevice device(sim_options(1 * GiB));
    CachingAllocator alloc(device, Config::parse(conf));
    void* big = alloc.allocate(100 * MiB, default_stream);
    alloc.deallocate(big, default_stream);
    void* small = alloc.allocate(10 * MiB, default_stream);
    EXPECT_EQ(small == big, alloc.uses_virtual_memory());
    EXPECT_EQ(alloc.stats().max_split_size, static_cast<std::int64_t>(40 * MiB));
    alloc.check();
    alloc.deallocate(small, default_stream);
  }
}

}  // namespace
}  // namespace cistern::testing
