// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The Allocator contract (cistern/allocator.hpp), written once as a GoogleTest typed suite and
// instantiated for every allocator: CachingAllocator under several option sets (the defaults,
// parking and exact peaks, a split limit with garbage collection), PassThroughAllocator (as
// make_allocator selects it for pass_through:True) and the torch emulation. Every step is followed
// by both checkers: the allocator's own `check()` and the interface-level `Allocator::check()`
// (snapshot against statistics).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "cistern/pass_through_allocator.hpp"
#include "cistern/sim_device.hpp"
#include "replay/torch_allocator.hpp"

namespace cistern::testing {
namespace {

// --- the allocators under test --------------------------------------------------------------------

template <const char* Conf>
struct Caching {
  static std::unique_ptr<Allocator> make(Device& device) {
    return std::make_unique<CachingAllocator>(device, Config::parse(Conf));
  }
  static constexpr bool kPassThrough = false;
};

constexpr char kDefaults[] = "";  // on SimDevice: the virtual-memory engine
constexpr char kClassic[] = "vmm:False";
constexpr char kEngineTight[] = "memory_limit_mb:256,release_threshold_mb:8";  // reclaim and trims
constexpr char kParkedExact[] = "park_small_blocks:True,exact_peaks:True";
constexpr char kSplitLimit[] = "max_split_size_mb:40,garbage_collection_threshold:0.5";
// What the plug-in, the CLI's nocache policy and CISTERN_NO_CACHING=1 get.
struct PassThrough {
  static std::unique_ptr<Allocator> make(Device& device) {
    std::unique_ptr<DeviceAllocator> made =
        make_allocator(device, Config::parse("pass_through:True"));
    EXPECT_NE(dynamic_cast<PassThroughAllocator*>(made.get()), nullptr);
    return made;
  }
  static constexpr bool kPassThrough = true;
};

struct Torch {
  static std::unique_ptr<Allocator> make(Device& device) {
    return std::make_unique<replay::TorchAllocator>(device, Config{});
  }
  static constexpr bool kPassThrough = false;
};

// --- the fixture ----------------------------------------------------------------------------------

template <class Maker>
class AllocatorContract : public ::testing::Test {
 protected:
  void SetUp() override {
    SimDeviceOptions options;
    options.capacity = 4 * GiB;
    device = std::make_unique<SimDevice>(options);
    alloc = Maker::make(*device);
    s1 = device->create_stream();
    s2 = device->create_stream();
  }
  void TearDown() override {
    for (const auto& [ptr, live] : live_) alloc->deallocate(ptr, live.stream);
    live_.clear();
    checked();
  }

  /// Both checkers; every test calls this after every step.
  void checked() const {
    alloc->check();
    alloc->Allocator::check();
  }

  void* allocate(std::size_t bytes, Stream stream) {
    void* p = alloc->allocate(bytes, stream);
    live_[p] = Live{bytes, stream};
    checked();
    return p;
  }
  void deallocate(void* p, Stream stream) {
    alloc->deallocate(p, stream);
    live_.erase(p);
    checked();
  }

  std::int64_t current(StatKind kind) const {
    return alloc->stats().get(kind, StatPool::all).current;
  }
  std::int64_t peak(StatKind kind) const { return alloc->stats().get(kind, StatPool::all).peak; }
  static std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  static bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
    return addr(a) < addr(b) + b_bytes && addr(b) < addr(a) + a_bytes;
  }

