// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The planner (src/plan): every placement is verified by an overlap checker written here, apart
// from the planner; small instances against the optimum found by exhaustive search over offsets;
// randomized instances with fixed seeds; the shared lifetime lists and a PyTorch snapshot.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cistern/errors.hpp"
#include "plan/planner.hpp"
#include "plan/problem.hpp"
#include "plan/trace_buffers.hpp"
#include "support/reference_figures.hpp"
#include "support/trace_sizes.hpp"
#include "trace/readers.hpp"

namespace {

using cistern::plan::Buffer;
using cistern::plan::Options;
using cistern::plan::Placement;

bool live_together(const Buffer& a, const Buffer& b) {
  return a.lower < b.upper && b.lower < a.upper;
}

std::uint64_t rounded(std::uint64_t size, std::uint64_t alignment) {
  return (size + alignment - 1) / alignment * alignment;
}

/// The independent checker: every pair live at the same time is disjoint in the arena, every
/// offset aligned, and the arena is what the offsets reach. Quadratic on purpose: simple.
void expect_valid(const std::vector<Buffer>& buffers, const Placement& p,
                  std::uint64_t alignment = 1) {
  ASSERT_EQ(p.offsets.size(), buffers.size());
  std::uint64_t arena = 0;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    ASSERT_EQ(p.offsets[i] % alignment, 0u) << "buffer " << i;
    arena = std::max(arena, p.offsets[i] + rounded(buffers[i].size, alignment));
    for (std::size_t j = i + 1; j < buffers.size(); ++j) {
      if (!live_together(buffers[i], buffers[j])) continue;
      const bool apart = p.offsets[i] + buffers[i].size <= p.offsets[j] ||
                         p.offsets[j] + buffers[j].size <= p.offsets[i];
      ASSERT_TRUE(apart) << "buffers " << i << " and " << j << " overlap at offsets "
                         << p.offsets[i] << " and " << p.offsets[j];
    }
  }
  EXPECT_EQ(p.arena, arena);
  EXPECT_GE(p.arena, p.peak_live);
  EXPECT_LE(p.arena, p.greedy_arena);
}

/// The optimum by exhaustive search over every offset below the bound (tiny instances only).
class Exhaustive {
 public:
  explicit Exhaustive(const std::vector<Buffer>& buffers) : b_(buffers), at_(buffers.size()) {}

  std::uint64_t optimum(std::uint64_t upper_bound) {
    best_ = upper_bound;
    place(0);
    return best_;
  }

 private:
  void place(std::size_t i) {
    if (i == b_.size()) {
      std::uint64_t arena = 0;
      for (std::size_t j = 0; j < b_.size(); ++j) arena = std::max(arena, at_[j] + b_[j].size);
      best_ = std::min(best_, arena);
      return;
    }
    for (std::uint64_t offset = 0; offset + b_[i].size < best_; ++offset) {
      bool fits = true;
      for (std::size_t j = 0; j < i && fits; ++j) {
        fits = !live_together(b_[i], b_[j]) || offset + b_[i].size <= at_[j] ||
               at_[j] + b_[j].size <= offset;
      }
      if (!fits) continue;
      at_[i] = offset;
      place(i + 1);
    }
  }

  const std::vector<Buffer>& b_;
  std::vector<std::uint64_t> at_;
  std::uint64_t best_ = 0;
};

std::vector<Buffer> random_buffers(std::mt19937_64& rng, std::size_t n, std::uint64_t horizon,
                                   std::uint64_t max_size) {
  std::vector<Buffer> buffers;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t lower = rng() % horizon;
    const std::uint64_t upper = lower + 1 + rng() % (horizon - lower);
    buffers.push_back(Buffer{lower, upper, 1 + rng() % max_size});
  }
  return buffers;
}

TEST(Planner, MinimallocExampleReachesItsCapacity) {
  // minimalloc's example.input.12.csv: capacity 12, met exactly.
  const std::vector<Buffer> buffers = {{0, 3, 4}, {3, 9, 4}, {0, 9, 4}, {9, 21, 4}, {0, 21, 4}};
  const Placement p = cistern::plan::plan(buffers, Options{1, 0});
  expect_valid(buffers, p);
  EXPECT_EQ(p.peak_live, 12u);
  EXPECT_EQ(p.arena, 12u);
  EXPECT_TRUE(p.optimal);
}

