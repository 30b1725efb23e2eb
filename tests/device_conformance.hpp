// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The device conformance suite: the semantics of include/cistern/device.hpp, written once against
// the `cistern::Device` interface and instantiated for every backend.
//
// A backend is plugged in through a factory trait:
//
//   struct MyFactory {
//     static bool available();                                   // false: every test is skipped
//     static std::unique_ptr<cistern::Device> make();
//     static cistern::Stream make_stream(cistern::Device&);      // streams are not in the contract
//     static void destroy_stream(cistern::Device&, cistern::Stream);
//     // Makes the next call of `op` fail inside the backend (as the driver would); false where
//     // the backend cannot inject failures (a real GPU): the failure tests skip themselves.
//     static bool fail_next(cistern::Device&, cistern::DeviceOp op);
//     // How many granules the free-memory figure may move on its own between two reads: 0 where
//     // the backend's accounting is exact (simulated, fake driver), more on a real GPU.
//     static constexpr std::size_t kFreeMemoryDriftGranules = 0;
//   };
//   namespace cistern::conformance {  // the instantiation must name the suite unqualified
//   INSTANTIATE_TYPED_TEST_SUITE_P(My, DeviceConformance, ::testing::Types<MyFactory>);
//   }
//
// Every expectation here must also hold on a real GPU, because the CUDA backends run the same
// suite: no exact addresses, no exact free-memory figures beyond "drops by at least" and "comes
// back" (each within the backend's drift), no simulated time. Sizes stay small so that a shared
// GPU can run it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "cistern/device.hpp"

namespace cistern::conformance {

/// The fixture: one fresh device per test, or a skip when the backend is not available here.
template <class Factory>
class DeviceConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Factory::available()) GTEST_SKIP() << "backend not available on this machine";
    device_ = Factory::make();
    ASSERT_NE(device_, nullptr);
  }

  void TearDown() override {
    for (Stream stream : streams_) Factory::destroy_stream(*device_, stream);
  }

  Device& device() { return *device_; }
  std::size_t granule() { return device_->granularity(); }

  /// A stream made by the factory, destroyed after the test.
  Stream new_stream() {
    streams_.push_back(Factory::make_stream(*device_));
    return streams_.back();
  }

  MemoryInfo memory() {
    MemoryInfo info;
    EXPECT_EQ(device_->memory_info(&info), Status::ok) << device_->last_error();
    return info;
  }

  void* allocate(std::size_t bytes) {
    void* ptr = nullptr;
    EXPECT_EQ(device_->allocate(bytes, &ptr), Status::ok) << device_->last_error();
    EXPECT_NE(ptr, nullptr);
    return ptr;
  }

  void* reserve(std::size_t bytes) {
    void* va = nullptr;
    EXPECT_EQ(device_->reserve(bytes, 0, &va), Status::ok) << device_->last_error();
    return va;
  }

  PhysicalHandle create_physical(std::size_t bytes) {
    PhysicalHandle handle;
    EXPECT_EQ(device_->create_physical(bytes, &handle), Status::ok) << device_->last_error();
    return handle;
  }

  Event create_event() {
    Event event;
    EXPECT_EQ(device_->create_event(&event), Status::ok) << device_->last_error();
    return event;
  }

  /// Whether the backend lacks virtual memory (the VMM tests skip themselves then).
  bool lacks_virtual_memory() { return !device_->supports_virtual_memory(); }

  /// Makes the next call of `op` fail; false where the backend cannot inject failures.
  bool fail_next(DeviceOp op) { return Factory::fail_next(*device_, op); }

  /// How far the free figure may move on its own between two reads (see the factory).
  std::size_t drift() { return Factory::kFreeMemoryDriftGranules * granule(); }

  /// Expects free memory to be at least `bytes` below `before`, give or take the drift.
  void expect_taken(const MemoryInfo& before, std::size_t bytes, const char* when) {
    const MemoryInfo now = memory();
    EXPECT_LE(now.free + bytes, before.free + drift())
        << when << ": free memory must drop by at least " << bytes << " (drift allowed " << drift()
        << ")";
  }

  /// Expects free memory to be back at `before`, give or take the drift.
  void expect_returned(const MemoryInfo& before, const char* when) {
    const MemoryInfo now = memory();
    const std::size_t apart =
        now.free > before.free ? now.free - before.free : before.free - now.free;
    EXPECT_LE(apart, drift()) << when << ": free memory " << now.free << " is not back at "
                              << before.free << " (drift allowed " << drift() << ")";
  }

  /// `bytes` rounded up to whole granules.
  std::size_t granules_for(std::size_t bytes) {
    return (bytes + granule() - 1) / granule() * granule();
  }

 private:
  std::unique_ptr<Device> device_;
  std::vector<Stream> streams_;
};

