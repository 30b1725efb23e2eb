// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The PyTorch emulation, rule by rule, with exact byte counts: rounding and segment sizes (the
// reference's worked examples), best fit by (stream, size, address), split and oversize rules,
// record_stream, the out-of-memory path and its counters, garbage collection, the statistics
// PyTorch keeps, and the warm-start placement. check() runs after every scenario.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"
#include "replay/torch_allocator.hpp"
#include "replay/warm_start.hpp"

namespace cistern::replay {
namespace {

constexpr std::uintptr_t kBase = 0x7f0000000000;  // SimDevice's lowest address

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
void* ptr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
std::int64_t i64(std::size_t v) { return static_cast<std::int64_t>(v); }

class TorchTest : public ::testing::Test {
 protected:
  /// A fresh allocator with PyTorch options `conf` on a device of `capacity` bytes.
  void make(const std::string& conf = "", std::size_t capacity = 8 * GiB) {
    alloc.reset();
    SimDeviceOptions options;
    options.capacity = capacity;
    device = std::make_unique<SimDevice>(options);
    alloc = std::make_unique<TorchAllocator>(*device, Config::parse(conf));
  }
  void SetUp() override { make(); }
  void TearDown() override {
    if (alloc) alloc->check();
  }

  void* get(std::size_t bytes, Stream stream = default_stream) {
    void* p = alloc->allocate(bytes, stream);
    alloc->check();
    return p;
  }
  void put(void* p, Stream stream = default_stream) {
    alloc->deallocate(p, stream);
    alloc->check();
  }
  std::int64_t stat(StatKind kind, StatPool pool = StatPool::all) const {
    return alloc->stats().get(kind, pool).current;
  }
  std::int64_t reserved() const { return stat(StatKind::reserved_bytes); }
  std::int64_t allocated() const { return stat(StatKind::allocated_bytes); }

