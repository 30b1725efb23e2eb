// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CUDA graph pools through the plug-in's C ABI (and PyTorch's C++ hooks), on the simulated
// backend (1 GiB): blocks of a pool are never reused outside it and are reused inside it, a
// released pool gives its memory back only once nothing in it is live, pools shared by id,
// stream filters, statistics and empty_cache with pools, out of memory in a pool, and an
// allocation on a captured stream with no pool begun. Exact byte counts throughout.
#include <gtest/gtest.h>
#include <stdlib.h>  // setenv, unsetenv

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "cistern/plugin.h"

namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

std::int64_t stat(const char* key, int device = 0) {
  std::string text(cistern_memory_stats_json(device, nullptr, 0), '\0');
  cistern_memory_stats_json(device, text.data(), text.size() + 1);
  return nlohmann::json::parse(text).at(key).get<std::int64_t>();
}

std::int64_t reserved() { return stat("reserved_bytes.all.current"); }
std::int64_t allocated() { return stat("allocated_bytes.all.current"); }

std::string last_error() {
  std::string text(cistern_last_error(nullptr, 0), '\0');
  cistern_last_error(text.data(), text.size() + 1);
  return text;
}

/// Accepts the one stream its context points to.
int only_stream(void* context, cistern_stream_t stream) {
  return stream == *static_cast<cistern_stream_t*>(context) ? 1 : 0;
}

class GraphPools : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("CISTERN_BACKEND", "sim", 1);
    setenv("CISTERN_SIM_CAPACITY", "1GiB", 1);
    unsetenv("CISTERN_ALLOC_CONF");
    cistern_shutdown();
  }
  void TearDown() override {
    EXPECT_EQ(cistern_check(0), CISTERN_OK) << last_error();
    cistern_shutdown();
  }
};

TEST_F(GraphPools, BlocksAllocatedInAPoolAreNotReusedOutsideIt) {
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 1, 0, nullptr, nullptr), CISTERN_OK);
  void* in_pool = cistern_malloc(1000, 0, nullptr);
  ASSERT_NE(in_pool, nullptr);
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 1, 0), CISTERN_OK);
  cistern_free(in_pool, 1000, 0, nullptr);
  EXPECT_EQ(allocated(), 0);
  EXPECT_EQ(reserved(), 2 * kMiB);  // the pool's small segment, cached in the pool

  void* outside = cistern_malloc(1000, 0, nullptr);  // the general pool: a segment of its own
  ASSERT_NE(outside, nullptr);
  EXPECT_NE(outside, in_pool);
  EXPECT_EQ(reserved(), 4 * kMiB);
  EXPECT_EQ(allocated(), 1024);
  EXPECT_EQ(stat("segment.all.current"), 2);
  EXPECT_EQ(cistern_check(0), CISTERN_OK) << last_error();
  cistern_free(outside, 1000, 0, nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK) << last_error();
}

TEST_F(GraphPools, FreedBlocksAreReusedByTheSamePoolAcrossItsGraphs) {
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 1, 0, nullptr, nullptr), CISTERN_OK);
  void* first = cistern_malloc(1000, 0, nullptr);
  cistern_free(first, 1000, 0, nullptr);  // freed during the capture: back to the pool
  void* again = cistern_malloc(1000, 0, nullptr);
  EXPECT_EQ(again, first);
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 1, 0), CISTERN_OK);
  cistern_free(again, 1000, 0, nullptr);

  // A second graph sharing the pool id (torch.cuda.graph(pool=...)) reuses the same block.
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 1, 0, nullptr, nullptr), CISTERN_OK);
  void* shared = cistern_malloc(1000, 0, nullptr);
  EXPECT_EQ(shared, first);
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 1, 0), CISTERN_OK);
  EXPECT_EQ(stat("num_device_alloc"), 1);
  EXPECT_EQ(reserved(), 2 * kMiB);
  cistern_free(shared, 1000, 0, nullptr);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK) << last_error();
}