TYPED_TEST_SUITE_P(DeviceConformance);

inline std::uintptr_t address(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

inline char* bytes_at(void* ptr, std::size_t offset) { return static_cast<char*>(ptr) + offset; }

// --- description ---------------------------------------------------------------------------------

TYPED_TEST_P(DeviceConformance, DescribesItself) {
  EXPECT_GE(this->device().index(), 0);
  EXPECT_FALSE(this->device().name().empty());
}

TYPED_TEST_P(DeviceConformance, GranularityIsAPowerOfTwo) {
  const std::size_t granule = this->granule();
  EXPECT_GE(granule, 256u);
  EXPECT_EQ(granule & (granule - 1), 0u) << granule;
}

TYPED_TEST_P(DeviceConformance, MemoryInfoReportsFreeWithinTotal) {
  const MemoryInfo info = this->memory();
  EXPECT_GT(info.total, 0u);
  EXPECT_LE(info.free, info.total);
}

// --- segments ------------------------------------------------------------------------------------

TYPED_TEST_P(DeviceConformance, AllocateAlignsToAtLeast256Bytes) {
  const std::size_t sizes[] = {1, 255, 256, 257, 4096, this->granule() + 1, 3 * this->granule()};
  std::vector<void*> segments;
  for (std::size_t bytes : sizes) {
    void* ptr = this->allocate(bytes);
    EXPECT_EQ(address(ptr) % 256, 0u) << "allocate(" << bytes << ") gave " << ptr;
    segments.push_back(ptr);
  }
  for (void* ptr : segments) EXPECT_EQ(this->device().deallocate(ptr), Status::ok);
}

TYPED_TEST_P(DeviceConformance, LiveSegmentsNeverOverlap) {
  const std::size_t sizes[] = {
      1, 1000, this->granule(), this->granule() + 512, 2 * this->granule(), 64 * 1024, 3};
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> live;
  for (std::size_t bytes : sizes) {
    const std::uintptr_t start = address(this->allocate(bytes));
    live.emplace_back(start, start + bytes);
  }
  std::sort(live.begin(), live.end());
  for (std::size_t i = 1; i < live.size(); ++i) {
    EXPECT_LE(live[i - 1].second, live[i].first)
        << "segment " << i - 1 << " overlaps segment " << i;
  }
  for (const auto& segment : live) {
    EXPECT_EQ(this->device().deallocate(reinterpret_cast<void*>(segment.first)), Status::ok);
  }
}

TYPED_TEST_P(DeviceConformance, FreeMemoryDropsOnAllocateAndReturnsOnDeallocate) {
  const std::size_t bytes = 4 * this->granule();
  const MemoryInfo before = this->memory();
  void* ptr = this->allocate(bytes);
  const MemoryInfo during = this->memory();
  EXPECT_EQ(during.total, before.total);
  EXPECT_LE(during.free + bytes, before.free) << "free memory must drop by at least the size";
  ASSERT_EQ(this->device().deallocate(ptr), Status::ok) << this->device().last_error();
  this->expect_returned(before, "after the deallocation");
}

TYPED_TEST_P(DeviceConformance, TooLargeAllocationIsOutOfMemoryAndLeavesNothingBehind) {
  const MemoryInfo before = this->memory();
  void* ptr = nullptr;
  EXPECT_EQ(this->device().allocate(2 * before.total + this->granule(), &ptr),
            Status::out_of_memory);
  EXPECT_FALSE(this->device().last_error().empty());
  // Nothing taken: free memory is back where it was, within the drift that a real driver's figure
  // shows between two reads (on an H200 it grew by 2 MiB between two reads with no call between
  // them), which an allocation that leaked even one granule on the simulated and fake devices
  // (drift 0) would still fail. The drift is the factory's: 0 there, 2 granules on a real GPU.
  this->expect_returned(before, "after the refused allocation");
  EXPECT_EQ(this->memory().total, before.total);
  // The device is still usable after the failure.
  void* small = this->allocate(1);
  EXPECT_EQ(this->device().deallocate(small), Status::ok);
}

TYPED_TEST_P(DeviceConformance, DeallocateOfABadPointerIsInvalidAndChangesNothing) {
  void* ptr = this->allocate(2 * this->granule());
  const MemoryInfo before = this->memory();
  EXPECT_EQ(this->device().deallocate(bytes_at(ptr, this->granule())), Status::invalid_argument);
  EXPECT_FALSE(this->device().last_error().empty());
  EXPECT_EQ(this->memory().free, before.free);
  // The segment itself is untouched and can still be returned, exactly once.
  EXPECT_EQ(this->device().deallocate(ptr), Status::ok) << this->device().last_error();
}

// --- virtual memory ------------------------------------------------------------------------------

TYPED_TEST_P(DeviceConformance, VirtualMemoryRoundTrip) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const MemoryInfo before = this->memory();

  void* va = this->reserve(4 * granule);
  EXPECT_EQ(address(va) % granule, 0u);
  const PhysicalHandle low = this->create_physical(2 * granule);
  const PhysicalHandle high = this->create_physical(2 * granule);
  this->expect_taken(before, 4 * granule, "two handles of two granules");

  ASSERT_EQ(device.map(va, low), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(bytes_at(va, 2 * granule), high), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, 2 * granule), 2 * granule), Status::ok)
      << device.last_error();
  EXPECT_EQ(device.release_physical(low), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(high), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok) << device.last_error();
  this->expect_returned(before, "after the round trip");
}

