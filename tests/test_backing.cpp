// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// A backing on its own (src/core/backing.hpp): classic segments and the virtual-memory engine
// built over a BackingContext - a simulated device, one pool, the counters, the history - with no
// CachingAllocator, and driven through the contract's calls. Exact bytes, handles and calls after
// each step; the device's refusal of the engine and the releases it fails come back as values.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"
#include "core/backing.hpp"
#include "core/region_table.hpp"

namespace cistern::detail {
namespace {

/// Everything a backing is lent, owned by the test.
struct Harness {
  explicit Harness(bool engine, std::size_t capacity = 8 * GiB)
      : device(SimDeviceOptions{capacity}),
        policy(engine ? SizePolicy(config).for_engine() : SizePolicy(config)),
        events(device) {
    MemoryInfo info;
    EXPECT_EQ(device.memory_info(&info), Status::ok);
    reservation.device_total = info.total;
    pools.add(std::make_unique<StreamPool>(Stream{}, policy, config, shared, log, regions));
    backing = engine ? make_mapped_handles(context()) : make_segments(context());
  }

  BackingContext context() {
    return {device, config, policy, pools, reservation, counters, events, HistorySink(log)};
  }
  StreamPool& pool() { return *pools.all().front(); }
  std::vector<const Segment*> segments() {
    std::vector<const Segment*> all;
    for (const Segment* s = pool().segments(); s != nullptr; s = s->next) all.push_back(s);
    return all;
  }
  /// The actions recorded so far, with their sizes.
  std::vector<std::pair<HistoryEntry::Action, std::size_t>> recorded() const {
    std::vector<std::pair<HistoryEntry::Action, std::size_t>> out;
    for (const HistoryEntry& e : history.entries()) out.emplace_back(e.action, e.size);
    return out;
  }