TEST_F(GraphPools, ReleaseGivesTheMemoryBackOnlyWhenNothingInThePoolIsLive) {
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 5, 0, nullptr, nullptr), CISTERN_OK);
  void* output = cistern_malloc(30 * kMiB, 0, nullptr);  // a graph's output, kept by the program
  void* scratch = cistern_malloc(1000, 0, nullptr);
  ASSERT_NE(output, nullptr);
  ASSERT_NE(scratch, nullptr);
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 5, 0), CISTERN_OK);
  cistern_free(scratch, 1000, 0, nullptr);
  const std::int64_t with_pool = reserved();
  EXPECT_EQ(with_pool, 40 * kMiB + 2 * kMiB);  // two whole 20 MiB pages far from the limit

  ASSERT_EQ(cistern_release_pool(0, 5, 0), CISTERN_OK);  // the graph is reset
  EXPECT_EQ(reserved(), with_pool);                      // output is live: nothing goes back
  EXPECT_EQ(allocated(), 30 * kMiB);
  cistern_empty_cache();             // a released pool's free blocks do go back with empty_cache
  EXPECT_EQ(reserved(), 40 * kMiB);  // output's pages
  EXPECT_EQ(cistern_check(0), CISTERN_OK) << last_error();

  cistern_free(output, 30 * kMiB, 0, nullptr);  // the last live block: the pool goes
  EXPECT_EQ(reserved(), 0);
  EXPECT_EQ(allocated(), 0);
  EXPECT_EQ(stat("allocated_bytes.all.allocated"), 30 * kMiB + 1024);
  EXPECT_EQ(stat("allocated_bytes.all.freed"), 30 * kMiB + 1024);
  EXPECT_EQ(stat("num_device_free"), stat("num_device_alloc"));
  // The pool is gone: its id is unknown now.
  EXPECT_EQ(cistern_release_pool(0, 5, 0), CISTERN_ERROR_INVALID_ARGUMENT);
  cistern_clear_error();
}

TEST_F(GraphPools, ReleasingAnEmptyPoolGivesItsMemoryBackAtOnce) {
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 6, 0, nullptr, nullptr), CISTERN_OK);
  void* p = cistern_malloc(12 * kMiB, 0, nullptr);
  cistern_free(p, 12 * kMiB, 0, nullptr);
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 6, 0), CISTERN_OK);
  EXPECT_EQ(reserved(), 20 * kMiB);  // a whole page far from the limit
  ASSERT_EQ(cistern_release_pool(0, 6, 0), CISTERN_OK);
  EXPECT_EQ(reserved(), 0);
}

TEST_F(GraphPools, APoolReleasedBeforeItsEndGoesAtTheEnd) {
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 13, 0, nullptr, nullptr), CISTERN_OK);
  void* p = cistern_malloc(1000, 0, nullptr);
  cistern_free(p, 1000, 0, nullptr);
  ASSERT_EQ(cistern_release_pool(0, 13, 0), CISTERN_OK);
  void* routed = cistern_malloc(1000, 0, nullptr);  // still begun: still the pool's
  EXPECT_EQ(routed, p);
  cistern_free(routed, 1000, 0, nullptr);
  EXPECT_EQ(reserved(), 2 * kMiB);
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 13, 0), CISTERN_OK);
  EXPECT_EQ(reserved(), 0);
}

TEST_F(GraphPools, APoolSharedByIdLivesUntilEveryUseIsReleased) {
  for (int graph = 0; graph < 2; ++graph) {  // two graphs captured into MemPool id (0, 7)
    ASSERT_EQ(cistern_begin_allocate_to_pool(0, 0, 7, nullptr, nullptr), CISTERN_OK);
    void* p = cistern_malloc(4 * kMiB, 0, nullptr);
    cistern_free(p, 4 * kMiB, 0, nullptr);
    ASSERT_EQ(cistern_end_allocate_to_pool(0, 0, 7), CISTERN_OK);
  }
  EXPECT_EQ(reserved(), 20 * kMiB);  // one block's page, reused by the second graph
  EXPECT_EQ(stat("allocated_bytes.all.allocated"), 8 * kMiB);
  ASSERT_EQ(cistern_release_pool(0, 0, 7), CISTERN_OK);
  EXPECT_EQ(reserved(), 20 * kMiB);  // the other graph still replays
  cistern_empty_cache();             // and empty_cache keeps a pool in use
  EXPECT_EQ(reserved(), 20 * kMiB);
  ASSERT_EQ(cistern_release_pool(0, 0, 7), CISTERN_OK);
  EXPECT_EQ(reserved(), 0);
}

