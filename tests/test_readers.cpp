// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Every reader on the real traces of ../shared/traces: the figures of its README to the byte,
// the cistern format's exact round trip, and reading speed. The other test_read_*.cpp files
// cover each format's rules and malformed input with small hand-made files.
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "support/reference_figures.hpp"
#include "support/trace_sizes.hpp"
#include "trace/native.hpp"
#include "trace/readers.hpp"
#include "trace_test_util.hpp"

namespace {

namespace trace = cistern::trace;
using cistern::testing::expect_same_trace;

using cistern::testing::reference_figures;
using Figures = cistern::testing::ReferenceFigures;

bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(undefined_behavior_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

class RealTraces : public ::testing::TestWithParam<Figures> {
 protected:
  void SetUp() override {
    const std::string shared = cistern::testing::shared_dir();
    if (!cistern::testing::traces_available(shared)) {
      GTEST_SKIP() << "no shared traces at " << shared << "/traces";
    }
    path_ = (std::filesystem::path(shared) / "traces" / GetParam().path).string();
  }
  std::string path_;
};

std::uint64_t live_before_bytes(const trace::Trace& trace) {
  std::uint64_t total = 0;
  for (const trace::LiveBlock& block : trace.live_before) total += block.size;
  return total;
}

TEST_P(RealTraces, MatchReferenceFigures) {
  const Figures& expected = GetParam();
  // Wall time for the report; processor time for the limit, so that a loaded machine (CI
  // runners, parallel ctest) does not fail the test.
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t start_cpu = std::clock();
  const trace::Trace trace = trace::read_trace(path_);
  const double cpu_seconds = static_cast<double>(std::clock() - start_cpu) / CLOCKS_PER_SEC;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  EXPECT_EQ(trace.format, expected.format);
  EXPECT_EQ(trace.device, expected.device);
  EXPECT_EQ(trace.allocations(), expected.allocations);
  EXPECT_EQ(live_before_bytes(trace), expected.live_before);
  EXPECT_EQ(trace.peak_live(), expected.peak_live);
  if (expected.peak_reserved) {
    EXPECT_EQ(trace.recorded.peak_reserved, expected.peak_reserved);
  } else {
    EXPECT_FALSE(trace.recorded.peak_reserved.has_value());
  }
  EXPECT_NO_THROW(trace.check());
  std::cout << "[figures] " << expected.path << ": allocations " << trace.allocations()
            << ", live before " << live_before_bytes(trace) << ", peak_live " << trace.peak_live()
            << ", recorded peak reserved "
            << (trace.recorded.peak_reserved ? std::to_string(*trace.recorded.peak_reserved) : "-")
            << ", read in " << seconds * 1e3 << " ms (" << cpu_seconds * 1e3 << " ms of CPU)\n";
  if (!sanitized()) {
    EXPECT_LT(cpu_seconds, 1.0) << "reading must take well under a second";
  }
}

TEST_P(RealTraces, NativeRoundTripIsExact) {
  const trace::Trace original = trace::read_trace(path_);
  std::ostringstream text;
  trace::write_native(text, original);
  const trace::Trace copy = trace::read_trace_bytes(text.str(), "copy.trace");
  EXPECT_EQ(copy.source, "copy.trace");
  expect_same_trace(original, copy);

  // And through a gzipped file, recognised by content.
  const cistern::testing::ScratchDir dir;
  const std::string path = dir.path("copy.trace.gz");
  trace::write_native_file(path, original);
  expect_same_trace(original, trace::read_trace(path));
}

TEST_P(RealTraces, ListsTheirDevice) {
  EXPECT_EQ(trace::list_devices(path_), std::vector<int>{GetParam().device});
}

std::string test_name(const ::testing::TestParamInfo<Figures>& info) {
  return cistern::testing::identifier(info.param.path);
}

INSTANTIATE_TEST_SUITE_P(SharedTraces, RealTraces, ::testing::ValuesIn(reference_figures()),
                         test_name);

// The Kineto figures the issue states beside the README's.
TEST(KinetoTrace, PyTorchCountersAreReproduced) {
  const std::string shared = cistern::testing::shared_dir();
  if (!cistern::testing::traces_available(shared))
    GTEST_SKIP() << "no shared traces at " << shared << "/traces";
  const trace::Trace trace = trace::read_trace(shared + "/traces/kineto/df_index_resolver.json.gz");
  // Total Reserved never moved: the run was at its high-water mark before the window.
  EXPECT_EQ(trace.recorded.initial_reserved, 12782141440U);
  ASSERT_EQ(trace.recorded.reserved_samples.size(), 1U);
  EXPECT_EQ(trace.recorded.reserved_samples[0],
            (std::pair<std::size_t, std::uint64_t>{0, 12782141440U}));
  EXPECT_EQ(trace.streams, std::vector<std::uint64_t>{0});
  EXPECT_EQ(trace.events.size(), 2 * 13385U);
}

// The recorded state before the window: segments and their reserved bytes.
TEST(PyTorchSnapshot, WarmStartStateIsRebuilt) {
  const std::string shared = cistern::testing::shared_dir();
  if (!cistern::testing::traces_available(shared))
    GTEST_SKIP() << "no shared traces at " << shared << "/traces";
  const std::string base = shared + "/traces/pytorch/";
  const trace::Trace decomfl = trace::read_trace(base + "DeComFL/memory.pickle.gz");
  // The window opened on an empty device: every one of its 61 segments was allocated in it.
  EXPECT_TRUE(decomfl.recorded.initial_segments.empty());
  EXPECT_EQ(decomfl.recorded.initial_reserved, 0U);
  EXPECT_EQ(decomfl.recorded.segment_events.size(), 61U);
  EXPECT_TRUE(decomfl.recorded.deferred_frees.empty());  // single stream: completions at once

  const trace::Trace ctx512 =
      trace::read_trace(base + "cs336_Wedsonlin/medium_ctx512_training.pickle.gz");
  EXPECT_EQ(ctx512.recorded.initial_segments.size(), 399U);
  EXPECT_EQ(ctx512.recorded.initial_reserved, 12593397760U);
  ASSERT_EQ(ctx512.recorded.segment_events.size(), 1U);
  EXPECT_EQ(ctx512.recorded.segment_events[0].size, 67108864U);
  bool has_default_settings = false;
  for (const auto& [key, value] : ctx512.recorded.settings) {
    if (key == "expandable_segments") has_default_settings = value == "False";
  }
  EXPECT_TRUE(has_default_settings);
  // Live blocks come with their recorded addresses, in address order, ids 0..L-1.
  ASSERT_FALSE(ctx512.live_before.empty());
  for (std::size_t i = 0; i < ctx512.live_before.size(); ++i) {
    EXPECT_EQ(ctx512.live_before[i].id, i);
    EXPECT_NE(ctx512.live_before[i].addr, 0U);
  }
}

}  // namespace
