// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Stress: 16 threads on their own streams and one shared stream allocate, free (their own blocks
// and blocks other threads handed over), record_stream, empty_cache and read the statistics,
// against the plug-in's C ABI and against the C++ API on a simulated device. At the end every
// block is freed, the device synchronised and the cache emptied: allocated, active and reserved
// bytes must all be zero, and nothing may be counted as misuse. Each thread's operations are
// seeded, and each thread holds at most 32 blocks (256 more wait to be handed over), so that the
// live set stays within the 8 GiB simulated device however long the run. The default size
// (CISTERN_STRESS_OPS, 1500 operations per thread) is the short run that the ThreadSanitizer CI
// step uses; ctest's `stress_full` (label long) runs 150000.
#include <gtest/gtest.h>
#include <stdlib.h>  // setenv, unsetenv

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/plugin.h"
#include "cistern/sim_device.hpp"

namespace {

constexpr int kThreads = 16;

int operations_per_thread() {
  const char* text = std::getenv("CISTERN_STRESS_OPS");
  return text != nullptr && *text != '\0' ? std::atoi(text) : 1500;
}

/// What a test drives: the plug-in or a C++ allocator, behind the same few calls.
class Target {
 public:
  virtual ~Target() = default;
  virtual std::uintptr_t create_stream() = 0;
  virtual void* allocate(std::size_t size, std::uintptr_t stream) = 0;
  virtual void free(void* ptr, std::size_t size, std::uintptr_t stream) = 0;
  virtual void record_stream(void* ptr, std::uintptr_t stream) = 0;
  virtual void launch(std::uintptr_t stream, std::uint64_t ns) = 0;
  virtual void empty_cache() = 0;
  virtual std::map<std::string, std::int64_t> stats() = 0;
  virtual void synchronize() = 0;
};

cistern_stream_t as_stream(std::uintptr_t handle) {
  return reinterpret_cast<cistern_stream_t>(handle);
}

class PluginTarget : public Target {
 public:
  std::uintptr_t create_stream() override {
    return reinterpret_cast<std::uintptr_t>(cistern_sim_create_stream(0));
  }
  void* allocate(std::size_t size, std::uintptr_t stream) override {
    return cistern_malloc(size, 0, as_stream(stream));
  }
  void free(void* ptr, std::size_t size, std::uintptr_t stream) override {
    cistern_free(ptr, size, 0, as_stream(stream));
  }
  void record_stream(void* ptr, std::uintptr_t stream) override {
    cistern_record_stream(ptr, as_stream(stream));
  }
  void launch(std::uintptr_t stream, std::uint64_t ns) override {
    EXPECT_EQ(cistern_sim_launch(0, as_stream(stream), ns), CISTERN_OK);
  }
  void empty_cache() override { cistern_empty_cache(); }
  std::map<std::string, std::int64_t> stats() override {
    // Other threads change the figures between calls: retry until the text fits the buffer.
    std::string text(4096, '\0');
    for (;;) {
      const std::size_t length = cistern_memory_stats_json(0, text.data(), text.size());
      if (length < text.size()) {
        text.resize(length);
        break;
      }
      text.resize(length + 256);
    }
    return nlohmann::json::parse(text).get<std::map<std::string, std::int64_t>>();
  }
  void synchronize() override { EXPECT_EQ(cistern_sim_synchronize(0), CISTERN_OK); }
};

class CppTarget : public Target {
 public:
  CppTarget() : device_(options()), allocator_(device_, cistern::Config{}) {}
  std::uintptr_t create_stream() override { return device_.create_stream().handle; }
  void* allocate(std::size_t size, std::uintptr_t stream) override {
    return allocator_.allocate(size, cistern::Stream(as_stream(stream)));
  }
  void free(void* ptr, std::size_t /*size*/, std::uintptr_t stream) override {
    allocator_.deallocate(ptr, cistern::Stream(as_stream(stream)));
  }
  void record_stream(void* ptr, std::uintptr_t stream) override {
    allocator_.record_stream(ptr, cistern::Stream(as_stream(stream)));
  }
  void launch(std::uintptr_t stream, std::uint64_t ns) override {
    device_.launch(cistern::Stream(as_stream(stream)), ns);
  }
  void empty_cache() override { allocator_.empty_cache(); }
  std::map<std::string, std::int64_t> stats() override { return allocator_.stats().flatten(); }
  void synchronize() override { EXPECT_EQ(device_.synchronize_device(), cistern::Status::ok); }

