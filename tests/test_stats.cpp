// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Stat names and Stats::flatten(): exactly torch.cuda.memory_stats()'s keys, values in place.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "cistern/stats.hpp"

namespace cistern {
namespace {

TEST(StatNames, KindsArePyTorchKeys) {
  EXPECT_STREQ(to_string(StatKind::allocation), "allocation");
  EXPECT_STREQ(to_string(StatKind::segment), "segment");
  EXPECT_STREQ(to_string(StatKind::active), "active");
  EXPECT_STREQ(to_string(StatKind::inactive_split), "inactive_split");
  EXPECT_STREQ(to_string(StatKind::allocated_bytes), "allocated_bytes");
  EXPECT_STREQ(to_string(StatKind::reserved_bytes), "reserved_bytes");
  EXPECT_STREQ(to_string(StatKind::active_bytes), "active_bytes");
  EXPECT_STREQ(to_string(StatKind::inactive_split_bytes), "inactive_split_bytes");
  EXPECT_STREQ(to_string(StatKind::requested_bytes), "requested_bytes");
}

TEST(StatNames, PoolsAndBlockStates) {
  EXPECT_STREQ(to_string(StatPool::all), "all");
  EXPECT_STREQ(to_string(StatPool::small_pool), "small_pool");
  EXPECT_STREQ(to_string(StatPool::large_pool), "large_pool");
  EXPECT_STREQ(to_string(BlockState::active_allocated), "active_allocated");
  EXPECT_STREQ(to_string(BlockState::active_pending_free), "active_pending_free");
  EXPECT_STREQ(to_string(BlockState::inactive), "inactive");
}

/// The key set of torch.cuda.memory_stats() (native backend) plus cistern's one extra counter,
/// written out by hand rather than generated the way flatten() generates it.
std::set<std::string> expected_keys() {
  std::set<std::string> keys;
  const char* kinds[] = {
      "allocation",      "segment",        "active",       "inactive_split",
      "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
      "requested_bytes"};
  const char* pools[] = {"all", "small_pool", "large_pool"};
  const char* fields[] = {"current", "peak", "allocated", "freed"};
  for (const char* kind : kinds) {
    for (const char* pool : pools) {
      for (const char* field : fields) {
        keys.insert(std::string(kind) + "." + pool + "." + field);
      }
    }
  }
  for (const char* field : fields) {
    keys.insert(std::string("oversize_allocations.") + field);
    keys.insert(std::string("oversize_segments.") + field);
  }
  for (const char* counter :
       {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
        "num_device_free", "max_split_size", "num_cross_stream_reuse", "num_pages_mapped",
        "num_pages_unmapped", "num_pages_reclaimed", "num_handles_created", "num_handles_released",
        "num_reclaim_syncs", "num_handle_splits", "num_oom_rescues", "num_fine_cuts",
        "num_vmm_fallbacks"}) {
    keys.insert(counter);
  }
  return keys;
}

TEST(StatsFlatten, HasExactlyThePyTorchKeys) {
  const auto flat = Stats().flatten();
  std::set<std::string> keys;
  for (const auto& entry : flat) keys.insert(entry.first);
  EXPECT_EQ(expected_keys().size(), 9u * 3u * 4u + 8u + 6u + 1u + 10u);
  EXPECT_EQ(flat.size(), 133u);
  EXPECT_EQ(keys, expected_keys());
}

TEST(StatsFlatten, DefaultsAreZeroExceptUnlimitedSplitSize) {
  for (const auto& [key, value] : Stats().flatten()) {
    EXPECT_EQ(value, key == "max_split_size" ? -1 : 0) << key;
  }
}

TEST(StatsFlatten, ArrayValuesLandUnderTheirKeys) {
  Stats stats;
  // A distinct value per (kind, pool, field) so that any transposition shows.
  for (int kind = 0; kind < kStatKinds; ++kind) {
    for (int pool = 0; pool < kStatPools; ++pool) {
      Stat& stat = stats.array[kind][pool];
      const std::int64_t base = 1000 * (kind + 1) + 100 * (pool + 1);
      stat.current = base + 1;
      stat.peak = base + 2;
      stat.allocated = base + 3;
      stat.freed = base + 4;
    }
  }
  const auto flat = stats.flatten();
  EXPECT_EQ(flat.at("allocation.all.current"), 1101);
  EXPECT_EQ(flat.at("segment.small_pool.peak"), 2202);
  EXPECT_EQ(flat.at("allocated_bytes.large_pool.allocated"), 5303);
  EXPECT_EQ(flat.at("inactive_split_bytes.large_pool.peak"), 8302);
  EXPECT_EQ(flat.at("requested_bytes.all.freed"), 9104);
  EXPECT_EQ(flat.at("reserved_bytes.small_pool.current"), 6201);
}

TEST(StatsFlatten, GetAndUpdateAreVisible) {
  Stats stats;
  stats.get(StatKind::active_bytes, StatPool::small_pool).update(4096);
  stats.get(StatKind::active_bytes, StatPool::small_pool).update(-1024);
  const auto flat = stats.flatten();
  EXPECT_EQ(flat.at("active_bytes.small_pool.current"), 3072);
  EXPECT_EQ(flat.at("active_bytes.small_pool.peak"), 4096);
  EXPECT_EQ(flat.at("active_bytes.small_pool.allocated"), 4096);
  EXPECT_EQ(flat.at("active_bytes.small_pool.freed"), 1024);
  EXPECT_EQ(flat.at("active_bytes.all.current"), 0);
}

TEST(StatsFlatten, ScalarsLandUnderTheirKeys) {
  Stats stats;
  stats.oversize_allocations = Stat{1, 2, 3, 4};
  stats.oversize_segments = Stat{5, 6, 7, 8};
  stats.num_alloc_retries = 11;
  stats.num_ooms = 12;
  stats.num_sync_all_streams = 13;
  stats.num_device_alloc = 14;
  stats.num_device_free = 15;
  stats.num_cross_stream_reuse = 16;
  stats.max_split_size = 20 << 20;
  const auto flat = stats.flatten();
  EXPECT_EQ(flat.at("oversize_allocations.current"), 1);
  EXPECT_EQ(flat.at("oversize_allocations.peak"), 2);
  EXPECT_EQ(flat.at("oversize_allocations.allocated"), 3);
  EXPECT_EQ(flat.at("oversize_allocations.freed"), 4);
  EXPECT_EQ(flat.at("oversize_segments.current"), 5);
  EXPECT_EQ(flat.at("oversize_segments.peak"), 6);
  EXPECT_EQ(flat.at("oversize_segments.allocated"), 7);
  EXPECT_EQ(flat.at("oversize_segments.freed"), 8);
  EXPECT_EQ(flat.at("num_alloc_retries"), 11);
  EXPECT_EQ(flat.at("num_ooms"), 12);
  EXPECT_EQ(flat.at("num_sync_all_streams"), 13);
  EXPECT_EQ(flat.at("num_device_alloc"), 14);
  EXPECT_EQ(flat.at("num_device_free"), 15);
  EXPECT_EQ(flat.at("num_cross_stream_reuse"), 16);
  EXPECT_EQ(flat.at("max_split_size"), 20 << 20);
}

}  // namespace
}  // namespace cistern