  std::unique_ptr<SimDevice> device;
  std::unique_ptr<TorchAllocator> alloc;
};

// --- sizes ---------------------------------------------------------------------------------------

TEST_F(TorchTest, RoundsAndSizesSegmentsAsTheReferenceTable) {
  struct Row {
    std::size_t request, rounded, segment;
  };
  const std::vector<Row> rows = {
      {1, 512, 2 * MiB},
      {511, 512, 2 * MiB},
      {513, 1024, 2 * MiB},
      {MiB, MiB, 2 * MiB},
      {MiB + 1, 1049088, 20 * MiB},
      {5 * MiB, 5 * MiB, 20 * MiB},
      {10 * MiB, 10 * MiB, 10 * MiB},
      {10 * MiB + MiB / 2, 10 * MiB + MiB / 2, 12 * MiB},
      {105172173, 105172480, 106954752},  // 100.3 MiB -> 102 MiB segment
  };
  for (const Row& row : rows) {
    EXPECT_EQ(alloc->round_size(row.request), row.rounded) << row.request;
    EXPECT_EQ(alloc->allocation_size(row.rounded), row.segment) << row.request;
  }
}

TEST_F(TorchTest, RoundsToPowerOfTwoDivisionsAboveTheGuard) {
  make("roundup_power2_divisions:4");
  EXPECT_EQ(alloc->round_size(1100000), 1310720u);               // 1.1 MB -> 1.25 MiB
  EXPECT_EQ(alloc->round_size(5 * MiB + MiB / 10), 6 * MiB);     // 5.1 MiB
  EXPECT_EQ(alloc->round_size(300 * MiB + MiB / 2), 320 * MiB);  // 300.5 MiB
  EXPECT_EQ(alloc->round_size(700 * MiB), 768 * MiB);            // 700 MiB
  EXPECT_EQ(alloc->round_size(1200), 1536u);         // 1200 <= 512 * 4: only 512-multiples
  EXPECT_EQ(alloc->round_size(64 * MiB), 64 * MiB);  // powers of two are kept
  make("roundup_power2_divisions:1");                // 1 means off (pytorch#161139)
  EXPECT_EQ(alloc->round_size(5 * MiB + MiB / 10), 5347840u);
}

TEST_F(TorchTest, ObtainsTheSegmentSizeOfEachClass) {
  void* a = get(1);
  EXPECT_EQ(reserved(), i64(2 * MiB));
  EXPECT_EQ(stat(StatKind::segment, StatPool::small_pool), 1);
  void* b = get(3 * MiB);
  EXPECT_EQ(reserved(), i64(22 * MiB));
  EXPECT_EQ(stat(StatKind::reserved_bytes, StatPool::large_pool), i64(20 * MiB));
  void* c = get(10 * MiB + MiB / 2);  // fits the 17 MiB rest of the 20 MiB segment
  EXPECT_EQ(reserved(), i64(22 * MiB));
  put(c);
  c = get(17 * MiB + MiB / 2);  // does not: a segment of its own, rounded to 2 MiB
  EXPECT_EQ(reserved(), i64(40 * MiB));
  EXPECT_EQ(alloc->stats().num_device_alloc, 3);
  put(a);
  put(b);
  put(c);
}

// --- best fit ----------------------------------------------------------------------------------------

TEST_F(TorchTest, BestFitIsSmallestThenLowestAddressOnTheSameStream) {
  void* a = get(12 * MiB);  // own 12 MiB segment at kBase
  void* b = get(14 * MiB);  // 14 MiB
  void* c = get(12 * MiB);  // 12 MiB
  ASSERT_EQ(addr(a), kBase);
  ASSERT_EQ(addr(b), kBase + 12 * MiB);
  ASSERT_EQ(addr(c), kBase + 26 * MiB);
  put(c);
  put(b);
  put(a);
  // 11 MiB: the two 12 MiB blocks tie on size; the lower address wins. A 1 MiB rest is not
  // split off (a large block splits only when more than 1 MiB remains).
  void* x = get(11 * MiB);
  EXPECT_EQ(x, a);
  EXPECT_EQ(allocated(), i64(12 * MiB));
  void* y = get(11 * MiB);
  EXPECT_EQ(y, c);
  void* z = get(11 * MiB);  // only the 14 MiB block is left: split, 3 MiB stays cached
  EXPECT_EQ(z, b);
  EXPECT_EQ(allocated(), i64(35 * MiB));
  EXPECT_EQ(stat(StatKind::inactive_split), 1);
  EXPECT_EQ(stat(StatKind::inactive_split_bytes), i64(3 * MiB));
  EXPECT_EQ(alloc->stats().num_device_alloc, 3);
  put(x);
  put(y);
  put(z);
}

TEST_F(TorchTest, NeverReusesAnotherStreamsCache) {
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* a = get(12 * MiB, s1);
  put(a, s1);
  void* b = get(12 * MiB, s2);  // the cached 12 MiB of s1 is not taken
  EXPECT_NE(b, a);
  EXPECT_EQ(reserved(), i64(24 * MiB));
  void* c = get(12 * MiB, s1);  // but s1 reuses it at once
  EXPECT_EQ(c, a);
  put(b, s2);
  put(c, s1);
}

// --- split and oversize ---------------------------------------------------------------------------------

TEST_F(TorchTest, LargeBlocksSplitOnlyWhenMoreThanOneMiBRemains) {
  void* a = get(19 * MiB + MiB / 2);  // 19.5 MiB: a 20 MiB segment, 0.5 MiB rest kept
  EXPECT_EQ(allocated(), i64(20 * MiB));
  EXPECT_EQ(stat(StatKind::requested_bytes), i64(19 * MiB + MiB / 2));
  EXPECT_EQ(stat(StatKind::inactive_split), 0);
  put(a);
  void* b = get(19 * MiB);  // from the cached 20 MiB: exactly 1 MiB rest, not split
  EXPECT_EQ(b, a);
  EXPECT_EQ(allocated(), i64(20 * MiB));
  put(b);
  void* c = get(18 * MiB + MiB / 2);  // 1.5 MiB rest: split
  EXPECT_EQ(allocated(), i64(18 * MiB + MiB / 2));
  EXPECT_EQ(stat(StatKind::inactive_split), 1);
  EXPECT_EQ(stat(StatKind::inactive_split_bytes), i64(MiB + MiB / 2));
  put(c);
  EXPECT_EQ(stat(StatKind::inactive_split), 0);  // merged back into the whole segment
  EXPECT_EQ(alloc->stats().num_device_alloc, 1);
}

TEST_F(TorchTest, SmallBlocksSplitWhenAtLeast512BytesRemain) {
  void* a = get(MiB);        // 2 MiB small segment: 1 MiB rest
  void* b = get(MiB - 512);  // from the rest: 512 bytes remain, still split off
  EXPECT_EQ(addr(b), addr(a) + MiB);
  EXPECT_EQ(stat(StatKind::inactive_split, StatPool::small_pool), 1);
  EXPECT_EQ(stat(StatKind::inactive_split_bytes, StatPool::small_pool), 512);
  void* c = get(1);  // takes the last 512 bytes whole
  EXPECT_EQ(addr(c), addr(a) + 2 * MiB - 512);
  EXPECT_EQ(stat(StatKind::inactive_split), 0);
  EXPECT_EQ(reserved(), i64(2 * MiB));
  put(b);  // a free block between two live ones
  EXPECT_EQ(stat(StatKind::inactive_split), 1);
  EXPECT_EQ(stat(StatKind::inactive_split_bytes), i64(MiB - 512));
  put(a);  // merges with b's block
  EXPECT_EQ(stat(StatKind::inactive_split), 1);
  EXPECT_EQ(stat(StatKind::inactive_split_bytes), i64(2 * MiB - 512));
  put(c);
  EXPECT_EQ(stat(StatKind::inactive_split), 0);
  EXPECT_EQ(stat(StatKind::inactive_split_bytes), 0);
}

TEST_F(TorchTest, OversizeBlocksServeOnlyLargeRequestsWithinTheTolerance) {
  make("max_split_size_mb:40");
  EXPECT_EQ(alloc->stats().max_split_size, i64(40 * MiB));
  void* big = get(50 * MiB);
  EXPECT_EQ(alloc->stats().oversize_allocations.current, 1);
  EXPECT_EQ(alloc->stats().oversize_segments.current, 1);
  put(big);
  // Below max_split_size: never an oversize block.
  void* a = get(30 * MiB);
  EXPECT_NE(a, big);
  EXPECT_EQ(reserved(), i64(80 * MiB));
  // At least max_split_size: the 50 MiB block, since 50 < 45 + 20; whole, never split.
  void* b = get(45 * MiB);
  EXPECT_EQ(b, big);
  EXPECT_EQ(allocated(), i64(80 * MiB));
  EXPECT_EQ(stat(StatKind::inactive_split), 0);
  put(b);
  // 50 >= 25 + 20... but 25 MiB is below max_split_size anyway; 41 MiB: 50 < 61, served.
  void* c = get(41 * MiB);
  EXPECT_EQ(c, big);
  put(c);
  put(a);
  const std::int64_t before = reserved();
  void* d = get(82 * MiB);  // 82 + 20 > every cached block: a new segment
  EXPECT_EQ(reserved(), before + i64(82 * MiB));
  put(d);
  void* e = get(60 * MiB);  // the cached 82 MiB block: 82 >= 60 + 20, so no; new 60 MiB segment
  EXPECT_NE(e, d);
  put(e);
}

TEST_F(TorchTest, MaxNonSplitRoundingWidensTheTolerance) {
  make("max_split_size_mb:40,max_non_split_rounding_mb:30");
  void* big = get(70 * MiB);
  put(big);
  void* a = get(45 * MiB);  // 70 < 45 + 30
  EXPECT_EQ(a, big);
  EXPECT_EQ(allocated(), i64(70 * MiB));
  put(a);
  make("max_split_size_mb:40");
  big = get(70 * MiB);
  put(big);
  a = get(45 * MiB);  // 70 >= 45 + 20: a new segment
  EXPECT_NE(a, big);
  put(a);
}

// --- record_stream ------------------------------------------------------------------------------------

TEST_F(TorchTest, RecordStreamDelaysReuseUntilTheEventCompletes) {
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* a = get(MiB / 2, s1);
  alloc->record_stream(a, s1);  // the allocation stream: ignored
  alloc->record_stream(a, s2);
  device->launch(s2, 1000);
  put(a, s1);
  // Freed but pending: allocated drops, active and requested do not.
  EXPECT_EQ(allocated(), 0);
  EXPECT_EQ(stat(StatKind::active_bytes), i64(MiB / 2));
  EXPECT_EQ(stat(StatKind::requested_bytes), i64(MiB / 2));
  EXPECT_EQ(alloc->snapshot().segments.at(0).blocks.at(0).state, BlockState::active_pending_free);
  void* b = get(MiB / 2, s1);  // s2's work is not done: a is not reusable
  EXPECT_EQ(addr(b), addr(a) + MiB / 2);
  device->advance(1000);
  void* c = get(MiB / 2, s1);  // process_events frees a first; it is the best fit
  EXPECT_EQ(c, a);
  EXPECT_EQ(stat(StatKind::active), 2);
  put(b, s1);
  put(c, s1);
}

TEST_F(TorchTest, EmptyCacheWaitsForPendingFreesAndReleasesWholeSegments) {
  const Stream s2 = device->create_stream();
  void* a = get(12 * MiB);
  void* b = get(3 * MiB);  // 20 MiB segment, split
  void* c = get(3 * MiB);  // same segment
  alloc->record_stream(a, s2);
  device->launch(s2, 1000);
  put(a);
  put(b);
  alloc->empty_cache();  // a completes (synchronised) and goes; the split segment stays
  alloc->check();
  const Stats s = alloc->stats();
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(reserved(), i64(20 * MiB));
  EXPECT_EQ(stat(StatKind::active), 1);
  put(c);
  alloc->empty_cache();
  EXPECT_EQ(reserved(), 0);
  EXPECT_EQ(device->live_segments(), 0u);
}

TEST_F(TorchTest, DeallocatingOnAnotherStreamWaitsForIt) {
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* a = get(MiB, s1);
  device->launch(s2, 500);
  put(a, s2);
  EXPECT_EQ(stat(StatKind::active), 1);
  device->advance(500);
  void* b = get(MiB, s1);
  EXPECT_EQ(b, a);
  put(b, s1);
}

// --- out of memory -------------------------------------------------------------------------------------

TEST_F(TorchTest, ReleasesTheCacheAndRetriesOnce) {
  make("", 64 * MiB);
  void* a = get(40 * MiB);
  void* b = get(12 * MiB);
  put(b);
  void* c = get(14 * MiB);  // 52 + 14 > 64: release the cached 12 MiB, retry
  const Stats s = alloc->stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_device_alloc, 3);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(reserved(), i64(54 * MiB));
  put(a);
  put(c);
}

TEST_F(TorchTest, ReleasesAvailableOversizeBlocksBeforeFlushingEverything) {
  make("max_split_size_mb:20", 100 * MiB);
  void* live = get(40 * MiB);
  void* big = get(50 * MiB);
  put(big);
  // 25 MiB: the cached 50 MiB is too large (50 >= 25 + 20); 90 + 26 > 100; the smallest
  // oversize block of at least max(25, 20) MiB goes, and the allocation succeeds without a sync.
  void* a = get(25 * MiB);
  const Stats s = alloc->stats();
  EXPECT_EQ(s.num_alloc_retries, 0);
  EXPECT_EQ(s.num_sync_all_streams, 0);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(reserved(), i64(66 * MiB));
  EXPECT_EQ(s.oversize_segments.current, 2);
  put(a);
  put(live);
}

TEST_F(TorchTest, FreesSeveralOversizeBlocksFromTheLargest) {
  make("max_split_size_mb:20", 100 * MiB);
  void* live = get(30 * MiB);
  void* b1 = get(22 * MiB);
  void* b2 = get(24 * MiB);
  put(b1);
  put(b2);
  // 50 MiB: no cached block is that large; 76 + 50 > 100. From the largest down: 24 then 22
  // (46 < 50: not enough, so this step fails), then release_cached_blocks and the retry.
  void* a = get(50 * MiB);
  const Stats s = alloc->stats();
  EXPECT_EQ(s.num_device_free, 2);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(reserved(), i64(80 * MiB));
  put(a);
  put(live);
}

TEST_F(TorchTest, OutOfMemoryReportsPyTorchsMessage) {
  make("", 64 * MiB);
  void* a = get(40 * MiB);
  void* b = get(12 * MiB);
  try {
    alloc->allocate(14 * MiB + 100, default_stream);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(std::string(e.what()),
              "CUDA out of memory. Tried to allocate 16.00 MiB. GPU 0 has a total capacity of "
              "64.00 MiB of which 12.00 MiB is free. Of the allocated memory 52.00 MiB is "
              "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If "
              "reserved but unallocated memory is large try setting "
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation. See "
              "documentation for Memory Management "
              "(https://docs.pytorch.org/docs/stable/notes/"
              "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)");
    EXPECT_EQ(e.info().requested, 14 * MiB + 100);
    EXPECT_EQ(e.info().rounded, 14 * MiB + 512);
    EXPECT_EQ(e.info().segment, 16 * MiB);
    EXPECT_EQ(e.info().device_free, 12 * MiB);
  }
  const Stats s = alloc->stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  put(a);
  put(b);
  EXPECT_THROW(alloc->allocate(std::size_t{1} << 60, default_stream), OutOfMemory);
  EXPECT_EQ(alloc->allocate(0, default_stream), nullptr);
}

TEST_F(TorchTest, AMemoryFractionRefusesBeforeCallingTheDevice) {
  make("per_process_memory_fraction:0.5", 100 * MiB);
  void* a = get(40 * MiB);
  try {
    alloc->allocate(12 * MiB, default_stream);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("60.00 MiB is free. 50.00 MiB allowed; Of the"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(e.info().limit, 50 * MiB);
  }
  EXPECT_EQ(device->counters().of(DeviceOp::allocate), 1u);
  EXPECT_EQ(alloc->stats().num_alloc_retries, 1);
  put(a);
}

TEST_F(TorchTest, GarbageCollectionFreesBlocksOlderThanAverage) {
  make("garbage_collection_threshold:0.5,per_process_memory_fraction:0.5", 200 * MiB);
  // allowed 100 MiB, collect above 50 MiB.
  std::vector<void*> p;
  for (int i = 0; i < 5; ++i) p.push_back(get(12 * MiB));  // A..E, 60 MiB
  put(p[0]);
  put(p[1]);
  for (int i = 0; i < 3; ++i) put(get(12 * MiB));  // A is reused and re-cached; B ages
  put(p[2]);
  put(p[3]);
  put(p[4]);
  // The miss ages every block once more: A, C, D, E are 1 call old, B is 4; the average is
  // 1.6, so only B goes, which frees enough (12 of the 10 MiB over the threshold).
  void* x = get(16 * MiB);
  const Stats s = alloc->stats();
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_sync_all_streams, 0);
  EXPECT_EQ(reserved(), i64(64 * MiB));
  for (const SegmentInfo& segment : alloc->snapshot().segments) {
    EXPECT_NE(segment.address, addr(p[1]));
  }
  put(x);
}

TEST_F(TorchTest, GarbageCollectionNeedsAFraction) {
  make("garbage_collection_threshold:0.5", 200 * MiB);
  std::vector<void*> p;
  for (int i = 0; i < 5; ++i) p.push_back(get(12 * MiB));
  for (void* q : p) put(q);
  void* x = get(16 * MiB);
  EXPECT_EQ(alloc->stats().num_device_free, 0);
  EXPECT_EQ(reserved(), i64(76 * MiB));
  put(x);
}

// --- statistics and misuse ----------------------------------------------------------------------------

TEST_F(TorchTest, StatisticsFollowPyTorch) {
  void* a = get(1000);
  Stats s = alloc->stats();
  EXPECT_EQ(s.get(StatKind::requested_bytes, StatPool::small_pool).current, 1000);
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::small_pool).current, 1024);
  EXPECT_EQ(s.get(StatKind::active_bytes, StatPool::all).current, 1024);
  EXPECT_EQ(s.get(StatKind::inactive_split, StatPool::small_pool).current, 1);
  EXPECT_EQ(s.get(StatKind::inactive_split_bytes, StatPool::small_pool).current,
            i64(2 * MiB - 1024));
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::large_pool).current, 0);
  EXPECT_EQ(s.max_split_size, -1);
  put(a);
  s = alloc->stats();
  EXPECT_EQ(s.get(StatKind::requested_bytes, StatPool::all).current, 0);
  EXPECT_EQ(s.get(StatKind::requested_bytes, StatPool::all).freed, 1000);
  EXPECT_EQ(s.get(StatKind::inactive_split, StatPool::all).current, 0);
  EXPECT_EQ(s.get(StatKind::allocation, StatPool::all).allocated, 1);
  EXPECT_EQ(s.get(StatKind::reserved_bytes, StatPool::all).current, i64(2 * MiB));
  EXPECT_EQ(s.flatten().at("inactive_split_bytes.all.peak"), i64(2 * MiB - 1024));
  alloc->reset_peak_stats();
  EXPECT_EQ(alloc->stats().get(StatKind::allocated_bytes, StatPool::all).peak, 0);
  alloc->reset_accumulated_stats();
  s = alloc->stats();
  EXPECT_EQ(s.get(StatKind::allocation, StatPool::all).allocated, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
}

