// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// libcistern_plugin.so through its C ABI only (include/cistern/plugin.h), on the simulated
// backend (CISTERN_BACKEND=sim, 1 GiB per device): allocation, frees on streams, statistics,
// every misuse the ABI promises to survive, concurrent callers, and the PyTorch-format snapshot.
#include <gtest/gtest.h>
#include <stdlib.h>  // setenv, unsetenv

#include <array>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cistern/plugin.h"
#include "trace/pickle.hpp"
#include "trace/readers.hpp"

// An allocation site with external linkage, in the test program's dynamic symbol table
// (ENABLE_EXPORTS), never inlined and never a tail call: the innermost native frame of the
// allocations it makes, by name.
extern "C" __attribute__((noinline)) void* native_stack_site(std::size_t size) {
  void* p = cistern_malloc(size, 0, nullptr);
  asm volatile("" : : "r"(p) : "memory");  // the call returns here: not a tail call
  return p;
}

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::int64_t stat(const char* key, int device = 0) {
  std::string text(cistern_memory_stats_json(device, nullptr, 0), '\0');
  cistern_memory_stats_json(device, text.data(), text.size() + 1);
  return nlohmann::json::parse(text).at(key).get<std::int64_t>();
}

std::string last_error() {
  std::string text(cistern_last_error(nullptr, 0), '\0');
  cistern_last_error(text.data(), text.size() + 1);
  return text;
}

class Plugin : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("CISTERN_BACKEND", "sim", 1);
    setenv("CISTERN_SIM_CAPACITY", "1GiB", 1);
    unsetenv("CISTERN_ALLOC_CONF");
    cistern_shutdown();
  }
  void TearDown() override { cistern_shutdown(); }
};

TEST_F(Plugin, AllocatesFreesAndReportsPyTorchStatistics) {
  EXPECT_STREQ(cistern_backend(), "sim");
  void* p = cistern_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 1024);
  EXPECT_EQ(stat("requested_bytes.all.current"), 1000);
  EXPECT_EQ(stat("allocation.small_pool.current"), 1);
  EXPECT_EQ(stat("segment.all.current"), 1);
  EXPECT_EQ(stat("reserved_bytes.all.current"), 2 * static_cast<std::int64_t>(kMiB));
  cistern_free(p, 1000, 0, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat("allocated_bytes.all.peak"), 1024);
  EXPECT_EQ(stat("reserved_bytes.all.current"), 2 * static_cast<std::int64_t>(kMiB));
  cistern_empty_cache();
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat("num_device_free"), 1);
  EXPECT_EQ(cistern_reset_peak_stats(0), CISTERN_OK);
  EXPECT_EQ(stat("allocated_bytes.all.peak"), 0);
  EXPECT_EQ(cistern_reset_accumulated_stats(0), CISTERN_OK);
  EXPECT_EQ(stat("allocated_bytes.all.allocated"), 0);
  EXPECT_EQ(stat("max_split_size"), -1);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK);
  EXPECT_EQ(cistern_misuse_count(), 0u);
}

TEST_F(Plugin, ZeroBytesAndNullAreNoOps) {
  EXPECT_EQ(cistern_malloc(0, 0, nullptr), nullptr);
  cistern_free(nullptr, 0, 0, nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK);
  EXPECT_EQ(stat("allocation.all.allocated"), 0);  // device 0 not even opened: zeros
}

TEST_F(Plugin, StatisticsJsonIsCutLikeSnprintf) {
  char small[8];
  const std::size_t length = cistern_memory_stats_json(3, small, sizeof small);
  EXPECT_GT(length, sizeof small);
  EXPECT_EQ(std::string(small), "{\"activ");
}