  SimDevice device;
  Config config;
  SizePolicy policy;
  EventPool events;
  RegionTable regions;
  PoolTable pools;
  Reservation reservation;
  Counters counters;
  std::atomic<SharedStats*> shared{nullptr};
  HistoryLog history{1024};
  std::atomic<HistoryLog*> log{&history};
  std::unique_ptr<Backing> backing;
};

using Action = HistoryEntry::Action;

TEST(Backing, SegmentsGrowAndReleaseWholeSegments) {
  Harness h(/*engine=*/false);
  const std::size_t size = h.policy.round(3 * MiB);
  const Growth growth = h.backing->grow(h.pool(), size, /*small=*/false);
  ASSERT_NE(growth.block, nullptr);
  EXPECT_TRUE(growth.refusal.empty());
  const std::size_t segment = h.policy.segment_size(size);  // 20 MiB, as PyTorch's
  EXPECT_EQ(segment, 20 * MiB);
  EXPECT_EQ(growth.block->size, segment);
  EXPECT_EQ(h.reservation.bytes(), segment);
  EXPECT_EQ(h.counters.device_alloc, 1);
  EXPECT_EQ(h.device.counters().of(DeviceOp::allocate), 1u);
  h.backing->check(h.segments());
  // Nothing to take from inside a classic segment.
  EXPECT_EQ(h.backing->reclaim_and_grow(h.pool(), size, false).block, nullptr);

  const Releases released = h.backing->release_segment(h.pool(), growth.block);
  EXPECT_TRUE(released.ok());
  EXPECT_EQ(h.reservation.bytes(), 0u);
  EXPECT_EQ(h.counters.device_free, 1);
  EXPECT_EQ(h.pool().segments(), nullptr);
  const std::vector<std::pair<Action, std::size_t>> expected = {{Action::segment_alloc, segment},
                                                                {Action::segment_free, segment}};
  EXPECT_EQ(h.recorded(), expected);
}

TEST(Backing, SegmentsReportAFailedReleaseAsAValue) {
  Harness h(/*engine=*/false);
  const Growth growth = h.backing->grow(h.pool(), 2 * MiB, /*small=*/false);
  ASSERT_NE(growth.block, nullptr);
  h.device.fail_nth(DeviceOp::deallocate, 1, Status::device_error);
  const Releases failed = h.backing->release_segment(h.pool(), growth.block);
  EXPECT_EQ(failed.failures, 1u);
  EXPECT_NE(failed.last_error.find("device_error"), std::string::npos) << failed.last_error;
  EXPECT_EQ(h.reservation.bytes(), 20 * MiB);  // kept, cached
  ASSERT_NE(h.pool().segments(), nullptr);
  EXPECT_TRUE(h.backing->release_segment(h.pool(), growth.block).ok());
  EXPECT_EQ(h.reservation.bytes(), 0u);
}

TEST(Backing, SegmentsStopAtTheLimit) {
  Harness h(/*engine=*/false);
  h.reservation.allowed = 10 * MiB;
  const Growth growth = h.backing->grow(h.pool(), 2 * MiB, /*small=*/false);  // a 20 MiB segment
  EXPECT_EQ(growth.block, nullptr);
  EXPECT_TRUE(growth.refusal.empty());  // no room: not a refusal of the backing
  EXPECT_EQ(h.device.counters().of(DeviceOp::allocate), 0u);
}

// A 50 MiB request in a fresh range of twice the device (8 GiB): handles on the page rule's 20 MiB
// grid from the range's base, the last page mapped to its end as expandable segments map it (far
// from the limit: 20 + 20 + 20 MiB), in one run recorded as one segment_map.
TEST(Backing, EngineMapsARequestOnPages) {
  Harness h(/*engine=*/true);
  const std::size_t size = 50 * MiB;
  const Growth growth = h.backing->grow(h.pool(), size, /*small=*/false);
  ASSERT_NE(growth.block, nullptr);
  EXPECT_TRUE(growth.refusal.empty());
  const Segment& seg = *growth.block->segment;
  EXPECT_TRUE(seg.expandable);
  EXPECT_EQ(seg.size, 16 * GiB);
  EXPECT_EQ(growth.block->addr, seg.base);
  EXPECT_EQ(h.reservation.bytes(), 60 * MiB);
  EXPECT_EQ(h.counters.handles_created, 3);
  EXPECT_EQ(h.counters.device_alloc, 3);
  EXPECT_EQ(h.counters.pages_mapped, 30);
  EXPECT_EQ(seg.unmapped_pages, seg.pages.size() - 30);
  EXPECT_EQ(h.device.counters().of(DeviceOp::reserve), 1u);
  EXPECT_EQ(h.device.counters().of(DeviceOp::create_physical), 3u);
  const std::vector<std::pair<Action, std::size_t>> expected = {{Action::segment_map, 60 * MiB}};
  EXPECT_EQ(h.recorded(), expected);
  h.backing->check(h.segments());

  // Handed out and given back: the handles stay under the cached free block (a steady state
  // makes no call), and the release of the cache returns all of them, then the range.
  void* p = h.pool().take(growth.block, size, size);
  EXPECT_EQ(h.backing->cached_fit(h.pool(), size, false), nullptr);  // nothing free is mapped
  Block* b = h.pool().extract_allocated(reinterpret_cast<std::uintptr_t>(p));
  ASSERT_NE(b, nullptr);
  h.pool().release(b);
  Block* again = h.backing->cached_fit(h.pool(), size, false);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->addr, reinterpret_cast<std::uintptr_t>(p));
  EXPECT_EQ(h.device.counters().of(DeviceOp::create_physical), 3u);
  h.backing->check(h.segments());

