// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// PassThroughAllocator (pass_through:True, CISTERN_NO_CACHING=1): one device allocation per
// request, exact statistics, the pointer queries the plug-in uses, misuse and failures, history;
// and make_allocator, which chooses it. The contract shared with every allocator is in
// test_allocator_conformance.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "allocator_fixture.hpp"
#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "cistern/pass_through_allocator.hpp"

namespace cistern::testing {
namespace {

class PassThrough : public ::testing::Test {
 protected:
  void make(const std::string& conf, std::size_t capacity = 1 * GiB) {
    alloc.reset();
    device = std::make_unique<SimDevice>(sim_options(capacity));
    Config config = Config::parse(conf);
    config.pass_through = true;
    alloc = std::make_unique<PassThroughAllocator>(*device, config);
  }
  void SetUp() override { make(""); }
  void TearDown() override {
    if (alloc) alloc->check();
  }
  /// Allocates and checks.
  void* allocate(std::size_t bytes, Stream stream = default_stream) {
    void* p = alloc->allocate(bytes, stream);
    alloc->check();
    return p;
  }
  void deallocate(void* p, Stream stream = default_stream) {
    alloc->deallocate(p, stream);
    alloc->check();
  }
  std::int64_t stat(StatKind kind, StatPool pool = StatPool::all) const {
    return alloc->stats().get(kind, pool).current;
  }
  std::uint64_t device_calls(DeviceOp op) const { return device->counters().of(op); }
  static std::string message_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  std::unique_ptr<SimDevice> device;
  std::unique_ptr<PassThroughAllocator> alloc;
};

TEST(MakeAllocator, PassThroughSelectsThePassThroughAllocator) {
  SimDevice device(sim_options(1 * GiB));
  EXPECT_NE(dynamic_cast<PassThroughAllocator*>(
                make_allocator(device, Config::parse("pass_through:True")).get()),
            nullptr);
  EXPECT_NE(dynamic_cast<CachingAllocator*>(make_allocator(device, Config()).get()), nullptr);
}

TEST(MakeAllocator, CachingAllocatorRefusesPassThroughAndNamesTheRightClass) {
  SimDevice device(sim_options(1 * GiB));
  try {
    CachingAllocator alloc(device, Config::parse("pass_through:True"));
    FAIL() << "CachingAllocator accepted pass_through:True";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("PassThroughAllocator"), std::string::npos) << e.what();
  }
}

TEST_F(PassThrough, MakesOneDeviceAllocationPerRequest) {
  void* a = allocate(100);
  void* b = allocate(100);
  EXPECT_EQ(device_calls(DeviceOp::allocate), 2u);
  EXPECT_EQ(stat(StatKind::reserved_bytes), 1024);  // each rounded to 512 bytes
  EXPECT_EQ(alloc->reserved_bytes(), 1024u);
  EXPECT_EQ(device->used_bytes(), 2 * MiB);  // the device packs both into one shared granule
  deallocate(a);
  EXPECT_EQ(device_calls(DeviceOp::deallocate), 1u);
  EXPECT_EQ(stat(StatKind::reserved_bytes), 512);
  EXPECT_THROW(alloc->deallocate(a, default_stream), InvalidPointer);
  deallocate(b);
  EXPECT_EQ(device->used_bytes(), 0u);
  EXPECT_EQ(alloc->stats().num_device_alloc, 2);
  EXPECT_EQ(alloc->stats().num_device_free, 2);
}

TEST_F(PassThrough, StatisticsCountEachAllocationAsItsOwnSegmentInItsPool) {
  make("max_split_size_mb:20");
  void* small = allocate(1000);
  void* large = allocate(3 * MiB);
  void* oversize = allocate(25 * MiB);
  const Stats s = alloc->stats();
  EXPECT_EQ(s.get(StatKind::segment, StatPool::small_pool).current, 1);
  EXPECT_EQ(s.get(StatKind::segment, StatPool::large_pool).current, 2);
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::small_pool).current, 1024);
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::large_pool).current,
            static_cast<std::int64_t>(28 * MiB));
  EXPECT_EQ(s.get(StatKind::requested_bytes, StatPool::all).current,
            static_cast<std::int64_t>(1000 + 28 * MiB));
  EXPECT_EQ(s.get(StatKind::active, StatPool::all).current, 3);
  EXPECT_EQ(s.get(StatKind::inactive_split, StatPool::all).current, 0);
  EXPECT_EQ(s.oversize_allocations.current, 1);
  EXPECT_EQ(s.oversize_segments.current, 1);
  EXPECT_EQ(s.max_split_size, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(alloc->allocated_bytes(), 1024 + 28 * MiB);
  deallocate(oversize);
  deallocate(small);
  alloc->reset_peak_stats();
  alloc->check();
  EXPECT_EQ(alloc->stats().get(StatKind::reserved_bytes, StatPool::all).peak,
            static_cast<std::int64_t>(3 * MiB));
  alloc->reset_accumulated_stats();
  alloc->check();
  EXPECT_EQ(alloc->stats().get(StatKind::allocation, StatPool::all).allocated, 0);
  EXPECT_EQ(alloc->stats().num_device_alloc, 0);
  deallocate(large);
  EXPECT_EQ(alloc->stats().get(StatKind::allocation, StatPool::all).freed, 1);
  EXPECT_EQ(alloc->stats().num_device_free, 1);
}

