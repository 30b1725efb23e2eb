// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern advise`'s search (replay/advise.hpp): the values it draws from a trace, the
// combinations it tries (expandable segments among them), that it finds the configuration that
// a hand-worked example says is best, with that example's figures, and that cistern's own figure
// is a replay of cistern's defaults.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "replay/advise.hpp"
#include "trace/trace.hpp"

namespace cistern::replay {
namespace {

constexpr std::uint64_t MiB = std::uint64_t{1} << 20;

/// A trace of allocations and frees in the order given: a positive size allocates the next id,
/// a negative number frees that id minus one (-1 frees id 0).
trace::Trace make_trace(const std::vector<std::int64_t>& steps) {
  trace::Trace t;
  t.source = "advise-test";
  t.format = "lifetimes";
  std::vector<std::uint64_t> sizes;
  for (const std::int64_t step : steps) {
    trace::Event e;
    e.time = static_cast<std::int64_t>(t.events.size());
    if (step > 0) {
      e.op = trace::Op::alloc;
      e.id = sizes.size();
      e.size = static_cast<std::uint64_t>(step);
      sizes.push_back(e.size);
    } else {
      e.op = trace::Op::free;
      e.id = static_cast<std::uint64_t>(-step - 1);
      e.size = sizes.at(e.id);
    }
    t.events.push_back(e);
  }
  t.check();
  return t;
}

std::int64_t mib(double m) { return static_cast<std::int64_t>(m * static_cast<double>(MiB)); }

const AdviceCandidate* find(const Advice& advice, const std::string& config) {
  for (const AdviceCandidate& c : advice.candidates) {
    if (c.config == config) return &c;
  }
  return nullptr;
}

/// cistern's figure in `advice` is what a replay of cistern's defaults finds on its own.
void expect_cistern_is_its_replay(const trace::Trace& t, const Advice& advice,
                                  const AdviseOptions& options) {
  EXPECT_TRUE(advice.cistern.error.empty()) << advice.cistern.error;
  EXPECT_EQ(advice.cistern.config, "");
  EXPECT_EQ(advice.cistern.min_capacity, min_capacity(t, Policy::parse("cistern"), options.replay));
  EXPECT_GT(advice.cistern.min_capacity, 0u);
}

TEST(Advise, SplitValuesComeFromTheTracesLargeSizes) {
  const trace::Trace t = make_trace({mib(1), mib(25), mib(25.5), mib(30), mib(100), mib(19.5)});
  EXPECT_EQ(max_split_values(t, 8), (std::vector<std::uint64_t>{25, 26, 30, 100}));
  EXPECT_EQ(max_split_values(t, 2), (std::vector<std::uint64_t>{25, 100}));
  EXPECT_TRUE(max_split_values(make_trace({mib(1), mib(19)}), 8).empty());
}

TEST(Advise, DivisionListsSitAtTheByteMedian) {
  // Bytes: 3 x 1 MiB, 1 x 40 MiB: the byte-weighted median is 40 MiB, in [32, 64) MiB.
  const trace::Trace t = make_trace({mib(1), mib(1), mib(1), mib(40)});
  EXPECT_EQ(division_lists(t, 4),
            (std::vector<std::string>{
                "roundup_power2_divisions:[32:1,>:4]", "roundup_power2_divisions:[32:4,>:1]",
                "roundup_power2_divisions:[64:1,>:4]", "roundup_power2_divisions:[64:4,>:1]"}));
  EXPECT_TRUE(division_lists(t, 1).empty());
}

TEST(Advise, CombinationsPairExpandableSegmentsWithRoundingOnly) {
  const std::string split = "max_split_size_mb:95";
  const std::string r4 = "roundup_power2_divisions:4";
  const std::string r8 = "roundup_power2_divisions:8";
  const std::string list = "roundup_power2_divisions:[32:1,>:4]";
  const std::string gc = "garbage_collection_threshold:0.6,per_process_memory_fraction:0.99";
  const std::string es = "expandable_segments:True";
  EXPECT_EQ(combine_options({split}, {r4}, {gc}, {r4, r8, list}),
            (std::vector<std::string>{"", gc, r4, r4 + "," + gc, split, split + "," + gc,
                                      split + "," + r4, split + "," + r4 + "," + gc,
                                      // Expandable segments alone and with every rounding; never
                                      // with the split threshold or garbage collection.
                                      es, r4 + "," + es, r8 + "," + es, list + "," + es}));
  // Nothing to combine: the defaults and expandable segments alone.
  EXPECT_EQ(combine_options({}, {}, {}, {}), (std::vector<std::string>{"", es}));
}

// A 100 MiB segment is cached; a 12 MiB block splits it and stays live, so a 95 MiB request
// needs a segment of its own: 100 + 96 = 196 MiB under PyTorch's defaults, and no release can
// help. With max_split_size_mb:95 the 12 MiB request may not split the 100 MiB block: on a
// large device it gets a 12 MiB segment and the 95 MiB request takes the whole 100 MiB block
// (2 cudaMalloc calls); on a device of 108 MiB its miss first releases the cached 100 MiB
// segment, and the 95 MiB request then gets 96 MiB: 12 + 96 = 108 MiB.
TEST(Advise, FindsTheSplitThresholdThatAvoidsPinnedSegments) {
  const trace::Trace t = make_trace({mib(100), -1, mib(12), mib(95), -3, -2});
  AdviseOptions options;
  options.threads = 2;
  std::size_t calls = 0;
  const Advice advice = advise(t, options, [&](std::size_t done, std::size_t total) {
    EXPECT_LE(done, total);
    ++calls;
  });
  EXPECT_GT(calls, 0u);
  EXPECT_EQ(advice.baseline.config, "");
  EXPECT_EQ(advice.baseline.min_capacity, 196 * MiB);
  EXPECT_EQ(advice.defaults.min_capacity, 196 * MiB);
  ASSERT_FALSE(advice.candidates.empty());
  EXPECT_EQ(advice.candidates.front().config, "max_split_size_mb:95");
  EXPECT_EQ(advice.candidates.front().min_capacity, 108 * MiB);
  EXPECT_EQ(advice.candidates.front().device_allocs, 2u);
  for (std::size_t i = 1; i < advice.candidates.size(); ++i) {
    EXPECT_LE(advice.candidates[i - 1].min_capacity, advice.candidates[i].min_capacity);
  }
  // Stage 3 combined the best split value with rounding; every configuration is tried once.
  bool combined = false;
  for (const AdviceCandidate& c : advice.candidates) {
    combined |= c.config.find("max_split_size_mb:95,roundup_power2_divisions") == 0;
    EXPECT_TRUE(c.error.empty());
  }
  EXPECT_TRUE(combined);
  // Expandable segments place the 95 MiB block right after the 12 MiB one, across 20 MiB
  // pages: 107 MiB of blocks in 6 pages, 120 MiB.
  const auto expandable =
      std::find_if(advice.candidates.begin(), advice.candidates.end(),
                   [](const AdviceCandidate& c) { return c.config == "expandable_segments:True"; });
  ASSERT_NE(expandable, advice.candidates.end());
  EXPECT_EQ(expandable->min_capacity, 120 * MiB);
  EXPECT_EQ(expandable->device_allocs, 0u);
  EXPECT_GT(expandable->device_maps, 0u);
  // Expandable segments were also tried with each rounding, and never with a split threshold
  // or garbage collection.
  for (const unsigned d : {2, 4, 8, 16}) {
    const std::string config =
        "roundup_power2_divisions:" + std::to_string(d) + ",expandable_segments:True";
    EXPECT_NE(find(advice, config), nullptr) << config;
  }
  for (const AdviceCandidate& c : advice.candidates) {
    if (c.config.find("expandable_segments:True") == std::string::npos) continue;
    EXPECT_EQ(c.config.find("max_split_size_mb"), std::string::npos) << c.config;
    EXPECT_EQ(c.config.find("garbage_collection_threshold"), std::string::npos) << c.config;
  }
  expect_cistern_is_its_replay(t, advice, options);
}

// Two 14 MiB segments are freed, then two 12 MiB blocks split them (2 MiB left in each) and a
// 6 MiB request gets a 20 MiB segment of its own: 14 + 14 + 20 = 48 MiB under PyTorch's
// defaults, none of it releasable. No split threshold (at least 20 MiB, above every request)
// helps, nor any rounding: 12, 14 and 6 MiB stay whole, or 14 becomes 16 and leaves 4 MiB holes,
// still too small. Expandable segments put 14 + 14 MiB side by side in two 20 MiB pages; freed,
// they merge into one 40 MiB free range that holds 12 + 12 + 6 MiB: 40 MiB, the best
// configuration.
TEST(Advise, ExpandableSegmentsWinWhereFreedSegmentsMerge) {
  const trace::Trace t =
      make_trace({mib(14), mib(14), -1, -2, mib(12), mib(12), mib(6), -3, -4, -5});
  AdviseOptions options;
  options.threads = 2;
  const Advice advice = advise(t, options);
  EXPECT_EQ(advice.defaults.min_capacity, 48 * MiB);
  ASSERT_FALSE(advice.candidates.empty());
  EXPECT_EQ(advice.candidates.front().config, "expandable_segments:True");
  EXPECT_EQ(advice.candidates.front().min_capacity, 40 * MiB);
  EXPECT_EQ(advice.candidates.front().device_allocs, 0u);
  EXPECT_EQ(advice.candidates.front().device_maps, 2u);
  // Without expandable segments nothing needs less than the defaults (a memory fraction or
  // 14 -> 16 MiB rounding needs more); with them every rounding fits in the same two pages.
  for (const AdviceCandidate& c : advice.candidates) {
    if (c.config.find("expandable_segments:True") == std::string::npos) {
      EXPECT_GE(c.min_capacity, 48 * MiB) << c.config;
    } else {
      EXPECT_EQ(c.min_capacity, 40 * MiB) << c.config;
    }
  }
  expect_cistern_is_its_replay(t, advice, options);
}

// The trace of FindsTheSplitThresholdThatAvoidsPinnedSegments: 10 configurations in stage 1 (the
// defaults, max_split_size_mb 95 and 100, 4 roundings, 2 gc settings, expandable segments), 4
// lists in stage 2 (around the 95 MiB byte median: keys 64 and 128), in stage 3 the 3 x 4 x 2
// combinations of (2 splits, 3 roundings, 1 gc setting, or unset) less the 7 tried alone, and
// the 8 roundings with expandable segments, then cistern: 10 + 4 + 17 + 8 + 1 = 40 replays.
TEST(Advise, ProgressHasAKnownTotalFromTheFirstReplay) {
  EXPECT_EQ(most_replays(10, 2, 4, 2, 4), 40u);
  EXPECT_EQ(most_replays(8, 0, 4, 2, 4), 8u + 4 + (1 * 4 * 2 - 5) + 8 + 1);
  const trace::Trace t = make_trace({mib(100), -1, mib(12), mib(95), -3, -2});
  AdviseOptions options;
  options.threads = 2;
  std::vector<std::pair<std::size_t, std::size_t>> calls;
  const Advice advice = advise(
      t, options, [&](std::size_t done, std::size_t total) { calls.emplace_back(done, total); });
  ASSERT_FALSE(calls.empty());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, 40u) << "call " << i;
    if (i > 0) EXPECT_GE(calls[i].first, calls[i - 1].first) << "call " << i;
  }
  EXPECT_EQ(calls.back(), std::make_pair(std::size_t{40}, std::size_t{40}));
  // Every configuration could be replayed: the bound was met exactly.
  EXPECT_EQ(advice.candidates.size(), 39u);
}