TYPED_TEST_P(DeviceConformance, CreatedHandleKnowsItsSize) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  for (const std::size_t bytes : {granule, 3 * granule}) {
    const PhysicalHandle handle = this->create_physical(bytes);
    EXPECT_EQ(handle.bytes, bytes);
    EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  }
}

TYPED_TEST_P(DeviceConformance, MapOfAHandleClaimingMoreThanItsSizeIsInvalid) {
  // The contract's own check: a handle whose `bytes` exceeds what was created is not one the
  // device handed out.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(4 * granule);
  const PhysicalHandle handle = this->create_physical(2 * granule);
  PhysicalHandle larger = handle;
  larger.bytes = 4 * granule;
  EXPECT_EQ(device.map(va, larger), Status::invalid_argument);
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::invalid_argument) << "the refused map mapped";
  EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, ReleasingAReservationWithMappingsIsInvalid) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(2 * granule);
  const PhysicalHandle handle = this->create_physical(granule);
  ASSERT_EQ(device.map(va, handle), Status::ok) << device.last_error();

  EXPECT_EQ(device.release_reservation(va, 2 * granule), Status::invalid_argument);
  EXPECT_FALSE(device.last_error().empty());
  // The failed release changed nothing: the mapping and the reservation are still there.
  EXPECT_EQ(device.unmap(va, granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 2 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, ReservesLargeRangesThatNeverOverlapAndTakeNoMemory) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const MemoryInfo before = this->memory();
  // As PyTorch does per pool: 9/8 of the device's memory, so that one range never runs out.
  const std::size_t large = this->granules_for(before.total / 8 * 9);
  const std::size_t aligned = 16 * granule;
  void* first = this->reserve(large);
  void* second = nullptr;
  ASSERT_EQ(device.reserve(large, aligned, &second), Status::ok) << device.last_error();
  EXPECT_EQ(address(first) % granule, 0u);
  EXPECT_EQ(address(second) % aligned, 0u) << "alignment " << aligned << " not honoured";
  EXPECT_TRUE(address(first) + large <= address(second) ||
              address(second) + large <= address(first))
      << "the reservations overlap";
  this->expect_returned(before, "address space must not take device memory");
  EXPECT_EQ(device.release_reservation(first, large), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(second, large), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, CreatesPhysicalHandlesOfSeveralSizes) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const MemoryInfo before = this->memory();
  const std::size_t sizes[] = {granule, 10 * granule, 3 * granule};
  std::vector<PhysicalHandle> handles;
  std::size_t total = 0;
  for (std::size_t bytes : sizes) {
    handles.push_back(this->create_physical(bytes));
    total += bytes;
    this->expect_taken(before, total, "after a handle");
  }
  for (std::size_t i = 0; i < handles.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(handles[i].handle, handles[j].handle);
  }
  for (const PhysicalHandle handle : handles) {
    EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  }
  this->expect_returned(before, "after the releases");
  EXPECT_EQ(device.release_physical(handles[0]), Status::invalid_argument) << "released twice";
}

