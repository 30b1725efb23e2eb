// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Out of memory: the free-and-retry path, the message, limits, garbage collection, and device
// faults injected at every call site, with check() and a leak check after each.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "allocator_fixture.hpp"
#include "cistern/errors.hpp"

namespace cistern::testing {
namespace {

using Oom = AllocatorTest;

TEST_F(Oom, ReleasesTheCacheAndRetriesBeforeFailing) {
  make("", 48 * MiB);
  void* a = alloc->allocate(3 * MiB, default_stream);   // 20 MiB segment
  void* b = alloc->allocate(24 * MiB, default_stream);  // 24 MiB segment
  alloc->deallocate(a, default_stream);
  alloc->deallocate(b, default_stream);
  // 30 MiB fits no cached block and not beside them: the cache goes back, then it fits.
  void* c = alloc->allocate(30 * MiB, default_stream);
  const Stats s = alloc->stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  EXPECT_EQ(s.num_device_free, 2);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(30 * MiB));
  alloc->deallocate(c, default_stream);
}

TEST_F(Oom, TheErrorStatesTheFiguresAndLeavesTheAllocatorUsable) {
  make("", 40 * MiB);
  void* a = alloc->allocate(3 * MiB, default_stream);
  void* b = alloc->allocate(5 * MiB, default_stream);  // same 20 MiB segment
  void* c = alloc->allocate(18 * MiB, default_stream);
  try {
    alloc->allocate(16 * MiB, default_stream);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    const OutOfMemoryInfo& info = e.info();
    EXPECT_EQ(info.requested, 16 * MiB);
    EXPECT_EQ(info.segment, 16 * MiB);
    EXPECT_EQ(info.allocated, 26 * MiB);
    EXPECT_EQ(info.reserved, 38 * MiB);
    EXPECT_EQ(info.cached, 12 * MiB);
    EXPECT_EQ(info.largest_free, 12 * MiB);
    EXPECT_EQ(info.device_total, 40 * MiB);
    EXPECT_EQ(info.device_free, 2 * MiB);
    for (const char* part :
         {"Tried to allocate 16.00 MiB", "total capacity of 40.00 MiB", "2.00 MiB is free",
          "38.00 MiB reserved", "26.00 MiB is allocated", "12.00 MiB is cached"}) {
      EXPECT_NE(msg.find(part), std::string::npos) << part << " missing from: " << msg;
    }
  }
  EXPECT_EQ(alloc->stats().num_ooms, 1);
  alloc->check();
  // Nothing was lost: the same memory serves requests that fit.
  void* d = alloc->allocate(12 * MiB, default_stream);
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(38 * MiB));
  for (void* p : {a, b, c, d}) alloc->deallocate(p, default_stream);
  alloc.reset();
  EXPECT_EQ(device->used_bytes(), 0u);
}

TEST_F(Oom, MemoryLimitIsEnforcedBeforeTheDeviceIsAsked) {
  make("memory_limit_mb:24", 1 * GiB);
  void* a = alloc->allocate(3 * MiB, default_stream);  // 20 MiB segment
  EXPECT_THROW(alloc->allocate(4 * MiB + 512 * KiB + 16 * MiB, default_stream), OutOfMemory);
  EXPECT_EQ(device_calls(DeviceOp::allocate), 1u);
  void* b = alloc->allocate(1000, default_stream);  // 2 MiB more still fits the limit
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(22 * MiB));
  alloc->deallocate(a, default_stream);
  alloc->deallocate(b, default_stream);
}

TEST_F(Oom, MemoryFractionLimitsReservedMemory) {
  make("per_process_memory_fraction:0.5", 100 * MiB);
  void* a = alloc->allocate(40 * MiB, default_stream);
  EXPECT_THROW(alloc->allocate(20 * MiB, default_stream), OutOfMemory);
  alloc->set_memory_fraction(1.0);
  void* b = alloc->allocate(20 * MiB, default_stream);
  EXPECT_THROW(alloc->set_memory_fraction(0.0), InvalidArgument);
  alloc->deallocate(a, default_stream);
  alloc->deallocate(b, default_stream);
}

