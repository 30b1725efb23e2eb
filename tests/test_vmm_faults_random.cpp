// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The engine under a random walk of allocations, frees (on their own stream and on others),
// record_stream and empty_cache() on three streams, with device calls failing at random: after
// every step the allocator's invariants hold (check()), a free that throws has not freed, and once
// the faults stop and everything is freed, empty_cache() returns every handle, every reservation
// and every byte. Fixed seeds; `ctest -L long` (CISTERN_TEST_FULL=1) runs more of them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "allocator_fixture.hpp"
#include "cistern/errors.hpp"

namespace cistern::testing {
namespace {

struct Walk {
  const char* conf;
  std::size_t capacity;
  std::size_t granularity;
  double fault;       // probability that a fallible call fails
  bool fail_unmap;    // faults on unmap (and none on map) rather than on map
  std::size_t scale;  // request sizes multiplied by this
  int steps;
};

// One walk; returns after the first failed expectation.
void walk(const Walk& w, std::uint64_t seed) {
  SimDeviceOptions options = sim_options(w.capacity);
  options.granularity = w.granularity;
  options.seed = seed;
  SimDevice device(options);
  CachingAllocator alloc(device, Config::parse(w.conf));
  const Stream streams[] = {default_stream, device.create_stream(), device.create_stream()};
  std::mt19937_64 rng(seed);
  if (w.fault > 0) {
    // A map that fails part way is undone; an undo that fails too would leave a mapping the
    // engine cannot know of, so one walk fails maps or unmaps, not both.
    device.fail_with_probability(w.fail_unmap ? DeviceOp::unmap : DeviceOp::map, w.fault,
                                 Status::device_error);
    device.fail_with_probability(DeviceOp::create_physical, w.fault, Status::out_of_memory);
    device.fail_with_probability(DeviceOp::release_physical, w.fault, Status::device_error);
    device.fail_with_probability(DeviceOp::reserve, w.fault, Status::device_error);
  }
  std::vector<std::pair<void*, Stream>> live;
  for (int step = 0; step < w.steps; ++step) {
    const unsigned r = static_cast<unsigned>(rng() % 100);
    try {
      if (!live.empty() && (r < 42 || live.size() > 80)) {
        const std::size_t i = rng() % live.size();
        const Stream on = rng() % 10 == 0 ? streams[rng() % 3] : live[i].second;
        void* p = live[i].first;
        live[i] = live.back();
        live.pop_back();
        try {
          alloc.deallocate(p, on);
        } catch (const DeviceError&) {
          // A free that throws has not freed: the pointer is still the program's to free.
          ASSERT_TRUE(alloc.requested_size(p).has_value())
              << "step " << step << ": deallocate threw after freeing";
          live.emplace_back(p, on);
          throw;
        }
      } else if (r < 44) {
        alloc.empty_cache();
      } else if (r < 46 && !live.empty()) {
        alloc.record_stream(live[rng() % live.size()].first, streams[rng() % 3]);
      } else {
        const std::size_t band = rng() % 10;
        const std::size_t bytes = band < 4   ? 1 + rng() % MiB
                                  : band < 8 ? MiB + rng() % (12 * MiB)
                                             : 12 * MiB + rng() % (60 * MiB);
        const Stream on = streams[rng() % 3];
        live.emplace_back(alloc.allocate(bytes * w.scale, on), on);
      }
    } catch (const OutOfMemory&) {
    } catch (const DeviceError&) {
    }
    if (rng() % 8 == 0) device.advance(1000000);
    try {
      alloc.check();
    } catch (const std::exception& e) {
      FAIL() << "step " << step << ": " << e.what();
    }
  }
  device.clear_faults();
  for (const auto& [p, on] : live) alloc.deallocate(p, on);
  ASSERT_NO_THROW(alloc.empty_cache());
  alloc.check();
  EXPECT_EQ(alloc.reserved_bytes(), 0u);
  EXPECT_EQ(alloc.stats().get(StatKind::reserved_bytes, StatPool::all).current, 0);
  EXPECT_EQ(device.live_physical(), 0u);
  EXPECT_EQ(device.live_reservations(), 0u);
  EXPECT_EQ(device.used_bytes(), 0u);
}

const char* const kConfs[] = {
    "vmm:True",
    "vmm:True,max_handle_size_mb:64",
    "vmm:True,max_handle_size_mb:1024",
    "vmm:True,memory_limit_mb:200",
    "vmm:True,memory_limit_mb:200,max_handle_size_mb:64",
    "vmm:True,release_threshold_mb:16",
    "vmm:True,release_threshold_mb:16,max_handle_size_mb:64",
    "vmm:True,garbage_collection_threshold:0.6,memory_limit_mb:300",
    "vmm:True,small_handle_size_mb:2,large_handle_size_mb:64",
};

class FaultWalk : public ::testing::TestWithParam<int> {};

// A 400 MiB device, requests of 1 B to 72 MiB, each option set above, 2 MiB and 64 KiB granules,
// without faults and with 3% of maps or of unmaps failing (and of creations, releases and
// reservations).
TEST_P(FaultWalk, InvariantsHoldAndEverythingGoesBack) {
  const auto seed = static_cast<std::uint64_t>(GetParam());
  for (const char* conf : kConfs) {
    for (const std::size_t granularity : {2 * MiB, 64 * KiB}) {
      for (const int faults : {0, 1, 2}) {
        const Walk w{conf, 400 * MiB, granularity, faults == 0 ? 0.0 : 0.03, faults == 2, 1, 600};
        SCOPED_TRACE(fmt::format("{}, {} KiB granules, {}, seed {}", conf, granularity / KiB,
                                 faults == 0   ? "no faults"
                                 : faults == 1 ? "3% of maps fail"
                                               : "3% of unmaps fail",
                                 seed));
        walk(w, seed * 7919 + static_cast<std::uint64_t>(faults));
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// An 80 GiB device, requests of up to 21 GiB, under a limit or with a release threshold, without
// faults and with 2% of maps or of unmaps failing.
TEST_P(FaultWalk, LargeRequestsOnALargeDevice) {
  const auto seed = static_cast<std::uint64_t>(GetParam());
  for (const char* conf :
       {"vmm:True,memory_limit_mb:40000", "vmm:True,release_threshold_mb:1000"}) {
    for (const int faults : {0, 1, 2}) {
      const Walk w{conf, 80 * GiB, 2 * MiB, faults == 0 ? 0.0 : 0.02, faults == 2, 300, 200};
      SCOPED_TRACE(fmt::format("{}, faults {}, seed {}", conf, faults, seed));
      walk(w, seed * 104729 + static_cast<std::uint64_t>(faults));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, FaultWalk, ::testing::Values(1));

// More seeds for `ctest -L long` (an empty instantiation otherwise).
std::vector<int> more_seeds() {
  std::vector<int> seeds;
  if (std::getenv("CISTERN_TEST_FULL") != nullptr) {
    for (int s = 100; s < 120; ++s) seeds.push_back(s);
  }
  return seeds;
}
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FaultWalk);
INSTANTIATE_TEST_SUITE_P(MoreSeeds, FaultWalk, ::testing::ValuesIn(more_seeds()));

}  // namespace
}  // namespace cistern::testing