TEST_F(TorchTest, RejectsForeignPointersAndLeavesStateIntact) {
  void* a = get(MiB);
  EXPECT_THROW(alloc->deallocate(ptr(addr(a) + 512), default_stream), InvalidPointer);
  EXPECT_THROW(alloc->record_stream(ptr(0x1234), default_stream), InvalidPointer);
  alloc->check();
  put(a);
  EXPECT_THROW(alloc->deallocate(a, default_stream), InvalidPointer);
  alloc->deallocate(nullptr, default_stream);
  EXPECT_EQ(alloc->name(), "torch");
}

TEST_F(TorchTest, SnapshotListsSegmentsAndBlocksByAddress) {
  void* a = get(3 * MiB);
  void* b = get(MiB);
  const Snapshot snap = alloc->snapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  const SegmentInfo& large = snap.segments[0];
  EXPECT_TRUE(large.is_large);
  EXPECT_EQ(large.total_size, 20 * MiB);
  EXPECT_EQ(large.allocated_size, 3 * MiB);
  ASSERT_EQ(large.blocks.size(), 2u);
  EXPECT_EQ(large.blocks[1].state, BlockState::inactive);
  EXPECT_EQ(large.blocks[1].size, 17 * MiB);
  EXPECT_FALSE(snap.segments[1].is_large);
  put(a);
  put(b);
}

