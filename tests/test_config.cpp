// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The options table: every key, PyTorch's syntax and examples, errors that name the key, the
// environment, and the round trip Config -> to_string() -> parse() over many configurations.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <set>
#include <string>

#include "cistern/config.hpp"
#include "cistern/errors.hpp"
#include "cistern/types.hpp"

namespace cistern {
namespace {

using Divisions = std::array<std::uint32_t, kRoundupIntervals>;

/// The ConfigError thrown by `action`; fails the test when there is none.
template <class Action>
ConfigError config_error(Action action) {
  try {
    action();
  } catch (const ConfigError& error) {
    return error;
  }
  ADD_FAILURE() << "no ConfigError";
  return ConfigError("", "");
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// Expects `text` to be rejected by Config::parse with an error about `key`.
void expect_rejected(const std::string& text, const std::string& key) {
  const ConfigError error = config_error([&] { Config::parse(text); });
  EXPECT_EQ(error.key(), key) << text << " -> " << error.what();
}

// --- defaults ------------------------------------------------------------------------------------

TEST(ConfigDefaults, FollowPyTorch) {
  const Config c;
  EXPECT_EQ(c.max_split_size, SIZE_MAX);
  EXPECT_EQ(c.max_non_split_rounding, 20 * MiB);
  EXPECT_EQ(c.roundup_power2_divisions, Divisions{});
  EXPECT_EQ(c.large_segment_size, 20 * MiB);
  EXPECT_EQ(c.min_block_size, 512u);
  EXPECT_EQ(c.small_size, 1 * MiB);
  EXPECT_EQ(c.small_segment_size, 2 * MiB);
  EXPECT_EQ(c.min_large_alloc, 10 * MiB);
  EXPECT_EQ(c.round_large, 2 * MiB);
  EXPECT_EQ(c.memory_fraction, 1.0);
  EXPECT_EQ(c.memory_limit, 0u);
  EXPECT_EQ(c.garbage_collection_threshold, 0.0);
  EXPECT_FALSE(c.expandable_segments);
  EXPECT_TRUE(c.cross_stream_reuse);
  EXPECT_FALSE(c.pass_through);
  EXPECT_FALSE(c.release_lock_on_cudamalloc);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.to_string(), "");
}

TEST(ConfigDefaults, EmptyAndBlankStringsGiveDefaults) {
  EXPECT_EQ(Config::parse(""), Config());
  EXPECT_EQ(Config::parse("   "), Config());
  EXPECT_EQ(Config::parse(","), Config());
}

// --- every key -----------------------------------------------------------------------------------

TEST(ConfigKeys, SizeKeysAreMiB) {
  const Config c = Config::parse(
      "max_split_size_mb:512,max_non_split_rounding_mb:1024,large_segment_size_mb:32,"
      "memory_limit_mb:40960");
  EXPECT_EQ(c.max_split_size, 512 * MiB);
  EXPECT_EQ(c.max_non_split_rounding, 1024 * MiB);
  EXPECT_EQ(c.large_segment_size, 32 * MiB);
  EXPECT_EQ(c.memory_limit, 40 * GiB);
  EXPECT_EQ(Config::parse("max_split_size_mb:unlimited").max_split_size, SIZE_MAX);
  EXPECT_EQ(Config::parse("max_split_size_mb:20").max_split_size, 20 * MiB);
  EXPECT_EQ(Config::parse("memory_limit_mb:0").memory_limit, 0u);
  EXPECT_EQ(Config::parse("memory_limit_mb:0.5").memory_limit, 512 * KiB);
}

TEST(ConfigKeys, HandleSizesAreMiBAndTheLargestMayBeAuto) {
  const Config c =
      Config::parse("small_handle_size_mb:4,large_handle_size_mb:64,max_handle_size_mb:512");
  EXPECT_EQ(c.small_handle_size, 4 * MiB);
  EXPECT_EQ(c.large_handle_size, 64 * MiB);
  EXPECT_EQ(c.max_handle_size, 512 * MiB);
  EXPECT_EQ(Config::parse("max_handle_size_mb:auto").max_handle_size, 0u);
  EXPECT_EQ(Config().max_handle_size, 0u);
  EXPECT_EQ(Config::parse("max_handle_size_mb:64").to_string(), "max_handle_size_mb:64");
  EXPECT_THROW(Config::parse("max_handle_size_mb:0"), InvalidArgument);
  EXPECT_THROW(Config::parse("max_handle_size_mb:big"), InvalidArgument);
}

TEST(ConfigKeys, FractionKeys) {
  EXPECT_EQ(Config::parse("garbage_collection_threshold:0.6").garbage_collection_threshold, 0.6);
  EXPECT_EQ(Config::parse("garbage_collection_threshold:0").garbage_collection_threshold, 0.0);
  EXPECT_EQ(Config::parse("per_process_memory_fraction:0.25").memory_fraction, 0.25);
  EXPECT_EQ(Config::parse("per_process_memory_fraction:1").memory_fraction, 1.0);
  EXPECT_EQ(Config::parse("per_process_memory_fraction:5e-1").memory_fraction, 0.5);
}

TEST(ConfigKeys, BooleanKeys) {
  const Config c = Config::parse(
      "expandable_segments:True,cross_stream_reuse:False,pass_through:True,"
      "release_lock_on_cudamalloc:True");
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_FALSE(c.cross_stream_reuse);
  EXPECT_TRUE(c.pass_through);
  EXPECT_TRUE(c.release_lock_on_cudamalloc);
}

TEST(ConfigKeys, BooleanSpellings) {
  for (const char* yes : {"True", "true", "1"}) {
    EXPECT_TRUE(Config::parse(std::string("expandable_segments:") + yes).expandable_segments);
  }
  for (const char* no : {"False", "false", "0"}) {
    EXPECT_FALSE(Config::parse(std::string("cross_stream_reuse:") + no).cross_stream_reuse);
  }
  for (const char* bad : {"TRUE", "yes", "on", "2", "Tru"}) {
    expect_rejected(std::string("expandable_segments:") + bad, "expandable_segments");
  }
}

TEST(ConfigKeys, CompatibilityNoOpsAreAcceptedAndIgnored) {
  const Config c = Config::parse(
      "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,"
      "pinned_use_background_threads:True,graph_capture_record_stream_reuse:True,"
      "backend:native");
  EXPECT_EQ(c, Config());
  EXPECT_EQ(c.to_string(), "");
  expect_rejected("pinned_num_register_threads:3", "pinned_num_register_threads");
  expect_rejected("pinned_num_register_threads:256", "pinned_num_register_threads");
  expect_rejected("pinned_use_background_threads:maybe", "pinned_use_background_threads");
  expect_rejected("backend:magic", "backend");
}

TEST(ConfigKeys, CudaMallocAsyncBackendIsRejectedWithAReason) {
  const ConfigError error = config_error([] { Config::parse("backend:cudaMallocAsync"); });
  EXPECT_EQ(error.key(), "backend");
  EXPECT_TRUE(contains(error.what(), "cistern replaces the cudaMallocAsync backend"))
      << error.what();
}

// --- roundup_power2_divisions --------------------------------------------------------------------

Divisions divisions_of(const std::string& value) {
  return Config::parse("roundup_power2_divisions:" + value).roundup_power2_divisions;
}

TEST(ConfigRoundup, SingleValueFillsAllSixteenIntervals) {
  Divisions fours;
  fours.fill(4);
  EXPECT_EQ(divisions_of("4"), fours);
  Divisions ones;
  ones.fill(1);
  EXPECT_EQ(divisions_of("1"), ones);
  EXPECT_EQ(divisions_of("0"), Divisions{});
}

TEST(ConfigRoundup, PyTorchTestExample) {
  // c10/test/core/AllocatorConfig_test.cpp: key K covers [K, 2K) MB, i.e. entry log2(K).
  const Divisions d = divisions_of("[128:8,256:16,512:1,2048:8,>:2]");
  const Divisions expected = {8,  8, 8, 8, 8, 8, 8, 8,  // 1..128 MB: first key copied downward
                              16, 1,                    // 256 MB, 512 MB
                              0,                        // 1024 MB: skipped, stays 0
                              8,                        // 2048 MB
                              2,  2, 2, 2};             // '>' after the last key
  EXPECT_EQ(d, expected);
  EXPECT_EQ(d[10], 0u);  // divisions(1024 MB) = 0
}

TEST(ConfigRoundup, DocsStyleExample) {
  const Divisions expected = {8, 8, 8, 8, 8, 8, 8,  // 1..64 MB
                              2, 4,                 // 128 MB, 256 MB
                              1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(divisions_of("[64:8,128:2,256:4,>:1]"), expected);
}

/// Divisions with `value` in every entry from `first` to `last`, 0 elsewhere.
Divisions run(int first, int last, std::uint32_t value) {
  Divisions d{};
  for (int i = first; i <= last; ++i) d[i] = value;
  return d;
}

TEST(ConfigRoundup, KeyEdgeCases) {
  EXPECT_EQ(divisions_of("[1:4]"), run(0, 0, 4));       // 1 MB is entry 0
  EXPECT_EQ(divisions_of("[32768:8]"), run(0, 15, 8));  // 2^15 MB is entry 15, copied downward
  Divisions clamped = run(0, 0, 2);
  clamped[15] = 8;
  EXPECT_EQ(divisions_of("[1:2,1048576:8]"), clamped);  // keys above 2^15 MB share entry 15
  EXPECT_EQ(divisions_of("[>:4]"), run(0, 15, 4));      // '>' with no key covers everything
  Divisions rest_after_key = run(0, 15, 4);
  rest_after_key[0] = rest_after_key[1] = 8;
  EXPECT_EQ(divisions_of("[>:4,2:8]"), rest_after_key);  // '>' starts after the last key anyway
  EXPECT_EQ(divisions_of("[64:0,>:4]"), run(7, 15, 4));  // an explicit 0 is allowed
  Divisions repeated = run(0, 5, 8);
  repeated[6] = 2;  // a repeated key overrides its entry; only the first key fills downward
  EXPECT_EQ(divisions_of("[64:8,64:2]"), repeated);
}

TEST(ConfigRoundup, RejectsBadValues) {
  const std::string key = "roundup_power2_divisions";
  for (const char* bad : {"3", "-4", "x", "4.0", "[64:3]", "[65:4]", "[0:4]", "[64:8", "[]", "[64]",
                          "[64:8,,>:1]", "[64:8:2]", "[>:3]", "[64:8,>]", "[a:2]"}) {
    expect_rejected(key + ":" + bad, key);
  }
}

TEST(ConfigRoundup, ValidateRejectsNonPowerOfTwoSetInCode) {
  Config c;
  c.roundup_power2_divisions[3] = 6;
  EXPECT_EQ(config_error([&] { c.validate(); }).key(), "roundup_power2_divisions");
}

// --- cross-option rules --------------------------------------------------------------------------

TEST(ConfigRules, MaxSplitSizeAtLeastLargeSegment) {
  const ConfigError error = config_error([] { Config::parse("max_split_size_mb:10"); });
  EXPECT_EQ(error.key(), "max_split_size_mb");
  EXPECT_TRUE(contains(error.what(), "20")) << error.what();
  EXPECT_NO_THROW(Config::parse("max_split_size_mb:20"));
  expect_rejected("large_segment_size_mb:32,max_split_size_mb:20", "max_split_size_mb");
  // Checked after all keys are read, so the order of keys does not matter.
  expect_rejected("max_split_size_mb:20,large_segment_size_mb:32", "max_split_size_mb");
  EXPECT_NO_THROW(Config::parse("max_split_size_mb:32,large_segment_size_mb:32"));
}

TEST(ConfigRules, MaxNonSplitRoundingAtLeastLargeSegment) {
  expect_rejected("max_non_split_rounding_mb:19", "max_non_split_rounding_mb");
  expect_rejected("large_segment_size_mb:64,max_non_split_rounding_mb:32",
                  "max_non_split_rounding_mb");
  EXPECT_NO_THROW(Config::parse("large_segment_size_mb:64,max_non_split_rounding_mb:64"));
  EXPECT_NO_THROW(Config::parse("large_segment_size_mb:12,max_non_split_rounding_mb:12"));
  // As in PyTorch, raising the segment size alone keeps the default tolerance valid.
  EXPECT_NO_THROW(Config::parse("large_segment_size_mb:64"));
  EXPECT_NO_THROW(Config::parse("large_segment_size_mb:64,max_non_split_rounding_mb:20"));
}

TEST(ConfigRules, LargeSegmentAboveTenMiB) {
  expect_rejected("large_segment_size_mb:10", "large_segment_size_mb");
  expect_rejected("large_segment_size_mb:4", "large_segment_size_mb");
  EXPECT_EQ(Config::parse("large_segment_size_mb:11").large_segment_size, 11 * MiB);
}

TEST(ConfigRules, FractionRanges) {
  for (const char* bad : {"1.5", "1", "-0.1", "nan", "inf", "0.5x", "", "half"}) {
    expect_rejected(std::string("garbage_collection_threshold:") + bad,
                    "garbage_collection_threshold");
  }
  for (const char* bad : {"0", "1.01", "-1", "nan", "x"}) {
    expect_rejected(std::string("per_process_memory_fraction:") + bad,
                    "per_process_memory_fraction");
  }
}

TEST(ConfigRules, SizeValuesMustBeNumbers) {
  for (const char* bad : {"-1", "abc", "1e3", "12MiB", "5 12", "0x10", "99999999999999999999"}) {
    expect_rejected(std::string("max_split_size_mb:") + bad, "max_split_size_mb");
    expect_rejected(std::string("memory_limit_mb:") + bad, "memory_limit_mb");
  }
}

TEST(ConfigRules, SetChecksTheValueButNotOtherOptions) {
  Config c;
  c.set("large_segment_size_mb", "32");  // max_split rule is for validate(), after every key
  c.set("max_split_size_mb", "24");
  EXPECT_EQ(config_error([&] { c.validate(); }).key(), "max_split_size_mb");
  c.set("max_split_size_mb", "32");
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(config_error([&] { c.set("expandable_segments", "maybe"); }).key(),
            "expandable_segments");
}

TEST(ConfigRules, CodeOnlyFieldsAreValidated) {
  Config c;
  c.min_block_size = 384;
  EXPECT_EQ(config_error([&] { c.validate(); }).key(), "min_block_size");
  c = Config();
  c.small_size = 4 * MiB;
  EXPECT_EQ(config_error([&] { c.validate(); }).key(), "small_size");
  c = Config();
  c.memory_fraction = 0.0;
  EXPECT_EQ(config_error([&] { c.validate(); }).key(), "per_process_memory_fraction");
  c = Config();
  c.garbage_collection_threshold = 1.0;
  EXPECT_EQ(config_error([&] { c.validate(); }).key(), "garbage_collection_threshold");
}

// --- syntax and messages -------------------------------------------------------------------------

TEST(ConfigSyntax, WhitespaceIsIgnored) {
  const Config c = Config::parse(
      "  max_split_size_mb : 512 ,\texpandable_segments : True ,"
      " roundup_power2_divisions : [ 64 : 8 , > : 1 ] ");
  EXPECT_EQ(c.max_split_size, 512 * MiB);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c, Config::parse("max_split_size_mb:512,expandable_segments:True,"
                             "roundup_power2_divisions:[64:8,>:1]"));
}

TEST(ConfigSyntax, EqualsSignAtTopLevel) {
  const Config c = Config::parse(
      "max_split_size_mb=512,expandable_segments=True,"
      "roundup_power2_divisions=[64:8,>:1],pass_through:True");
  EXPECT_EQ(c.max_split_size, 512 * MiB);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_TRUE(c.pass_through);
  EXPECT_EQ(c.roundup_power2_divisions[6], 8u);
  EXPECT_EQ(c.roundup_power2_divisions[7], 1u);
}

TEST(ConfigSyntax, LaterKeysOverride) {
  EXPECT_EQ(Config::parse("max_split_size_mb:64,max_split_size_mb:128").max_split_size, 128 * MiB);
}

TEST(ConfigSyntax, MalformedStringsNameTheKey) {
  expect_rejected("max_split_size_mb", "max_split_size_mb");   // no value
  expect_rejected("max_split_size_mb:", "max_split_size_mb");  // empty value
  expect_rejected("max_split_size_mb:,pass_through:True", "max_split_size_mb");
  expect_rejected("max_split_size_mb:512:3", "max_split_size_mb");  // trailing garbage
  expect_rejected("max_split_size_mb:512]", "max_split_size_mb");
  expect_rejected("roundup_power2_divisions:[64:8", "roundup_power2_divisions");  // unbalanced
  expect_rejected("roundup_power2_divisions:[64:[8]]", "roundup_power2_divisions");
  expect_rejected("roundup_power2_divisions:[64:8]x", "roundup_power2_divisions");
  expect_rejected("roundup_power2_divisions:64:8]", "roundup_power2_divisions");
  expect_rejected("expandable_segments:True False", "expandable_segments");
  expect_rejected(":512", "");  // no key
  expect_rejected("]", "");
  expect_rejected("[64:8]", "");
}

TEST(ConfigSyntax, UnknownKeyIsNamedWithTheKnownKeys) {
  const ConfigError error = config_error([] { Config::parse("max_split_size_mb:64,foo:1"); });
  EXPECT_EQ(error.key(), "foo");
  const std::string message = error.what();
  EXPECT_TRUE(contains(message, "Unrecognized key 'foo'")) << message;
  EXPECT_TRUE(contains(message, "CISTERN_ALLOC_CONF")) << message;
  EXPECT_TRUE(contains(message, "known keys:")) << message;
  EXPECT_TRUE(contains(message, "max_split_size_mb")) << message;
  EXPECT_TRUE(contains(message, "expandable_segments")) << message;
}

TEST(ConfigSyntax, BadValueMessageNamesKeyValueAndExpectation) {
  const ConfigError error = config_error([] { Config::parse("garbage_collection_threshold:1.5"); });
  EXPECT_EQ(error.key(), "garbage_collection_threshold");
  const std::string message = error.what();
  EXPECT_TRUE(contains(message, "'garbage_collection_threshold'")) << message;
  EXPECT_TRUE(contains(message, "'1.5'")) << message;
  EXPECT_TRUE(contains(message, "expected")) << message;
}

TEST(ConfigSyntax, KeysAreCaseSensitiveLikePyTorch) {
  expect_rejected("Max_Split_Size_MB:64", "Max_Split_Size_MB");
}

TEST(ConfigSyntax, FailedApplyLeavesTheConfigUnchanged) {
  Config c = Config::parse("max_split_size_mb:64");
  const Config before = c;
  EXPECT_THROW(c.apply("expandable_segments:True,max_split_size_mb:5"), ConfigError);
  EXPECT_THROW(c.apply("expandable_segments:True,bogus:1"), ConfigError);
  EXPECT_EQ(c, before);
  c.apply("expandable_segments:True");
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.max_split_size, 64 * MiB);  // apply builds on the current values
}

// --- to_string, equality and the round trip ------------------------------------------------------

TEST(ConfigText, ListsOnlyNonDefaultOptionsInTableOrder) {
  Config c;
  c.pass_through = true;
  c.max_split_size = 512 * MiB;
  c.garbage_collection_threshold = 0.8;
  EXPECT_EQ(c.to_string(),
            "max_split_size_mb:512,garbage_collection_threshold:0.8,pass_through:True");
  c = Config();
  c.cross_stream_reuse = false;
  EXPECT_EQ(c.to_string(), "cross_stream_reuse:False");
}

TEST(ConfigText, DivisionListsAreCanonical) {
  const auto text = [](const std::string& value) {
    return Config::parse("roundup_power2_divisions:" + value).to_string();
  };
  EXPECT_EQ(text("4"), "roundup_power2_divisions:4");
  EXPECT_EQ(text("[1:4,>:4]"), "roundup_power2_divisions:4");
  EXPECT_EQ(text("[64:8,128:2,256:4,>:1]"), "roundup_power2_divisions:[64:8,128:2,256:4,>:1]");
  EXPECT_EQ(text("[128:8,256:16,512:1,2048:8,>:2]"),
            "roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]");
  EXPECT_EQ(text("[64:8]"), "roundup_power2_divisions:[64:8]");
  EXPECT_EQ(text("[1:0,4:2,>:2]"), "roundup_power2_divisions:[2:0,>:2]");
}

TEST(ConfigText, SubMiBSizesSetInCodeAreExact) {
  Config c;
  c.max_split_size = 64 * MiB + 512;
  c.memory_limit = 3;
  EXPECT_EQ(c.to_string(),
            "max_split_size_mb:64.00048828125,memory_limit_mb:0.00000286102294921875");
  EXPECT_EQ(Config::parse(c.to_string()), c);
}

TEST(ConfigEquality, EveryFieldCounts) {
  const Config base;
  std::vector<Config> changed(16, base);
  changed[0].max_split_size = 64 * MiB;
  changed[1].max_non_split_rounding = 21 * MiB;
  changed[2].roundup_power2_divisions[9] = 2;
  changed[3].large_segment_size = 20 * MiB + 512;
  changed[4].min_block_size = 1024;
  changed[5].small_size = 512 * KiB;
  changed[6].small_segment_size = 4 * MiB;
  changed[7].min_large_alloc = 8 * MiB;
  changed[8].round_large = 4 * MiB;
  changed[9].memory_fraction = 0.5;
  changed[10].memory_limit = 1;
  changed[11].garbage_collection_threshold = 0.1;
  changed[12].expandable_segments = true;
  changed[13].cross_stream_reuse = false;
  changed[14].pass_through = true;
  changed[15].release_lock_on_cudamalloc = true;
  for (std::size_t i = 0; i < changed.size(); ++i) {
    EXPECT_NE(changed[i], base) << "field " << i;
    EXPECT_EQ(changed[i], changed[i]) << "field " << i;
  }
}

/// A random configuration that passes validate(), reachable through keys (code-only fields stay
/// at their defaults since the string syntax cannot carry them).
Config random_config(std::mt19937_64& rng) {
  const auto chance = [&rng](int percent) {
    return std::uniform_int_distribution<int>(0, 99)(rng) < percent;
  };
  const auto between = [&rng](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  Config c;
  if (chance(50)) c.large_segment_size = between(11, 64) * MiB + (chance(20) ? between(1, MiB) : 0);
  if (chance(60))
    c.max_split_size = c.large_segment_size + between(0, 4096) * MiB + between(0, 3) * 512;
  if (chance(50)) c.max_non_split_rounding = c.large_segment_size + between(0, 2048) * MiB;
  if (chance(60)) {
    const std::uint32_t choices[] = {0, 1, 2, 4, 8, 16, 64, 1u << 31};
    const std::uint64_t pick_from = between(1, 8);  // few distinct values make runs likely
    for (auto& d : c.roundup_power2_divisions) d = choices[between(0, pick_from - 1)];
  }
  if (chance(40)) c.memory_fraction = std::uniform_real_distribution<double>(1e-6, 1.0)(rng);
  if (chance(40))
    c.garbage_collection_threshold = std::uniform_real_distribution<double>(0, 1)(rng);
  if (chance(40)) c.memory_limit = between(0, std::uint64_t{1} << 44);
  c.expandable_segments = chance(50);
  c.cross_stream_reuse = chance(50);
  c.pass_through = chance(50);
  c.release_lock_on_cudamalloc = chance(50);
  return c;
}

TEST(ConfigText, RoundTripsOverManyConfigs) {
  std::mt19937_64 rng(20260517);
  for (int i = 0; i < 5000; ++i) {
    const Config c = random_config(rng);
    ASSERT_NO_THROW(c.validate()) << c.to_string();
    const std::string text = c.to_string();
    Config back;
    ASSERT_NO_THROW(back = Config::parse(text)) << text;
    ASSERT_EQ(back, c) << text;
    // Field by field too, so that a lossy getter cannot hide behind operator==.
    ASSERT_EQ(back.max_split_size, c.max_split_size) << text;
    ASSERT_EQ(back.max_non_split_rounding, c.max_non_split_rounding) << text;
    ASSERT_EQ(back.roundup_power2_divisions, c.roundup_power2_divisions) << text;
    ASSERT_EQ(back.large_segment_size, c.large_segment_size) << text;
    ASSERT_EQ(back.memory_fraction, c.memory_fraction) << text;
    ASSERT_EQ(back.garbage_collection_threshold, c.garbage_collection_threshold) << text;
    ASSERT_EQ(back.memory_limit, c.memory_limit) << text;
    ASSERT_EQ(back.to_string(), text);
  }
}

TEST(ConfigText, RoundTripsEveryDivisionsPatternOfTwoValues) {
  // All 2^16 arrays over {0, 4}, plus the same over {2, 8}: every lead, gap and tail shape.
  for (const auto& [low, high] : {std::pair<std::uint32_t, std::uint32_t>{0, 4}, {2, 8}}) {
    for (std::uint32_t mask = 0; mask < (1u << kRoundupIntervals); ++mask) {
      Config c;
      for (int i = 0; i < kRoundupIntervals; ++i) {
        c.roundup_power2_divisions[i] = (mask >> i) & 1u ? high : low;
      }
      ASSERT_EQ(Config::parse(c.to_string()).roundup_power2_divisions, c.roundup_power2_divisions)
          << c.to_string();
    }
  }
}

// --- the environment -----------------------------------------------------------------------------

/// Sets an environment variable for one test and restores the previous state.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
      had_ = true;
    }
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(ConfigEnv, UnsetOrEmptyGivesDefaults) {
  ScopedEnv conf("CISTERN_ALLOC_CONF", nullptr);
  ScopedEnv no_caching("CISTERN_NO_CACHING", nullptr);
  EXPECT_EQ(Config::from_env(), Config());
  ScopedEnv empty("CISTERN_ALLOC_CONF", "");
  EXPECT_EQ(Config::from_env(), Config());
}

TEST(ConfigEnv, ReadsTheVariable) {
  ScopedEnv conf("CISTERN_ALLOC_CONF", "max_split_size_mb:256,expandable_segments:True");
  ScopedEnv no_caching("CISTERN_NO_CACHING", nullptr);
  const Config c = Config::from_env();
  EXPECT_EQ(c.max_split_size, 256 * MiB);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_FALSE(c.pass_through);
}

TEST(ConfigEnv, ErrorsMentionTheVariable) {
  ScopedEnv conf("CISTERN_ALLOC_CONF", "max_split_size_mb:5");
  const ConfigError error = config_error([] { Config::from_env(); });
  EXPECT_EQ(error.key(), "max_split_size_mb");
  EXPECT_TRUE(contains(error.what(), "CISTERN_ALLOC_CONF")) << error.what();
  EXPECT_TRUE(contains(error.what(), "max_split_size_mb:5")) << error.what();
}

TEST(ConfigEnv, NoCachingMeansPassThrough) {
  ScopedEnv conf("CISTERN_ALLOC_CONF", "pass_through:False,cross_stream_reuse:False");
  {
    ScopedEnv no_caching("CISTERN_NO_CACHING", "1");
    const Config c = Config::from_env();
    EXPECT_TRUE(c.pass_through);
    EXPECT_FALSE(c.cross_stream_reuse);
  }
  {
    ScopedEnv no_caching("CISTERN_NO_CACHING", "0");
    EXPECT_FALSE(Config::from_env().pass_through);
  }
  {
    ScopedEnv no_caching("CISTERN_NO_CACHING", "please");
    EXPECT_EQ(config_error([] { Config::from_env(); }).key(), "CISTERN_NO_CACHING");
  }
}

// --- the table -----------------------------------------------------------------------------------

const char* const kAllKeys[] = {
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "large_segment_size_mb",
    "garbage_collection_threshold",
    "expandable_segments",
    "vmm",
    "release_threshold_mb",
    "small_handle_size_mb",
    "large_handle_size_mb",
    "max_handle_size_mb",
    "per_process_memory_fraction",
    "memory_limit_mb",
    "cross_stream_reuse",
    "park_small_blocks",
    "exact_peaks",
    "pass_through",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
    "backend",
};
const char* const kNoOpKeys[] = {
    "release_lock_on_cudamalloc",        "pinned_use_cuda_host_register",
    "pinned_num_register_threads",       "pinned_use_background_threads",
    "graph_capture_record_stream_reuse", "backend",
};

const OptionInfo* find_info(const std::string& name) {
  for (const OptionInfo& info : options()) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

TEST(ConfigTable, HasEveryKeyExactlyOnce) {
  std::set<std::string> names;
  for (const OptionInfo& info : options()) {
    EXPECT_TRUE(names.insert(info.name).second) << "duplicate " << info.name;
    EXPECT_FALSE(info.type.empty()) << info.name;
    EXPECT_FALSE(info.help.empty()) << info.name;
    EXPECT_FALSE(info.default_value.empty()) << info.name;
  }
  EXPECT_EQ(names, std::set<std::string>(std::begin(kAllKeys), std::end(kAllKeys)));
  for (const char* code_only :
       {"min_block_size", "small_size", "small_segment_size", "min_large_alloc", "round_large"}) {
    EXPECT_EQ(names.count(code_only), 0u) << code_only;
  }
}

TEST(ConfigTable, DefaultsAsWritten) {
  EXPECT_EQ(find_info("max_split_size_mb")->default_value, "unlimited");
  EXPECT_EQ(find_info("max_non_split_rounding_mb")->default_value, "20");
  EXPECT_EQ(find_info("roundup_power2_divisions")->default_value, "0");
  EXPECT_EQ(find_info("large_segment_size_mb")->default_value, "20");
  EXPECT_EQ(find_info("garbage_collection_threshold")->default_value, "0");
  EXPECT_EQ(find_info("expandable_segments")->default_value, "False");
  EXPECT_EQ(find_info("per_process_memory_fraction")->default_value, "1");
  EXPECT_EQ(find_info("memory_limit_mb")->default_value, "0");
  EXPECT_EQ(find_info("cross_stream_reuse")->default_value, "True");
  EXPECT_EQ(find_info("park_small_blocks")->default_value, "False");
  EXPECT_EQ(find_info("exact_peaks")->default_value, "False");
  EXPECT_EQ(find_info("pass_through")->default_value, "False");
  EXPECT_EQ(find_info("backend")->default_value, "native");
}

TEST(ConfigTable, EveryDefaultParsesToTheDefaults) {
  for (const OptionInfo& info : options()) {
    EXPECT_EQ(Config::parse(info.name + ":" + info.default_value), Config()) << info.name;
  }
}

TEST(ConfigTable, NoOpsSayTheyHaveNoEffect) {
  for (const char* key : kNoOpKeys) {
    EXPECT_TRUE(contains(find_info(key)->help, "(accepted for compatibility; no effect)")) << key;
  }
}

TEST(ConfigTable, MarkdownListsEveryKey) {
  const std::string markdown = options_markdown();
  EXPECT_EQ(markdown.rfind("| option | values | default | meaning |\n|---|---|---|---|\n", 0), 0u)
      << markdown;
  for (const OptionInfo& info : options()) {
    EXPECT_TRUE(contains(markdown, "| `" + info.name + "` |")) << info.name;
  }
  std::size_t rows = 0;
  for (char c : markdown) rows += c == '\n';
  EXPECT_EQ(rows, options().size() + 2);
}

}  // namespace
}  // namespace cistern