TEST_F(GraphPools, OnlyStreamsTheFilterAcceptsAllocateFromThePool) {
  cistern_stream_t captured = cistern_sim_create_stream(0);
  cistern_stream_t other = cistern_sim_create_stream(0);
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 2, 0, only_stream, &captured), CISTERN_OK);
  void* in_pool = cistern_malloc(1000, 0, captured);
  void* general = cistern_malloc(1000, 0, other);
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 2, 0), CISTERN_OK);
  cistern_free(in_pool, 1000, 0, captured);
  // After the end, `captured` allocates from the general pool again: not the pool's block.
  void* after = cistern_malloc(1000, 0, captured);
  EXPECT_NE(after, in_pool);
  EXPECT_EQ(reserved(), 6 * kMiB);
  cistern_free(general, 1000, 0, other);
  cistern_free(after, 1000, 0, captured);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK) << last_error();
}

TEST_F(GraphPools, StatisticsCountThePoolsAndEmptyCacheSparesPoolsInUse) {
  void* general = cistern_malloc(3000, 0, nullptr);
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 3, 0, nullptr, nullptr), CISTERN_OK);
  void* a = cistern_malloc(2 * kMiB, 0, nullptr);
  void* b = cistern_malloc(1000, 0, nullptr);
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 3, 0), CISTERN_OK);
  EXPECT_EQ(allocated(), 3072 + 2 * kMiB + 1024);
  EXPECT_EQ(stat("requested_bytes.all.current"), 3000 + 2 * kMiB + 1000);
  EXPECT_EQ(stat("allocation.all.current"), 3);
  EXPECT_EQ(stat("segment.all.current"), 3);
  EXPECT_EQ(reserved(), 2 * kMiB + 20 * kMiB + 2 * kMiB);  // a's whole page, far from the limit
  EXPECT_EQ(stat("max_split_size"), -1);

  cistern_free(a, 2 * kMiB, 0, nullptr);
  cistern_free(general, 3000, 0, nullptr);
  cistern_empty_cache();  // the general pool's segment goes; the pool's stay for its replays
  EXPECT_EQ(reserved(), 20 * kMiB + 2 * kMiB);
  EXPECT_EQ(allocated(), 1024);
  EXPECT_EQ(cistern_reset_peak_stats(0), CISTERN_OK);
  EXPECT_EQ(stat("allocated_bytes.all.peak"), 1024);
  EXPECT_EQ(cistern_reset_accumulated_stats(0), CISTERN_OK);
  EXPECT_EQ(stat("allocated_bytes.all.allocated"), 0);
  cistern_free(b, 1000, 0, nullptr);
  EXPECT_EQ(stat("allocated_bytes.all.freed"), 1024);
  ASSERT_EQ(cistern_release_pool(0, 3, 0), CISTERN_OK);
  EXPECT_EQ(reserved(), 0);
}

TEST_F(GraphPools, RecordStreamAndBaseAllocationReachThePool) {
  cistern_stream_t side = cistern_sim_create_stream(0);
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 4, 0, nullptr, nullptr), CISTERN_OK);
  void* p = cistern_malloc(1000, 0, nullptr);
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 4, 0), CISTERN_OK);
  void* general = cistern_malloc(1000, 0, nullptr);
  size_t size = 0;
  size_t general_size = 0;
  EXPECT_EQ(cistern_base_allocation(p, &size), p);  // the first block of the pool's own range
  EXPECT_EQ(cistern_base_allocation(general, &general_size), general);
  EXPECT_EQ(size, general_size);
  cistern_free(general, 1000, 0, nullptr);
  cistern_record_stream(p, side);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK) << last_error();
  ASSERT_EQ(cistern_sim_launch(0, side, 1000), CISTERN_OK);
  cistern_free(p, 1000, 0, nullptr);
  ASSERT_EQ(cistern_sim_synchronize(0), CISTERN_OK);
  ASSERT_EQ(cistern_release_pool(0, 4, 0), CISTERN_OK);
  EXPECT_EQ(reserved(), 2 * kMiB);  // the general allocation's segment, cached
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK) << last_error();
}