TEST_F(PassThrough, PointerQueriesAndSnapshotDescribeEachAllocation) {
  const Stream s2 = device->create_stream();
  void* a = allocate(3000, s2);
  void* b = allocate(2 * MiB + 1);
  EXPECT_EQ(alloc->allocation_size(a), 3072u);
  EXPECT_EQ(alloc->requested_size(a), std::optional<std::size_t>(3000));
  EXPECT_EQ(alloc->base_allocation(b), std::make_pair(b, std::size_t{2 * MiB + 512}));
  EXPECT_FALSE(alloc->requested_size(static_cast<char*>(a) + 512).has_value());
  const Snapshot snap = alloc->snapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  EXPECT_LT(snap.segments[0].address, snap.segments[1].address);
  for (const SegmentInfo& seg : snap.segments) {
    const bool is_a = seg.address == reinterpret_cast<std::uintptr_t>(a);
    EXPECT_EQ(seg.stream, is_a ? s2 : default_stream);
    EXPECT_EQ(seg.is_large, !is_a);
    ASSERT_EQ(seg.blocks.size(), 1u);
    EXPECT_EQ(seg.blocks[0].state, BlockState::active_allocated);
    EXPECT_EQ(seg.blocks[0].requested_size, is_a ? 3000u : 2 * MiB + 1);
  }
  alloc->record_stream(a, default_stream);  // accepted; the device free orders the reuse
  deallocate(a, default_stream);
  deallocate(b);
  EXPECT_FALSE(alloc->requested_size(a).has_value());
}

TEST_F(PassThrough, MisuseIsNamedAndChangesNothing) {
  void* a = allocate(4096);
  const std::string interior =
      message_of([&] { alloc->deallocate(static_cast<char*>(a) + 1024, default_stream); });
  EXPECT_NE(interior.find("1024 bytes inside the allocated block"), std::string::npos) << interior;
  int foreign = 0;
  EXPECT_THROW(alloc->record_stream(&foreign, default_stream), InvalidPointer);
  EXPECT_THROW((void)alloc->allocation_size(&foreign), InvalidPointer);
  EXPECT_THROW((void)alloc->base_allocation(&foreign), InvalidPointer);
  alloc->check();
  EXPECT_EQ(stat(StatKind::allocation), 1);
  deallocate(a);
  const std::string twice = message_of([&] { alloc->deallocate(a, default_stream); });
  EXPECT_NE(twice.find("deallocate(0x"), std::string::npos) << twice;
  EXPECT_NE(twice.find("double free"), std::string::npos) << twice;
  EXPECT_EQ(alloc->stats().num_device_free, 1);
}

TEST_F(PassThrough, LimitsAndDeviceFailuresAreOutOfMemoryWithNothingChanged) {
  make("memory_limit_mb:8", 64 * MiB);
  void* a = allocate(6 * MiB);
  try {
    alloc->allocate(3 * MiB, default_stream);
    FAIL() << "the limit was not enforced";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.info().limit, 8 * MiB);
    EXPECT_EQ(e.info().allocated, 6 * MiB);
    EXPECT_NE(std::string(e.what()).find("pass-through"), std::string::npos) << e.what();
  }
  alloc->check();
  EXPECT_EQ(alloc->stats().num_ooms, 1);
  EXPECT_EQ(device_calls(DeviceOp::allocate), 1u);  // refused before the device was asked
  EXPECT_THROW(alloc->set_memory_fraction(0.0), InvalidArgument);
  device->fail_nth(DeviceOp::allocate, 1);
  EXPECT_THROW(alloc->allocate(512, default_stream), OutOfMemory);
  alloc->check();
  EXPECT_EQ(alloc->stats().num_ooms, 2);
  device->fail_nth(DeviceOp::deallocate, 1, Status::device_error);
  EXPECT_THROW(alloc->deallocate(a, default_stream), DeviceError);
  alloc->check();
  EXPECT_EQ(alloc->allocation_size(a), 6 * MiB);  // still allocated: the free may be retried
  deallocate(a);
  EXPECT_EQ(alloc->reserved_bytes(), 0u);
}

TEST_F(PassThrough, MemoryFractionBoundsTheBytesHeld) {
  make("", 64 * MiB);
  alloc->set_memory_fraction(0.25);
  EXPECT_THROW(alloc->allocate(17 * MiB, default_stream), OutOfMemory);
  void* a = allocate(16 * MiB);
  deallocate(a);
}

TEST_F(PassThrough, HistoryRecordsEveryRequestAsASegmentOfItsOwn) {
  alloc->record_history(true, 100);
  void* a = allocate(100);
  deallocate(a);
  alloc->record_history(false, 0);
  void* b = allocate(100);  // not recorded
  deallocate(b);
  using A = HistoryEntry::Action;
  const std::vector<A> expected = {A::segment_alloc, A::alloc, A::free_requested, A::free_completed,
                                   A::segment_free};
  const std::vector<HistoryEntry> history = alloc->history();
  ASSERT_EQ(history.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(history[i].action, expected[i]) << i;
    EXPECT_EQ(history[i].addr, reinterpret_cast<std::uintptr_t>(a)) << i;
  }
  EXPECT_EQ(history[1].size, 100u);
  EXPECT_EQ(history[4].size, 512u);
}

}  // namespace
}  // namespace cistern::testing
