// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Expandable segments in the PyTorch emulation (`expandable_segments:True`): one reservation of
// 1.125 x the device's memory per pool and stream, 20 MiB pages of the large pool mapped on
// demand, growth into the unmapped space after a free block, pages unmapped only by
// release_cached_blocks and only when whole, and the out-of-memory path. Every step is checked
// against addresses and byte counts worked out by hand, with check() after each.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"
#include "replay/torch_allocator.hpp"

namespace cistern::replay {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

Config expandable() {
  Config config;
  config.expandable_segments = true;
  return config;
}

std::uintptr_t at(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

struct Fixture {
  explicit Fixture(std::size_t capacity)
      : device([capacity] {
          SimDeviceOptions o;
          o.capacity = capacity;
          return o;
        }()),
        alloc(device, expandable()) {}
  SimDevice device;
  TorchAllocator alloc;
};

TEST(TorchExpandable, GrowsIntoTheUnmappedSpaceAfterAFreeBlock) {
  Fixture f(std::size_t{1} << 30);
  void* a = f.alloc.allocate(5 * kMiB, default_stream);
  const std::uintptr_t base = at(a);
  f.alloc.check();
  EXPECT_EQ(f.alloc.reserved_bytes(), 20 * kMiB);  // one 20 MiB page
  EXPECT_EQ(f.device.live_reservations(), 1u);
  // 30 MiB does not fit the 15 MiB free after `a`; it grows that block into the next page
  // instead of taking a segment of its own.
  void* b = f.alloc.allocate(30 * kMiB, default_stream);
  f.alloc.check();
  EXPECT_EQ(at(b), base + 5 * kMiB);
  EXPECT_EQ(f.alloc.reserved_bytes(), 40 * kMiB);
  const Snapshot grown = f.alloc.snapshot();
  ASSERT_EQ(grown.segments.size(), 1u);  // one run of mapped pages
  EXPECT_TRUE(grown.segments[0].is_expandable);
  EXPECT_EQ(grown.segments[0].total_size, 40 * kMiB);
  ASSERT_EQ(grown.segments[0].blocks.size(), 3u);  // a, b and the 5 MiB split off b
  EXPECT_EQ(grown.segments[0].blocks[2].size, 5 * kMiB);

  f.alloc.deallocate(a, default_stream);
  f.alloc.deallocate(b, default_stream);
  f.alloc.check();
  EXPECT_EQ(f.alloc.reserved_bytes(), 40 * kMiB);  // freeing never unmaps
  f.alloc.empty_cache();
  f.alloc.check();
  EXPECT_EQ(f.alloc.reserved_bytes(), 0u);
  EXPECT_EQ(f.device.live_physical(), 0u);
  EXPECT_EQ(f.device.live_reservations(), 0u);  // the segment had no pages left: released
  EXPECT_TRUE(f.alloc.snapshot().segments.empty());
}

TEST(TorchExpandable, EachStreamAndPoolHasItsOwnReservation) {
  Fixture f(std::size_t{1} << 30);
  const Stream s1 = f.device.create_stream();
  void* large0 = f.alloc.allocate(4 * kMiB, default_stream);
  void* large1 = f.alloc.allocate(4 * kMiB, s1);
  void* small0 = f.alloc.allocate(1000, default_stream);
  f.alloc.check();
  EXPECT_EQ(f.device.live_reservations(), 3u);
  EXPECT_EQ(f.alloc.reserved_bytes(), 20 * kMiB + 20 * kMiB + 2 * kMiB);  // small pages: 2 MiB
  // A reservation spans 1.125 x 1 GiB rounded up to whole pages: 58 pages of 20 MiB.
  EXPECT_GE(at(large1) > at(large0) ? at(large1) - at(large0) : at(large0) - at(large1),
            58 * 20 * kMiB);
  for (void* p : {large0, small0}) f.alloc.deallocate(p, default_stream);
  f.alloc.deallocate(large1, s1);
  f.alloc.empty_cache();
  EXPECT_EQ(f.device.live_reservations(), 0u);
}

TEST(TorchExpandable, OutOfMemoryUnmapsWhatItMappedAndPartialPagesStay) {
  // 100 MiB: the reservation has 6 pages (1.125 x 100 MiB = 112.5 MiB, rounded up).
  Fixture f(100 * kMiB);
  void* a = f.alloc.allocate(50 * kMiB, default_stream);  // 3 pages; 10 MiB free after it
  const std::uintptr_t base = at(a);
  void* b = f.alloc.allocate(30 * kMiB, default_stream);  // the 10 MiB + one more page
  EXPECT_EQ(at(b), base + 50 * kMiB);
  EXPECT_EQ(f.alloc.reserved_bytes(), 80 * kMiB);
  // 40 MiB needs two more pages; the device has room for one: nothing stays mapped.
  EXPECT_THROW(f.alloc.allocate(40 * kMiB, default_stream), OutOfMemory);
  f.alloc.check();
  EXPECT_EQ(f.alloc.reserved_bytes(), 80 * kMiB);
  EXPECT_EQ(f.device.used_bytes(), 80 * kMiB);
  EXPECT_EQ(f.alloc.stats().num_alloc_retries, 1);

  f.alloc.deallocate(a, default_stream);
  void* c = f.alloc.allocate(40 * kMiB, default_stream);  // best fit: the freed 50 MiB
  EXPECT_EQ(at(c), base);
  // The 10 MiB left free shares its page with `c`: release_cached_blocks keeps it mapped.
  f.alloc.empty_cache();
  f.alloc.check();
  EXPECT_EQ(f.alloc.reserved_bytes(), 80 * kMiB);
  f.alloc.deallocate(c, default_stream);
  f.alloc.empty_cache();
  f.alloc.check();
  // Pages 0 and 1 are whole and free; page 2 holds the start of `b`.
  EXPECT_EQ(f.alloc.reserved_bytes(), 40 * kMiB);
  f.alloc.deallocate(b, default_stream);
}

// A random mix of sizes (both pools), two streams, frees and empty_cache() on a device small
// enough for the out-of-memory path, with check() after every step: the mapped pages are
// exactly the device's used memory, and everything goes back at the end.
TEST(TorchExpandable, RandomWorkloadKeepsEveryInvariant) {
  Fixture f(512 * kMiB);
  const Stream streams[] = {default_stream, f.device.create_stream()};
  std::mt19937_64 rng(20261203);
  std::vector<std::pair<void*, Stream>> live;
  for (int step = 0; step < 4000; ++step) {
    const auto op = rng() % 20;
    if (op < 11) {
      const std::size_t limits[] = {4096, 4 * kMiB, 70 * kMiB};
      const std::size_t size = 1 + rng() % limits[rng() % 3];
      const Stream stream = streams[rng() % 2];
      try {
        live.emplace_back(f.alloc.allocate(size, stream), stream);
      } catch (const OutOfMemory&) {
      }
    } else if (op < 19 && !live.empty()) {
      const std::size_t i = rng() % live.size();
      f.alloc.deallocate(live[i].first, live[i].second);
      live[i] = live.back();
      live.pop_back();
    } else {
      f.alloc.empty_cache();
    }
    f.alloc.check();
    ASSERT_EQ(f.device.used_bytes(), f.alloc.reserved_bytes()) << "step " << step;
  }
  for (const auto& [ptr, stream] : live) f.alloc.deallocate(ptr, stream);
  f.alloc.empty_cache();
  f.alloc.check();
  EXPECT_EQ(f.alloc.reserved_bytes(), 0u);
  EXPECT_EQ(f.device.live_reservations(), 0u);
}

}  // namespace
}  // namespace cistern::replay