// --- the CUDA driver's rules ------------------------------------------------------------------------
//
// One test per rule of what cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease and
// cuMemAddressFree accept, as measured on an H200 (../shared/reference/vmm-and-planning.md,
// section 4) or documented by NVIDIA. Every backend runs them - SimDevice, the fake driver, the
// real CudaVmmDevice - so that a device that accepts what the driver refuses shows at once. They
// share the prefix DriverRule: scripts/gpu-check.sh runs them first
// (--gtest_filter='*DriverRule*'). A map at an offset into a handle (CUDA_ERROR_NOT_SUPPORTED on
// the driver) cannot be expressed in the contract, which maps handles only whole; the fake driver's
// own tests cover that call.

TYPED_TEST_P(DeviceConformance, DriverRuleMapOfAWholeHandleAtOffsetZeroSucceeds) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const MemoryInfo before = this->memory();
  void* va = this->reserve(4 * granule);
  const PhysicalHandle big = this->create_physical(3 * granule);
  const PhysicalHandle small = this->create_physical(granule);
  ASSERT_EQ(device.map(va, big), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(bytes_at(va, 3 * granule), small), Status::ok) << device.last_error();
  this->expect_taken(before, 4 * granule, "two handles mapped");
  // Each is one mapping, of the handle's size.
  EXPECT_EQ(device.unmap(va, 3 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, 3 * granule), granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(big), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(small), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok) << device.last_error();
  this->expect_returned(before, "all released");
}

TYPED_TEST_P(DeviceConformance, DriverRuleMapOfPartOfAHandleIsNotSupportedAndMapsNothing) {
  // cuMemMap of 8 of a 16 MiB handle returned CUDA_ERROR_NOT_SUPPORTED on the H200.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(8 * granule);
  const PhysicalHandle whole = this->create_physical(4 * granule);
  const PhysicalHandle other = this->create_physical(granule);
  PhysicalHandle half = whole;
  half.bytes = 2 * granule;
  EXPECT_EQ(device.map(va, half), Status::not_supported);
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::invalid_argument) << "the refused map mapped";
  // In a run, the part refuses the whole run: the whole handle before it is not left mapped.
  const PhysicalHandle run[] = {other, half};
  EXPECT_EQ(device.map_run(va, run, 2), Status::not_supported);
  EXPECT_EQ(device.unmap(va, granule), Status::invalid_argument) << "the refused run mapped";
  // The whole handle maps where the part did not.
  ASSERT_EQ(device.map(va, whole), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(va, 4 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(whole), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(other), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 8 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, DriverRuleUnmapThatCutsAMappingIsInvalidAndChangesNothing) {
  // cuMemUnmap of part of one mapping returned CUDA_ERROR_INVALID_VALUE on the H200: a handle is
  // the smallest unit that can be unmapped.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const MemoryInfo before = this->memory();
  void* va = this->reserve(6 * granule);
  const PhysicalHandle handle = this->create_physical(4 * granule);
  const PhysicalHandle next = this->create_physical(2 * granule);
  ASSERT_EQ(device.map(va, handle), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(bytes_at(va, 4 * granule), next), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, granule), granule), Status::invalid_argument);
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::invalid_argument) << "the first half";
  EXPECT_EQ(device.unmap(bytes_at(va, 2 * granule), 2 * granule), Status::invalid_argument)
      << "the second half";
  EXPECT_EQ(device.unmap(va, 5 * granule), Status::invalid_argument)
      << "one whole mapping and part of the next";
  EXPECT_EQ(device.unmap(bytes_at(va, 2 * granule), 4 * granule), Status::invalid_argument)
      << "part of one mapping and the whole next";
  // Nothing was unmapped: both mappings are still there, whole.
  EXPECT_EQ(device.map(bytes_at(va, 4 * granule), next), Status::invalid_argument)
      << "still mapped";
  this->expect_taken(before, 6 * granule, "both still mapped");
  EXPECT_EQ(device.unmap(va, 4 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, 4 * granule), 2 * granule), Status::ok)
      << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok);
  EXPECT_EQ(device.release_physical(next), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 6 * granule), Status::ok);
}

