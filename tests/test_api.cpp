// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The public API's safety rules (issue 11): which types make a Stream, options passed explicitly
// rather than read from the environment behind the caller's back, and the per-device default
// allocators beside the process-wide scoped one.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <type_traits>
#include <utility>

#include "cistern/caching_allocator.hpp"
#include "cistern/device_buffer.hpp"
#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"
#include "cistern/stream_scope.hpp"

namespace cistern::testing {
namespace {

// A cudaStream_t converts (CUDA code passes its streams directly); no other pointer does.
static_assert(std::is_convertible_v<CUstream_st*, Stream>);
static_assert(!std::is_convertible_v<float*, Stream>);
static_assert(!std::is_constructible_v<Stream, float*>);
static_assert(!std::is_constructible_v<Stream, void*>);
static_assert(!std::is_constructible_v<Stream, const char*>);
// A raw handle makes a stream only when asked to.
static_assert(std::is_constructible_v<Stream, std::uintptr_t>);
static_assert(!std::is_convertible_v<std::uintptr_t, Stream>);

TEST(Api, AStreamKeepsTheCudaHandle) {
  auto* native = reinterpret_cast<CUstream_st*>(std::uintptr_t{0x1000});
  const Stream s = native;
  EXPECT_EQ(s.handle, 0x1000u);
  EXPECT_EQ(s.native<CUstream_st>(), native);
  EXPECT_EQ(Stream(static_cast<CUstream_st*>(nullptr)), default_stream);
}

// Restores an environment variable on scope exit.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedVariable() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(Api, TheConstructorDoesNotReadTheEnvironment) {
  ScopedVariable conf("CISTERN_ALLOC_CONF", "no_such_option:1,max_split_size_mb:1");
  SimDevice device;
  CachingAllocator alloc(device);  // a variable the caller never set cannot make this throw
  EXPECT_EQ(alloc.config().to_string(), Config().to_string());
  EXPECT_THROW(Config::from_env(), ConfigError);  // those who want it ask for it
}

TEST(Api, CheckIsPartOfTheAllocatorInterface) {
  SimDevice device;
  CachingAllocator caching(device);
  Allocator& generic = caching;
  void* p = generic.allocate(3 * MiB, default_stream);
  generic.check();
  generic.Allocator::check();
  generic.deallocate(p, default_stream);
  generic.check();
}

TEST(Api, BaseAllocationNamesTheSegmentOfAnyStreamsBlock) {
  SimDevice device;
  CachingAllocator alloc(device, Config::parse("vmm:False"));  // classic segments: exact sizes
  const Stream s1 = device.create_stream();
  const Stream s2 = device.create_stream();
  void* a = alloc.allocate(3 * MiB, s1);
  void* b = alloc.allocate(3 * MiB, s1);  // the same segment, after a
  void* c = alloc.allocate(4096, s2);
  const auto [base, size] = alloc.base_allocation(b);
  EXPECT_EQ(alloc.base_allocation(a), std::make_pair(base, size));
  EXPECT_EQ(base, a);
  EXPECT_EQ(size, alloc.snapshot().segments.front().total_size);
  const auto [small_base, small_size] = alloc.base_allocation(c);
  EXPECT_EQ(small_size, 2 * MiB);  // the small pool's segment
  EXPECT_LE(reinterpret_cast<std::uintptr_t>(small_base), reinterpret_cast<std::uintptr_t>(c));
  int foreign = 0;
  EXPECT_THROW(alloc.base_allocation(&foreign), InvalidPointer);
  alloc.deallocate(c, s1);  // a free on another stream than the allocating one
  EXPECT_THROW(alloc.base_allocation(c), InvalidPointer);
  alloc.deallocate(a, s1);
  alloc.deallocate(b, s2);
  alloc.check();
}

TEST(Api, RequestedSizeIsTheCallersSizeWhileLive) {
  SimDevice device;
  CachingAllocator alloc(device);
  const Stream s1 = device.create_stream();
  const Stream s2 = device.create_stream();
  void* a = alloc.allocate(1000, s1);  // rounded to 1024
  void* b = alloc.allocate(3 * MiB + 1, s2);
  EXPECT_EQ(alloc.requested_size(a), std::optional<std::size_t>(1000));
  EXPECT_EQ(alloc.requested_size(b), std::optional<std::size_t>(3 * MiB + 1));
  EXPECT_EQ(alloc.allocation_size(a), 1024u);
  EXPECT_EQ(alloc.requested_size(static_cast<char*>(a) + 512), std::nullopt);  // interior
  int foreign = 0;
  EXPECT_EQ(alloc.requested_size(&foreign), std::nullopt);
  alloc.deallocate(a, s2);  // on another stream: pending, no longer live
  EXPECT_EQ(alloc.requested_size(a), std::nullopt);
  alloc.deallocate(b, s2);
  EXPECT_EQ(alloc.requested_size(b), std::nullopt);
  alloc.check();
}

TEST(Api, EachDeviceHasItsOwnDefaultAllocator) {
  SimDevice device0;
  SimDevice device1;
  CachingAllocator alloc0(device0);
  CachingAllocator alloc1(device1);
  EXPECT_EQ(set_per_device_allocator(0, &alloc0), nullptr);
  EXPECT_EQ(set_per_device_allocator(1, &alloc1), nullptr);
  EXPECT_EQ(current_device(), 0);
  EXPECT_EQ(default_allocator(), &alloc0);
  {
    DeviceScope on(1);
    EXPECT_EQ(current_device(), 1);
    EXPECT_EQ(default_allocator(), &alloc1);
    DeviceBuffer buffer(4096);
    EXPECT_EQ(alloc1.stats().get(StatKind::allocation, StatPool::all).current, 1);
    EXPECT_EQ(alloc0.stats().get(StatKind::allocation, StatPool::all).current, 0);
    {
      AllocatorScope scoped(alloc0);  // the process-wide scoped default takes precedence
      EXPECT_EQ(default_allocator(), &alloc0);
    }
    EXPECT_EQ(default_allocator(), &alloc1);
  }
  EXPECT_EQ(current_device(), 0);
  EXPECT_EQ(set_per_device_allocator(0, nullptr), &alloc0);
  EXPECT_EQ(set_per_device_allocator(1, nullptr), &alloc1);
  EXPECT_EQ(default_allocator(), nullptr);
}

TEST(Api, PerDeviceOrdinalsAreChecked) {
  EXPECT_THROW(set_per_device_allocator(-1, nullptr), InvalidArgument);
  EXPECT_THROW(set_per_device_allocator(kMaxDefaultDevices, nullptr), InvalidArgument);
  EXPECT_EQ(per_device_allocator(kMaxDefaultDevices), nullptr);
  DeviceScope on(7);
  EXPECT_THROW(DeviceBuffer(4096), InvalidArgument);  // nothing set for device 7
}

}  // namespace
}  // namespace cistern::testing