TEST_F(GraphPools, OutOfMemoryInAPoolEmptiesTheGeneralCacheFirst) {
  void* big = cistern_malloc(600 * kMiB, 0, nullptr);
  cistern_free(big, 600 * kMiB, 0, nullptr);  // cached by the general pool
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 8, 0, nullptr, nullptr), CISTERN_OK);
  void* in_pool = cistern_malloc(600 * kMiB, 0, nullptr);
  EXPECT_NE(in_pool, nullptr) << last_error();
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 8, 0), CISTERN_OK);
  EXPECT_EQ(reserved(), 600 * kMiB);  // only the pool's segment
  cistern_free(in_pool, 600 * kMiB, 0, nullptr);
  ASSERT_EQ(cistern_release_pool(0, 8, 0), CISTERN_OK);
  EXPECT_EQ(reserved(), 0);
}

TEST_F(GraphPools, DuringACaptureThePoolDoesNotEmptyTheGeneralCacheAndSaysSo) {
  cistern_stream_t s = cistern_sim_create_stream(0);
  void* big = cistern_malloc(600 * kMiB, 0, s);
  cistern_free(big, 600 * kMiB, 0, s);
  ASSERT_EQ(cistern_sim_set_capturing(0, s, 1), CISTERN_OK);
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 9, 0, nullptr, nullptr), CISTERN_OK);
  void* small = cistern_malloc(1000, 0, s);  // a pool allocation during the capture works
  EXPECT_NE(small, nullptr) << last_error();
  void* ptr = nullptr;
  char message[2048];
  EXPECT_EQ(cistern_try_malloc(600 * kMiB, 0, s, &ptr, message, sizeof message),
            CISTERN_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(message).find("torch.cuda.empty_cache() before capturing"),
            std::string::npos)
      << message;
  EXPECT_NE(std::string(message).find("a CUDA graph's private pool"), std::string::npos) << message;
  EXPECT_EQ(reserved(), 600 * kMiB + 2 * kMiB);  // the general pool's cache is still there
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 9, 0), CISTERN_OK);
  ASSERT_EQ(cistern_sim_set_capturing(0, s, 0), CISTERN_OK);
  cistern_free(small, 1000, 0, s);
  ASSERT_EQ(cistern_release_pool(0, 9, 0), CISTERN_OK);
  EXPECT_EQ(reserved(), 600 * kMiB);
  cistern_clear_error();
}

TEST_F(GraphPools, ACapturedStreamWithNoPoolGetsNoNewDeviceMemory) {
  cistern_stream_t s = cistern_sim_create_stream(0);
  void* warm = cistern_malloc(1000, 0, s);
  cistern_free(warm, 1000, 0, s);
  ASSERT_EQ(cistern_sim_set_capturing(0, s, 1), CISTERN_OK);
  void* cached = cistern_malloc(1000, 0, s);  // a hit needs no device memory
  EXPECT_EQ(cached, warm);
  const std::int64_t device_allocs = stat("num_device_alloc");
  void* ptr = nullptr;
  char message[2048];
  EXPECT_EQ(cistern_try_malloc(30 * kMiB, 0, s, &ptr, message, sizeof message),
            CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_NE(std::string(message).find("being captured into a CUDA graph"), std::string::npos)
      << message;
  EXPECT_NE(std::string(message).find("torch.cuda.graph"), std::string::npos) << message;
  EXPECT_EQ(stat("num_device_alloc"), device_allocs);
  EXPECT_EQ(reserved(), 2 * kMiB);
  // Other streams are not captured: they allocate as usual.
  void* elsewhere = cistern_malloc(30 * kMiB, 0, nullptr);
  EXPECT_NE(elsewhere, nullptr);
  ASSERT_EQ(cistern_sim_set_capturing(0, s, 0), CISTERN_OK);
  void* after = cistern_malloc(30 * kMiB, 0, s);  // the capture ended
  EXPECT_NE(after, nullptr);
  cistern_free(after, 30 * kMiB, 0, s);
  cistern_free(elsewhere, 30 * kMiB, 0, nullptr);
  cistern_free(cached, 1000, 0, s);
  cistern_clear_error();
}

TEST_F(GraphPools, ConcurrentCallersKeepThePoolAndTheGeneralPoolApart) {
  cistern_stream_t captured = cistern_sim_create_stream(0);
  cistern_stream_t other = cistern_sim_create_stream(0);
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 12, 0, only_stream, &captured), CISTERN_OK);
  std::set<void*> pool_blocks;
  std::set<void*> general_blocks;
  auto churn = [](cistern_stream_t stream, std::set<void*>* seen) {
    for (int i = 0; i < 300; ++i) {
      const std::size_t size = 512 * static_cast<std::size_t>(1 + i % 7);
      void* p = cistern_malloc(size, 0, stream);
      seen->insert(p);
      cistern_free(p, size, 0, stream);
    }
  };
  std::thread in_pool(churn, captured, &pool_blocks);
  std::thread outside(churn, other, &general_blocks);
  in_pool.join();
  outside.join();
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 12, 0), CISTERN_OK);
  for (void* p : pool_blocks) EXPECT_EQ(general_blocks.count(p), 0u);
  EXPECT_EQ(reserved(), 4 * kMiB);  // one small segment each
  EXPECT_EQ(allocated(), 0);
  ASSERT_EQ(cistern_release_pool(0, 12, 0), CISTERN_OK);
  EXPECT_EQ(reserved(), 2 * kMiB);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK) << last_error();
}

