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
//   };
//   namespace cistern::conformance {  // the instantiation must name the suite unqualified
//   INSTANTIATE_TYPED_TEST_SUITE_P(My, DeviceConformance, ::testing::Types<MyFactory>);
//   }
//
// Every expectation here must also hold on a real GPU, because the CUDA backends run the same
// suite: no exact addresses, no exact free-memory figures beyond "drops by at least" and "comes
// back", no simulated time. Sizes stay small so that a shared GPU can run it.
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
  EXPECT_EQ(this->memory().free, before.free);
}

TYPED_TEST_P(DeviceConformance, TooLargeAllocationIsOutOfMemoryAndLeavesNothingBehind) {
  const MemoryInfo before = this->memory();
  void* ptr = nullptr;
  EXPECT_EQ(this->device().allocate(2 * before.total + this->granule(), &ptr),
            Status::out_of_memory);
  EXPECT_FALSE(this->device().last_error().empty());
  const MemoryInfo after = this->memory();
  EXPECT_EQ(after.free, before.free);
  EXPECT_EQ(after.total, before.total);
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
  EXPECT_LE(this->memory().free + 4 * granule, before.free);

  ASSERT_EQ(device.map(va, 2 * granule, low, 0), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(bytes_at(va, 2 * granule), 2 * granule, high, 0), Status::ok)
      << device.last_error();
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, 2 * granule), 2 * granule), Status::ok)
      << device.last_error();
  EXPECT_EQ(device.release_physical(low), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(high), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(this->memory().free, before.free);
}

TYPED_TEST_P(DeviceConformance, ReleasedPhysicalMemoryReturnsWithItsLastMapping) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const MemoryInfo before = this->memory();
  void* va = this->reserve(2 * granule);
  const PhysicalHandle handle = this->create_physical(2 * granule);
  ASSERT_EQ(device.map(va, 2 * granule, handle, 0), Status::ok) << device.last_error();

  EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  EXPECT_LE(this->memory().free + 2 * granule, before.free) << "still mapped, still in use";
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(this->memory().free, before.free);
  EXPECT_EQ(device.release_reservation(va, 2 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, MisalignedMapIsInvalid) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(4 * granule);
  const PhysicalHandle handle = this->create_physical(2 * granule);

  EXPECT_EQ(device.map(bytes_at(va, 256), granule, handle, 0), Status::invalid_argument);
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.map(va, granule / 2, handle, 0), Status::invalid_argument);
  // Nothing was mapped by the failed calls: the whole range can still be mapped and unmapped.
  EXPECT_EQ(device.map(va, 2 * granule, handle, 0), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok);
}

TYPED_TEST_P(DeviceConformance, ReleasingAReservationWithMappingsIsInvalid) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(2 * granule);
  const PhysicalHandle handle = this->create_physical(granule);
  ASSERT_EQ(device.map(va, granule, handle, 0), Status::ok) << device.last_error();

  EXPECT_EQ(device.release_reservation(va, 2 * granule), Status::invalid_argument);
  EXPECT_FALSE(device.last_error().empty());
  // The failed release changed nothing: the mapping and the reservation are still there.
  EXPECT_EQ(device.unmap(va, granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 2 * granule), Status::ok) << device.last_error();
}

// --- virtual memory as the allocator's page engine uses it ----------------------------------------
//
// The engine reserves large ranges, creates physical handles of a few sizes (2 MiB and 20 MiB),
// maps runs of a handle's granules wherever blocks need them (one handle's pages may back several
// addresses while a range is being rebuilt), unmaps whole earlier mappings - several at once -
// after synchronising their users, and may release a handle before its last mapping goes.

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
  EXPECT_EQ(this->memory().free, before.free) << "address space must not take device memory";
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
    EXPECT_LE(this->memory().free + total, before.free) << "after a handle of " << bytes;
  }
  for (std::size_t i = 0; i < handles.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(handles[i].handle, handles[j].handle);
  }
  for (const PhysicalHandle handle : handles) {
    EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  }
  EXPECT_EQ(this->memory().free, before.free);
  EXPECT_EQ(device.release_physical(handles[0]), Status::invalid_argument) << "released twice";
}

