// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Every way a call of libcistern_plugin.so can fail, on the simulated backend (1 GiB per device):
// each failure reaches the caller as the code plugin.h documents (and a message naming the
// problem), no C entry point ever throws, nothing is allocated or freed by a failing call, and
// the allocator stays usable and consistent (cistern_check) afterwards. Then the two entry points
// for framework glue: `cistern_try_malloc` (code and message of this call) and
// `cistern_malloc_or_throw` (PyTorch: a throw, never NULL).
#include <gtest/gtest.h>
#include <stdlib.h>  // setenv, unsetenv

#include <cmath>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "cistern/plugin.h"

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

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

class PluginFailures : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("CISTERN_BACKEND", "sim", 1);
    setenv("CISTERN_SIM_CAPACITY", "1GiB", 1);
    unsetenv("CISTERN_ALLOC_CONF");
    cistern_shutdown();
  }
  void TearDown() override { cistern_shutdown(); }
};

/// One failing call: what it does, the code it must leave, and words its message must hold.
struct FailingCall {
  std::string name;
  std::function<void()> call;
  int code;
  std::string says;
};

// The table: every C entry point with every input it refuses. Each call runs against the same
// live allocation `held` (4096 bytes on device 0) and must leave it, and the counters, as they
// were.
TEST_F(PluginFailures, EveryFailingCallReturnsItsDocumentedCodeAndNeverThrows) {
  void* held = cistern_malloc(4096, 0, nullptr);
  ASSERT_NE(held, nullptr);
  cistern_stream_t stream = cistern_sim_create_stream(0);
  auto* bogus = reinterpret_cast<cistern_stream_t>(std::uintptr_t{0xdead0});
  int local = 0;
  void* result = &local;  // what a pointer-returning call gave back
  const std::vector<FailingCall> calls = {
      {"malloc beyond the device", [&] { result = cistern_malloc(2048 * kMiB, 0, nullptr); },
       CISTERN_ERROR_OUT_OF_MEMORY, "out of memory on device 0: requested 2147483648 bytes"},
      {"malloc of SIZE_MAX", [&] { result = cistern_malloc(SIZE_MAX, 0, nullptr); },
       CISTERN_ERROR_OUT_OF_MEMORY, "more than any device has"},
      {"malloc on device -1", [&] { result = cistern_malloc(512, -1, nullptr); },
       CISTERN_ERROR_INVALID_ARGUMENT, "device -1 is out of range"},
      {"malloc on device 64", [&] { result = cistern_malloc(512, 64, nullptr); },
       CISTERN_ERROR_INVALID_ARGUMENT, "device 64 is out of range"},
      {"malloc on an unknown stream", [&] { result = cistern_malloc(512, 0, bogus); },
       CISTERN_ERROR_INVALID_ARGUMENT, "malloc on device 0: unknown stream handle 0xdead0"},
      {"double free",
       [&] {
         void* p = cistern_malloc(1000, 0, nullptr);
         cistern_free(p, 1000, 0, nullptr);
         cistern_free(p, 1000, 0, nullptr);
       },
       CISTERN_ERROR_INVALID_POINTER, "double free"},
      {"free of a foreign pointer", [&] { cistern_free(&local, 4, 0, nullptr); },
       CISTERN_ERROR_INVALID_POINTER, "not allocated by this allocator"},
      {"free of an interior pointer",
       [&] { cistern_free(static_cast<char*>(held) + 512, 512, 0, nullptr); },
       CISTERN_ERROR_INVALID_POINTER, "512 bytes inside"},
      {"free with the wrong size", [&] { cistern_free(held, 4095, 0, nullptr); },
       CISTERN_ERROR_SIZE_MISMATCH, "the allocation has size 4096 on device 0"},
      {"free on the wrong device", [&] { cistern_free(held, 4096, 1, nullptr); },
       CISTERN_ERROR_SIZE_MISMATCH, "device 1): the allocation has size 4096 on device 0"},
      {"free on device -1", [&] { cistern_free(held, 4096, -1, nullptr); },
       CISTERN_ERROR_SIZE_MISMATCH, "device -1): the allocation has size 4096 on device 0"},
      {"free on an unknown stream", [&] { cistern_free(held, 4096, 0, bogus); },
       CISTERN_ERROR_INVALID_ARGUMENT, "free on device 0: unknown stream handle 0xdead0"},
      {"free on a device never used", [&] { cistern_free(&local, 4, 7, nullptr); },
       CISTERN_ERROR_INVALID_POINTER, "not allocated by cistern_malloc"},
      {"record_stream of a foreign pointer", [&] { cistern_record_stream(&local, stream); },
       CISTERN_ERROR_INVALID_POINTER, "record_stream("},
      {"record_stream on an unknown stream", [&] { cistern_record_stream(held, bogus); },
       CISTERN_ERROR_INVALID_ARGUMENT, "record_stream on device 0: unknown stream handle"},
      {"base_allocation of a foreign pointer",
       [&] {
         std::size_t size = 7;
         result = cistern_base_allocation(&local, &size);
         EXPECT_EQ(size, 7u);
       },
       CISTERN_ERROR_INVALID_POINTER, "base_allocation("},
      {"memory fraction 0", [&] { cistern_set_memory_fraction(0.0, 0); },
       CISTERN_ERROR_INVALID_ARGUMENT, "not in (0, 1]"},
      {"memory fraction 1.5", [&] { cistern_set_memory_fraction(1.5, 0); },
       CISTERN_ERROR_INVALID_ARGUMENT, "not in (0, 1]"},
      {"memory fraction NaN", [&] { cistern_set_memory_fraction(std::nan(""), 0); },
       CISTERN_ERROR_INVALID_ARGUMENT, "not in (0, 1]"},
      {"memory fraction of device 64", [&] { cistern_set_memory_fraction(0.5, 64); },
       CISTERN_ERROR_INVALID_ARGUMENT, "device 64 is out of range"},
      {"init with -1 devices", [&] { cistern_init(-1); }, CISTERN_ERROR_INVALID_ARGUMENT,
       "init with -1 devices"},
      {"init with 65 devices", [&] { cistern_init(65); }, CISTERN_ERROR_INVALID_ARGUMENT,
       "init with 65 devices"},
      {"statistics of device 64", [&] { EXPECT_EQ(cistern_memory_stats_json(64, nullptr, 0), 0u); },
       CISTERN_ERROR_INVALID_ARGUMENT, "memory_stats: device 64 is out of range"},
      {"reset_peak_stats of device -1",
       [&] { EXPECT_EQ(cistern_reset_peak_stats(-1), CISTERN_ERROR_INVALID_ARGUMENT); },
       CISTERN_ERROR_INVALID_ARGUMENT, "device -1 is out of range"},
      {"reset_accumulated_stats of device 64",
       [&] { EXPECT_EQ(cistern_reset_accumulated_stats(64), CISTERN_ERROR_INVALID_ARGUMENT); },
       CISTERN_ERROR_INVALID_ARGUMENT, "device 64 is out of range"},
      {"snapshot to NULL",
       [&] { EXPECT_EQ(cistern_write_snapshot(nullptr), CISTERN_ERROR_INVALID_ARGUMENT); },
       CISTERN_ERROR_INVALID_ARGUMENT, "write_snapshot needs a file path"},
      {"check of device 64", [&] { EXPECT_EQ(cistern_check(64), CISTERN_ERROR_INVALID_ARGUMENT); },
       CISTERN_ERROR_INVALID_ARGUMENT, "check: device 64 is out of range"},
      {"sim_launch on an unknown stream",
       [&] { EXPECT_EQ(cistern_sim_launch(0, bogus, 10), CISTERN_ERROR_INVALID_ARGUMENT); },
       CISTERN_ERROR_INVALID_ARGUMENT, "launch"},
      {"sim_create_stream on device -1", [&] { result = cistern_sim_create_stream(-1); },
       CISTERN_ERROR_INVALID_ARGUMENT, "device -1 is out of range"},
  };
  std::uint64_t misuses = cistern_misuse_count();
  for (const FailingCall& c : calls) {
    SCOPED_TRACE(c.name);
    cistern_clear_error();
    result = &local;
    EXPECT_NO_THROW(c.call());
    EXPECT_EQ(cistern_last_error_code(), c.code);
    EXPECT_NE(last_error().find(c.says), std::string::npos) << last_error();
    EXPECT_TRUE(result == nullptr || result == &local) << "a failing call handed on " << result;
    EXPECT_EQ(stat("allocated_bytes.all.current"), 4096);  // only `held` is allocated
    EXPECT_EQ(cistern_check(0), CISTERN_OK) << last_error();
    // Misuse is counted; out of memory is not misuse.
    if (c.code != CISTERN_ERROR_OUT_OF_MEMORY) ++misuses;
    EXPECT_EQ(cistern_misuse_count(), misuses);
  }
  // Still usable: allocate, free, and the held block frees as it should.
  void* p = cistern_malloc(kMiB, 0, stream);
  ASSERT_NE(p, nullptr);
  cistern_free(p, kMiB, 0, stream);
  cistern_free(held, 4096, 0, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
}

// Before anything was allocated (or after cistern_shutdown) nothing exists to free, record or
// look up: each call says so with its code instead of creating or touching anything.
TEST_F(PluginFailures, CallsBeforeTheFirstAllocationAreRefusedClearly) {
  int local = 0;
  EXPECT_NO_THROW(cistern_free(&local, 4, 0, nullptr));
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_POINTER);
  EXPECT_NE(last_error().find("not allocated by cistern_malloc"), std::string::npos);
  EXPECT_NO_THROW(cistern_record_stream(&local, nullptr));
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_POINTER);
  std::size_t size = 3;
  EXPECT_EQ(cistern_base_allocation(&local, &size), &local);
  EXPECT_EQ(size, 3u);
  EXPECT_EQ(cistern_check(0), CISTERN_OK);  // nothing to check
  EXPECT_NO_THROW(cistern_empty_cache());
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);  // no device opened: zeros
  EXPECT_EQ(cistern_misuse_count(), 3u);             // free, record_stream, base_allocation
}