TYPED_TEST_P(DeviceConformance, DriverRuleUnmapOverAHoleIsInvalidAndChangesNothing) {
  // cuMemUnmap takes "the entire contiguous address range that was mapped": a range with an
  // unmapped gap in it, or one that starts or ends in unmapped space, is refused.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(4 * granule);
  const PhysicalHandle low = this->create_physical(granule);
  const PhysicalHandle high = this->create_physical(granule);
  ASSERT_EQ(device.map(va, low), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(bytes_at(va, 2 * granule), high), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(va, 3 * granule), Status::invalid_argument) << "a hole in the middle";
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.unmap(va, 4 * granule), Status::invalid_argument) << "a hole at the end";
  EXPECT_EQ(device.unmap(bytes_at(va, granule), 2 * granule), Status::invalid_argument)
      << "a hole at the start";
  EXPECT_EQ(device.unmap(bytes_at(va, granule), granule), Status::invalid_argument)
      << "nothing mapped there";
  // Both mappings are still there.
  EXPECT_EQ(device.unmap(va, granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, 2 * granule), granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(low), Status::ok);
  EXPECT_EQ(device.release_physical(high), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok);
}

TYPED_TEST_P(DeviceConformance, DriverRuleOneHandleMapsAtTwoAddressesAsTheSameMemory) {
  // The same handle mapped at a second address while the first mapping stays: CUDA_SUCCESS on the
  // H200, and the memory is taken once (the GPU test writes through one address and reads
  // through the other).
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const std::size_t bytes = 8 * granule;
  const MemoryInfo before = this->memory();
  void* first = this->reserve(bytes);
  void* second = this->reserve(2 * bytes);
  const PhysicalHandle handle = this->create_physical(bytes);
  ASSERT_EQ(device.map(first, handle), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(second, handle), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(bytes_at(second, bytes), handle), Status::ok) << device.last_error();
  this->expect_taken(before, bytes, "the handle is mapped");
  EXPECT_LE(before.free - this->memory().free, bytes + this->drift())
      << "three mappings of one handle must take its memory once";
  // Each mapping is one of its own.
  EXPECT_EQ(device.unmap(second, bytes), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(first, bytes), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(second, bytes), bytes), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(first, bytes), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(second, 2 * bytes), Status::ok) << device.last_error();
  this->expect_returned(before, "all released");
}

TYPED_TEST_P(DeviceConformance, DriverRuleAccessAndUnmapCoverSeveralWholeMappings) {
  // cuMemSetAccess and cuMemUnmap over a range of several whole mappings side by side:
  // CUDA_SUCCESS on the H200. map_run grants access to its run in one step; one unmap takes
  // several mappings, and the mappings on either side stay.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const MemoryInfo before = this->memory();
  void* va = this->reserve(6 * granule);
  const PhysicalHandle big = this->create_physical(2 * granule);
  const PhysicalHandle handles[] = {this->create_physical(granule), big,
                                    this->create_physical(granule), this->create_physical(granule)};
  ASSERT_EQ(device.map_run(va, handles, 4), Status::ok) << device.last_error();
  this->expect_taken(before, 5 * granule, "the run is mapped");
  // The two middle mappings in one call.
  EXPECT_EQ(device.unmap(bytes_at(va, granule), 3 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, granule), 2 * granule), Status::invalid_argument)
      << "unmapped twice";
  // The hole takes other handles, in a run of its own; then one call over all of it.
  const PhysicalHandle refill[] = {this->create_physical(granule), this->create_physical(granule),
                                   this->create_physical(granule)};
  ASSERT_EQ(device.map_run(bytes_at(va, granule), refill, 3), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(va, 5 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(va, granule), Status::invalid_argument) << "all of it was unmapped";
  for (const PhysicalHandle handle : handles) {
    EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  }
  for (const PhysicalHandle handle : refill) {
    EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  }
  EXPECT_EQ(device.release_reservation(va, 6 * granule), Status::ok) << device.last_error();
  this->expect_returned(before, "all released");
}