TEST_F(Oom, OversizeBlocksAreReleasedFirstWithMaxSplitSize) {
  make("max_split_size_mb:32", 128 * MiB);
  void* a = alloc->allocate(60 * MiB, default_stream);
  void* b = alloc->allocate(40 * MiB, default_stream);
  alloc->deallocate(a, default_stream);
  alloc->deallocate(b, default_stream);
  // 36 MiB (at least max_split_size): the 40 MiB block serves it, being under 36 + 20 MiB.
  // A second 36 MiB finds only the 60 MiB block, too large to serve it, and the device has
  // 28 MiB left: the 60 MiB oversize block goes back to the device first, then it fits.
  void* c = alloc->allocate(36 * MiB, default_stream);
  EXPECT_EQ(c, b);
  void* d = alloc->allocate(36 * MiB, default_stream);
  const Stats s = alloc->stats();
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.num_alloc_retries, 0);  // released without the full flush
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(76 * MiB));
  alloc->deallocate(c, default_stream);
  alloc->deallocate(d, default_stream);
}

TEST_F(Oom, GarbageCollectionFreesOldCachedSegmentsAboveTheThreshold) {
  make("garbage_collection_threshold:0.5,per_process_memory_fraction:1.0,memory_limit_mb:100",
       1 * GiB);
  void* a = alloc->allocate(30 * MiB, default_stream);
  void* b = alloc->allocate(30 * MiB, default_stream);
  alloc->deallocate(a, default_stream);
  alloc->deallocate(b, default_stream);
  // Reserved 60 MiB > 50 MiB: a miss for 40 MiB collects cached segments first.
  void* c = alloc->allocate(40 * MiB, default_stream);
  EXPECT_GE(alloc->stats().num_device_free, 1);
  EXPECT_LE(reserved(), static_cast<std::int64_t>(70 * MiB));
  alloc->deallocate(c, default_stream);
}

// --- fault injection ---------------------------------------------------------------------------------