TEST_F(PluginFailures, TryMallocGivesThisCallsCodeAndMessage) {
  char message[1024] = "untouched";
  void* ptr = &message;
  EXPECT_EQ(cistern_try_malloc(1000, 0, nullptr, &ptr, message, sizeof message), CISTERN_OK);
  ASSERT_NE(ptr, nullptr);
  EXPECT_STREQ(message, "");
  EXPECT_EQ(stat("requested_bytes.all.current"), 1000);
  cistern_free(ptr, 1000, 0, nullptr);

  void* zero = &message;
  EXPECT_EQ(cistern_try_malloc(0, 0, nullptr, &zero, message, sizeof message), CISTERN_OK);
  EXPECT_EQ(zero, nullptr);

  ptr = &message;
  EXPECT_EQ(cistern_try_malloc(2048 * kMiB, 0, nullptr, &ptr, message, sizeof message),
            CISTERN_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_EQ(std::string(message), last_error());
  EXPECT_TRUE(starts_with(message,
                          "cistern: out of memory on device 0: requested 2147483648 "
                          "bytes (2.00 GiB), of which the device has 1.00 GiB free"))
      << message;

  ptr = &message;
  EXPECT_EQ(cistern_try_malloc(512, 64, nullptr, &ptr, message, sizeof message),
            CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_NE(std::string(message).find("device 64 is out of range"), std::string::npos);

  // No place for the pointer: refused, nothing allocated; a short buffer is cut like snprintf.
  char small[8];
  EXPECT_EQ(cistern_try_malloc(512, 0, nullptr, nullptr, small, sizeof small),
            CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(small, "cistern");
  EXPECT_EQ(cistern_try_malloc(512, 0, nullptr, nullptr, nullptr, 0),
            CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
}

// The message of a try_malloc is the call's own, not whatever another thread recorded last.
TEST_F(PluginFailures, TryMallocMessagesAreNotMixedUpBetweenCalls) {
  char first[1024];
  char second[1024];
  void* ptr = nullptr;
  ASSERT_EQ(cistern_try_malloc(2048 * kMiB, 0, nullptr, &ptr, first, sizeof first),
            CISTERN_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(cistern_try_malloc(512, 64, nullptr, &ptr, second, sizeof second),
            CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(first).find("out of memory"), std::string::npos);
  EXPECT_EQ(std::string(first).find("out of range"), std::string::npos);
  EXPECT_EQ(last_error(), std::string(second));
}

TEST_F(PluginFailures, MallocOrThrowThrowsRuntimeErrorsNeverNull) {
  void* p = cistern_malloc_or_throw(1000, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(cistern_malloc_or_throw(0, 0, nullptr), nullptr);  // size 0: no allocation, no throw

  // Out of memory: PyTorch's words first, then cistern's message.
  try {
    cistern_malloc_or_throw(2048 * kMiB, 0, nullptr);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_TRUE(starts_with(message, CISTERN_FRAMEWORK_OOM_PREFIX
                            "cistern: out of memory on device 0: requested 2147483648 bytes"))
        << message;
    EXPECT_EQ(message, CISTERN_FRAMEWORK_OOM_PREFIX + last_error());
  }
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_OUT_OF_MEMORY);

  // Any other failure: cistern's message alone.
  try {
    cistern_malloc_or_throw(512, 64, nullptr);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(starts_with(e.what(), "cistern: device 64 is out of range")) << e.what();
  }
  auto* bogus = reinterpret_cast<cistern_stream_t>(std::uintptr_t{0xdead0});
  EXPECT_THROW(cistern_malloc_or_throw(512, 0, bogus), std::runtime_error);

  // The allocator is as it was: the live block, a consistent state, the next allocation served.
  EXPECT_EQ(stat("allocated_bytes.all.current"), 1024);
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
  void* q = cistern_malloc_or_throw(600 * kMiB, 0, nullptr);
  ASSERT_NE(q, nullptr);
  cistern_free(q, 600 * kMiB, 0, nullptr);
  cistern_free(p, 1000, 0, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat("num_ooms"), 1);
}

// Under a memory fraction the thrown message also gives cistern's limit; with classic segments
// the release-and-retry returns the whole cache first, so the figures are exact.
TEST_F(PluginFailures, MallocOrThrowMessageIsThePrefixAndCisternsWholeMessage) {
  setenv("CISTERN_ALLOC_CONF", "vmm:False", 1);
  cistern_shutdown();
  cistern_set_memory_fraction(0.5, 0);
  void* held = cistern_malloc(300 * kMiB, 0, nullptr);
  ASSERT_NE(held, nullptr);
  try {
    cistern_malloc_or_throw(400 * kMiB, 0, nullptr);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "CUDA out of memory. cistern: out of memory on device 0: requested 419430400 bytes "
              "(400.00 MiB), of which the device has 724.00 MiB free out of 1.00 GiB. cistern has "
              "300.00 MiB reserved: 300.00 MiB allocated to the program and 0 bytes cached (free "
              "blocks kept for reuse; the largest that could serve this request is 0 bytes). It "
              "may reserve at most 512.00 MiB (memory fraction or limit).");
  }
  void* next = cistern_malloc_or_throw(200 * kMiB, 0, nullptr);
  EXPECT_NE(next, nullptr);
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
  cistern_free(next, 200 * kMiB, 0, nullptr);
  cistern_free(held, 300 * kMiB, 0, nullptr);
}

TEST_F(PluginFailures, CheckPassesThroughoutOrdinaryUse) {
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
  std::vector<std::pair<void*, std::size_t>> held;
  for (std::size_t i = 1; i <= 40; ++i) {
    const std::size_t size = (i * 7919 * 1024) % (24 * kMiB) + 512;
    held.emplace_back(cistern_malloc(size, 0, nullptr), size);
    if (i % 3 == 0) {
      cistern_free(held.front().first, held.front().second, 0, nullptr);
      held.erase(held.begin());
    }
    ASSERT_EQ(cistern_check(0), CISTERN_OK) << last_error();
  }
  for (const auto& [p, size] : held) cistern_free(p, size, 0, nullptr);
  cistern_empty_cache();
  EXPECT_EQ(cistern_check(0), CISTERN_OK);
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

}  // namespace
