// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The internal indexes against simple oracles: BlockIndex (best fit by size, then address)
// against a std::set, PtrMap against a std::unordered_map, and the bin mapping.
#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/block_index.hpp"
#include "core/ptr_map.hpp"

namespace cistern::detail {
namespace {

struct ByKey {
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->addr < b->addr;
  }
};

Block* oracle_best_fit(const std::set<Block*, ByKey>& set, std::size_t size) {
  Block probe;
  probe.size = size;
  probe.addr = 0;
  const auto it = set.lower_bound(&probe);
  return it == set.end() ? nullptr : *it;
}

TEST(BlockIndex, BinsAreMonotonicAndCoverAllSizes) {
  int previous = -1;
  for (std::size_t size = 512; size < (std::size_t{1} << 40); size += size / 97 + 512) {
    const int bin = BlockIndex::bin_of(size);
    ASSERT_GE(bin, previous) << size;
    ASSERT_LT(bin, BlockIndex::kBins) << size;
    previous = bin;
  }
  EXPECT_EQ(BlockIndex::bin_of(512), 0);
  EXPECT_EQ(BlockIndex::bin_of(1024), 1);
  EXPECT_EQ(BlockIndex::bin_of(32 * KiB), 63);
  EXPECT_EQ(BlockIndex::bin_of(32 * KiB + 512), 64);
  EXPECT_LT(BlockIndex::bin_of(std::size_t{1} << 57), BlockIndex::kBins);
  // A size on a bin boundary shares the bin of the sizes just below it: a whole segment (2 MiB,
  // 20 MiB) and its rest after a 512-byte split.
  EXPECT_EQ(BlockIndex::bin_of(2 * MiB), BlockIndex::bin_of(2 * MiB - 512));
  EXPECT_NE(BlockIndex::bin_of(2 * MiB), BlockIndex::bin_of(2 * MiB + 512));
  EXPECT_EQ(BlockIndex::bin_of(20 * MiB), BlockIndex::bin_of(20 * MiB - 512));
  // From 256 MiB up, 4 bins per power of two: an engine's 1 GiB range and what is left of it
  // after a 100 MiB request share a bin, so the pair's split and coalesce flip no bitmap bit.
  EXPECT_EQ(BlockIndex::bin_of(1 * GiB), BlockIndex::bin_of(1 * GiB - 100 * MiB));
  EXPECT_EQ(BlockIndex::bin_of(256 * MiB + 512), BlockIndex::bin_of(256 * MiB) + 1);
  EXPECT_EQ(BlockIndex::bin_of(256 * MiB + 512), BlockIndex::bin_of(320 * MiB));
  EXPECT_EQ(BlockIndex::bin_of(320 * MiB + 512), BlockIndex::bin_of(320 * MiB) + 1);
  EXPECT_NE(BlockIndex::bin_of(256 * MiB - 512), BlockIndex::bin_of(256 * MiB - 4 * MiB - 512));
}

// same_bin, the hot path's shortcut, against bin_of: every pair of sizes (multiples of 512) near
// bin and octave boundaries, and random pairs of sizes up to 2^57 with a fixed seed.
TEST(BlockIndex, SameBinAgreesWithBinOf) {
  std::vector<std::size_t> sizes;
  for (int log2 = 9; log2 <= 57; ++log2) {
    const std::size_t edge = std::size_t{1} << log2;
    for (std::size_t d = 0; d <= 4 * 512; d += 512) {
      sizes.push_back(edge + d);
      if (edge > d) sizes.push_back(edge - d);
    }
    sizes.push_back(edge + (edge >> 6));  // the next sub-bin's edge
  }
  for (std::size_t size = 512; size <= 128 * KiB; size += 512) sizes.push_back(size);
  for (const std::size_t a : sizes) {
    if (a < 512) continue;
    for (const std::size_t b : sizes) {
      if (b < 512) continue;
      ASSERT_EQ(BlockIndex::same_bin(a, b), BlockIndex::bin_of(a) == BlockIndex::bin_of(b))
          << a << " " << b;
    }
  }
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200000; ++i) {
    const int shift = static_cast<int>(rng() % 48);
    const std::size_t a = ((rng() >> shift) | 1u) * 512 % (std::size_t{1} << 57) + 512;
    const std::size_t b = rng() % 2 == 0 ? a + (rng() % 64) * 512 : ((rng() >> shift) | 1u) * 512;
    if (b < 512 || b > (std::size_t{1} << 57)) continue;
    ASSERT_EQ(BlockIndex::same_bin(a, b), BlockIndex::bin_of(a) == BlockIndex::bin_of(b))
        << a << " " << b;
  }
}

