// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Concurrency: many threads allocating and freeing on their own streams, on shared streams,
// freeing each other's memory and recording streams on it, while a monitor thread reads
// statistics and snapshots, runs check() and empties the cache - on a device small enough that
// out-of-memory retries and cross-stream take-overs happen under contention. Live ranges of all
// threads are kept in one set, so two live allocations that overlap are caught at once. Also:
// exact allocator-wide peaks while several pools change in lock-step; and the simulated device's
// lock-free streams and events under threads that record, query and wait at once.
//
// Seeds are fixed per thread (the interleaving is not, so counts vary from run to run; the
// invariants do not). CISTERN_TEST_FULL=1 runs ten times as many iterations. Meant to be run
// under ThreadSanitizer as well (-DCISTERN_SANITIZE=thread).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"

namespace cistern::testing {
namespace {

bool full_mode() {
  const char* full = std::getenv("CISTERN_TEST_FULL");
  return full != nullptr && std::string(full) == "1";
}

/// Iterations per thread: ten times more in the full mode.
std::uint64_t iterations(std::uint64_t smoke) { return full_mode() ? smoke * 10 : smoke; }

/// Draws made from mt19937_64's output directly, so a seed means the same everywhere.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  std::uint64_t below(std::uint64_t n) { return engine_() % n; }
  std::uint64_t between(std::uint64_t lo, std::uint64_t hi) { return lo + below(hi - lo + 1); }
  bool percent(std::uint64_t p) { return below(100) < p; }
  /// Request sizes: mostly small, some large, a few that need a segment of their own.
  std::size_t size() {
    const std::uint64_t r = below(100);
    if (r < 45) return between(1, 8192);
    if (r < 75) return between(8193, MiB);
    if (r < 97) return between(MiB + 1, 12 * MiB);
    return between(12 * MiB, 48 * MiB);
  }

 private:
  std::mt19937_64 engine_;
};

/// The live ranges of every thread, to catch two live allocations that overlap.
class LiveRanges {
 public:
  void add(void* p, std::size_t bytes) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto next = ranges_.lower_bound(a);
    if (next != ranges_.end() && next->first < a + bytes) overlap(a, bytes, *next);
    if (next != ranges_.begin() && std::prev(next)->first + std::prev(next)->second > a) {
      overlap(a, bytes, *std::prev(next));
    }
    ranges_[a] = bytes;
  }
  void remove(void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    ranges_.erase(reinterpret_cast<std::uintptr_t>(p));
  }

 private:
  static void overlap(std::uintptr_t a, std::size_t bytes,
                      const std::pair<const std::uintptr_t, std::size_t>& other) {
    ADD_FAILURE() << fmt::format("[{:#x}, +{}) was returned while [{:#x}, +{}) is live", a, bytes,
                                 other.first, other.second);
  }
  std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> ranges_;
};

/// Pointers handed between threads: whoever pops one owns it.
class Handoff {
 public:
  void push(void* p, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(p, bytes);
  }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return queue_.size();
  }
  bool pop(std::pair<void*, std::size_t>& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.empty()) return false;
    out = queue_.front();
    queue_.pop_front();
    return true;
  }

 private:
  std::mutex mutex_;
  std::deque<std::pair<void*, std::size_t>> queue_;
};

/// A reusable barrier for a fixed number of threads (std::barrier is C++20).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t phase = phase_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++phase_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return phase_ != phase; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  const int count_;
  int waiting_ = 0;
  std::uint64_t phase_ = 0;
};

/// The allocator under test, its device, and what the threads share.
class Arena {
 public:
  /// Classic segments unless `conf` sets `vmm`.
  explicit Arena(std::size_t capacity, const std::string& conf = "")
      : device(options(capacity)), alloc(device, classic(conf)) {}

  static Config classic(const std::string& conf) {
    Config config;
    config.vmm = Config::Vmm::off;
    return config.apply(conf);
  }