// --- warm start ---------------------------------------------------------------------------------------

TEST_F(TorchTest, PlacesBlocksInsideAdoptedSegments) {
  const std::uintptr_t seg = kBase + 64 * MiB;
  ASSERT_EQ(device->allocate_at(ptr(seg), 20 * MiB), Status::ok);
  alloc->adopt_segment(ptr(seg), 20 * MiB, default_stream, true);
  EXPECT_EQ(reserved(), i64(20 * MiB));
  EXPECT_EQ(alloc->stats().num_device_alloc, 0);
  // A 4 MiB request held as 4.5 MiB at offset 8 MiB: free 8 MiB before, 7.5 MiB after.
  void* p = alloc->place_block(ptr(seg + 8 * MiB), 4 * MiB, 4 * MiB + MiB / 2, default_stream);
  alloc->check();
  EXPECT_EQ(addr(p), seg + 8 * MiB);
  EXPECT_EQ(allocated(), i64(4 * MiB + MiB / 2));
  EXPECT_EQ(stat(StatKind::requested_bytes), i64(4 * MiB));
  EXPECT_EQ(stat(StatKind::inactive_split), 2);
  EXPECT_EQ(stat(StatKind::inactive_split_bytes), i64(15 * MiB + MiB / 2));
  // Best fit: 7 MiB takes the 7.5 MiB block (whole: 0.5 MiB rest), 8 MiB the block before.
  void* a = get(7 * MiB);
  EXPECT_EQ(addr(a), seg + 12 * MiB + MiB / 2);
  void* b = get(8 * MiB);
  EXPECT_EQ(addr(b), seg);
  EXPECT_THROW(alloc->place_block(ptr(seg + MiB), MiB * 2, 0, default_stream), InvalidArgument);
  put(p);
  put(a);
  put(b);
  EXPECT_EQ(stat(StatKind::inactive_split), 0);
  alloc->empty_cache();
  EXPECT_EQ(device->live_segments(), 0u);
}