TEST_F(GraphPools, MisuseIsRefusedAndChangesNothing) {
  EXPECT_EQ(cistern_begin_allocate_to_pool(0, 0, 0, nullptr, nullptr),
            CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(cistern_end_allocate_to_pool(0, 1, 0), CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(cistern_release_pool(0, 1, 0), CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(cistern_begin_allocate_to_pool(-1, 1, 0, nullptr, nullptr),
            CISTERN_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(cistern_begin_allocate_to_pool(0, 1, 0, nullptr, nullptr), CISTERN_OK);
  void* p = cistern_malloc(1000, 0, nullptr);
  ASSERT_EQ(cistern_end_allocate_to_pool(0, 1, 0), CISTERN_OK);
  EXPECT_EQ(cistern_end_allocate_to_pool(0, 1, 0), CISTERN_ERROR_INVALID_ARGUMENT);
  cistern_free(p, 999, 0, nullptr);  // wrong size: nothing freed
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_SIZE_MISMATCH);
  EXPECT_EQ(allocated(), 1024);
  cistern_free(p, 1000, 0, nullptr);
  cistern_free(p, 1000, 0, nullptr);  // double free
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_POINTER);
  ASSERT_EQ(cistern_release_pool(0, 1, 0), CISTERN_OK);
  EXPECT_EQ(cistern_release_pool(0, 1, 0), CISTERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(reserved(), 0);
  cistern_clear_error();
}

TEST_F(GraphPools, PyTorchsHooksRouteWithItsStreamFilter) {
  cistern_stream_t captured = cistern_sim_create_stream(0);
  const std::pair<unsigned long long, unsigned long long> id{11, 0};
  cistern_torch_begin_allocate_to_pool(
      0, id, [captured](cistern_stream_t stream) { return stream == captured; });
  void* in_pool = cistern_malloc(1000, 0, captured);
  void* general = cistern_malloc(1000, 0, nullptr);
  cistern_torch_end_allocate_to_pool(0, id);
  EXPECT_EQ(reserved(), 4 * kMiB);
  cistern_free(in_pool, 1000, 0, captured);
  cistern_free(general, 1000, 0, nullptr);
  cistern_torch_release_pool(0, id);
  EXPECT_EQ(reserved(), 2 * kMiB);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK) << last_error();
  EXPECT_THROW(cistern_torch_begin_allocate_to_pool(0, {0, 0}, {}), std::runtime_error);
  cistern_torch_release_pool(0, id);  // never throws: recorded
  EXPECT_EQ(cistern_last_error_code(), CISTERN_ERROR_INVALID_ARGUMENT);
  cistern_clear_error();
}

}  // namespace