TEST_F(Plugin, OutOfMemoryReturnsNullAndKeepsTheAllocatorUsable) {
  EXPECT_EQ(cistern_malloc(2048 * kMiB, 0, nullptr), nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(last_error().find("out of memory"), std::string::npos) << last_error();
  EXPECT_EQ(cistern_misuse_count(), 0u);
  EXPECT_EQ(stat("num_ooms"), 1);
  void* p = cistern_malloc(kMiB, 0, nullptr);
  ASSERT_NE(p, nullptr);
  cistern_free(p, kMiB, 0, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
}

// The textbook case of fragmentation through the C ABI with the defaults, as PyTorch would drive
// it: a 3 GiB block comes and goes, 100 MiB blocks fill the 4 GiB device, every other one is freed,
// and 1.5 GiB - which only the holes together hold - is served, as expandable segments serve it.
// Then the same with odd sizes and holes at random, small-pool blocks, and a request of several
// GiB.
TEST_F(Plugin, TheHolesOfFreedBlocksServeALargeRequestByDefault) {
  struct Case {
    const char* capacity;
    std::size_t device, first, block, ask;
    unsigned holes;  // 0: every other block; else a seed for holes at random
  };
  const Case cases[] = {
      {"4GiB", 4096 * kMiB, 3072 * kMiB, 100 * kMiB, 1536 * kMiB, 0},
      {"4GiB", 4096 * kMiB, 3072 * kMiB + 4097, 100 * kMiB + 1000, 1536 * kMiB + 12345, 0},
      {"4GiB", 4096 * kMiB, 3000 * kMiB, 77 * kMiB + 513, 1000 * kMiB, 7},
      {"16GiB", 16384 * kMiB, 10240 * kMiB, 300 * kMiB + 4096, 6144 * kMiB + 777, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.capacity << ", blocks of " << c.block);
    cistern_shutdown();
    setenv("CISTERN_SIM_CAPACITY", c.capacity, 1);
    void* first = cistern_malloc(c.first, 0, nullptr);
    ASSERT_NE(first, nullptr);
    cistern_free(first, c.first, 0, nullptr);
    std::vector<void*> blocks;
    while (void* p = cistern_malloc(c.block, 0, nullptr)) blocks.push_back(p);
    cistern_clear_error();
    ASSERT_GT(blocks.size(), 4u);
    std::mt19937 rng(c.holes);
    std::size_t freed = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const bool hole = c.holes == 0 ? i % 2 == 1 : rng() % 2 == 1;
      if (!hole) continue;
      cistern_free(blocks[i], c.block, 0, nullptr);
      blocks[i] = nullptr;
      freed += c.block;
    }
    ASSERT_GE(freed, c.ask + c.ask / 4) << "too few holes for the request";
    void* big = cistern_malloc(c.ask, 0, nullptr);
    EXPECT_NE(big, nullptr) << last_error();
    EXPECT_EQ(cistern_check(0), CISTERN_OK) << last_error();
    if (big != nullptr) cistern_free(big, c.ask, 0, nullptr);
    for (void* p : blocks) {
      if (p != nullptr) cistern_free(p, c.block, 0, nullptr);
    }
    EXPECT_EQ(cistern_misuse_count(), 0u);
  }
  setenv("CISTERN_SIM_CAPACITY", "1GiB", 1);
}

TEST_F(Plugin, DoubleFreeIsRecordedAndChangesNothing) {
  void* p = cistern_malloc(4096, 0, nullptr);
  void* q = cistern_malloc(4096, 0, nullptr);
  cistern_free(p, 4096, 0, nullptr);
  cistern_free(p, 4096, 0, nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_POINTER);
  EXPECT_NE(last_error().find("free(0x"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("double free"), std::string::npos) << last_error();
  EXPECT_EQ(cistern_misuse_count(), 1u);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 4096);
  EXPECT_EQ(stat("allocation.all.freed"), 1);
  cistern_free(q, 4096, 0, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  cistern_clear_error();
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK);
  EXPECT_EQ(last_error(), "");
  EXPECT_EQ(cistern_misuse_count(), 1u);
}

TEST_F(Plugin, UnknownPointerIsRecorded) {
  void* p = cistern_malloc(4096, 0, nullptr);
  int local = 0;
  cistern_free(&local, 4, 0, nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_POINTER);
  EXPECT_NE(last_error().find("not allocated by this allocator"), std::string::npos)
      << last_error();
  cistern_free(static_cast<char*>(p) + 512, 512, 0, nullptr);
  EXPECT_NE(last_error().find("512 bytes inside"), std::string::npos) << last_error();
  cistern_free(&local, 4, 5, nullptr);  // a device never used
  EXPECT_NE(last_error().find("not allocated by cistern_malloc"), std::string::npos)
      << last_error();
  EXPECT_EQ(cistern_misuse_count(), 3u);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 4096);
  cistern_free(p, 4096, 0, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
}

TEST_F(Plugin, SizeOrDeviceMismatchFreesNothing) {
  void* p = cistern_malloc(1000, 0, nullptr);
  cistern_free(p, 999, 0, nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_SIZE_MISMATCH);
  EXPECT_NE(last_error().find("size 999, device 0): the allocation has size 1000 on device 0"),
            std::string::npos)
      << last_error();
  cistern_free(p, 1000, 1, nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_SIZE_MISMATCH);
  EXPECT_NE(last_error().find("size 1000, device 1): the allocation has size 1000 on device 0"),
            std::string::npos)
      << last_error();
  EXPECT_EQ(cistern_misuse_count(), 2u);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 1024);
  cistern_free(p, 1000, 0, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(cistern_misuse_count(), 2u);
}

TEST_F(Plugin, BadArgumentsAreRecorded) {
  EXPECT_EQ(cistern_malloc(512, -1, nullptr), nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(cistern_malloc(512, 64, nullptr), nullptr);
  EXPECT_NE(last_error().find("device 64 is out of range"), std::string::npos) << last_error();
  cistern_set_memory_fraction(1.5, 0);
  EXPECT_NE(last_error().find("not in (0, 1]"), std::string::npos) << last_error();
  cistern_record_stream(reinterpret_cast<void*>(0x1000), nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_POINTER);
  EXPECT_EQ(cistern_write_snapshot(""), CISTERN_ERROR_INVALID_ARGUMENT);
  cistern_init(-1);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(cistern_misuse_count(), 6u);
}

TEST_F(Plugin, ConfigurationErrorsNameTheKey) {
  setenv("CISTERN_ALLOC_CONF", "no_such_option:1", 1);
  cistern_shutdown();
  cistern_init(1);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_CONFIG);
  EXPECT_NE(last_error().find("no_such_option"), std::string::npos) << last_error();
  EXPECT_EQ(cistern_malloc(512, 0, nullptr), nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_CONFIG);
  setenv("CISTERN_BACKEND", "tpu", 1);
  unsetenv("CISTERN_ALLOC_CONF");
  cistern_shutdown();
  EXPECT_STREQ(cistern_backend(), "");
  EXPECT_NE(last_error().find("CISTERN_BACKEND='tpu'"), std::string::npos) << last_error();
  EXPECT_EQ(cistern_misuse_count(), 0u);
}

TEST_F(Plugin, AppliesCisternAllocConf) {
  setenv("CISTERN_ALLOC_CONF", "pass_through:True", 1);
  cistern_shutdown();
  void* p = cistern_malloc(1000, 0, nullptr);
  EXPECT_EQ(stat("num_device_alloc"), 1);
  cistern_free(p, 1000, 0, nullptr);
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);  // nothing cached
}