TYPED_TEST_P(DeviceConformance, DriverRuleMapRunIsAllOrNothing) {
  // One cuMemMap per handle and one cuMemSetAccess over the run: where any handle is refused,
  // none is left mapped.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(4 * granule);
  const PhysicalHandle first = this->create_physical(granule);
  const PhysicalHandle second = this->create_physical(2 * granule);
  const PhysicalHandle blocker = this->create_physical(granule);
  ASSERT_EQ(device.map(bytes_at(va, 3 * granule), blocker), Status::ok) << device.last_error();
  // The last handle of this run would land on the blocker's mapping.
  const PhysicalHandle run[] = {first, second, first};
  EXPECT_EQ(device.map_run(va, run, 3), Status::invalid_argument);
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.unmap(va, granule), Status::invalid_argument) << "the failed run mapped";
  // Without the blocker the same run maps (the first handle twice: one handle at two addresses).
  ASSERT_EQ(device.unmap(bytes_at(va, 3 * granule), granule), Status::ok) << device.last_error();
  ASSERT_EQ(device.map_run(va, run, 3), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(va, 4 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(first), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(second), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(blocker), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, DriverRuleReleasedHandleLivesUntilItsLastMappingGoes) {
  // cuMemRelease frees the memory only "when all outstanding mappings to the memory are
  // unmapped"; the released handle itself can no longer be mapped.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const MemoryInfo before = this->memory();
  void* first = this->reserve(2 * granule);
  void* second = this->reserve(4 * granule);
  const PhysicalHandle handle = this->create_physical(2 * granule);
  ASSERT_EQ(device.map(first, handle), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(second, handle), Status::ok) << device.last_error();

  EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  this->expect_taken(before, 2 * granule, "released, still mapped twice");
  EXPECT_EQ(device.map(bytes_at(second, 2 * granule), handle), Status::invalid_argument)
      << "a released handle cannot be mapped again";
  EXPECT_EQ(device.release_physical(handle), Status::invalid_argument) << "released twice";
  EXPECT_EQ(device.unmap(first, 2 * granule), Status::ok) << device.last_error();
  this->expect_taken(before, 2 * granule, "released, still mapped once");
  EXPECT_EQ(device.unmap(second, 2 * granule), Status::ok) << device.last_error();
  this->expect_returned(before, "the last mapping is gone");
  EXPECT_EQ(device.release_reservation(first, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(second, 4 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, DriverRuleMapOutsideOneReservationIsInvalid) {
  // cuMemMap's range "must be an address reservation previously reserved with
  // cuMemAddressReserve": not past its end, not in a segment, not in a released one.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(3 * granule);
  void* segment = this->allocate(2 * granule);
  const PhysicalHandle handle = this->create_physical(2 * granule);
  EXPECT_EQ(device.map(bytes_at(va, 2 * granule), handle), Status::invalid_argument)
      << "past the end of the reservation";
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.map(segment, handle), Status::invalid_argument) << "inside a segment";
  // A run that would cross the end of its reservation maps nothing.
  const PhysicalHandle run[] = {handle, handle};
  EXPECT_EQ(device.map_run(va, run, 2), Status::invalid_argument) << "a run past the end";
  ASSERT_EQ(device.release_reservation(va, 3 * granule), Status::ok) << "the failed maps mapped";
  EXPECT_EQ(device.map(va, handle), Status::invalid_argument) << "in a released reservation";
  EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  EXPECT_EQ(device.deallocate(segment), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, DriverRuleMapOverAMappingIsInvalid) {
  // "cuMemMap can only create mappings on VA range reservations that are not currently mapped".
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(4 * granule);
  const PhysicalHandle mapped = this->create_physical(2 * granule);
  const PhysicalHandle other = this->create_physical(2 * granule);
  ASSERT_EQ(device.map(bytes_at(va, granule), mapped), Status::ok) << device.last_error();
  EXPECT_EQ(device.map(bytes_at(va, granule), other), Status::invalid_argument) << "the same range";
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.map(va, other), Status::invalid_argument) << "its first granule";
  EXPECT_EQ(device.map(bytes_at(va, 2 * granule), other), Status::invalid_argument)
      << "its last granule";
  EXPECT_EQ(device.unmap(bytes_at(va, granule), 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(mapped), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(other), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, DriverRuleMisalignedMapIsInvalid) {
  // cuMemMap's address must be a multiple of the granularity.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(4 * granule);
  const PhysicalHandle handle = this->create_physical(2 * granule);

  EXPECT_EQ(device.map(bytes_at(va, 256), handle), Status::invalid_argument);
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.map(bytes_at(va, granule / 2), handle), Status::invalid_argument);
  // Nothing was mapped by the failed calls: the whole range can still be mapped and unmapped.
  EXPECT_EQ(device.map(va, handle), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok);
}

TYPED_TEST_P(DeviceConformance, DriverRuleReservationIsFreedWholeOnly) {
  // cuMemAddressFree: "The size must match what was given to memAddressReserve and the ptr given
  // must match what was returned from memAddressReserve."
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(4 * granule);
  EXPECT_EQ(device.release_reservation(va, 2 * granule), Status::invalid_argument) << "its head";
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.release_reservation(bytes_at(va, 2 * granule), 2 * granule),
            Status::invalid_argument)
      << "its tail";
  EXPECT_EQ(device.release_reservation(va, 6 * granule), Status::invalid_argument) << "more";
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::invalid_argument) << "twice";
}

TYPED_TEST_P(DeviceConformance, SynchronisesAStreamAndAnEventBeforeUnmapping) {
  // What the engine does before reclaiming a page: query its users' events, wait for those still
  // running (or for their stream), then unmap.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const Stream stream = this->new_stream();
  const Event event = this->create_event();
  void* va = this->reserve(2 * granule);
  const PhysicalHandle handle = this->create_physical(2 * granule);
  ASSERT_EQ(device.map(va, handle), Status::ok) << device.last_error();
  ASSERT_EQ(device.record_event(event, stream), Status::ok) << device.last_error();
  const Status queried = device.query_event(event);
  EXPECT_TRUE(queried == Status::ok || queried == Status::not_ready) << to_string(queried);
  EXPECT_EQ(device.synchronize_event(event), Status::ok) << device.last_error();
  EXPECT_EQ(device.query_event(event), Status::ok);
  EXPECT_EQ(device.synchronize_stream(stream), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.destroy_event(event), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 2 * granule), Status::ok) << device.last_error();
}

// --- failures: a failed call leaves nothing behind ------------------------------------------------

TYPED_TEST_P(DeviceConformance, AFailedVirtualMemoryCallLeavesNothingBehind) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  if (!this->fail_next(DeviceOp::reserve)) GTEST_SKIP() << "the backend cannot inject failures";
  const MemoryInfo before = this->memory();
  void* va = nullptr;
  EXPECT_NE(device.reserve(4 * granule, 0, &va), Status::ok);
  EXPECT_FALSE(device.last_error().empty());
  va = this->reserve(4 * granule);

  ASSERT_TRUE(this->fail_next(DeviceOp::create_physical));
  PhysicalHandle handle;
  EXPECT_NE(device.create_physical(2 * granule, &handle), Status::ok);
  EXPECT_EQ(this->memory().free, before.free) << "a failed create took memory";
  handle = this->create_physical(2 * granule);

  ASSERT_TRUE(this->fail_next(DeviceOp::map));
  EXPECT_NE(device.map(va, handle), Status::ok);
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::invalid_argument) << "a failed map mapped";
  EXPECT_EQ(device.map(va, handle), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(bytes_at(va, 2 * granule), handle), Status::ok) << device.last_error();

  ASSERT_TRUE(this->fail_next(DeviceOp::unmap));
  EXPECT_NE(device.unmap(va, 4 * granule), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::invalid_argument)
      << "a failed unmap must leave the range mapped";
  EXPECT_EQ(device.unmap(va, 4 * granule), Status::ok) << "the retry: " << device.last_error();

  ASSERT_TRUE(this->fail_next(DeviceOp::release_physical));
  EXPECT_NE(device.release_physical(handle), Status::ok);
  EXPECT_EQ(device.map(va, handle), Status::ok) << "the handle must still live";
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();

  ASSERT_TRUE(this->fail_next(DeviceOp::release_reservation));
  EXPECT_NE(device.release_reservation(va, 4 * granule), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(this->memory().free, before.free);
}

