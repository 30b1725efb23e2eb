// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The RAII API: DeviceBuffer, device_unique_ptr / make_device_unique, StreamScope and the
// default allocator.
#include <gtest/gtest.h>

#include <vector>

#include "allocator_fixture.hpp"
#include "cistern/device_buffer.hpp"
#include "cistern/errors.hpp"
#include "cistern/stream_scope.hpp"

namespace cistern::testing {
namespace {

using RaiiTest = AllocatorTest;

TEST_F(RaiiTest, DeviceBufferFreesOnItsStreamWhenDestroyed) {
  const Stream s = device->create_stream();
  {
    DeviceBuffer buf(1000, s, *alloc);
    EXPECT_FALSE(buf.empty());
    EXPECT_EQ(buf.size(), 1000u);
    EXPECT_EQ(buf.stream(), s);
    EXPECT_EQ(buf.allocator(), alloc.get());
    EXPECT_EQ(allocated(), 1024);
    EXPECT_EQ(alloc->allocation_size(buf.data()), 1024u);
  }
  EXPECT_EQ(allocated(), 0);
  EXPECT_EQ(stat(StatKind::active), 0);  // freed on its own stream: cached at once
}

TEST_F(RaiiTest, DeviceBufferMovesOwnership) {
  DeviceBuffer a(4096, default_stream, *alloc);
  void* p = a.data();
  DeviceBuffer b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(b.data(), p);
  DeviceBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(stat(StatKind::allocation), 1);
  c = DeviceBuffer(512, default_stream, *alloc);  // the old memory is freed
  EXPECT_EQ(stat(StatKind::allocation), 1);
  EXPECT_EQ(allocated(), 512);
  std::vector<DeviceBuffer> many;
  for (int i = 0; i < 10; ++i) many.emplace_back(100, default_stream, *alloc);
  EXPECT_EQ(stat(StatKind::allocation), 11);
  many.clear();
  c.reset();
  EXPECT_EQ(stat(StatKind::allocation), 0);
}

TEST_F(RaiiTest, ReleaseHandsTheMemoryToTheCaller) {
  DeviceBuffer a(4096, default_stream, *alloc);
  void* p = a.release();
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(stat(StatKind::allocation), 1);
  alloc->deallocate(p, default_stream);
}

TEST_F(RaiiTest, SetStreamMakesTheFreeWaitForTheNewStream) {
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  DeviceBuffer buf(4096, s1, *alloc);
  buf.set_stream(s2);
  device->launch(s2, 100);
  buf.reset();
  EXPECT_EQ(stat(StatKind::active), 1);  // pending until s2's work completes
  device->advance(100);
  void* again = alloc->allocate(4096, s1);
  EXPECT_EQ(stat(StatKind::active), 1);  // the pending block was cached and reused
  alloc->deallocate(again, s1);
}

struct Pod {
  float x, y, z;
};

TEST_F(RaiiTest, MakeDeviceUniqueAllocatesTypedMemory) {
  const Stream s = device->create_stream();
  {
    auto one = make_device_unique<Pod>(*alloc, s);
    auto many = make_device_unique<double[]>(1000, *alloc, s);
    EXPECT_NE(one.get(), nullptr);
    EXPECT_EQ(alloc->allocation_size(one.get()), 512u);
    EXPECT_EQ(alloc->allocation_size(many.get()), 8192u);
    EXPECT_EQ(many.get_deleter().stream, s);
    EXPECT_EQ(stat(StatKind::allocation), 2);
  }
  EXPECT_EQ(stat(StatKind::allocation), 0);
  EXPECT_THROW(make_device_unique<double[]>(SIZE_MAX / 4, *alloc, s), InvalidArgument);
}

TEST_F(RaiiTest, ScopesSetTheCurrentStreamAndTheDefaultAllocator) {
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  EXPECT_EQ(current_stream(), default_stream);
  EXPECT_THROW(DeviceBuffer{64}, InvalidArgument);  // no default allocator yet
  {
    AllocatorScope use(*alloc);
    StreamScope outer(s1);
    DeviceBuffer a(64);
    EXPECT_EQ(a.stream(), s1);
    {
      StreamScope inner(s2);
      EXPECT_EQ(current_stream(), s2);
      auto b = make_device_unique<int[]>(16, *alloc);
      EXPECT_EQ(b.get_deleter().stream, s2);
    }
    EXPECT_EQ(current_stream(), s1);
  }
  EXPECT_EQ(current_stream(), default_stream);
  EXPECT_EQ(default_allocator(), nullptr);
  EXPECT_EQ(stat(StatKind::allocation), 0);
}

TEST_F(RaiiTest, AFailingFreeInADestructorIsReportedNotThrown) {
  auto* stray = new DeviceBuffer(4096, default_stream, *alloc);
  void* p = stray->data();
  alloc->deallocate(p, default_stream);  // freed behind the buffer's back
  ::testing::internal::CaptureStderr();
  delete stray;  // must not throw or crash
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("double free"), std::string::npos) << err;
}

}  // namespace
}  // namespace cistern::testing
