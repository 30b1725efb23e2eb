// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// cistern::cccl::memory_resource against the CCCL the CUDA toolkit installs: the concepts are
// checked at compile time, then the adaptor runs on the simulated device (no GPU: a
// cuda::stream_ref only carries the handle, which SimDevice understands).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cistern/caching_allocator.hpp"
#include "cistern/cccl_resource.hpp"
#include "cistern/sim_device.hpp"

namespace {

using Resource = cistern::cccl::memory_resource;

// The installed CCCL's concepts.
#if CCCL_MAJOR_VERSION * 1000 + CCCL_MINOR_VERSION >= 3001
static_assert(cuda::mr::synchronous_resource<Resource>, "cuda::mr::synchronous_resource");
static_assert(cuda::mr::resource<Resource>, "cuda::mr::resource (stream-ordered)");
static_assert(cuda::mr::synchronous_resource_with<Resource, cuda::mr::device_accessible>,
              "cuda::mr::synchronous_resource_with<device_accessible>");
#else
static_assert(cuda::mr::resource<Resource>, "cuda::mr::resource");
static_assert(cuda::mr::async_resource<Resource>, "cuda::mr::async_resource");
static_assert(cuda::mr::async_resource_with<Resource, cuda::mr::device_accessible>,
              "cuda::mr::async_resource_with<device_accessible>");
#endif
static_assert(cuda::mr::resource_with<Resource, cuda::mr::device_accessible>,
              "cuda::mr::resource_with<device_accessible>");
static_assert(!cuda::mr::resource_with<Resource, cuda::mr::host_accessible>,
              "device memory is not host accessible");

// Both generations' members by signature, whichever CCCL is installed: CCCL 3.0's allocate /
// deallocate (synchronous) and _async forms, CCCL 3.1's allocate_sync / deallocate_sync and the
// stream-first allocate / deallocate.
template <typename... Args>
using allocate_t = decltype(std::declval<Resource&>().allocate(std::declval<Args>()...));
template <typename... Args>
using deallocate_t = decltype(std::declval<Resource&>().deallocate(std::declval<Args>()...));
using std::size_t;
using StreamRef = cuda::stream_ref;
static_assert(std::is_same_v<allocate_t<size_t, size_t>, void*>);
static_assert(std::is_same_v<deallocate_t<void*, size_t, size_t>, void>);
static_assert(std::is_same_v<allocate_t<StreamRef, size_t, size_t>, void*>);
static_assert(std::is_same_v<deallocate_t<StreamRef, void*, size_t, size_t>, void>);
static_assert(std::is_same_v<decltype(std::declval<Resource&>().allocate_async(
                                 size_t{}, size_t{}, std::declval<StreamRef>())),
                             void*>);
static_assert(std::is_same_v<decltype(std::declval<Resource&>().deallocate_async(
                                 nullptr, size_t{}, size_t{}, std::declval<StreamRef>())),
                             void>);
static_assert(
    std::is_same_v<decltype(std::declval<Resource&>().allocate_sync(size_t{}, size_t{})), void*>);
static_assert(
    std::is_same_v<decltype(std::declval<Resource&>().deallocate_sync(nullptr, size_t{}, size_t{})),
                   void>);

cuda::stream_ref ref(cistern::Stream stream) {
  return cuda::stream_ref(stream.native<CUstream_st>());
}

TEST(CcclResource, AllocatesThroughCisternOnStreams) {
  cistern::SimDevice device;
  cistern::CachingAllocator allocator(device, cistern::Config{});
  Resource resource(allocator);
  const cistern::Stream stream = device.create_stream();

  void* p = resource.allocate_async(1000, 256, ref(stream));
  EXPECT_EQ(
      allocator.stats().get(cistern::StatKind::allocated_bytes, cistern::StatPool::all).current,
      1024);
  resource.deallocate_async(p, 1000, 256, ref(stream));
  EXPECT_EQ(resource.allocate_async(1000, ref(stream)), p);  // same stream: reused at once
  resource.deallocate_async(p, 1000, ref(stream));

  void* q = resource.allocate(4096);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(q) % 512, 0u);
  resource.deallocate(q, 4096);
  EXPECT_EQ(allocator.allocated_bytes(), 0u);
  allocator.check();
}

TEST(CcclResource, StreamFirstFormsAllocateOnTheirStream) {
  cistern::SimDevice device;
  cistern::CachingAllocator allocator(device, cistern::Config{});
  Resource resource(allocator);
  const cistern::Stream stream = device.create_stream();

  void* p = resource.allocate(ref(stream), 1000, 256);
  ASSERT_EQ(allocator.snapshot().segments.size(), 1u);
  EXPECT_EQ(allocator.snapshot().segments[0].stream, stream);  // the stream's pool
  EXPECT_EQ(allocator.allocated_bytes(), 1024u);
  resource.deallocate(ref(stream), p, 1000, 256);
  EXPECT_EQ(resource.allocate(ref(stream), 1000), p);  // same stream: reused at once
  resource.deallocate(ref(stream), p, 1000);
  EXPECT_THROW(resource.allocate(ref(stream), 512, 1024), cistern::InvalidArgument);

  // The _sync forms are the legacy default stream's.
  void* q = resource.allocate_sync(4096, 512);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(q) % 512, 0u);
  EXPECT_EQ(allocator.snapshot().segments.size(), 2u);
  bool on_default = false;
  for (const cistern::SegmentInfo& segment : allocator.snapshot().segments)
    on_default |= segment.stream == cistern::default_stream && segment.allocated_size == 4096;
  EXPECT_TRUE(on_default);
  resource.deallocate_sync(q, 4096);
  EXPECT_THROW(resource.allocate_sync(512, 3), cistern::InvalidArgument);
  EXPECT_EQ(allocator.allocated_bytes(), 0u);
  allocator.check();
}

TEST(CcclResource, EqualityAndErrors) {
  cistern::SimDeviceOptions small;
  small.capacity = 64 * cistern::MiB;
  cistern::SimDevice device(small);
  cistern::CachingAllocator a(device, cistern::Config{}), b(device, cistern::Config{});
  EXPECT_TRUE(Resource(a) == Resource(a));
  EXPECT_TRUE(Resource(a) != Resource(b));
  Resource resource(a);
#if CCCL_MAJOR_VERSION * 1000 + CCCL_MINOR_VERSION < 3001
  // Type-erased, as CCCL 3.0 code holds resources.
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> erased(resource);
  void* p = erased.allocate_async(512, 512, ref(cistern::default_stream));
  erased.deallocate_async(p, 512, 512, ref(cistern::default_stream));
#endif

  EXPECT_THROW(resource.allocate(512, 1024), cistern::InvalidArgument);
  EXPECT_THROW(resource.allocate(512, 3), cistern::InvalidArgument);
  EXPECT_THROW(resource.allocate(cistern::GiB), cistern::OutOfMemory);
  int local = 0;
  EXPECT_THROW(resource.deallocate(&local, 4), cistern::InvalidPointer);
  EXPECT_EQ(a.allocated_bytes(), 0u);
  a.check();
}

}  // namespace