TEST(Advise, EqualFiguresShareARank) {
  // ExpandableSegmentsWinWhereFreedSegmentsMerge's trace: with expandable segments every rounding
  // fits the same two pages.
  const trace::Trace t =
      make_trace({mib(14), mib(14), -1, -2, mib(12), mib(12), mib(6), -3, -4, -5});
  AdviseOptions options;
  options.threads = 2;
  const Advice advice = advise(t, options);
  ASSERT_FALSE(advice.candidates.empty());
  const auto same = [](const AdviceCandidate& a, const AdviceCandidate& b) {
    return a.min_capacity == b.min_capacity && a.device_allocs == b.device_allocs &&
           a.device_maps == b.device_maps && a.device_ms == b.device_ms;
  };
  EXPECT_EQ(advice.candidates[0].rank, 1u);
  std::size_t shared = 0;
  for (std::size_t i = 1; i < advice.candidates.size(); ++i) {
    const AdviceCandidate& c = advice.candidates[i];
    const bool tie = same(advice.candidates[i - 1], c);
    EXPECT_EQ(c.rank, tie ? advice.candidates[i - 1].rank : i + 1) << c.config;
    shared += tie ? 1 : 0;
  }
  EXPECT_GT(shared, 0u);
  EXPECT_EQ(advice.cistern.rank, 0u);  // cistern is beside the ranking, not in it
}

TEST(Advise, BaselineIsTheTracesOwnSettings) {
  trace::Trace t = make_trace({mib(100), -1, mib(12), mib(95), -3, -2});
  t.recorded.settings = {{"max_split_size", std::to_string(95 * MiB)}};
  const Advice advice = advise(t, AdviseOptions{});
  EXPECT_EQ(advice.baseline.config, "max_split_size_mb:95");
  EXPECT_EQ(advice.baseline.min_capacity, 108 * MiB);
  EXPECT_EQ(advice.defaults.min_capacity, 196 * MiB);
}

}  // namespace
}  // namespace cistern::replay