TYPED_TEST_P(DeviceConformance, MapsRunsOfGranulesAtOffsetsInsideAHandle) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(12 * granule);
  const PhysicalHandle handle = this->create_physical(10 * granule);
  // The handle's granules in two runs, in the opposite order, with a gap between them.
  ASSERT_EQ(device.map(va, 7 * granule, handle, 3 * granule), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(bytes_at(va, 9 * granule), 3 * granule, handle, 0), Status::ok)
      << device.last_error();
  // The last granule fits; one granule past the end of the handle does not.
  void* other = this->reserve(2 * granule);
  EXPECT_EQ(device.map(other, 2 * granule, handle, 9 * granule), Status::invalid_argument);
  ASSERT_EQ(device.map(other, granule, handle, 9 * granule), Status::ok) << device.last_error();
  // A run may not cross the end of its reservation.
  EXPECT_EQ(device.map(bytes_at(va, 7 * granule), 6 * granule, handle, 0),
            Status::invalid_argument);

  EXPECT_EQ(device.unmap(va, 7 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, 9 * granule), 3 * granule), Status::ok)
      << device.last_error();
  EXPECT_EQ(device.unmap(other, granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 12 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(other, 2 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, MapsARunOfPiecesAllOrNothingAndUnmapsEachAlone) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(6 * granule);
  const PhysicalHandle big = this->create_physical(3 * granule);
  const PhysicalHandle small = this->create_physical(granule);
  // Pieces of two handles side by side, the big one's out of order.
  const MapPiece run[] = {{big, 2 * granule, granule}, {small, 0, granule}, {big, 0, 2 * granule}};
  ASSERT_EQ(device.map_run(va, run, 3), Status::ok) << device.last_error();
  // A run whose last piece lies outside its handle maps nothing, not even its good pieces.
  const MapPiece bad[] = {{big, 0, granule}, {small, granule, granule}};
  EXPECT_EQ(device.map_run(bytes_at(va, 4 * granule), bad, 2), Status::invalid_argument);
  // Each piece is a mapping of its own; a range over two of them unmaps both.
  EXPECT_EQ(device.unmap(bytes_at(va, granule), granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, 2 * granule), granule), Status::invalid_argument)
      << "part of the third piece";
  EXPECT_EQ(device.unmap(va, granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, 2 * granule), 2 * granule), Status::ok)
      << device.last_error();
  // Nothing of the failed run is left: its range maps again.
  ASSERT_EQ(device.map(bytes_at(va, 4 * granule), 2 * granule, big, 0), Status::ok)
      << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, 4 * granule), 2 * granule), Status::ok)
      << device.last_error();
  EXPECT_EQ(device.release_physical(big), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(small), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 6 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, MapsOneHandleAtSeveralAddressesUntilTheLastMappingGoes) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  const MemoryInfo before = this->memory();
  void* first = this->reserve(4 * granule);
  void* second = this->reserve(2 * granule);
  const PhysicalHandle handle = this->create_physical(2 * granule);
  // The same pages at three places: two ranges and a second alias of the last granule.
  ASSERT_EQ(device.map(first, 2 * granule, handle, 0), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(second, 2 * granule, handle, 0), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(bytes_at(first, 3 * granule), granule, handle, granule), Status::ok)
      << device.last_error();

  EXPECT_EQ(device.unmap(first, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  EXPECT_LE(this->memory().free + 2 * granule, before.free) << "still mapped twice";
  EXPECT_EQ(device.map(first, granule, handle, 0), Status::invalid_argument)
      << "a released handle cannot be mapped again";
  EXPECT_EQ(device.unmap(second, 2 * granule), Status::ok) << device.last_error();
  EXPECT_LE(this->memory().free + 2 * granule, before.free) << "still mapped once";
  EXPECT_EQ(device.unmap(bytes_at(first, 3 * granule), granule), Status::ok) << device.last_error();
  EXPECT_EQ(this->memory().free, before.free) << "the last mapping is gone";
  EXPECT_EQ(device.release_reservation(first, 4 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(second, 2 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, UnmapsPartOfWhatWasMappedAsSeparateCalls) {
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(4 * granule);
  const PhysicalHandle pages = this->create_physical(4 * granule);
  const PhysicalHandle spare = this->create_physical(2 * granule);
  for (std::size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(device.map(bytes_at(va, i * granule), granule, pages, i * granule), Status::ok)
        << "granule " << i << ": " << device.last_error();
  }
  // The middle two in one call: the mappings on either side stay.
  EXPECT_EQ(device.unmap(bytes_at(va, granule), 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, granule), granule), Status::invalid_argument)
      << "unmapped twice";
  EXPECT_EQ(device.map(va, granule, spare, 0), Status::invalid_argument) << "still mapped";
  // The hole takes other pages; then one call unmaps a whole mapping of each handle.
  ASSERT_EQ(device.map(bytes_at(va, granule), 2 * granule, spare, 0), Status::ok)
      << device.last_error();
  EXPECT_EQ(device.unmap(va, granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, granule), 3 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(pages), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(spare), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok) << device.last_error();
}

TYPED_TEST_P(DeviceConformance, UnmappingPartOfOneMappingIsInvalidAndChangesNothing) {
  // cuMemUnmap takes whole mappings: a page the engine may reclaim alone is mapped alone.
  if (this->lacks_virtual_memory()) GTEST_SKIP() << "no virtual memory support";
  Device& device = this->device();
  const std::size_t granule = this->granule();
  void* va = this->reserve(4 * granule);
  const PhysicalHandle handle = this->create_physical(4 * granule);
  ASSERT_EQ(device.map(va, 4 * granule, handle, 0), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(bytes_at(va, granule), granule), Status::invalid_argument);
  EXPECT_FALSE(device.last_error().empty());
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::invalid_argument);
  EXPECT_EQ(device.unmap(bytes_at(va, 2 * granule), 2 * granule), Status::invalid_argument);
  EXPECT_EQ(device.unmap(va, 4 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_physical(handle), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok);
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
  ASSERT_EQ(device.map(va, 2 * granule, handle, 0), Status::ok) << device.last_error();
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
  EXPECT_NE(device.map(va, 2 * granule, handle, 0), Status::ok);
  EXPECT_EQ(device.unmap(va, 2 * granule), Status::invalid_argument) << "a failed map mapped";
  EXPECT_EQ(device.map(va, 2 * granule, handle, 0), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(bytes_at(va, 2 * granule), 2 * granule, handle, 0), Status::ok)
      << device.last_error();

  ASSERT_TRUE(this->fail_next(DeviceOp::unmap));
  EXPECT_NE(device.unmap(va, 4 * granule), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::invalid_argument)
      << "a failed unmap must leave the range mapped";
  EXPECT_EQ(device.unmap(va, 4 * granule), Status::ok) << "the retry: " << device.last_error();

  ASSERT_TRUE(this->fail_next(DeviceOp::release_physical));
  EXPECT_NE(device.release_physical(handle), Status::ok);
  EXPECT_EQ(device.map(va, 2 * granule, handle, 0), Status::ok) << "the handle must still live";
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
    ReleasedPhysicalMemoryReturnsWithItsLastMapping, MisalignedMapIsInvalid,
    ReleasingAReservationWithMappingsIsInvalid, ReservesLargeRangesThatNeverOverlapAndTakeNoMemory,
    CreatesPhysicalHandlesOfSeveralSizes, MapsRunsOfGranulesAtOffsetsInsideAHandle,
    MapsARunOfPiecesAllOrNothingAndUnmapsEachAlone,
    MapsOneHandleAtSeveralAddressesUntilTheLastMappingGoes,
    UnmapsPartOfWhatWasMappedAsSeparateCalls, UnmappingPartOfOneMappingIsInvalidAndChangesNothing,
    SynchronisesAStreamAndAnEventBeforeUnmapping, AFailedVirtualMemoryCallLeavesNothingBehind,
    AFailedEventOrStreamCallCanBeRetried, RecordedEventOnAnIdleStreamCompletes,
    EventsWorkOnTheDefaultStreamAndCanBeReRecorded, StreamWaitEventAndSynchronizationSucceed,
    UnknownEventIsAnError);

}  // namespace cistern::conformance