TEST(Planner, FindsTheOptimumWhereGreedyBySizeDoesNot) {
  // Largest first puts the 3 at 0 and then nothing pairs up: 3 + 2 + 2 = 7 on top of each other
  // in [1, 3). The optimum stacks 2 over 2 beside the 3 and reaches the peak live of 5.
  const std::vector<Buffer> buffers = {{0, 2, 3}, {1, 3, 2}, {0, 1, 2}, {2, 4, 2}, {3, 4, 3}};
  Exhaustive exhaustive(buffers);
  const Placement p = cistern::plan::plan(buffers, Options{10, 0});
  expect_valid(buffers, p);
  EXPECT_EQ(p.arena, exhaustive.optimum(p.greedy_arena + 1));
  EXPECT_TRUE(p.optimal);
  EXPECT_EQ(p.greedy_arena, 7u);
  EXPECT_EQ(p.arena, 5u);
}

TEST(Planner, EqualsTheExhaustiveOptimumOnSmallRandomInstances) {
  std::mt19937_64 rng(20261203);
  int improved = 0;
  for (int round = 0; round < 60; ++round) {
    const std::vector<Buffer> buffers = random_buffers(rng, 6, 8, 5);
    const Placement p = cistern::plan::plan(buffers, Options{10, 0});
    SCOPED_TRACE(round);
    expect_valid(buffers, p);
    Exhaustive exhaustive(buffers);
    EXPECT_EQ(p.arena, exhaustive.optimum(p.greedy_arena + 1));
    EXPECT_TRUE(p.optimal);
    improved += p.arena < p.greedy_arena ? 1 : 0;
  }
  EXPECT_GT(improved, 0) << "the search never did better than greedy: the test shows nothing";
}

TEST(Planner, TheSearchAtACapacityIsCompleteAndSound) {
  // The decision search behind the planner, asked for every capacity from the peak live up to
  // the exhaustive optimum: below the optimum it must prove that nothing fits (an exhausted
  // search), at the optimum it must find a valid placement within it.
  std::mt19937_64 rng(424242);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  for (int round = 0; round < 40; ++round) {
    SCOPED_TRACE(round);
    const std::vector<Buffer> buffers = random_buffers(rng, 6, 8, 5);
    const cistern::plan::detail::Problem problem = cistern::plan::detail::normalise(buffers, 1);
    const Placement greedy = cistern::plan::plan(buffers, Options{0, 0});
    const std::uint64_t optimum = Exhaustive(buffers).optimum(greedy.greedy_arena + 1);
    // Below the peak live as well: one step under it must be refused too.
    for (std::uint64_t capacity = cistern::plan::peak_live(buffers) - 1; capacity <= optimum;
         ++capacity) {
      std::vector<std::uint64_t> found;
      const cistern::plan::detail::SearchOutcome outcome = cistern::plan::detail::search(
          problem, capacity, {deadline, 0},
          [&](const std::vector<std::uint64_t>& offsets, std::uint64_t) { found = offsets; });
      if (capacity < optimum) {
        EXPECT_TRUE(outcome.exhausted) << "capacity " << capacity;
        EXPECT_TRUE(found.empty()) << "capacity " << capacity;
      } else {
        ASSERT_FALSE(found.empty()) << "nothing found at the optimum " << optimum;
        Placement p;
        p.offsets = found;
        p.arena = cistern::plan::detail::arena_of(problem, found);
        p.peak_live = greedy.peak_live;
        p.greedy_arena = greedy.greedy_arena;
        EXPECT_LE(p.arena, capacity);
        expect_valid(buffers, p);
      }
    }
  }
}

TEST(Planner, RandomizedInstancesAreValidAndDeterministic) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 8; ++round) {
    const std::vector<Buffer> buffers = random_buffers(rng, 300, 400, 1 << 20);
    Options options{60, 3000};  // the node limit decides: the same result everywhere
    const Placement a = cistern::plan::plan(buffers, options);
    const Placement b = cistern::plan::plan(buffers, options);
    SCOPED_TRACE(round);
    expect_valid(buffers, a);
    EXPECT_EQ(a.offsets, b.offsets);
    EXPECT_EQ(a.peak_live, cistern::plan::peak_live(buffers));
  }
}

