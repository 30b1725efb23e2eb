// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CachingAllocator on one stream: rounding, segments, splitting, coalescing, best fit, the
// oversize rules, statistics, snapshots and misuse. Exact byte counts throughout.
#include <gtest/gtest.h>

#include <vector>

#include "allocator_fixture.hpp"
#include "cistern/errors.hpp"

namespace cistern::testing {
namespace {

using Rounding = AllocatorTest;

struct RoundCase {
  std::size_t request;
  std::int64_t block;
  std::int64_t segment;
};

// The worked examples of PyTorch's rules (reference, appendix).
TEST_F(Rounding, BlockAndSegmentSizesFollowPyTorchDefaults) {
  const RoundCase cases[] = {
      {1, 512, 2 * MiB},
      {511, 512, 2 * MiB},
      {513, 1024, 2 * MiB},
      {1 * MiB, 1 * MiB, 2 * MiB},
      {1 * MiB + 1, 1049088, 20 * MiB},
      {5 * MiB, 5 * MiB, 20 * MiB},
      {10 * MiB, 10 * MiB, 10 * MiB},
      {10 * MiB + 512 * KiB, 10 * MiB + 512 * KiB, 12 * MiB},
      {105172480, 105172480, 106954752},
  };
  for (const RoundCase& c : cases) {
    make();
    void* p = alloc->allocate(c.request, default_stream);
    EXPECT_EQ(allocated(), c.block) << "request " << c.request;
    EXPECT_EQ(reserved(), c.segment) << "request " << c.request;
    EXPECT_EQ(stat(StatKind::requested_bytes), static_cast<std::int64_t>(c.request));
    EXPECT_EQ(addr(p) % 512, 0u);
    alloc->check();
    alloc->deallocate(p, default_stream);
  }
}

TEST_F(Rounding, PowerOfTwoDivisions) {
  make("roundup_power2_divisions:4");
  const std::pair<std::size_t, std::int64_t> cases[] = {
      {1100000, 1310720},
      {1200, 1536},  // the guard size > 512 * divisions keeps small sizes at 512-multiples
      {5 * MiB + MiB / 10, 6 * MiB},
      {static_cast<std::size_t>(300.5 * MiB), 320 * MiB},
      {700 * MiB, 768 * MiB},
  };
  for (const auto& [request, block] : cases) {
    void* p = alloc->allocate(request, default_stream);
    EXPECT_EQ(static_cast<std::int64_t>(alloc->allocation_size(p)), block) << request;
    alloc->deallocate(p, default_stream);
  }
}

TEST_F(AllocatorTest, ZeroBytesIsNullAndFreeingNullIsANoOp) {
  EXPECT_EQ(alloc->allocate(0, default_stream), nullptr);
  alloc->deallocate(nullptr, default_stream);
  EXPECT_EQ(device_calls(DeviceOp::allocate), 0u);
}

TEST_F(AllocatorTest, SmallBlocksSplitOneSegment) {
  void* a = alloc->allocate(512, default_stream);
  void* b = alloc->allocate(1000, default_stream);
  void* c = alloc->allocate(512, default_stream);
  EXPECT_EQ(addr(b), addr(a) + 512);
  EXPECT_EQ(addr(c), addr(b) + 1024);
  EXPECT_EQ(stat(StatKind::segment), 1);
  EXPECT_EQ(allocated(), 2048);
  // The rest of the segment is one free block inside a split segment.
  EXPECT_EQ(stat(StatKind::inactive_split), 1);
  EXPECT_EQ(stat(StatKind::inactive_split_bytes), static_cast<std::int64_t>(2 * MiB - 2048));
  for (void* p : {a, b, c}) alloc->deallocate(p, default_stream);
  alloc->empty_cache();  // everything coalesces back into one free segment, which is released
  EXPECT_EQ(stat(StatKind::inactive_split), 0);
  EXPECT_EQ(reserved(), 0);
}

// A freed small block is parked for requests of exactly its size; parked blocks are coalesced
// before the allocator would grow, so a larger request still finds their combined space.
TEST_F(AllocatorTest, FreedSmallBlocksAreParkedThenCoalescedBeforeGrowing) {
  make("park_small_blocks:True");
  void* a = alloc->allocate(512, default_stream);
  void* b = alloc->allocate(1024, default_stream);
  void* c = alloc->allocate(512, default_stream);
  void* d = alloc->allocate(1 * MiB, default_stream);
  void* e = alloc->allocate(1 * MiB - 2048, default_stream);  // the segment is now full
  ASSERT_EQ(stat(StatKind::segment), 1);
  ASSERT_EQ(stat(StatKind::inactive_split), 0);
  for (void* p : {b, a, c}) alloc->deallocate(p, default_stream);
  EXPECT_EQ(stat(StatKind::inactive_split), 3);  // parked, not yet coalesced
  EXPECT_EQ(stat(StatKind::inactive_split_bytes), 2048);
  EXPECT_EQ(alloc->snapshot().segments[0].blocks.size(), 5u);
  EXPECT_EQ(alloc->allocate(1024, default_stream), b);  // exact size: straight back
  alloc->deallocate(b, default_stream);

  void* ab = alloc->allocate(2048, default_stream);  // fits only once a, b, c are coalesced
  EXPECT_EQ(ab, a);
  EXPECT_EQ(stat(StatKind::segment), 1);
  EXPECT_EQ(device_calls(DeviceOp::allocate), 1u);
  const Snapshot snap = alloc->snapshot();
  ASSERT_EQ(snap.segments[0].blocks.size(), 3u);
  EXPECT_EQ(snap.segments[0].blocks[0].size, 2048u);
  EXPECT_EQ(stat(StatKind::inactive_split), 0);
  for (void* p : {ab, d, e}) alloc->deallocate(p, default_stream);
  EXPECT_EQ(allocated(), 0);
}

TEST_F(AllocatorTest, FreedBlockIsReusedWithoutDeviceCalls) {
  void* p = alloc->allocate(3 * MiB, default_stream);
  alloc->deallocate(p, default_stream);
  void* q = alloc->allocate(3 * MiB, default_stream);
  EXPECT_EQ(p, q);
  EXPECT_EQ(device_calls(DeviceOp::allocate), 1u);
  EXPECT_EQ(alloc->stats().num_device_alloc, 1);
  alloc->deallocate(q, default_stream);
}

TEST_F(AllocatorTest, BestFitTakesTheSmallestBlockThenTheLowestAddress) {
  // Three 20 MiB large segments cut to leave free blocks of 4, 3 and 3 MiB.
  std::vector<void*> keep;
  std::vector<void*> holes;
  for (std::size_t hole : {4 * MiB, 3 * MiB, 3 * MiB}) {
    void* h = alloc->allocate(hole, default_stream);
    keep.push_back(alloc->allocate(20 * MiB - hole, default_stream));
    holes.push_back(h);
  }
  ASSERT_EQ(stat(StatKind::segment), 3);
  for (void* h : holes) alloc->deallocate(h, default_stream);
  const std::uintptr_t lowest3 = std::min(addr(holes[1]), addr(holes[2]));
  void* p = alloc->allocate(2 * MiB + 1, default_stream);
  EXPECT_EQ(addr(p), lowest3);
  void* q = alloc->allocate(3 * MiB, default_stream);
  EXPECT_EQ(addr(q), std::max(addr(holes[1]), addr(holes[2])));
  void* r = alloc->allocate(3 * MiB + 512, default_stream);
  EXPECT_EQ(r, holes[0]);
  EXPECT_EQ(stat(StatKind::segment), 3);
  for (void* x : {p, q, r}) alloc->deallocate(x, default_stream);
  for (void* x : keep) alloc->deallocate(x, default_stream);
}

TEST_F(AllocatorTest, LargeBlocksSplitOnlyWhenTheRestExceedsOneMiB) {
  // 19.5 MiB of a 20 MiB segment: the 0.5 MiB rest is not worth a block.
  void* p = alloc->allocate(19 * MiB + 512 * KiB, default_stream);
  EXPECT_EQ(allocated(), static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(stat(StatKind::inactive_split), 0);
  alloc->deallocate(p, default_stream);
  // 3 MiB from the cached 20 MiB: split, 17 MiB stays cached.
  void* q = alloc->allocate(3 * MiB, default_stream);
  EXPECT_EQ(q, p);
  EXPECT_EQ(allocated(), static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(stat(StatKind::inactive_split_bytes), static_cast<std::int64_t>(17 * MiB));
  alloc->deallocate(q, default_stream);
}

TEST_F(AllocatorTest, OversizeRulesOfMaxSplitSize) {
  make("max_split_size_mb:64");
  void* big = alloc->allocate(100 * MiB, default_stream);
  alloc->deallocate(big, default_stream);
  // A request below the limit never gets an oversize block.
  void* small = alloc->allocate(30 * MiB, default_stream);
  EXPECT_NE(small, big);
  EXPECT_EQ(stat(StatKind::segment), 2);
  // At or above the limit: only a block smaller than request + 20 MiB serves, unsplit.
  void* near = alloc->allocate(90 * MiB, default_stream);
  EXPECT_EQ(near, big);
  EXPECT_EQ(alloc->allocation_size(near), 100 * MiB);
  EXPECT_EQ(alloc->stats().oversize_allocations.current, 1);
  alloc->deallocate(near, default_stream);
  void* far = alloc->allocate(70 * MiB, default_stream);
  EXPECT_NE(far, big);
  const Stats s = alloc->stats();
  EXPECT_EQ(s.max_split_size, static_cast<std::int64_t>(64 * MiB));
  EXPECT_EQ(s.oversize_segments.current, 2);
  for (void* x : {small, far}) alloc->deallocate(x, default_stream);
}

TEST_F(AllocatorTest, StatisticsCountLikePyTorch) {
  void* a = alloc->allocate(100, default_stream);
  void* b = alloc->allocate(5 * MiB, default_stream);
  Stats s = alloc->stats();
  EXPECT_EQ(s.get(StatKind::allocation, StatPool::all).current, 2);
  EXPECT_EQ(s.get(StatKind::allocation, StatPool::small_pool).current, 1);
  EXPECT_EQ(s.get(StatKind::allocation, StatPool::large_pool).current, 1);
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::small_pool).current, 512);
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::large_pool).current,
            static_cast<std::int64_t>(5 * MiB));
  EXPECT_EQ(s.get(StatKind::requested_bytes, StatPool::all).current,
            static_cast<std::int64_t>(100 + 5 * MiB));
  EXPECT_EQ(s.get(StatKind::reserved_bytes, StatPool::all).current,
            static_cast<std::int64_t>(22 * MiB));
  EXPECT_EQ(s.num_device_alloc, 2);
  EXPECT_EQ(s.max_split_size, -1);
  alloc->deallocate(b, default_stream);
  s = alloc->stats();
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::all).current, 512);
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::all).peak,
            static_cast<std::int64_t>(512 + 5 * MiB));
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::all).allocated,
            static_cast<std::int64_t>(512 + 5 * MiB));
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::all).freed,
            static_cast<std::int64_t>(5 * MiB));
  alloc->reset_peak_stats();
  EXPECT_EQ(peak(StatKind::allocated_bytes), 512);
  alloc->reset_accumulated_stats();
  s = alloc->stats();
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::all).allocated, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
  const auto flat = s.flatten();
  EXPECT_EQ(flat.at("allocated_bytes.all.current"), 512);
  EXPECT_EQ(flat.at("segment.large_pool.current"), 1);
  EXPECT_EQ(flat.at("max_split_size"), -1);
  alloc->deallocate(a, default_stream);
  EXPECT_EQ(alloc->allocated_bytes(), 0u);
  EXPECT_EQ(alloc->reserved_bytes(), 22 * MiB);
}