 private:
  static cistern::SimDeviceOptions options() {
    cistern::SimDeviceOptions o;
    o.capacity = std::size_t{8} << 30;
    return o;
  }
  cistern::SimDevice device_;
  cistern::CachingAllocator allocator_;
};

struct Block {
  void* ptr = nullptr;
  std::size_t size = 0;
};

/// Blocks handed from one thread to another, to be freed by the receiver.
class Exchange {
 public:
  void give(Block block) {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.push_back(block);
  }
  /// Whether it holds fewer than `n` blocks.
  bool below(std::size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    return blocks_.size() < n;
  }
  bool take(Block* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (blocks_.empty()) return false;
    *block = blocks_.back();
    blocks_.pop_back();
    return true;
  }

 private:
  std::mutex mutex_;
  std::vector<Block> blocks_;
};

/// The most blocks a thread holds, and the most waiting in the exchange: allocations outnumber
/// frees in the mix, so without a bound the live set of a long run would outgrow any device
/// (150000 operations per thread would leave about 200,000 blocks live).
constexpr std::size_t kMaxLivePerThread = 32;
constexpr std::size_t kMaxExchanged = 256;

/// One thread's seeded mix of operations; leaves nothing allocated.
void worker(Target& target, int index, std::uintptr_t own, std::uintptr_t shared,
            Exchange& exchange, int operations) {
  std::mt19937_64 random(0x5eed0000 + static_cast<std::uint64_t>(index));
  std::vector<Block> mine;
  const auto stream_for = [&] { return random() % 4 == 0 ? shared : own; };
  for (int i = 0; i < operations; ++i) {
    const std::uint64_t pick = random() % 100;
    if (mine.empty() || (pick < 45 && mine.size() < kMaxLivePerThread)) {
      // Mostly small blocks, some large ones (over 1 MiB: the large pool).
      const std::size_t size =
          random() % 8 == 0 ? (std::size_t{1} << 20) + random() % (8 << 20) : 1 + random() % 65536;
      void* ptr = target.allocate(size, stream_for());
      ASSERT_NE(ptr, nullptr) << "thread " << index << " operation " << i;
      mine.push_back({ptr, size});
    } else if (pick < 75 || (pick < 85 && !exchange.below(kMaxExchanged))) {
      // A free on this thread (an allocation when the thread holds its most, a hand-over when
      // the exchange is full).
      const std::size_t at = random() % mine.size();
      target.free(mine[at].ptr, mine[at].size, stream_for());
      mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(at));
    } else if (pick < 85) {
      const std::size_t at = random() % mine.size();
      exchange.give(mine[at]);  // another thread frees it
      mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(at));
    } else if (pick < 91) {
      Block block;
      if (exchange.take(&block)) target.free(block.ptr, block.size, own);
    } else if (pick < 95) {
      target.record_stream(mine[random() % mine.size()].ptr, shared);
      target.launch(shared, 1000);
    } else if (pick < 97) {
      target.empty_cache();
    } else {
      const std::map<std::string, std::int64_t> stats = target.stats();
      EXPECT_GE(stats.at("allocated_bytes.all.current"), 0);
      EXPECT_GE(stats.at("reserved_bytes.all.current"), stats.at("allocated_bytes.all.current"));
    }
  }
  for (const Block& block : mine) target.free(block.ptr, block.size, own);
}

void stress(Target& target) {
  const std::uintptr_t shared = target.create_stream();
  std::vector<std::uintptr_t> own;
  for (int t = 0; t < kThreads; ++t) own.push_back(target.create_stream());
  Exchange exchange;
  const int operations = operations_per_thread();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back(worker, std::ref(target), t, own[static_cast<std::size_t>(t)], shared,
                         std::ref(exchange), operations);
  }
  for (std::thread& thread : threads) thread.join();
  Block block;
  while (exchange.take(&block)) target.free(block.ptr, block.size, shared);
  target.synchronize();
  target.empty_cache();
  const std::map<std::string, std::int64_t> stats = target.stats();
  EXPECT_EQ(stats.at("allocated_bytes.all.current"), 0);
  EXPECT_EQ(stats.at("active_bytes.all.current"), 0);
  EXPECT_EQ(stats.at("reserved_bytes.all.current"), 0);
  EXPECT_EQ(stats.at("num_ooms"), 0);
}

TEST(Stress, PluginSixteenThreadsLeaveNothingBehind) {
  setenv("CISTERN_BACKEND", "sim", 1);
  setenv("CISTERN_SIM_CAPACITY", "8GiB", 1);
  unsetenv("CISTERN_ALLOC_CONF");
  cistern_shutdown();
  {
    PluginTarget target;
    stress(target);
  }
  EXPECT_EQ(cistern_misuse_count(), 0u);
  EXPECT_EQ(cistern_last_error_code(), CISTERN_OK);
  cistern_shutdown();
}

TEST(Stress, CppApiSixteenThreadsLeaveNothingBehind) {
  CppTarget target;
  stress(target);
}

}  // namespace
