// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// cistern::cccl::memory_resource against the CCCL the CUDA toolkit installs: the concepts are
// checked at compile time, then the adaptor runs on the simulated device (no GPU: a
// cuda::stream_ref only carries the handle, which SimDevice understands).
#include <gtest/gtest.h>

#include "cistern/caching_allocator.hpp"
#include "cistern/cccl_resource.hpp"
#include "cistern/sim_device.hpp"

namespace {

using Resource = cistern::cccl::memory_resource;

static_assert(cuda::mr::resource<Resource>, "cuda::mr::resource");
static_assert(cuda::mr::async_resource<Resource>, "cuda::mr::async_resource");
static_assert(cuda::mr::resource_with<Resource, cuda::mr::device_accessible>,
              "cuda::mr::resource_with<device_accessible>");
static_assert(cuda::mr::async_resource_with<Resource, cuda::mr::device_accessible>,
              "cuda::mr::async_resource_with<device_accessible>");
static_assert(!cuda::mr::resource_with<Resource, cuda::mr::host_accessible>,
              "device memory is not host accessible");

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

TEST(CcclResource, EqualityAndErrors) {
  cistern::SimDeviceOptions small;
  small.capacity = 64 * cistern::MiB;
  cistern::SimDevice device(small);
  cistern::CachingAllocator a(device, cistern::Config{}), b(device, cistern::Config{});
  EXPECT_TRUE(Resource(a) == Resource(a));
  EXPECT_TRUE(Resource(a) != Resource(b));
  // Type-erased, as CCCL code holds resources.
  Resource resource(a);
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> erased(resource);
  void* p = erased.allocate_async(512, 512, ref(cistern::default_stream));
  erased.deallocate_async(p, 512, 512, ref(cistern::default_stream));

  EXPECT_THROW(resource.allocate(512, 1024), cistern::InvalidArgument);
  EXPECT_THROW(resource.allocate(512, 3), cistern::InvalidArgument);
  EXPECT_THROW(resource.allocate(cistern::GiB), cistern::OutOfMemory);
  int local = 0;
  EXPECT_THROW(resource.deallocate(&local, 4), cistern::InvalidPointer);
  EXPECT_EQ(a.allocated_bytes(), 0u);
  a.check();
}

}  // namespace