TEST_F(AllocatorTest, SnapshotShowsSegmentsAndBlockStates) {
  void* a = alloc->allocate(1000, default_stream);
  void* b = alloc->allocate(6 * MiB, default_stream);
  const Snapshot snap = alloc->snapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  EXPECT_LT(snap.segments[0].address, snap.segments[1].address);
  std::size_t total = 0;
  for (const SegmentInfo& seg : snap.segments) {
    total += seg.total_size;
    std::size_t covered = 0;
    for (const BlockInfo& blk : seg.blocks) covered += blk.size;
    EXPECT_EQ(covered, seg.total_size);
    const BlockInfo& first = seg.blocks.front();
    EXPECT_EQ(first.state, BlockState::active_allocated);
    EXPECT_EQ(seg.blocks.back().state, BlockState::inactive);
    EXPECT_EQ(seg.requested_size, seg.is_large ? 6 * MiB : 1000u);
    EXPECT_EQ(seg.allocated_size, seg.is_large ? 6 * MiB : 1024u);
  }
  EXPECT_EQ(total, 22 * MiB);
  alloc->deallocate(a, default_stream);
  alloc->deallocate(b, default_stream);
}

TEST_F(AllocatorTest, DoubleFreeAndForeignPointersAreRejectedWithoutDamage) {
  void* p = alloc->allocate(4096, default_stream);
  void* q = alloc->allocate(4096, default_stream);
  alloc->deallocate(p, default_stream);
  const Stats before = alloc->stats();
  try {
    alloc->deallocate(p, default_stream);
    FAIL() << "double free accepted";
  } catch (const InvalidPointer& e) {
    EXPECT_NE(std::string(e.what()).find("double free"), std::string::npos) << e.what();
  }
  try {
    alloc->deallocate(static_cast<char*>(q) + 512, default_stream);
    FAIL() << "interior pointer accepted";
  } catch (const InvalidPointer& e) {
    EXPECT_NE(std::string(e.what()).find("inside"), std::string::npos) << e.what();
  }
  int host = 0;
  try {
    alloc->deallocate(&host, default_stream);
    FAIL() << "foreign pointer accepted";
  } catch (const InvalidPointer& e) {
    EXPECT_NE(std::string(e.what()).find("not allocated by this allocator"), std::string::npos);
  }
  EXPECT_THROW(alloc->record_stream(&host, Stream(1)), InvalidPointer);
  EXPECT_THROW(alloc->allocation_size(p), InvalidPointer);
  alloc->check();
  const Stats after = alloc->stats();
  EXPECT_EQ(after.flatten(), before.flatten());
  alloc->deallocate(q, default_stream);
}