TEST(Planner, AlignsOffsetsAndSizes) {
  std::mt19937_64 rng(11);
  const std::vector<Buffer> buffers = random_buffers(rng, 200, 100, 5000);
  Options options{60, 5000};
  options.alignment = 512;
  const Placement p = cistern::plan::plan(buffers, options);
  expect_valid(buffers, p, 512);
  EXPECT_EQ(p.peak_live, cistern::plan::peak_live(buffers, 512));
  EXPECT_EQ(p.arena % 512, 0u);
}

TEST(Planner, PageModeTouchesNoMorePagesThanTheBytePlan) {
  constexpr std::uint64_t page = 2 << 20;
  std::mt19937_64 rng(13);
  const std::vector<Buffer> buffers = random_buffers(rng, 150, 100, 5 << 20);
  Options bytes{60, 5000};
  Options pages = bytes;
  pages.page_size = page;
  const Placement by_bytes = cistern::plan::plan(buffers, bytes);
  const Placement by_pages = cistern::plan::plan(buffers, pages);
  expect_valid(buffers, by_pages);
  EXPECT_EQ(by_pages.peak_pages, cistern::plan::peak_pages(buffers, by_pages.offsets, page));
  EXPECT_LE(by_pages.peak_pages, cistern::plan::peak_pages(buffers, by_bytes.offsets, page));
  EXPECT_GE(by_pages.peak_pages * page, by_pages.peak_live);
}

TEST(Planner, PeakPagesCountsPagesTouchedAtOnce) {
  constexpr std::uint64_t page = 4096;
  // Two buffers live together, one straddling a page boundary: pages 0 and 1, then page 2 alone.
  const std::vector<Buffer> buffers = {{0, 2, 100}, {1, 3, 4096}, {3, 4, 10}};
  EXPECT_EQ(cistern::plan::peak_pages(buffers, {0, 4000, 8192}, page), 2u);
  EXPECT_EQ(cistern::plan::peak_pages(buffers, {0, 4096, 0}, page), 2u);
  EXPECT_EQ(cistern::plan::peak_pages(buffers, {0, 8192, 0}, page), 2u);
  EXPECT_EQ(cistern::plan::peak_pages(buffers, {5000, 8192, 0}, page), 2u);
  EXPECT_EQ(cistern::plan::peak_pages(buffers, {0, 100, 0}, page), 2u);
  EXPECT_EQ(cistern::plan::peak_pages(buffers, {0, 0, 0}, page), 1u);
}

TEST(Planner, GreedyOnlyWithoutTimeAndEmptyInput) {
  std::mt19937_64 rng(17);
  const std::vector<Buffer> buffers = random_buffers(rng, 100, 50, 1000);
  const Placement p = cistern::plan::plan(buffers, Options{0, 0});
  expect_valid(buffers, p);
  EXPECT_FALSE(p.searched);
  EXPECT_EQ(p.arena, p.greedy_arena);
  const Placement none = cistern::plan::plan({}, Options{});
  EXPECT_EQ(none.arena, 0u);
  EXPECT_TRUE(none.offsets.empty());
}