TEST_F(Plugin, MemoryFractionLimitsTheDevice) {
  cistern_set_memory_fraction(0.5, 0);
  EXPECT_EQ(cistern_malloc(600 * kMiB, 0, nullptr), nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_OUT_OF_MEMORY);
  void* p = cistern_malloc(400 * kMiB, 0, nullptr);
  ASSERT_NE(p, nullptr);
  cistern_free(p, 400 * kMiB, 0, nullptr);
}

TEST_F(Plugin, FreesOnStreamsAndRecordStream) {
  cistern_stream_t s1 = cistern_sim_create_stream(0);
  cistern_stream_t s2 = cistern_sim_create_stream(0);
  ASSERT_NE(s1, nullptr);
  void* p = cistern_malloc(4096, 0, s1);
  cistern_free(p, 4096, 0, s1);
  EXPECT_EQ(cistern_malloc(4096, 0, s1), p);  // same stream: reused at once
  cistern_record_stream(p, s2);
  ASSERT_EQ(cistern_sim_launch(0, s2, 1000000), CISTERN_OK);
  cistern_free(p, 4096, 0, s1);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat("active_bytes.all.current"), 4096);  // pending on s2's work
  void* q = cistern_malloc(4096, 0, s1);
  EXPECT_NE(q, p);
  ASSERT_EQ(cistern_sim_synchronize(0), CISTERN_OK);
  cistern_free(q, 4096, 0, s1);
  cistern_empty_cache();
  EXPECT_EQ(stat("active_bytes.all.current"), 0);
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
  EXPECT_EQ(cistern_misuse_count(), 0u);
}