  /// Allocates and registers the range; nullptr (counted) on out-of-memory.
  void* allocate(std::size_t bytes, Stream s) {
    void* p = nullptr;
    try {
      p = alloc.allocate(bytes, s);
    } catch (const OutOfMemory&) {
      ooms.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
    live.add(p, bytes);
    device.launch(s, 1 + bytes % 5000);  // the new owner uses it
    return p;
  }
  void deallocate(void* p, Stream s) {
    live.remove(p);
    alloc.deallocate(p, s);
  }

  /// Joined and quiet: nothing allocated, every running sum balanced, nothing left after
  /// empty_cache.
  void expect_everything_returned() {
    alloc.check();
    const Stats s = alloc.stats();
    EXPECT_EQ(s.get(StatKind::allocation, StatPool::all).current, 0);
    EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::all).current, 0);
    for (int k = 0; k < kStatKinds; ++k) {
      for (int q = 0; q < kStatPools; ++q) {
        const Stat& st = s.array[k][q];
        EXPECT_EQ(st.allocated - st.freed, st.current)
            << to_string(static_cast<StatKind>(k)) << "." << to_string(static_cast<StatPool>(q));
        EXPECT_GE(st.peak, st.current);
      }
    }
    const Stat& bytes = s.get(StatKind::allocated_bytes, StatPool::all);
    EXPECT_EQ(bytes.allocated, bytes.freed);
    EXPECT_EQ(s.num_ooms, static_cast<std::int64_t>(ooms.load()));
    alloc.empty_cache();
    alloc.check();
    EXPECT_EQ(alloc.reserved_bytes(), 0u);
    EXPECT_EQ(device.used_bytes(), 0u);
  }

  std::string summary() const {
    const Stats s = alloc.stats();
    return fmt::format(
        "{} OOMs, {} retries, {} cross-stream take-overs, {} device allocs, peak "
        "reserved {}",
        s.num_ooms, s.num_alloc_retries, s.num_cross_stream_reuse, s.num_device_alloc,
        format_bytes(
            static_cast<std::uint64_t>(s.get(StatKind::reserved_bytes, StatPool::all).peak)));
  }

  SimDevice device;
  CachingAllocator alloc;
  LiveRanges live;
  Handoff handoff;
  std::atomic<std::uint64_t> ooms{0};

 private:
  static SimDeviceOptions options(std::size_t capacity) {
    SimDeviceOptions o;
    o.capacity = capacity;
    return o;
  }
};

/// Runs `body()`, turning an exception (which would end the process on a thread) into a failure.
template <class F>
void failing_on_exceptions(const char* who, F&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    ADD_FAILURE() << who << ": " << e.what();
  }
}

/// Reads statistics and snapshots, checks invariants and now and then empties the cache, until
/// told to stop.
class Monitor {
 public:
  explicit Monitor(Arena& arena)
      : arena_(arena), thread_([this] { failing_on_exceptions("monitor", [this] { run(); }); }) {}
  ~Monitor() { stop(); }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    for (std::uint64_t round = 1; !stop_.load(); ++round) {
      check_stats(arena_.alloc.stats());
      check_snapshot(arena_.alloc.snapshot());
      if (round % 4 == 0) arena_.alloc.check();
      if (round % 16 == 0) arena_.alloc.empty_cache();
      (void)arena_.alloc.allocated_bytes();
      (void)arena_.alloc.reserved_bytes();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  static void check_stats(const Stats& s) {
    for (const auto& row : s.array) {
      for (const Stat& st : row) {
        EXPECT_GE(st.peak, st.current);
        EXPECT_GE(st.current, 0);
      }
    }
    EXPECT_GE(s.get(StatKind::reserved_bytes, StatPool::all).current,
              s.get(StatKind::allocated_bytes, StatPool::all).current);
  }
  static void check_snapshot(const Snapshot& snap) {
    std::uintptr_t end = 0;
    for (const SegmentInfo& seg : snap.segments) {
      EXPECT_GE(seg.address, end) << "segments overlap or are out of order";
      std::uintptr_t at = seg.address;
      for (const BlockInfo& b : seg.blocks) {
        EXPECT_EQ(b.address, at) << "blocks do not tile the segment";
        at += b.size;
      }
      EXPECT_EQ(at, seg.address + seg.total_size);
      end = seg.address + seg.total_size;
    }
  }

  Arena& arena_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// Runs `body(i)` on `n` threads and joins them.
void run_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&body, i] { failing_on_exceptions("worker", [&] { body(i); }); });
  }
  for (std::thread& t : threads) t.join();
}

// --- workloads -------------------------------------------------------------------------------------