/// A small recorded window: one 20 MiB segment with two blocks live before the window.
trace::Trace recorded_window() {
  trace::Trace t;
  t.source = "synthetic";
  t.format = "pytorch";
  const std::uint64_t seg = kBase + 100 * MiB;
  t.recorded.initial_segments.push_back({seg, 20 * MiB, 0, true, false});
  // Block 1: 3 MiB at the start, then 0.5 MiB before block 2: rule (1), it holds 3.5 MiB.
  t.live_before.push_back({1, 3 * MiB, seg, 0});
  // Block 2: 4 MiB at 3.5 MiB; the window allocates at 8 MiB (within 1 MiB of its rounded end,
  // 7.5 MiB) while it is live: rule (2), it holds 4.5 MiB.
  t.live_before.push_back({2, 4 * MiB, seg + 3 * MiB + MiB / 2, 0});
  t.events.push_back({trace::Op::alloc, 0, 10, 5 * MiB, seg + 8 * MiB, 0});
  t.events.push_back({trace::Op::free, 0, 2, 4 * MiB, 0, 1});
  t.events.push_back({trace::Op::free, 0, 1, 3 * MiB, 0, 2});
  t.events.push_back({trace::Op::free, 0, 10, 5 * MiB, 0, 3});
  t.recorded.segment_events.push_back(
      {trace::RecordedSegmentEvent::Kind::alloc, 3, kBase + 500 * MiB, 12 * MiB, 0, 3});
  return t;
}