TEST_F(Plugin, UnknownStreamHandleIsMisuseInMallocFreeAndRecordStream) {
  auto* bogus = reinterpret_cast<cistern_stream_t>(std::uintptr_t{0xdead0});
  const std::string unknown = "unknown stream handle 0xdead0";
  EXPECT_EQ(cistern_malloc(4096, 0, bogus), nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("malloc on device 0: " + unknown), std::string::npos) << last_error();
  EXPECT_EQ(cistern_misuse_count(), 1u);

  void* p = cistern_malloc(4096, 0, nullptr);
  ASSERT_NE(p, nullptr);
  cistern_free(p, 4096, 0, bogus);  // refused the same way; the block stays allocated
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("free on device 0: " + unknown), std::string::npos) << last_error();
  EXPECT_EQ(cistern_misuse_count(), 2u);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 4096);

  cistern_record_stream(p, bogus);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(cistern_misuse_count(), 3u);
  cistern_free(p, 4096, 0, nullptr);
  cistern_empty_cache();
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_F(Plugin, OutOfMemoryMessageSaysWhatWasAskedAndWhereMemoryIs) {
  // Classic segments: the release-and-retry returns the whole cache before the error.
  setenv("CISTERN_ALLOC_CONF", "vmm:False", 1);
  cistern_shutdown();
  void* held = cistern_malloc(600 * kMiB, 0, nullptr);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(cistern_malloc(24879916 * std::size_t{30}, 0, nullptr), nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(last_error(),
            "cistern: out of memory on device 0: requested 746397480 bytes (711.82 MiB), of "
            "which the device has 424.00 MiB free out of 1.00 GiB. cistern has 600.00 MiB "
            "reserved: 600.00 MiB allocated to the program and 0 bytes cached (free blocks kept "
            "for reuse; the largest that could serve this request is 0 bytes).");
  cistern_free(held, 600 * kMiB, 0, nullptr);
}

TEST_F(Plugin, SnapshotWriteErrorsAreInvalidArgumentsWithTheOsReason) {
  ASSERT_EQ(cistern_record_history(1, 0), CISTERN_OK);
  const std::string missing = "/nonexistent-folder-of-cistern/snapshot.pickle";
  EXPECT_EQ(cistern_write_snapshot(missing.c_str()), CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(last_error(), "snapshot: cannot write '" + missing + "': No such file or directory");
  if (std::filesystem::exists("/dev/full")) {
    EXPECT_EQ(cistern_write_snapshot("/dev/full"), CISTERN_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(last_error(), "snapshot: cannot write '/dev/full': No space left on device");
  }
}

// A device that refuses the engine at its first growth (a GPU under MIG or vGPU): the request is
// served by a classic segment, the statistic says so, and the plug-in says it once on stderr.
TEST_F(Plugin, AnEngineRefusedAtTheFirstGrowthFallsBackAndSaysSoOnce) {
  ASSERT_EQ(cistern_sim_refuse_next_map(0), CISTERN_OK);
  ::testing::internal::CaptureStderr();
  void* p = cistern_malloc(3 * kMiB, 0, nullptr);
  void* q = cistern_malloc(3 * kMiB, 0, nullptr);
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(stat("num_vmm_fallbacks"), 1);
  EXPECT_EQ(stat("segment.all.current"), 1);  // one 20 MiB classic segment holds both
  EXPECT_EQ(stat("reserved_bytes.all.current"), 20 * static_cast<std::int64_t>(kMiB));
  EXPECT_NE(said.find("refused the virtual-memory engine at its first growth"), std::string::npos)
      << said;
  EXPECT_EQ(said.find("refused"), said.rfind("refused")) << "said more than once: " << said;
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
  cistern_free(p, 3 * kMiB, 0, nullptr);
  cistern_free(q, 3 * kMiB, 0, nullptr);
}

TEST_F(Plugin, SimulatedStreamsNeedTheSimBackend) {
  setenv("CISTERN_BACKEND", "cuda", 1);
  cistern_shutdown();
  EXPECT_EQ(cistern_sim_create_stream(0), nullptr);
  EXPECT_NE(cistern_last_error_code(), CISTERN_OK);
}

TEST_F(Plugin, BaseAllocationIsTheSegment) {
  void* p = cistern_malloc(1000, 0, nullptr);
  void* q = cistern_malloc(1000, 0, nullptr);
  std::size_t size = 0;
  EXPECT_EQ(cistern_base_allocation(q, &size), p);
  // The simulated device has virtual memory: the segment is the small pool's 64 MiB address
  // range, whose first granule the two blocks share.
  EXPECT_EQ(size, 64 * kMiB);
  int local = 0;
  size = 7;
  EXPECT_EQ(cistern_base_allocation(&local, &size), &local);
  EXPECT_EQ(size, 7u);
  cistern_free(p, 1000, 0, nullptr);
  cistern_free(q, 1000, 0, nullptr);
}

TEST_F(Plugin, DevicesAreIndependent) {
  void* a = cistern_malloc(kMiB, 0, nullptr);
  void* b = cistern_malloc(kMiB, 1, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(stat("allocated_bytes.all.current", 0), static_cast<std::int64_t>(kMiB));
  EXPECT_EQ(stat("allocated_bytes.all.current", 1), static_cast<std::int64_t>(kMiB));
  cistern_free(b, kMiB, 1, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.current", 1), 0);
  cistern_free(a, kMiB, 0, nullptr);
}

TEST_F(Plugin, WritesAPyTorchSnapshotThatOurReaderReads) {
  ASSERT_EQ(cistern_record_history(1, 0), CISTERN_OK);
  void* p = cistern_malloc(1000, 0, nullptr);
  void* q = cistern_malloc(3 * kMiB, 0, nullptr);
  cistern_free(p, 1000, 0, nullptr);
  const std::string path =
      (std::filesystem::temp_directory_path() / "cistern_test_plugin_snapshot.pickle").string();
  ASSERT_EQ(cistern_write_snapshot(path.c_str()), CISTERN_OK) << last_error();

  const cistern::trace::pickle::Document doc = cistern::trace::pickle::read_file(path);
  const auto root = doc.root();
  ASSERT_EQ(root.at("segments").size(), 2u);
  const auto small = root.at("segments")[0];
  EXPECT_EQ(small.at("address").as_int(),
            static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p)));
  EXPECT_EQ(small.at("total_size").as_int(), 2 * static_cast<std::int64_t>(kMiB));
  EXPECT_EQ(small.at("segment_type").as_string(), "small");
  EXPECT_EQ(small.at("blocks")[0].at("state").as_string(), "inactive");
  const auto large = root.at("segments")[1];
  EXPECT_EQ(large.at("segment_type").as_string(), "large");
  EXPECT_EQ(large.at("blocks")[0].at("state").as_string(), "active_allocated");
  EXPECT_EQ(large.at("blocks")[0].at("requested_size").as_int(),
            3 * static_cast<std::int64_t>(kMiB));
  // The simulated device has virtual memory, so the engine maps handles: the small segment's
  // granule, then, far from the limit, the 3 MiB block's whole 20 MiB page, as expandable
  // segments map it; then 2 alloc, free_requested and free_completed.
  EXPECT_EQ(root.at("device_traces")[0].size(), 6u);

  const cistern::trace::Trace t = cistern::trace::read_trace(path);
  EXPECT_EQ(t.format, "pytorch");
  ASSERT_EQ(t.events.size(), 3u);
  EXPECT_EQ(t.events[0].op, cistern::trace::Op::alloc);
  EXPECT_EQ(t.events[0].size, 1000u);
  EXPECT_EQ(t.events[2].op, cistern::trace::Op::free);
  EXPECT_EQ(t.peak_live(), 1000u + 3 * kMiB);
  EXPECT_EQ(t.recorded.segment_events.size(), 2u);
  EXPECT_EQ(*t.recorded.peak_reserved, 2 * kMiB + 20 * kMiB);  // the mapped handles
  cistern_free(q, 3 * kMiB, 0, nullptr);
  std::filesystem::remove(path);
}

std::uint32_t python_stack_id = 0;
std::uint32_t python_stack() { return python_stack_id; }

TEST_F(Plugin, NativeStacksNameTheCallerLeaveOutThePluginAndEndWithTheHooksFrames) {
  ASSERT_EQ(cistern_record_history(1, 0), CISTERN_OK);
  // What a hook answers: a Python stack the caller registered (train.py's forward).
  const char* files[] = {"train.py"};
  const std::int64_t lines[] = {7};
  const char* names[] = {"forward"};
  ASSERT_EQ(cistern_add_stack(1, files, lines, names, &python_stack_id), CISTERN_OK);
  ASSERT_NE(python_stack_id, 0u);

  ASSERT_EQ(cistern_set_native_stacks(1, 0), CISTERN_OK);
  void* native_only = native_stack_site(4096);
  ASSERT_EQ(cistern_set_stack_hook(&python_stack, 0), CISTERN_OK);
  void* both = native_stack_site(8192);
  ASSERT_EQ(cistern_set_native_stacks(0, 0), CISTERN_OK);
  ASSERT_EQ(cistern_set_stack_hook(nullptr, 0), CISTERN_OK);
  void* none = native_stack_site(16384);
  const std::string path =
      (std::filesystem::temp_directory_path() / "cistern_test_native_stacks.pickle").string();
  ASSERT_EQ(cistern_write_snapshot(path.c_str()), CISTERN_OK) << last_error();
  cistern_free(native_only, 4096, 0, nullptr);
  cistern_free(both, 8192, 0, nullptr);
  cistern_free(none, 16384, 0, nullptr);

  const cistern::trace::pickle::Document doc = cistern::trace::pickle::read_file(path);
  std::filesystem::remove(path);
  std::vector<std::vector<std::array<std::string, 3>>> allocs;  // each alloc's frames
  const auto trace = doc.root().at("device_traces")[0];
  for (std::size_t i = 0; i < trace.size(); ++i) {
    if (trace[i].at("action").as_string() != "alloc") continue;
    std::vector<std::array<std::string, 3>> frames;
    const auto list = trace[i].at("frames");
    for (std::size_t f = 0; f < list.size(); ++f) {
      frames.push_back(std::array<std::string, 3>{std::string(list[f].at("filename").as_string()),
                                                  std::to_string(list[f].at("line").as_int()),
                                                  std::string(list[f].at("name").as_string())});
    }
    allocs.push_back(std::move(frames));
  }
  ASSERT_EQ(allocs.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    const auto& frames = allocs[static_cast<std::size_t>(i)];
    ASSERT_GE(frames.size(), 2u) << "alloc " << i;
    // The plug-in's own frames are left out: the caller comes first, from the test program.
    EXPECT_EQ(frames[0][2], "native_stack_site") << "alloc " << i;
    EXPECT_EQ(frames[0][1], "0");
    EXPECT_NE(frames[0][0].find("test_plugin"), std::string::npos) << frames[0][0];
    for (const auto& frame : frames) {
      EXPECT_EQ(frame[0].find("libcistern_plugin"), std::string::npos) << frame[2];
    }
  }
  // Without a hook the native frames alone; with one, its Python frames after them (the test
  // program is no Python interpreter, so no native frame gives way to them).
  EXPECT_NE(allocs[0].back()[0], "train.py");
  EXPECT_EQ(allocs[1].back(), (std::array<std::string, 3>{"train.py", "7", "forward"}));
  EXPECT_EQ(allocs[1].size(), allocs[0].size() + 1);
  EXPECT_TRUE(allocs[2].empty());  // neither: no frames
}

TEST_F(Plugin, ConcurrentCallersOnTheirOwnStreams) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 2000;
  std::vector<cistern_stream_t> streams;
  for (int i = 0; i < kThreads; ++i) streams.push_back(cistern_sim_create_stream(0));
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &streams, &failures] {
      std::vector<std::pair<void*, std::size_t>> held;
      for (int i = 0; i < kRounds; ++i) {
        const std::size_t size =
            512 + static_cast<std::size_t>((i * 7919 + t * 104729) % (4 * kMiB));
        void* p = cistern_malloc(size, 0, streams[static_cast<std::size_t>(t)]);
        if (p == nullptr) ++failures[static_cast<std::size_t>(t)];
        else held.emplace_back(p, size);
        if (held.size() > 16 || (i % 3 == 0 && !held.empty())) {
          cistern_free(held.front().first, held.front().second, 0,
                       streams[static_cast<std::size_t>(t)]);
          held.erase(held.begin());
        }
      }
      for (const auto& [p, size] : held)
        cistern_free(p, size, 0, streams[static_cast<std::size_t>(t)]);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int f : failures) EXPECT_EQ(f, 0);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat("allocation.all.allocated"), kThreads * kRounds);
  EXPECT_EQ(stat("allocation.all.freed"), kThreads * kRounds);
  EXPECT_EQ(cistern_misuse_count(), 0u);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK);
}

TEST_F(Plugin, ConcurrentMisuseIsCountedExactly) {
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 100; ++i) {
        void* p = cistern_malloc(2048, 0, nullptr);
        cistern_free(p, 2048, 0, nullptr);
        cistern_free(p, 2048, 0, nullptr);  // double free, maybe of another thread's new block
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  // A double free either finds the block cached or already handed to another thread; neither
  // may free anything: every allocation is freed exactly once.
  EXPECT_EQ(stat("allocation.all.freed"), kThreads * 100);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(cistern_misuse_count(), static_cast<std::uint64_t>(kThreads * 100));
}

}  // namespace