/// Random allocations and frees on one stream; now and then everything is freed, so that whole
/// segments become free for other streams to take over.
void churn(Arena& arena, Stream s, std::uint64_t seed, std::uint64_t count) {
  Rng rng(seed);
  std::vector<void*> mine;
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint64_t r = rng.below(1000);
    if (mine.empty() || (r < 520 && mine.size() < 24)) {
      if (void* p = arena.allocate(rng.size(), s)) mine.push_back(p);
    } else if (r < 960) {
      const std::size_t k = rng.below(mine.size());
      arena.deallocate(mine[k], s);
      mine[k] = mine.back();
      mine.pop_back();
    } else if (r < 990) {
      arena.device.advance(rng.below(20'000));
    } else {
      for (void* p : mine) arena.deallocate(p, s);
      mine.clear();
    }
  }
  for (void* p : mine) arena.deallocate(p, s);
}

/// At most this many pointers wait in the hand-off queue (beyond, threads only take).
constexpr std::size_t kMaxHandedOver = 48;

/// Allocates on its own stream and hands pointers over; takes other threads' pointers, records
/// its stream on some and passes them on, frees the rest on its own stream (pending there).
void exchange(Arena& arena, Stream s, std::uint64_t seed, std::uint64_t count) {
  Rng rng(seed);
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint64_t r = rng.below(100);
    std::pair<void*, std::size_t> taken;
    if (r < 45 && arena.handoff.size() < kMaxHandedOver) {
      const std::size_t bytes = rng.size();
      if (void* p = arena.allocate(bytes, s)) arena.handoff.push(p, bytes);
    } else if (r < 90 && arena.handoff.pop(taken)) {
      arena.device.launch(s, rng.between(1, 5000));  // this stream uses the memory
      if (rng.percent(30)) {
        arena.alloc.record_stream(taken.first, s);
        arena.handoff.push(taken.first, taken.second);
      } else {
        arena.deallocate(taken.first, s);
      }
    } else {
      arena.device.advance(rng.below(10'000));
    }
  }
}

void drain_handoff(Arena& arena) {
  std::pair<void*, std::size_t> taken;
  while (arena.handoff.pop(taken)) arena.deallocate(taken.first, default_stream);
}

std::vector<Stream> make_streams(SimDevice& device, int n) {
  std::vector<Stream> streams;
  for (int i = 0; i < n; ++i) streams.push_back(device.create_stream());
  return streams;
}

// --- tests --------------------------------------------------------------------------------------------

class Concurrency : public ::testing::TestWithParam<int> {};

TEST_P(Concurrency, ThreadsOnTheirOwnStreams) {
  const int n = GetParam();
  Arena arena(static_cast<std::size_t>(n) * 40 * MiB);
  const std::vector<Stream> streams = make_streams(arena.device, n);
  {
    Monitor monitor(arena);
    run_threads(n, [&](int t) {
      churn(arena, streams[static_cast<std::size_t>(t)], 1000 + static_cast<std::uint64_t>(t),
            iterations(30'000));
    });
  }
  const Stats s = arena.alloc.stats();
  std::cout << "[ stats    ] " << n << " threads, own streams: " << arena.summary() << "\n";
  EXPECT_GT(s.num_alloc_retries, 0) << "the release-and-retry path never ran";
  EXPECT_GT(s.num_cross_stream_reuse, 0) << "no segment was ever taken over";
  arena.expect_everything_returned();
}

TEST_P(Concurrency, ThreadsSharingTwoStreams) {
  const int n = GetParam();
  Arena arena(static_cast<std::size_t>(n) * 40 * MiB);
  const std::vector<Stream> streams = make_streams(arena.device, 2);
  {
    Monitor monitor(arena);
    run_threads(n, [&](int t) {
      churn(arena, streams[static_cast<std::size_t>(t % 2)], 2000 + static_cast<std::uint64_t>(t),
            iterations(30'000));
    });
  }
  std::cout << "[ stats    ] " << n << " threads, 2 streams: " << arena.summary() << "\n";
  arena.expect_everything_returned();
}

TEST_P(Concurrency, CrossThreadFreesAndRecordStream) {
  const int n = GetParam();
  Arena arena(static_cast<std::size_t>(n) * 48 * MiB);
  const std::vector<Stream> streams = make_streams(arena.device, n);
  {
    Monitor monitor(arena);
    run_threads(n, [&](int t) {
      exchange(arena, streams[static_cast<std::size_t>(t)], 3000 + static_cast<std::uint64_t>(t),
               iterations(30'000));
    });
  }
  drain_handoff(arena);
  std::cout << "[ stats    ] " << n << " threads, cross-thread frees: " << arena.summary() << "\n";
  arena.expect_everything_returned();
}

TEST_P(Concurrency, AllWorkloadsAtOnceWithEmptyCache) {
  const int n = GetParam();
  Arena arena(static_cast<std::size_t>(n) * 32 * MiB, "max_split_size_mb:40");
  const std::vector<Stream> streams = make_streams(arena.device, n);
  {
    Monitor monitor(arena);
    run_threads(n, [&](int t) {
      const Stream own = streams[static_cast<std::size_t>(t)];
      const std::uint64_t seed = 4000 + static_cast<std::uint64_t>(t);
      if (t % 3 == 0) churn(arena, own, seed, iterations(20'000));
      else if (t % 3 == 1) exchange(arena, own, seed, iterations(20'000));
      else churn(arena, streams[0], seed, iterations(20'000));  // shares thread 0's stream
    });
  }
  drain_handoff(arena);
  std::cout << "[ stats    ] " << n << " threads, mixed: " << arena.summary() << "\n";
  arena.expect_everything_returned();
}

// The virtual-memory engine at a capacity where threads keep reclaiming pages from each other's
// cached free blocks (and waiting for each other's streams) while others allocate and free.
TEST_P(Concurrency, EngineThreadsReclaimEachOthersPages) {
  const int n = GetParam();
  Arena arena(static_cast<std::size_t>(n) * 24 * MiB, "vmm:True,large_handle_size_mb:2");
  ASSERT_TRUE(arena.alloc.uses_virtual_memory());
  const std::vector<Stream> streams = make_streams(arena.device, n);
  {
    Monitor monitor(arena);
    run_threads(n, [&](int t) {
      const Stream own = streams[static_cast<std::size_t>(t)];
      const std::uint64_t seed = 5000 + static_cast<std::uint64_t>(t);
      if (t % 2 == 0) churn(arena, own, seed, iterations(20'000));
      else exchange(arena, own, seed, iterations(20'000));
    });
  }
  drain_handoff(arena);
  const Stats s = arena.alloc.stats();
  std::cout << "[ stats    ] " << n << " threads, engine: " << arena.summary() << ", "
            << s.num_pages_reclaimed << " pages reclaimed, " << s.num_reclaim_syncs
            << " reclaim waits\n";
  EXPECT_GT(s.num_pages_reclaimed, 0) << "no page was ever reclaimed";
  arena.expect_everything_returned();
}

INSTANTIATE_TEST_SUITE_P(Threads, Concurrency, ::testing::Values(4, 8),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return std::to_string(param.param);
                         });

// Two threads on two streams (two pools: the allocator-wide peak is no longer one pool's peak)
// change their allocations in lock-step; between barriers exactly one known set is live, so the
// peaks are exact. Thread 0 allocates small blocks, thread 1 large ones, so the per-pool peaks
// are exact too.
TEST(ConcurrencyPeaks, AllocatorWidePeaksAreExactWithSeveralPools) {
  Arena arena(8 * GiB, "exact_peaks:True");
  const Stream streams[2] = {arena.device.create_stream(), arena.device.create_stream()};
  // Before the second pool exists, one pool's peak is the allocator's.
  void* early = arena.alloc.allocate(90 * MiB, streams[0]);
  const auto early_size = static_cast<std::int64_t>(arena.alloc.allocation_size(early));
  arena.alloc.deallocate(early, streams[0]);

  constexpr int kRounds = 200;
  std::int64_t sizes[2][kRounds] = {};
  Barrier barrier(2);
  run_threads(2, [&](int t) {
    Rng rng(77 + static_cast<std::uint64_t>(t));
    for (int round = 0; round < kRounds; ++round) {
      const std::size_t bytes = t == 0 ? rng.between(1, MiB) : rng.between(MiB + 1, 80 * MiB);
      void* p = arena.alloc.allocate(bytes, streams[t]);
      sizes[t][round] = static_cast<std::int64_t>(arena.alloc.allocation_size(p));
      barrier.wait();  // both allocations live
      arena.alloc.deallocate(p, streams[t]);
      barrier.wait();  // both freed
    }
  });
  std::int64_t both = 0;
  std::int64_t small = 0;
  std::int64_t large = 0;
  for (int round = 0; round < kRounds; ++round) {
    both = std::max(both, sizes[0][round] + sizes[1][round]);
    small = std::max(small, sizes[0][round]);
    large = std::max(large, sizes[1][round]);
  }
  const Stats s = arena.alloc.stats();
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::all).peak, std::max(both, early_size));
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::small_pool).peak, small);
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::large_pool).peak,
            std::max(large, early_size));
  EXPECT_EQ(s.get(StatKind::allocation, StatPool::all).peak, 2);
  arena.alloc.reset_peak_stats();
  EXPECT_EQ(arena.alloc.stats().get(StatKind::allocated_bytes, StatPool::all).peak, 0);
  arena.expect_everything_returned();
}

// The same after a reset, with a block held throughout by a third pool.
TEST(ConcurrencyPeaks, PeaksAfterResetCountOnlyWhatCameAfter) {
  Arena arena(8 * GiB, "exact_peaks:True");
  const Stream held_stream = arena.device.create_stream();
  const Stream streams[2] = {arena.device.create_stream(), arena.device.create_stream()};
  void* big = arena.alloc.allocate(500 * MiB, streams[0]);
  arena.alloc.deallocate(big, streams[0]);
  void* held = arena.alloc.allocate(3 * MiB, held_stream);
  const auto held_size = static_cast<std::int64_t>(arena.alloc.allocation_size(held));
  arena.alloc.reset_peak_stats();
  EXPECT_EQ(arena.alloc.stats().get(StatKind::allocated_bytes, StatPool::all).peak, held_size);

  constexpr int kRounds = 100;
  std::int64_t sums[kRounds] = {};
  std::atomic<std::int64_t> partial[2][kRounds] = {};
  Barrier barrier(2);
  run_threads(2, [&](int t) {
    Rng rng(99 + static_cast<std::uint64_t>(t));
    for (int round = 0; round < kRounds; ++round) {
      void* p = arena.alloc.allocate(rng.between(1, 30 * MiB), streams[t]);
      partial[t][round].store(static_cast<std::int64_t>(arena.alloc.allocation_size(p)));
      barrier.wait();
      arena.alloc.deallocate(p, streams[t]);
      barrier.wait();
    }
  });
  std::int64_t expected = held_size;
  for (int round = 0; round < kRounds; ++round) {
    sums[round] = held_size + partial[0][round].load() + partial[1][round].load();
    expected = std::max(expected, sums[round]);
  }
  const Stats s = arena.alloc.stats();
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::all).peak, expected);
  EXPECT_EQ(s.get(StatKind::allocation, StatPool::all).peak, 3);
  arena.alloc.deallocate(held, held_stream);
  arena.expect_everything_returned();
}

// --- the simulated device's streams and events -----------------------------------------------------

bool is_answer(Status status) { return status == Status::ok || status == Status::not_ready; }

// One thread's part: an event and a stream of its own, checked exactly (only this thread moves
// them), events shared with the others on a shared stream, and an event created and destroyed
// every round, so that slots are reused while other threads look theirs up.
void drive_events(SimDevice& device, Stream own, Stream shared_stream, const Event (&shared)[2],
                  std::uint64_t rounds, std::uint64_t seed, Barrier& start) {
  Event event;
  ASSERT_EQ(device.create_event(&event), Status::ok);
  start.wait();  // all threads at once, so that their calls overlap
  Rng rng(seed);
  std::uint64_t last_now = 0;
  Event destroyed;
  for (std::uint64_t i = 0; i < rounds; ++i) {
    device.launch(own, rng.between(1, 50));
    device.launch(shared_stream, 3);
    const std::uint64_t done_at = device.stream_done_at(own);
    ASSERT_EQ(device.record_event(event, own), Status::ok);
    const Status status = device.query_event(event);
    ASSERT_TRUE(is_answer(status)) << to_string(status);
    if (status == Status::ok) {
      EXPECT_GE(device.now(), done_at) << "complete before its work";
    }
    ASSERT_EQ(device.synchronize_event(event), Status::ok);
    EXPECT_GE(device.now(), done_at);
    EXPECT_EQ(device.query_event(event), Status::ok) << "incomplete after synchronising";

    const Event common = shared[i % 2];
    ASSERT_EQ(device.record_event(common, shared_stream), Status::ok);
    ASSERT_EQ(device.stream_wait_event(own, common), Status::ok);
    EXPECT_GE(device.stream_done_at(own), done_at) << "a wait moved the stream back";
    EXPECT_TRUE(is_answer(device.query_event(common)));

    Event temporary;
    ASSERT_EQ(device.create_event(&temporary), Status::ok);
    EXPECT_NE(temporary, destroyed) << "a destroyed handle came back";
    ASSERT_EQ(device.record_event(temporary, shared_stream), Status::ok);
    ASSERT_EQ(device.destroy_event(temporary), Status::ok);
    EXPECT_EQ(device.query_event(temporary), Status::invalid_argument);
    destroyed = temporary;

    const std::uint64_t now = device.now();
    EXPECT_GE(now, last_now) << "the clock went back";
    last_now = now;
  }
  ASSERT_EQ(device.destroy_event(event), Status::ok);
}

// SimDevice records, queries and waits without its lock (SimClock): several threads at once, on
// their own and shared events, while another advances the clock. Run under ThreadSanitizer in CI.
TEST(SimDeviceConcurrency, ThreadsRecordQueryAndWaitOnOwnAndSharedEvents) {
  SimDevice device;
  constexpr int kThreads = 4;
  const std::uint64_t rounds = iterations(5'000);
  const Stream shared_stream = device.create_stream();
  Event shared[2];
  for (Event& e : shared) ASSERT_EQ(device.create_event(&e), Status::ok);
  std::vector<Stream> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(device.create_stream());

  Barrier start(kThreads);
  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    while (!stop.load()) {
      device.advance(7);
      std::this_thread::yield();
    }
  });
  run_threads(kThreads, [&](int t) {
    drive_events(device, streams[static_cast<std::size_t>(t)], shared_stream, shared, rounds,
                 500 + static_cast<std::uint64_t>(t), start);
  });
  stop = true;
  ticker.join();

  ASSERT_EQ(device.synchronize_device(), Status::ok);
  for (Stream s : streams) EXPECT_TRUE(device.stream_idle(s));
  EXPECT_TRUE(device.stream_idle(shared_stream));
  for (Event e : shared) EXPECT_EQ(device.query_event(e), Status::ok);
  EXPECT_EQ(device.live_events(), 2u);
  // Every call of every thread is counted; the only failures are the destroyed events' queries.
  const SimCounters counters = device.counters();
  const std::uint64_t per_op = kThreads * rounds;
  EXPECT_EQ(counters.of(DeviceOp::record_event), 3 * per_op);
  EXPECT_EQ(counters.failed(DeviceOp::record_event), 0u);
  EXPECT_EQ(counters.of(DeviceOp::query_event), 4 * per_op + 2);
  EXPECT_EQ(counters.failed(DeviceOp::query_event), per_op);
  EXPECT_EQ(counters.of(DeviceOp::stream_wait_event), per_op);
  EXPECT_EQ(counters.of(DeviceOp::create_event), per_op + kThreads + 2);
  EXPECT_EQ(counters.of(DeviceOp::destroy_event), per_op + kThreads);
}

// Every thread counts its calls in a shard of its own while fewer than 16 threads hold one, the
// rest in a shared one; shards pass to new threads as threads exit. No count may be lost: waves
// of more threads than shards, each making a known number of calls.
TEST(SimDeviceConcurrency, CallCountsStayExactAsThreadsComeAndGo) {
  SimDevice device;
  Event event;
  ASSERT_EQ(device.create_event(&event), Status::ok);
  constexpr int kWaves = 3;
  constexpr int kThreads = 20;
  const std::uint64_t calls = iterations(500);
  for (int wave = 0; wave < kWaves; ++wave) {
    Barrier start(kThreads);
    run_threads(kThreads, [&](int) {
      start.wait();
      for (std::uint64_t i = 0; i < calls; ++i) {
        ASSERT_EQ(device.query_event(event), Status::ok);
        ASSERT_EQ(device.query_event(Event{}), Status::invalid_argument);
      }
    });
    const SimCounters counters = device.counters();
    const std::uint64_t expected = 2 * calls * kThreads * static_cast<std::uint64_t>(wave + 1);
    EXPECT_EQ(counters.of(DeviceOp::query_event), expected) << "wave " << wave;
    EXPECT_EQ(counters.failed(DeviceOp::query_event), expected / 2) << "wave " << wave;
  }
}

}  // namespace
}  // namespace cistern::testing