  struct Live {
    std::size_t bytes;
    Stream stream;
  };
  std::unique_ptr<SimDevice> device;
  std::unique_ptr<Allocator> alloc;
  Stream s1, s2;
  std::map<void*, Live> live_;
};

using Allocators =
    ::testing::Types<Caching<kDefaults>, Caching<kClassic>, Caching<kEngineTight>,
                     Caching<kParkedExact>, Caching<kSplitLimit>, PassThrough, Torch>;

class AllocatorNames {
 public:
  template <class T>
  static std::string GetName(int) {  // NOLINT(readability-identifier-naming): GoogleTest's name
    if constexpr (std::is_same_v<T, Caching<kDefaults>>) return "caching_defaults";
    if constexpr (std::is_same_v<T, Caching<kClassic>>) return "caching_classic";
    if constexpr (std::is_same_v<T, Caching<kEngineTight>>) return "caching_engine_limit";
    if constexpr (std::is_same_v<T, Caching<kParkedExact>>) return "caching_parked_exact_peaks";
    if constexpr (std::is_same_v<T, Caching<kSplitLimit>>) return "caching_split_limit_gc";
    if constexpr (std::is_same_v<T, PassThrough>) return "pass_through";
    return "torch";
  }
};

TYPED_TEST_SUITE(AllocatorContract, Allocators, AllocatorNames);

// --- alignment and sizes --------------------------------------------------------------------------

TYPED_TEST(AllocatorContract, ZeroBytesGiveNullAndNullFreesNothing) {
  EXPECT_EQ(this->alloc->allocate(0, this->s1), nullptr);
  this->alloc->deallocate(nullptr, this->s1);
  this->checked();
  EXPECT_EQ(this->current(StatKind::allocation), 0);
}

TYPED_TEST(AllocatorContract, EveryAllocationIs512ByteAlignedAndDisjoint) {
  const std::size_t sizes[] = {1,       511,         512,     513,      4097,     1 * MiB - 1,
                               1 * MiB, 1 * MiB + 1, 3 * MiB, 25 * MiB, 100 * MiB};
  for (std::size_t bytes : sizes) {
    void* p = this->allocate(bytes, this->s1);
    EXPECT_EQ(this->addr(p) % 512, 0u) << bytes;
  }
  for (const auto& [a, la] : this->live_) {
    for (const auto& [b, lb] : this->live_) {
      if (a != b) EXPECT_FALSE(this->overlap(a, la.bytes, b, lb.bytes)) << a << " and " << b;
    }
  }
}

// --- statistics -----------------------------------------------------------------------------------

// A fixed-seed random walk on one stream: counts, bytes and (one pool: exact) peaks agree with
// what is live, and everything is given back by empty_cache once nothing is.
TYPED_TEST(AllocatorContract, StatisticsFollowTheLiveAllocations) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<std::size_t> size(1, 4 * MiB);
  std::vector<void*> order;
  std::int64_t max_live = 0;
  for (int step = 0; step < 300; ++step) {
    if (order.empty() || rng() % 3 != 0) {
      order.push_back(this->allocate(size(rng), this->s1));
    } else {
      const std::size_t i = rng() % order.size();
      this->deallocate(order[i], this->s1);
      order.erase(order.begin() + static_cast<std::ptrdiff_t>(i));
    }
    max_live = std::max(max_live, static_cast<std::int64_t>(order.size()));
    std::size_t requested = 0;
    for (void* p : order) requested += this->live_.at(p).bytes;
    ASSERT_EQ(this->current(StatKind::allocation), static_cast<std::int64_t>(order.size()));
    ASSERT_GE(this->current(StatKind::allocated_bytes), static_cast<std::int64_t>(requested));
    ASSERT_EQ(this->current(StatKind::requested_bytes), static_cast<std::int64_t>(requested));
    ASSERT_LE(this->current(StatKind::allocated_bytes), this->current(StatKind::reserved_bytes));
    ASSERT_EQ(this->peak(StatKind::allocation), max_live);
  }
  for (void* p : order) this->deallocate(p, this->s1);
  this->alloc->empty_cache();
  this->checked();
  EXPECT_EQ(this->current(StatKind::allocated_bytes), 0);
  EXPECT_EQ(this->current(StatKind::reserved_bytes), 0);
  EXPECT_EQ(this->alloc->reserved_bytes(), 0u);
}

TYPED_TEST(AllocatorContract, ResetPeaksSetsThemToTheCurrentValues) {
  void* a = this->allocate(8 * MiB, this->s1);
  void* b = this->allocate(8 * MiB, this->s1);
  this->deallocate(a, this->s1);
  this->alloc->reset_peak_stats();
  this->checked();
  EXPECT_EQ(this->peak(StatKind::allocated_bytes), this->current(StatKind::allocated_bytes));
  EXPECT_EQ(this->peak(StatKind::allocation), 1);
  this->deallocate(b, this->s1);
  EXPECT_EQ(this->peak(StatKind::allocation), 1);
}

// --- stream semantics -----------------------------------------------------------------------------