TYPED_TEST_P(DeviceConformance, AFailedEventOrStreamCallCanBeRetried) {
  Device& device = this->device();
  if (!this->fail_next(DeviceOp::record_event)) {
    GTEST_SKIP() << "the backend cannot inject failures";
  }
  const Stream stream = this->new_stream();
  const Event event = this->create_event();
  EXPECT_NE(device.record_event(event, stream), Status::ok);
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.record_event(event, stream), Status::ok) << device.last_error();
  ASSERT_TRUE(this->fail_next(DeviceOp::query_event));
  const Status failed_query = device.query_event(event);
  EXPECT_TRUE(failed_query != Status::ok && failed_query != Status::not_ready);
  ASSERT_TRUE(this->fail_next(DeviceOp::synchronize_event));
  EXPECT_NE(device.synchronize_event(event), Status::ok);
  EXPECT_EQ(device.synchronize_event(event), Status::ok) << device.last_error();
  EXPECT_EQ(device.query_event(event), Status::ok);
  ASSERT_TRUE(this->fail_next(DeviceOp::synchronize_stream));
  EXPECT_NE(device.synchronize_stream(stream), Status::ok);
  EXPECT_EQ(device.synchronize_stream(stream), Status::ok) << device.last_error();
  EXPECT_EQ(device.destroy_event(event), Status::ok) << device.last_error();
}

// --- streams and events --------------------------------------------------------------------------