TEST_F(AllocatorTest, ImpossibleSizesAreOutOfMemory) {
  EXPECT_THROW(alloc->allocate(std::size_t{1} << 60, default_stream), OutOfMemory);
  EXPECT_EQ(alloc->stats().num_ooms, 1);
  EXPECT_EQ(device_calls(DeviceOp::allocate), 0u);
}

TEST_F(AllocatorTest, EmptyCacheReturnsEveryUnusedSegment) {
  void* a = alloc->allocate(100, default_stream);
  void* b = alloc->allocate(30 * MiB, default_stream);
  void* c = alloc->allocate(3 * MiB, default_stream);
  alloc->deallocate(b, default_stream);
  alloc->deallocate(c, default_stream);
  alloc->empty_cache();
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(device->used_bytes(), 2 * MiB);
  EXPECT_EQ(alloc->stats().num_device_free, 2);
  EXPECT_EQ(alloc->stats().num_sync_all_streams, 1);
  alloc->deallocate(a, default_stream);
  alloc->empty_cache();
  EXPECT_EQ(device->used_bytes(), 0u);
}

TEST_F(AllocatorTest, DestructionReturnsTheCache) {
  void* a = alloc->allocate(100, default_stream);
  alloc->deallocate(a, default_stream);
  alloc.reset();
  EXPECT_EQ(device->used_bytes(), 0u);
  EXPECT_EQ(device->live_segments(), 0u);
}

}  // namespace
}  // namespace cistern::testing
