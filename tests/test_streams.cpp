// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Streams: per-stream pools, record_stream and frees on other streams (event-gated reuse), and
// taking over another stream's cached segment (ordered after its work with an event). The
// simulated streams only complete work when the clock moves, so "reused too early" is visible.
#include <gtest/gtest.h>

#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "allocator_fixture.hpp"
#include "cistern/errors.hpp"

namespace cistern::testing {
namespace {

class StreamTest : public AllocatorTest {
 protected:
  static void* addr_of(void* p, std::size_t offset) { return static_cast<char*>(p) + offset; }
  void SetUp() override {
    AllocatorTest::SetUp();
    s1 = device->create_stream();
    s2 = device->create_stream();
  }
  Stream s1, s2;
};

TEST_F(StreamTest, EachStreamHasItsOwnPool) {
  void* a = alloc->allocate(4096, s1);
  alloc->deallocate(a, s1);
  // s1's cached block is recent: s2 does not take it while the device has room.
  void* b = alloc->allocate(4096, s2);
  EXPECT_NE(a, b);
  EXPECT_EQ(device_calls(DeviceOp::allocate), 2u);
  EXPECT_EQ(alloc->stats().num_cross_stream_reuse, 0);
  EXPECT_EQ(alloc->allocate(4096, s1), a);  // s1 gets its own block back
  alloc->deallocate(a, s1);
  alloc->deallocate(b, s2);
}

// While the device has room, a stream does not take another's cached memory, however long that
// memory has sat idle: each stream keeps its own cache (a take-over would order this stream after
// the other's work).
TEST_F(StreamTest, AnIdleCachedSegmentIsNotTakenOverWhileTheDeviceHasRoom) {
  void* a = alloc->allocate(30 * MiB, s1);
  void* c = alloc->allocate(3 * MiB, s1);  // a 20 MiB segment, 17 MiB of it cached
  alloc->deallocate(a, s1);
  // s1 keeps working in its other segment: the 30 MiB one sits idle.
  for (int i = 0; i < 100; ++i) alloc->deallocate(alloc->allocate(3 * MiB, s1), s1);
  void* b = alloc->allocate(30 * MiB, s2);
  EXPECT_NE(a, b);
  EXPECT_EQ(device_calls(DeviceOp::allocate), 3u);
  EXPECT_EQ(alloc->stats().num_cross_stream_reuse, 0);
  alloc->deallocate(b, s2);
  alloc->deallocate(c, s1);
}

// Several streams each repeating their own work (sizes from 512 B to 60 MiB, freed in another
// order than allocated) on a device with room, with classic segments and the engine: after the
// first iteration no stream takes over another's memory and nothing calls the device.
TEST_F(StreamTest, StreamsInASteadyStateNeitherTakeOverNorCallTheDevice) {
  for (const char* conf : {"", "vmm:True"}) {
    SCOPED_TRACE(conf);
    make(conf, 8 * GiB);
    const Stream streams[] = {default_stream, device->create_stream(), device->create_stream(),
                              device->create_stream()};
    std::mt19937_64 rng(11);
    std::vector<std::vector<std::size_t>> work(std::size(streams));
    for (auto& sizes : work) {
      for (int i = 0; i < 40; ++i) {
        const std::size_t kind = rng() % 4;
        sizes.push_back(kind == 0   ? 512 + rng() % MiB
                        : kind == 1 ? MiB + rng() % (10 * MiB)
                        : kind == 2 ? 10 * MiB + rng() % (50 * MiB)
                                    : 512 * (1 + rng() % 64));
      }
    }
    std::uint64_t calls_after_first = 0;
    for (int iteration = 0; iteration < 6; ++iteration) {
      std::vector<std::vector<void*>> held(std::size(streams));
      for (std::size_t s = 0; s < std::size(streams); ++s) {
        for (std::size_t bytes : work[s]) held[s].push_back(alloc->allocate(bytes, streams[s]));
      }
      for (std::size_t s = 0; s < std::size(streams); ++s) {
        for (std::size_t i = 0; i < held[s].size(); ++i) {
          alloc->deallocate(held[s][(i * 7) % held[s].size()], streams[s]);
        }
      }
      alloc->check();
      // Every call but memory_info (the engine asks for the room left at each growth).
      std::uint64_t calls = 0;
      for (int op = 0; op < kDeviceOpCount; ++op) {
        if (static_cast<DeviceOp>(op) != DeviceOp::memory_info) {
          calls += device_calls(static_cast<DeviceOp>(op));
        }
      }
      if (iteration == 0) calls_after_first = calls;
      EXPECT_EQ(calls, calls_after_first) << "iteration " << iteration;
      EXPECT_EQ(alloc->stats().num_cross_stream_reuse, 0) << "iteration " << iteration;
    }
    alloc->empty_cache();
  }
}

TEST_F(StreamTest, WhenTheDeviceIsFullAnyCachedSegmentIsTakenOver) {
  make("", 2 * MiB);
  s1 = device->create_stream();
  s2 = device->create_stream();
  void* a = alloc->allocate(4096, s1);
  alloc->deallocate(a, s1);  // parked in s1's only segment
  void* b = alloc->allocate(4096, s2);
  EXPECT_EQ(a, b);
  const Stats s = alloc->stats();
  EXPECT_EQ(s.num_cross_stream_reuse, 1);
  EXPECT_EQ(s.num_alloc_retries, 0);  // no need to free the cache
  EXPECT_EQ(s.num_device_free, 0);
  alloc->deallocate(b, s2);
}

TEST_F(StreamTest, TakeOverOrdersTheNewStreamAfterTheOldStreamsWork) {
  make("", 20 * MiB);
  s1 = device->create_stream();
  s2 = device->create_stream();
  void* a = alloc->allocate(8 * MiB, s1);
  device->launch(s1, 1000);  // a kernel on s1 still uses `a`
  alloc->deallocate(a, s1);
  void* b = alloc->allocate(8 * MiB, s2);
  EXPECT_EQ(a, b);
  // s2's later work cannot start before s1's kernel has finished.
  EXPECT_GE(device->stream_done_at(s2), device->stream_done_at(s1));
  EXPECT_EQ(device->now(), 0u);  // and the host never waited
  EXPECT_EQ(device_calls(DeviceOp::stream_wait_event), 1u);
  alloc->deallocate(b, s2);
}

TEST_F(StreamTest, CrossStreamReuseCanBeSwitchedOff) {
  make("cross_stream_reuse:False", 2 * MiB);
  s1 = device->create_stream();
  s2 = device->create_stream();
  void* a = alloc->allocate(4096, s1);
  alloc->deallocate(a, s1);
  void* b = alloc->allocate(4096, s2);  // the device is full: the cache is released instead
  const Stats s = alloc->stats();
  EXPECT_EQ(s.num_cross_stream_reuse, 0);
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_device_free, 1);
  alloc->deallocate(b, s2);
}

TEST_F(StreamTest, RecordStreamDelaysReuseUntilTheOtherStreamsWorkCompletes) {
  void* a = alloc->allocate(4096, s1);
  alloc->record_stream(a, s2);
  alloc->record_stream(a, s2);  // recorded once
  alloc->record_stream(a, s1);  // the allocating stream is ignored
  device->launch(s2, 500);
  alloc->deallocate(a, s1);
  EXPECT_EQ(stat(StatKind::allocated_bytes), 0);
  EXPECT_EQ(stat(StatKind::active_bytes), 4096);  // pending: still active
  EXPECT_EQ(alloc->snapshot().segments[0].blocks[0].state, BlockState::active_pending_free);

  void* b = alloc->allocate(4096, s1);
  EXPECT_NE(a, b);  // s2 may still be reading a
  device->advance(500);
  alloc->deallocate(b, s1);
  void* c = alloc->allocate(4096, s1);  // the event has completed: a is cached again
  EXPECT_EQ(a, c);
  EXPECT_EQ(stat(StatKind::active_bytes), 4096);
  EXPECT_EQ(device_calls(DeviceOp::record_event), 1u);
  alloc->deallocate(c, s1);
}

TEST_F(StreamTest, FreeOnAnotherStreamWaitsForThatStream) {
  void* a = alloc->allocate(4096, s1);
  device->launch(s2, 100);
  alloc->deallocate(a, s2);  // ordered on s2
  void* b = alloc->allocate(4096, s1);
  EXPECT_NE(a, b);
  device->advance(100);
  alloc->deallocate(b, s1);
  EXPECT_EQ(alloc->allocate(4096, s1), a);
  alloc->deallocate(a, s1);
}

TEST_F(StreamTest, EmptyCacheWaitsForPendingFreesAndReleasesThem) {
  void* a = alloc->allocate(4096, s1);
  alloc->record_stream(a, s2);
  device->launch(s2, 1000);
  alloc->deallocate(a, s1);
  alloc->empty_cache();
  EXPECT_EQ(device->now(), 1000u);  // the host waited for s2
  EXPECT_EQ(reserved(), 0);
  EXPECT_EQ(device->used_bytes(), 0u);
  EXPECT_EQ(alloc->stats().num_sync_all_streams, 1);
}

TEST_F(StreamTest, StatisticsAddUpAcrossPools) {
  void* a = alloc->allocate(3 * MiB, s1);
  void* b = alloc->allocate(5 * MiB, s2);
  EXPECT_EQ(allocated(), static_cast<std::int64_t>(8 * MiB));
  EXPECT_EQ(peak(StatKind::allocated_bytes), static_cast<std::int64_t>(8 * MiB));
  alloc->deallocate(a, s1);
  void* c = alloc->allocate(1 * MiB, s2);
  EXPECT_EQ(allocated(), static_cast<std::int64_t>(6 * MiB));
  EXPECT_EQ(peak(StatKind::allocated_bytes), static_cast<std::int64_t>(8 * MiB));
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(42 * MiB));  // 1 MiB is small: a 2 MiB segment
  const Stats s = alloc->stats();
  EXPECT_EQ(s.get(StatKind::allocation, StatPool::all).allocated, 3);
  EXPECT_EQ(s.get(StatKind::allocation, StatPool::all).freed, 1);
  alloc->reset_peak_stats();
  EXPECT_EQ(peak(StatKind::allocated_bytes), static_cast<std::int64_t>(6 * MiB));
  alloc->deallocate(b, s2);
  alloc->deallocate(c, s2);
}