TYPED_TEST_P(DeviceConformance, RecordedEventOnAnIdleStreamCompletes) {
  Device& device = this->device();
  const Stream stream = this->new_stream();
  const Event event = this->create_event();
  ASSERT_EQ(device.record_event(event, stream), Status::ok) << device.last_error();
  EXPECT_EQ(device.synchronize_event(event), Status::ok) << device.last_error();
  EXPECT_EQ(device.query_event(event), Status::ok);
  EXPECT_EQ(device.destroy_event(event), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, EventsWorkOnTheDefaultStreamAndCanBeReRecorded) {
  Device& device = this->device();
  const Event event = this->create_event();
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(device.record_event(event, default_stream), Status::ok) << device.last_error();
    EXPECT_EQ(device.synchronize_event(event), Status::ok) << device.last_error();
    EXPECT_EQ(device.query_event(event), Status::ok);
  }
  EXPECT_EQ(device.destroy_event(event), Status::ok);
}

TYPED_TEST_P(DeviceConformance, StreamWaitEventAndSynchronizationSucceed) {
  Device& device = this->device();
  const Stream producer = this->new_stream();
  const Stream consumer = this->new_stream();
  const Event event = this->create_event();
  ASSERT_EQ(device.record_event(event, producer), Status::ok) << device.last_error();
  EXPECT_EQ(device.stream_wait_event(consumer, event), Status::ok) << device.last_error();
  // The event may be destroyed as soon as the call that used it has returned.
  EXPECT_EQ(device.destroy_event(event), Status::ok) << device.last_error();
  EXPECT_EQ(device.synchronize_stream(consumer), Status::ok) << device.last_error();
  EXPECT_EQ(device.synchronize_stream(producer), Status::ok) << device.last_error();
  EXPECT_EQ(device.synchronize_stream(default_stream), Status::ok) << device.last_error();
  EXPECT_EQ(device.synchronize_device(), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, UnknownEventIsAnError) {
  // The null handle is the one unknown event every backend can reject without undefined behaviour.
  Device& device = this->device();
  const Event unknown{};
  const Status query = device.query_event(unknown);
  EXPECT_NE(query, Status::ok);
  EXPECT_NE(query, Status::not_ready);
  EXPECT_NE(device.record_event(unknown, default_stream), Status::ok);
  EXPECT_NE(device.synchronize_event(unknown), Status::ok);
  EXPECT_FALSE(device.last_error().empty());
}

REGISTER_TYPED_TEST_SUITE_P(
    DeviceConformance, DescribesItself, GranularityIsAPowerOfTwo, MemoryInfoReportsFreeWithinTotal,
    AllocateAlignsToAtLeast256Bytes, LiveSegmentsNeverOverlap,
    FreeMemoryDropsOnAllocateAndReturnsOnDeallocate,
    TooLargeAllocationIsOutOfMemoryAndLeavesNothingBehind,
    DeallocateOfABadPointerIsInvalidAndChangesNothing, VirtualMemoryRoundTrip,
    CreatedHandleKnowsItsSize, MapOfAHandleClaimingMoreThanItsSizeIsInvalid,
    ReleasingAReservationWithMappingsIsInvalid, ReservesLargeRangesThatNeverOverlapAndTakeNoMemory,
    CreatesPhysicalHandlesOfSeveralSizes, DriverRuleMapOfAWholeHandleAtOffsetZeroSucceeds,
    DriverRuleMapOfPartOfAHandleIsNotSupportedAndMapsNothing,
    DriverRuleUnmapThatCutsAMappingIsInvalidAndChangesNothing,
    DriverRuleUnmapOverAHoleIsInvalidAndChangesNothing,
    DriverRuleOneHandleMapsAtTwoAddressesAsTheSameMemory,
    DriverRuleAccessAndUnmapCoverSeveralWholeMappings, DriverRuleMapRunIsAllOrNothing,
    DriverRuleReleasedHandleLivesUntilItsLastMappingGoes,
    DriverRuleMapOutsideOneReservationIsInvalid, DriverRuleMapOverAMappingIsInvalid,
    DriverRuleMisalignedMapIsInvalid, DriverRuleReservationIsFreedWholeOnly,
    SynchronisesAStreamAndAnEventBeforeUnmapping, AFailedVirtualMemoryCallLeavesNothingBehind,
    AFailedEventOrStreamCallCanBeRetried, RecordedEventOnAnIdleStreamCompletes,
    EventsWorkOnTheDefaultStreamAndCanBeReRecorded, StreamWaitEventAndSynchronizationSucceed,
    UnknownEventIsAnError);

}  // namespace cistern::conformance