TEST(Planner, BadInputIsNamed) {
  const auto message = [](const std::vector<Buffer>& buffers, Options options) {
    try {
      cistern::plan::plan(buffers, options);
    } catch (const cistern::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({{0, 1, 1}, {4, 4, 8}}, Options{}),
            "plan: buffer 1: lifetime [4, 4) is empty (upper must be after lower)");
  EXPECT_EQ(message({{0, 1, 0}}, Options{}), "plan: buffer 0: size 0");
  Options odd;
  odd.alignment = 3;
  EXPECT_EQ(message({{0, 1, 1}}, odd), "plan: alignment 3 is not a power of two");
  Options pages;
  pages.page_size = 1000;
  EXPECT_EQ(message({{0, 1, 1}}, pages),
            "plan: page size 1000 is not a power of two of at least the alignment 1");
}

// ---- the shared traces ------------------------------------------------------------------------

class SharedLists : public ::testing::TestWithParam<cistern::testing::ReferenceFigures> {};

TEST_P(SharedLists, BuffersKeepThePeakLiveAndThePlanIsValid) {
  const std::string root = cistern::testing::shared_dir();
  if (!cistern::testing::traces_available(root)) GTEST_SKIP() << "no shared traces at " << root;
  const auto& figures = GetParam();
  const cistern::trace::Trace trace = cistern::trace::read_trace(root + "/traces/" + figures.path);
  const cistern::plan::TraceBuffers tb = cistern::plan::buffers_of(trace);
  EXPECT_EQ(cistern::plan::peak_live(tb.buffers), figures.peak_live);
  // A short search: each node costs O(n log n) on the large SOMAS lists.
  const Placement p = cistern::plan::plan(tb.buffers, Options{60, 200});
  expect_valid(tb.buffers, p);
  EXPECT_EQ(p.peak_live, figures.peak_live);
}

/// A SOMAS list of the shared traces as buffers (empty when the traces are not there).
std::vector<Buffer> somas_list(const std::string& name) {
  const std::string root = cistern::testing::shared_dir();
  if (!cistern::testing::traces_available(root)) return {};
  return cistern::plan::buffers_of(cistern::trace::read_trace(root + "/traces/somas/" + name))
      .buffers;
}

TEST(SomasLists, TheImprovingSearchReachesTinyBertsLowerBound) {
  // The planner's second strategy, alone: on tiny_bert the search at a capacity finds nothing at
  // the peak live in its share of the budget, this one places every buffer at it.
  const std::vector<Buffer> buffers = somas_list("tiny_bert.csv");
  if (buffers.empty()) GTEST_SKIP() << "no shared traces at " << cistern::testing::shared_dir();
  const cistern::plan::detail::Problem problem = cistern::plan::detail::normalise(buffers, 1);
  const std::uint64_t lower = cistern::plan::detail::peak_live(problem);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  Placement p;
  const cistern::plan::detail::SearchOutcome outcome = cistern::plan::detail::improve(
      problem, lower + 1, lower, {{deadline, 2500}, true},
      [&](const std::vector<std::uint64_t>& offsets, std::uint64_t arena) {
        p.offsets = offsets;
        p.arena = arena;
      });
  EXPECT_LE(outcome.nodes, 2500u);
  ASSERT_EQ(p.arena, lower) << "no placement at the peak live within 2500 nodes";
  p.peak_live = lower;
  p.greedy_arena =
      cistern::plan::detail::arena_of(problem, cistern::plan::detail::greedy_by_size(problem));
  expect_valid(buffers, p);
}

TEST(SomasLists, EveryListWithinTheTargetOfIssue10) {
  // At most 1.005 x peak_live on every SOMAS list, with a node limit (the same everywhere).
  // About 30 s: CISTERN_TEST_FULL=1 only (ctest -L long).
  if (std::getenv("CISTERN_TEST_FULL") == nullptr) GTEST_SKIP() << "CISTERN_TEST_FULL=1 runs it";
  for (const char* name : {"resnet50.csv", "tiny_bert.csv", "bert_base.csv"}) {
    SCOPED_TRACE(name);
    const std::vector<Buffer> buffers = somas_list(name);
    if (buffers.empty()) GTEST_SKIP() << "no shared traces at " << cistern::testing::shared_dir();
    const Placement p = cistern::plan::plan(buffers, Options{600, 12000});
    expect_valid(buffers, p);
    EXPECT_LE(static_cast<double>(p.arena), 1.005 * static_cast<double>(p.peak_live));
  }
}

std::vector<cistern::testing::ReferenceFigures> lifetime_lists() {
  std::vector<cistern::testing::ReferenceFigures> lists;
  for (const auto& f : cistern::testing::reference_figures()) {
    if (std::string(f.format) == "lifetimes") lists.push_back(f);
  }
  return lists;
}

std::string list_name(
    const ::testing::TestParamInfo<cistern::testing::ReferenceFigures>& param_info) {
  return cistern::testing::identifier(param_info.param.path);
}

INSTANTIATE_TEST_SUITE_P(Lifetimes, SharedLists, ::testing::ValuesIn(lifetime_lists()), list_name);

}  // namespace