TEST_F(StreamTest, TakeOverMovesSegmentStatisticsWithoutCountingThemTwice) {
  make("", 30 * MiB);
  s1 = device->create_stream();
  s2 = device->create_stream();
  void* a = alloc->allocate(30 * MiB, s1);
  alloc->deallocate(a, s1);
  void* b = alloc->allocate(30 * MiB, s2);
  const Stats s = alloc->stats();
  EXPECT_EQ(s.get(StatKind::segment, StatPool::all).current, 1);
  EXPECT_EQ(s.get(StatKind::segment, StatPool::all).allocated, 1);
  EXPECT_EQ(s.get(StatKind::segment, StatPool::all).freed, 0);
  EXPECT_EQ(s.get(StatKind::reserved_bytes, StatPool::all).peak,
            static_cast<std::int64_t>(30 * MiB));
  alloc->deallocate(b, s2);
}

// The message of the InvalidPointer that `call` throws ("" if it throws none).
template <class F>
std::string invalid_pointer_message(F&& call) {
  try {
    call();
  } catch (const InvalidPointer& e) {
    return e.what();
  }
  return "";
}

// Segments smaller than a 2 MiB region (4 KiB here, packed into one granule by the device, as the
// driver packs small cudaMallocs) put four streams' segments in one region: the region table
// names two owners and marks the region crowded for the others. Every lookup still finds its
// block, frees on other streams still reach the owner, misuse is still named, and check()
// verifies the table after every step, also as the region empties and stops being crowded.
TEST_F(StreamTest, SegmentsOfManyStreamsInOneRegionAreAllFound) {
  Config config = classic_config("");
  config.small_size = 2048;
  config.small_segment_size = 4096;
  alloc = std::make_unique<CachingAllocator>(*device, config);
  const std::vector<Stream> streams{s1, s2, device->create_stream(), device->create_stream()};
  std::vector<void*> blocks;
  for (const Stream s : streams) {
    blocks.push_back(alloc->allocate(1000, s));
    alloc->check();
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    void* p = blocks[i];
    ASSERT_EQ(addr(p) >> 21, addr(blocks[0]) >> 21) << "the segments share one region";
    EXPECT_EQ(alloc->allocation_size(p), 1024u);
    EXPECT_EQ(alloc->requested_size(p), std::optional<std::size_t>(1000));
    EXPECT_EQ(alloc->base_allocation(p), std::make_pair(p, std::size_t{4096}));
    alloc->record_stream(p, streams[(i + 1) % streams.size()]);
  }
  EXPECT_NE(invalid_pointer_message([&] {
              alloc->deallocate(addr_of(blocks[3], 512), s1);
            }).find("512 bytes inside the allocated block"),
            std::string::npos);
  EXPECT_EQ(alloc->requested_size(addr_of(blocks[2], 512)), std::nullopt);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    alloc->deallocate(blocks[i], streams[(i + 2) % streams.size()]);  // another stream's block
    alloc->check();
  }
  EXPECT_NE(invalid_pointer_message([&] {
              alloc->deallocate(blocks[3], streams[3]);
            }).find("double free"),
            std::string::npos);
  EXPECT_NE(invalid_pointer_message([&] { alloc->allocation_size(blocks[0]); }).find("double free"),
            std::string::npos);
  alloc->empty_cache();  // waits for the pending frees, then returns every segment
  alloc->check();
  EXPECT_EQ(reserved(), 0);
  EXPECT_NE(invalid_pointer_message([&] {
              alloc->record_stream(blocks[1], s1);
            }).find("not allocated by this allocator"),
            std::string::npos);
}

}  // namespace
}  // namespace cistern::testing