// Memory freed on s1 while s1 still has work queued is not handed to s2 before that work ends.
TYPED_TEST(AllocatorContract, AFreeIsNotReusedByAnotherStreamBeforeItsWorkEnds) {
  void* a = this->allocate(2 * MiB, this->s1);
  this->device->launch(this->s1, 1000);
  const std::uint64_t busy_until = this->device->stream_done_at(this->s1);
  this->deallocate(a, this->s1);
  for (int i = 0; i < 4; ++i) {
    void* b = this->allocate(2 * MiB, this->s2);
    if (this->overlap(a, 2 * MiB, b, 2 * MiB)) {
      EXPECT_GE(this->device->now(), busy_until) << "s2 got s1's memory while s1's work ran";
    }
  }
}

// record_stream: a block used by s2 and freed on s1 waits for s2's work, even on s1.
TYPED_TEST(AllocatorContract, RecordStreamDelaysReuseUntilTheUsingStreamIsDone) {
  void* a = this->allocate(64 * KiB, this->s1);
  this->alloc->record_stream(a, this->s2);
  this->checked();
  this->device->launch(this->s2, 1000);
  const std::uint64_t busy_until = this->device->stream_done_at(this->s2);
  this->deallocate(a, this->s1);
  void* b = this->allocate(64 * KiB, this->s1);
  if (this->overlap(a, 64 * KiB, b, 64 * KiB)) {
    EXPECT_GE(this->device->now(), busy_until) << "reused while s2 still used it";
  }
  this->device->advance(2000);
  this->deallocate(b, this->s1);
}

// A block may be freed on another stream than the allocating one; it is reused afterwards.
TYPED_TEST(AllocatorContract, AFreeOnAnotherStreamIsAccepted) {
  void* a = this->allocate(4096, this->s1);
  this->deallocate(a, this->s2);
  this->device->synchronize_device();
  void* b = this->allocate(4096, this->s1);
  EXPECT_EQ(this->addr(b) % 512, 0u);
  EXPECT_EQ(this->current(StatKind::allocation), 1);
}

// --- misuse ---------------------------------------------------------------------------------------

// Each misuse throws InvalidPointer and leaves the allocator as it was.
TYPED_TEST(AllocatorContract, MisuseIsReportedAndChangesNothing) {
  void* a = this->allocate(4096, this->s1);
  const Stats before = this->alloc->stats();
  int foreign = 0;
  EXPECT_THROW(this->alloc->deallocate(&foreign, this->s1), InvalidPointer);
  EXPECT_THROW(this->alloc->record_stream(&foreign, this->s2), InvalidPointer);
  EXPECT_THROW(this->alloc->deallocate(static_cast<char*>(a) + 512, this->s1), InvalidPointer);
  this->checked();
  const Stats after = this->alloc->stats();
  EXPECT_EQ(after.get(StatKind::allocated_bytes, StatPool::all),
            before.get(StatKind::allocated_bytes, StatPool::all));
  this->deallocate(a, this->s1);
  EXPECT_THROW(this->alloc->deallocate(a, this->s1), InvalidPointer);  // double free
  this->checked();
  EXPECT_EQ(this->current(StatKind::allocation), 0);
}

TYPED_TEST(AllocatorContract, AnImpossibleRequestThrowsOutOfMemoryAndChangesNothing) {
  void* a = this->allocate(4096, this->s1);
  EXPECT_THROW(this->alloc->allocate(64 * GiB, this->s1), OutOfMemory);
  this->checked();
  EXPECT_EQ(this->current(StatKind::allocation), 1);
  this->deallocate(a, this->s1);
}

TYPED_TEST(AllocatorContract, EmptyCacheKeepsLiveAllocations) {
  void* a = this->allocate(3 * MiB, this->s1);
  void* b = this->allocate(30 * MiB, this->s1);
  this->deallocate(b, this->s1);
  this->alloc->empty_cache();
  this->checked();
  EXPECT_GE(this->current(StatKind::reserved_bytes), static_cast<std::int64_t>(3 * MiB));
  EXPECT_LT(this->current(StatKind::reserved_bytes), static_cast<std::int64_t>(30 * MiB));
  if (TypeParam::kPassThrough) {
    EXPECT_EQ(this->current(StatKind::reserved_bytes), this->current(StatKind::allocated_bytes));
  }
  this->deallocate(a, this->s1);
}

}  // namespace
}  // namespace cistern::testing