  Block* whole = h.pool().whole_free(false);
  ASSERT_NE(whole, nullptr);
  EXPECT_TRUE(h.backing->release_segment(h.pool(), whole).ok());
  EXPECT_EQ(h.reservation.bytes(), 0u);
  EXPECT_EQ(h.counters.handles_released, 3);
  EXPECT_EQ(h.pool().segments(), nullptr);
  h.backing->check(h.segments());
}

// A device that cannot run the engine (CUDA_ERROR_NOT_SUPPORTED at the first growth, as under MIG
// or vGPU): the growth says so as a value, and nothing is left reserved.
TEST(Backing, EngineReportsARefusalAtItsFirstGrowth) {
  Harness h(/*engine=*/true);
  h.device.fail_nth(DeviceOp::create_physical, 1, Status::not_supported);
  const Growth growth = h.backing->grow(h.pool(), 4 * MiB, /*small=*/false);
  EXPECT_EQ(growth.block, nullptr);
  EXPECT_NE(growth.refusal.find("not_supported"), std::string::npos) << growth.refusal;
  EXPECT_EQ(h.pool().segments(), nullptr);  // the range went back: classic segments take over
  EXPECT_EQ(h.device.counters().of(DeviceOp::release_reservation), 1u);
  EXPECT_EQ(h.reservation.bytes(), 0u);

  // After a first growth, the same status is an error of the request, not a refusal.
  ASSERT_NE(h.backing->grow(h.pool(), 4 * MiB, false).block, nullptr);
  h.device.fail_nth(DeviceOp::create_physical, 1, Status::not_supported);
  EXPECT_THROW((void)h.backing->grow(h.pool(), 64 * MiB, false), DeviceError);
}

// A handle whose release the device refuses stays reserved, and release_rest says how many and
// why (each once, though it tried twice); the next release_rest retries it. A release that fails
// once and succeeds on the retry is no failure.
TEST(Backing, EngineReportsFailedReleasesAsValues) {
  Harness h(/*engine=*/true);
  const Growth first = h.backing->grow(h.pool(), 20 * MiB, /*small=*/false);
  ASSERT_NE(first.block, nullptr);
  void* p = h.pool().take(first.block, 20 * MiB, 20 * MiB);
  const Growth second = h.backing->grow(h.pool(), 20 * MiB, false);  // the next page, kept live
  ASSERT_NE(second.block, nullptr);
  h.pool().take(second.block, 20 * MiB, 20 * MiB);
  h.pool().release(h.pool().extract_allocated(reinterpret_cast<std::uintptr_t>(p)));
  ASSERT_EQ(h.reservation.bytes(), 40 * MiB);

  // Refused, and refused again by release_rest's retry of what is left unplaced.
  h.device.fail_with_probability(DeviceOp::release_physical, 1.0, Status::device_error);
  const Releases failed = h.backing->release_rest(/*asked=*/true);
  h.device.clear_faults();
  EXPECT_EQ(failed.failures, 1u);
  EXPECT_NE(failed.last_error.find("device_error"), std::string::npos) << failed.last_error;
  EXPECT_EQ(h.reservation.bytes(), 40 * MiB);  // unmapped, not released
  h.backing->check(h.segments());

  const Releases retried = h.backing->release_rest(true);
  EXPECT_TRUE(retried.ok()) << retried.last_error;
  EXPECT_EQ(h.reservation.bytes(), 20 * MiB);  // the live block's page
  h.backing->check(h.segments());

  h.pool().release(h.pool().extract_allocated(second.block->addr));
  h.device.fail_nth(DeviceOp::release_physical, 1, Status::device_error);
  const Releases once = h.backing->release_rest(true);
  EXPECT_TRUE(once.ok()) << once.last_error;
  EXPECT_EQ(h.reservation.bytes(), 0u);
  EXPECT_EQ(h.device.counters().failed(DeviceOp::release_physical), 3u);
  h.backing->check(h.segments());
}

// Near the limit the engine follows the room: its handles shrink, it sets the flag the hot path
// reads once a growth has had to reclaim, and reclaim_and_grow takes handles from under cached
// free blocks.
TEST(Backing, EngineReclaimsUnderFreeBlocksAtTheLimit) {
  Harness h(/*engine=*/true, /*capacity=*/128 * MiB);
  std::vector<void*> live;
  std::vector<void*> freed;
  for (int i = 0; i < 6; ++i) {
    const Growth g = h.backing->grow(h.pool(), 20 * MiB, /*small=*/false);
    ASSERT_NE(g.block, nullptr) << i;
    (i % 2 == 0 ? freed : live).push_back(h.pool().take(g.block, 20 * MiB, 20 * MiB));
  }
  for (void* p : freed) {
    h.pool().release(h.pool().extract_allocated(reinterpret_cast<std::uintptr_t>(p)));
  }
  ASSERT_EQ(h.reservation.bytes(), 120 * MiB);
  // 40 MiB more: no room on the device until the freed blocks' handles go back.
  const Growth plain = h.backing->grow(h.pool(), 40 * MiB, false);
  EXPECT_EQ(plain.block, nullptr);
  EXPECT_TRUE(plain.refusal.empty());
  const Growth reclaimed = h.backing->reclaim_and_grow(h.pool(), 40 * MiB, false);
  ASSERT_NE(reclaimed.block, nullptr);
  EXPECT_GT(h.counters.pages_reclaimed, 0);
  EXPECT_LE(h.reservation.bytes(), 128 * MiB);
  h.backing->check(h.segments());
}

}  // namespace
}  // namespace cistern::detail