TEST(TorchWarmStart, InfersTheBlockSizesTheWindowImplies) {
  const trace::Trace t = recorded_window();
  const std::vector<std::size_t> sizes = infer_live_block_sizes(t);
  ASSERT_EQ(sizes.size(), 2u);
  EXPECT_EQ(sizes[0], 3 * MiB + MiB / 2);
  EXPECT_EQ(sizes[1], 4 * MiB + MiB / 2);
}

TEST(TorchWarmStart, ReadsTheRecordingAllocatorsSettings) {
  trace::Trace t;
  t.recorded.settings = {{"PYTORCH_CUDA_ALLOC_CONF", ""},
                         {"max_split_size", "-1"},
                         {"garbage_collection_threshold", "0.0"},
                         {"expandable_segments", "False"},
                         {"roundup_power2_divisions", "{'1': 0, '2': 4, '4': 0, '32768': 8}"}};
  Config c = recorded_config(t);
  EXPECT_EQ(c.max_split_size, SIZE_MAX);
  EXPECT_FALSE(c.expandable_segments);
  EXPECT_EQ(c.roundup_power2_divisions[1], 4u);
  EXPECT_EQ(c.roundup_power2_divisions[2], 0u);
  EXPECT_EQ(c.roundup_power2_divisions[15], 8u);
  t.recorded.settings = {{"max_split_size", "268435456"}, {"roundup_power2_divisions", "4"}};
  c = recorded_config(t);
  EXPECT_EQ(c.max_split_size, 256 * MiB);
  EXPECT_EQ(c.roundup_power2_divisions[7], 4u);
}