TEST(BlockIndex, BestFitMatchesAnOrderedSetOnRandomOperations) {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    std::deque<Block> storage;
    std::vector<Block*> in_index;
    std::set<Block*, ByKey> oracle;
    BlockIndex index;
    std::uintptr_t next_addr = 0x100000;
    auto random_size = [&] {
      const int kind = static_cast<int>(rng() % 4);
      const std::size_t unit = 512;
      if (kind == 0) return unit * (1 + rng() % 64);  // the exact 512-byte bins
      if (kind == 1) return unit * (1 + rng() % 4096);
      if (kind == 2) return unit * (1 + rng() % (1u << 20));
      return std::size_t{20} << 20;  // many equal sizes: address order decides
    };
    for (int step = 0; step < 20000; ++step) {
      const int op = static_cast<int>(rng() % 3);
      if (op == 0 || in_index.empty()) {
        storage.emplace_back();
        Block* b = &storage.back();
        b->size = random_size();
        b->addr = next_addr;
        next_addr += b->size + 512 * (rng() % 3);
        index.insert(b);
        oracle.insert(b);
        in_index.push_back(b);
      } else if (op == 1) {
        const std::size_t i = rng() % in_index.size();
        Block* b = in_index[i];
        index.remove(b);
        oracle.erase(b);
        in_index[i] = in_index.back();
        in_index.pop_back();
      } else {
        const std::size_t want = random_size() + 512 * (rng() % 2);
        ASSERT_EQ(index.best_fit(want), oracle_best_fit(oracle, want))
            << "seed " << seed << " step " << step << " size " << want;
      }
      ASSERT_EQ(index.count(), oracle.size());
      if (step % 997 == 0) {
        ASSERT_EQ(index.check(), nullptr);
      }
    }
    for (Block* b : in_index) {
      ASSERT_TRUE(index.contains(b));
    }
    ASSERT_EQ(index.check(), nullptr);
  }
}

TEST(BlockIndex, EmptyIndexFindsNothing) {
  BlockIndex index;
  EXPECT_EQ(index.best_fit(512), nullptr);
  EXPECT_EQ(index.check(), nullptr);
  Block b;
  b.addr = 0x1000;
  b.size = 4096;
  index.insert(&b);
  EXPECT_EQ(index.best_fit(4097), nullptr);
  EXPECT_EQ(index.best_fit(4096), &b);
  EXPECT_EQ(index.best_fit(1), &b);
  index.remove(&b);
  EXPECT_EQ(index.best_fit(512), nullptr);
  EXPECT_EQ(index.check(), nullptr);
}

TEST(PtrMap, MatchesAnUnorderedMapOnRandomOperations) {
  std::mt19937_64 rng(7);
  PtrMap map;
  std::unordered_map<std::uintptr_t, Block*> oracle;
  std::vector<std::uintptr_t> keys;
  std::deque<Block> blocks(64);
  for (int step = 0; step < 200000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {
      std::uintptr_t key = (1 + rng() % 100000) * 512;  // collisions in the low bits are common
      if (oracle.count(key) != 0) continue;
      Block* value = &blocks[rng() % blocks.size()];
      map.insert(key, value);
      oracle.emplace(key, value);
      keys.push_back(key);
    } else if (op == 1 && !keys.empty()) {
      const std::size_t i = rng() % keys.size();
      ASSERT_TRUE(map.erase(keys[i]));
      oracle.erase(keys[i]);
      keys[i] = keys.back();
      keys.pop_back();
    } else {
      const std::uintptr_t key = (1 + rng() % 100000) * 512;
      const auto it = oracle.find(key);
      ASSERT_EQ(map.find(key), it == oracle.end() ? nullptr : it->second) << step;
    }
    ASSERT_EQ(map.size(), oracle.size());
  }
  std::size_t visited = 0;
  map.for_each([&](std::uintptr_t key, Block* value) {
    ++visited;
    EXPECT_EQ(oracle.at(key), value);
  });
  EXPECT_EQ(visited, oracle.size());
  EXPECT_FALSE(map.erase(3 * 512 * 100001));
}

}  // namespace
}  // namespace cistern::detail