// A workload that reaches every device call site of the allocator: segment allocation (and the
// out-of-memory retry), segment release, event creation, recording, querying and synchronising,
// the take-over wait, and stream synchronisation as the fallback of a failed record.
void exercise(SimDevice& device, CachingAllocator& alloc) {
  const Stream s1 = device.create_stream();
  const Stream s2 = device.create_stream();
  std::vector<std::pair<void*, Stream>> live;
  auto try_alloc = [&](std::size_t bytes, Stream s) {
    try {
      live.emplace_back(alloc.allocate(bytes, s), s);
    } catch (const OutOfMemory&) {
    } catch (const DeviceError&) {
    }
    alloc.check();
  };
  auto try_free = [&](std::size_t i) {
    try {
      alloc.deallocate(live[i].first, live[i].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } catch (const DeviceError&) {
      // The block is still allocated; the caller keeps it and frees it later.
    }
    alloc.check();
  };
  try_alloc(1000, s1);
  try_alloc(3 * MiB, s1);
  try_alloc(24 * MiB, s2);
  if (!live.empty()) {
    try {
      alloc.record_stream(live.front().first, s2);
    } catch (const InvalidPointer&) {
    }
  }
  device.launch(s2, 100);
  while (!live.empty()) try_free(live.size() - 1);
  try_alloc(1000, s1);      // event query of the pending free
  try_alloc(24 * MiB, s1);  // take-over from s2
  device.advance(1000);
  try_alloc(38 * MiB, s2);  // needs the full release-and-retry path on a 64 MiB device
  while (!live.empty()) try_free(0);
  try {
    alloc.empty_cache();
  } catch (const DeviceError&) {
  }
  alloc.check();
}

struct FaultCase {
  DeviceOp op;
  Status status;
};

class FaultInjection : public ::testing::TestWithParam<FaultCase> {};

TEST_P(FaultInjection, EveryCallSiteFailsCleanlyAndNothingLeaks) {
  const FaultCase fault = GetParam();
  // First count how often the workload calls the operation, then fail each of those calls.
  std::uint64_t calls = 0;
  std::uint64_t natural_failures = 0;  // a full device fails allocations without injection
  {
    SimDevice device(sim_options(64 * MiB));
    CachingAllocator alloc(device, Config::parse("vmm:False"));  // the classic call sites
    exercise(device, alloc);
    calls = device.counters().of(fault.op);
    natural_failures = device.counters().failed(fault.op);
  }
  ASSERT_GT(calls, 0u) << "the workload never calls " << to_string(fault.op);
  std::uint64_t triggered = 0;
  for (std::uint64_t nth = 1; nth <= calls; ++nth) {
    SimDevice device(sim_options(64 * MiB));
    device.fail_nth(fault.op, nth, fault.status);
    {
      CachingAllocator alloc(device, Config::parse("vmm:False"));  // the classic call sites
      exercise(device, alloc);
      // A failure can change the path so that fewer calls follow, so not every nth fires.
      if (device.counters().failed(fault.op) > natural_failures) ++triggered;
    }
    EXPECT_EQ(device.used_bytes(), 0u) << to_string(fault.op) << " call " << nth << " leaked";
    EXPECT_EQ(device.live_segments(), 0u);
  }
  EXPECT_GE(triggered, 1u);
}

TEST_F(Oom, AFreeWhoseEventsAndFallbackBothFailKeepsTheBlockAllocated) {
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* a = alloc->allocate(4096, s1);
  alloc->record_stream(a, s2);
  device->fail_nth(DeviceOp::record_event, 1, Status::device_error);
  device->fail_nth(DeviceOp::synchronize_stream, 1, Status::device_error);
  EXPECT_THROW(alloc->deallocate(a, s1), DeviceError);
  alloc->check();
  EXPECT_EQ(alloc->allocation_size(a), 4096u);  // still the caller's
  EXPECT_EQ(allocated(), 4096);
  alloc->deallocate(a, s1);  // the device works again
  EXPECT_EQ(allocated(), 0);
  EXPECT_EQ(stat(StatKind::active_bytes), 4096);  // pending on s2's event
}

TEST_F(Oom, AFailedRecordFallsBackToWaitingForTheStream) {
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* a = alloc->allocate(4096, s1);
  alloc->record_stream(a, s2);
  device->launch(s2, 700);
  device->fail_nth(DeviceOp::record_event, 1, Status::device_error);
  alloc->deallocate(a, s1);
  EXPECT_EQ(device->now(), 700u);  // waited for s2 instead
  EXPECT_EQ(stat(StatKind::active_bytes), 0);
  EXPECT_EQ(alloc->allocate(4096, s1), a);
  alloc->deallocate(a, s1);
}

// A free on another stream records a spare event of the pool when it has one; if that record
// fails, the general path takes over (a fresh event here), and no event is lost.
TEST_F(Oom, AFailedRecordOfASpareEventFallsBackToTheGeneralPath) {
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* a = alloc->allocate(4096, s1);
  alloc->deallocate(a, s2);                 // one event, recorded on s2
  EXPECT_EQ(alloc->allocate(4096, s1), a);  // completed: the event is now a spare
  device->launch(s2, 700);
  device->fail_nth(DeviceOp::record_event, 1, Status::device_error);
  alloc->deallocate(a, s2);
  alloc->check();
  EXPECT_EQ(device->counters().of(DeviceOp::record_event), 3u);  // the spare failed, one more
  EXPECT_EQ(stat(StatKind::active_bytes), 4096);                 // pending on s2's work
  void* b = alloc->allocate(4096, s1);
  EXPECT_NE(b, a);  // s2 is still busy
  device->synchronize_device();
  alloc->deallocate(b, s1);
  void* c = alloc->allocate(4096, s1);            // sees a's event completed
  EXPECT_EQ(stat(StatKind::active_bytes), 4096);  // c alone
  alloc->deallocate(c, s1);
  alloc->check();
}

INSTANTIATE_TEST_SUITE_P(
    AllSites, FaultInjection,
    ::testing::Values(FaultCase{DeviceOp::allocate, Status::out_of_memory},
                      FaultCase{DeviceOp::allocate, Status::device_error},
                      FaultCase{DeviceOp::deallocate, Status::device_error},
                      FaultCase{DeviceOp::create_event, Status::device_error},
                      FaultCase{DeviceOp::record_event, Status::device_error},
                      FaultCase{DeviceOp::query_event, Status::device_error},
                      FaultCase{DeviceOp::synchronize_event, Status::device_error},
                      FaultCase{DeviceOp::stream_wait_event, Status::device_error},
                      FaultCase{DeviceOp::memory_info, Status::device_error}),
    [](const ::testing::TestParamInfo<FaultCase>& param_info) {
      return std::string(to_string(param_info.param.op)) + "_" + to_string(param_info.param.status);
    });

}  // namespace
}  // namespace cistern::testing