TEST(TorchWarmStart, AppliesTheRecordedStateAndSegmentAddresses) {
  const trace::Trace t = recorded_window();
  SimDevice device;
  TorchAllocator alloc(device);
  const WarmStartResult r = apply_warm_start(t, alloc, device);
  alloc.check();
  EXPECT_EQ(r.segments, 1u);
  EXPECT_EQ(r.reserved_bytes, 20 * MiB);
  ASSERT_EQ(r.live.size(), 2u);
  EXPECT_EQ(addr(r.live[1].second), kBase + 103 * MiB + MiB / 2);
  // The recorded allocation lands where PyTorch put it: the free block starts at 8 MiB.
  void* x = alloc.allocate(5 * MiB, default_stream);
  EXPECT_EQ(addr(x), kBase + 108 * MiB);
  alloc.deallocate(r.live[1].second, default_stream);
  alloc.deallocate(r.live[0].second, default_stream);
  alloc.deallocate(x, default_stream);
  // Everything merged back into the 20 MiB segment. 11 MiB splits it; the next 11 MiB does not
  // fit the 9 MiB left and takes a new 12 MiB segment at the recorded segment_alloc address.
  void* y = alloc.allocate(11 * MiB, default_stream);
  void* z = alloc.allocate(11 * MiB, default_stream);
  EXPECT_EQ(addr(y), kBase + 100 * MiB);
  EXPECT_EQ(addr(z), kBase + 500 * MiB);
  alloc.check();
  alloc.deallocate(y, default_stream);
  alloc.deallocate(z, default_stream);
}

}  // namespace
}  // namespace cistern::replay
