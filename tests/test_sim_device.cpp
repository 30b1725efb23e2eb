// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// SimDevice's own semantics, with exact expectations: granule charging, address reuse, adopted
// segments, the virtual clock, fault injection, counters, VMM accounting and thread safety. The
// contract it shares with the CUDA backends is tested by test_device_conformance.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"

namespace cistern {
namespace {

using ::testing::HasSubstr;

constexpr std::uintptr_t kBase = 0x7f0000000000;

SimDeviceOptions with_capacity(std::size_t capacity) {
  SimDeviceOptions options;
  options.capacity = capacity;
  return options;
}

// Every allocation charged whole granules: the arithmetic of most tests stays simple.
SimDeviceOptions unpacked(std::size_t capacity) {
  SimDeviceOptions options = with_capacity(capacity);
  options.pack_small_allocations = false;
  return options;
}

std::uintptr_t address(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

void* pointer(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

void* allocate(SimDevice& device, std::size_t bytes) {
  void* ptr = nullptr;
  EXPECT_EQ(device.allocate(bytes, &ptr), Status::ok) << device.last_error();
  return ptr;
}

Event create_event(SimDevice& device) {
  Event event;
  EXPECT_EQ(device.create_event(&event), Status::ok);
  return event;
}

PhysicalHandle create_physical(SimDevice& device, std::size_t bytes) {
  PhysicalHandle handle;
  EXPECT_EQ(device.create_physical(bytes, &handle), Status::ok) << device.last_error();
  return handle;
}

void* reserve(SimDevice& device, std::size_t bytes, std::size_t alignment = 0) {
  void* va = nullptr;
  EXPECT_EQ(device.reserve(bytes, alignment, &va), Status::ok) << device.last_error();
  return va;
}

std::size_t free_bytes(SimDevice& device) {
  MemoryInfo info;
  EXPECT_EQ(device.memory_info(&info), Status::ok);
  return info.free;
}

// --- construction --------------------------------------------------------------------------------

TEST(SimDevice, DescribesItself) {
  SimDeviceOptions options = with_capacity(8 * MiB);
  options.index = 3;
  SimDevice device(options);
  EXPECT_EQ(device.name(), "sim:3 (8.00 MiB)");
  EXPECT_EQ(device.index(), 3);
  EXPECT_EQ(device.granularity(), 2 * MiB);
  EXPECT_EQ(device.capacity(), 8 * MiB);
  EXPECT_TRUE(device.supports_virtual_memory());
  EXPECT_EQ(device.last_error(), "");
}

TEST(SimDevice, RejectsImpossibleOptions) {
  SimDeviceOptions odd_granule;
  odd_granule.granularity = 3000;
  EXPECT_THROW(SimDevice{odd_granule}, InvalidArgument);
  SimDeviceOptions tiny_granule;
  tiny_granule.granularity = 256;
  EXPECT_THROW(SimDevice{tiny_granule}, InvalidArgument);
  SimDeviceOptions misaligned_base;
  misaligned_base.base_address = kBase + 4096;
  EXPECT_THROW(SimDevice{misaligned_base}, InvalidArgument);
  SimDeviceOptions wrapping_space;
  wrapping_space.address_space = std::size_t{1} << 63;
  wrapping_space.base_address = std::uintptr_t{1} << 63;
  EXPECT_THROW(SimDevice{wrapping_space}, InvalidArgument);
}

// --- segments ------------------------------------------------------------------------------------

TEST(SimDevice, ChargesWholeGranules) {
  SimDevice device(with_capacity(64 * MiB));
  void* one_byte = allocate(device, 1);
  EXPECT_EQ(device.used_bytes(), 2 * MiB);
  EXPECT_EQ(free_bytes(device), 62 * MiB);
  void* just_over = allocate(device, 2 * MiB + 1);
  EXPECT_EQ(device.used_bytes(), 6 * MiB);
  EXPECT_EQ(device.live_segments(), 2u);

  ASSERT_EQ(device.deallocate(one_byte), Status::ok);
  EXPECT_EQ(device.used_bytes(), 4 * MiB);
  ASSERT_EQ(device.deallocate(just_over), Status::ok);
  EXPECT_EQ(device.used_bytes(), 0u);
  EXPECT_EQ(device.peak_used_bytes(), 6 * MiB);
  EXPECT_EQ(device.live_segments(), 0u);
  EXPECT_EQ(free_bytes(device), 64 * MiB);
}

TEST(SimDevice, HandsOutGranuleAlignedAddressesFromTheBase) {
  SimDevice device(unpacked(64 * MiB));
  EXPECT_EQ(address(allocate(device, 1)), kBase);
  EXPECT_EQ(address(allocate(device, 3 * MiB)), kBase + 2 * MiB);
  EXPECT_EQ(address(allocate(device, 100)), kBase + 6 * MiB);
}

TEST(SimDevice, PacksSmallAllocationsIntoSharedGranules) {
  SimDevice device(with_capacity(64 * MiB));
  void* a = allocate(device, 1);
  void* b = allocate(device, 513);
  void* c = allocate(device, 1 * MiB);  // half a granule: still packed
  EXPECT_EQ(address(a), kBase);
  EXPECT_EQ(address(b), kBase + 512);
  EXPECT_EQ(address(c), kBase + 1536);
  EXPECT_EQ(device.used_bytes(), 2 * MiB) << "the shared granule is charged once";
  EXPECT_EQ(device.live_segments(), 3u);
  void* d = allocate(device, 1 * MiB);  // does not fit beside c: a second shared granule
  EXPECT_EQ(address(d), kBase + 2 * MiB);
  void* e = allocate(device, 1 * MiB + 1);  // over half a granule: whole granules
  EXPECT_EQ(address(e), kBase + 4 * MiB);
  EXPECT_EQ(device.used_bytes(), 6 * MiB);

  ASSERT_EQ(device.deallocate(b), Status::ok);
  EXPECT_EQ(device.used_bytes(), 6 * MiB) << "the granule stays while a holds it";
  EXPECT_EQ(address(allocate(device, 512)), kBase + 512) << "the gap b left is reused";
  EXPECT_EQ(device.deallocate(pointer(kBase + 1024)), Status::invalid_argument)
      << "inside the shared granule but not the start of an allocation";
  EXPECT_EQ(device.deallocate(d), Status::ok);
  EXPECT_EQ(device.used_bytes(), 4 * MiB) << "the second granule left with its last allocation";
  EXPECT_EQ(device.deallocate(pointer(kBase + 2 * MiB)), Status::invalid_argument)
      << "a second free of a released shared granule";
}

TEST(SimDevice, ReusesTheLowestFreeAddressThatFits) {
  SimDevice device(with_capacity(64 * MiB));
  void* a = allocate(device, 2 * MiB);
  void* b = allocate(device, 2 * MiB);
  void* c = allocate(device, 2 * MiB);
  ASSERT_EQ(device.deallocate(b), Status::ok);
  EXPECT_EQ(allocate(device, 2 * MiB), b) << "the hole left by b is the lowest fit";

  ASSERT_EQ(device.deallocate(a), Status::ok);
  EXPECT_EQ(address(allocate(device, 4 * MiB)), address(c) + 2 * MiB) << "a's hole is too small";
  EXPECT_EQ(allocate(device, 1), a);
}

TEST(SimDevice, AllocateRejectsZeroBytesAndANullResult) {
  SimDevice device(with_capacity(8 * MiB));
  void* ptr = nullptr;
  EXPECT_EQ(device.allocate(0, &ptr), Status::invalid_argument);
  EXPECT_THAT(device.last_error(), HasSubstr("allocate(0 bytes)"));
  EXPECT_EQ(device.allocate(1, nullptr), Status::invalid_argument);
  EXPECT_EQ(device.used_bytes(), 0u);
  EXPECT_EQ(device.live_segments(), 0u);
}

TEST(SimDevice, CapacityIsExhaustedAtTheExactBoundary) {
  SimDevice device(with_capacity(8 * MiB));
  std::vector<void*> segments;
  for (int i = 0; i < 4; ++i) segments.push_back(allocate(device, 2 * MiB));
  EXPECT_EQ(device.used_bytes(), 8 * MiB);

  void* ptr = nullptr;
  EXPECT_EQ(device.allocate(1, &ptr), Status::out_of_memory);
  EXPECT_EQ(ptr, nullptr) << "a failed allocate writes no result";
  EXPECT_EQ(device.last_error(),
            "sim:0 allocate(1 bytes): out of memory: 0 bytes free of 8.00 MiB");
  EXPECT_EQ(device.used_bytes(), 8 * MiB);
  EXPECT_EQ(device.live_segments(), 4u);
  EXPECT_EQ(device.counters().failed(DeviceOp::allocate), 1u);

  ASSERT_EQ(device.deallocate(segments[2]), Status::ok);
  EXPECT_EQ(allocate(device, 2 * MiB), segments[2]);
}

TEST(SimDevice, OutOfMemoryMessageSaysWhatWasAskedAndWhatIsFree) {
  SimDevice device(with_capacity(2 * GiB));
  allocate(device, 512 * MiB);
  void* ptr = nullptr;
  EXPECT_EQ(device.allocate(3 * GiB, &ptr), Status::out_of_memory);
  EXPECT_EQ(device.last_error(),
            "sim:0 allocate(3.00 GiB): out of memory: 1.50 GiB free of 2.00 GiB");
  EXPECT_EQ(device.used_bytes(), 512 * MiB);
}

TEST(SimDevice, HugeRequestsDoNotWrapAround) {
  SimDevice device(with_capacity(8 * MiB));
  void* ptr = nullptr;
  EXPECT_EQ(device.allocate(SIZE_MAX, &ptr), Status::out_of_memory);
  EXPECT_EQ(device.allocate(SIZE_MAX - MiB, &ptr), Status::out_of_memory);
  EXPECT_EQ(device.used_bytes(), 0u);
}

TEST(SimDevice, AddressSpaceCanRunOutBeforeCapacity) {
  SimDeviceOptions options = with_capacity(64 * MiB);
  options.address_space = 4 * MiB;
  SimDevice device(options);
  allocate(device, 4 * MiB);
  void* ptr = nullptr;
  EXPECT_EQ(device.allocate(1, &ptr), Status::out_of_memory);
  EXPECT_THAT(device.last_error(), HasSubstr("out of address space"));
  EXPECT_EQ(device.used_bytes(), 4 * MiB);
}

TEST(SimDevice, DeallocateOfABadPointerChangesNothing) {
  SimDevice device(with_capacity(8 * MiB));
  void* segment = allocate(device, 4 * MiB);
  const Stream stream = device.create_stream();
  device.launch(stream, 1000);

  EXPECT_EQ(device.deallocate(static_cast<char*>(segment) + 2 * MiB), Status::invalid_argument);
  EXPECT_THAT(device.last_error(), HasSubstr("not its base"));
  EXPECT_EQ(device.deallocate(pointer(0x1234)), Status::invalid_argument);
  EXPECT_THAT(device.last_error(), HasSubstr("deallocate(0x1234): not a live segment"));
  EXPECT_EQ(device.deallocate(nullptr), Status::invalid_argument);
  EXPECT_EQ(device.used_bytes(), 4 * MiB);
  EXPECT_EQ(device.live_segments(), 1u);
  EXPECT_EQ(device.now(), 0u) << "a rejected deallocate does not synchronise";

  ASSERT_EQ(device.deallocate(segment), Status::ok);
  EXPECT_EQ(device.deallocate(segment), Status::invalid_argument) << "double free";
  EXPECT_EQ(device.counters().failed(DeviceOp::deallocate), 4u);
}

// --- allocate_at ---------------------------------------------------------------------------------

TEST(SimDevice, AllocateAtAdoptsAGivenAddress) {
  SimDevice device(with_capacity(16 * MiB));
  void* at = pointer(kBase + 4 * MiB);
  ASSERT_EQ(device.allocate_at(at, 3 * MiB), Status::ok) << device.last_error();
  EXPECT_EQ(device.used_bytes(), 4 * MiB);
  EXPECT_EQ(device.live_segments(), 1u);
  // allocate works around it: the lowest gap first, then above the adopted segment.
  EXPECT_EQ(address(allocate(device, 4 * MiB)), kBase);
  EXPECT_EQ(address(allocate(device, 2 * MiB)), kBase + 8 * MiB);
  EXPECT_EQ(device.counters().of(DeviceOp::allocate), 2u) << "allocate_at is not a contract call";
  ASSERT_EQ(device.deallocate(at), Status::ok);
  EXPECT_EQ(device.used_bytes(), 6 * MiB);
}

TEST(SimDevice, AllocateAtOutsideTheAddressSpaceIsSteppedOver) {
  SimDevice device(with_capacity(16 * MiB));
  void* below = pointer(kBase - 2 * MiB);
  ASSERT_EQ(device.allocate_at(below, 4 * MiB), Status::ok) << "straddles the base";
  EXPECT_EQ(address(allocate(device, 1)), kBase + 2 * MiB);
}

TEST(SimDevice, AllocateAtRejectsOverlapMisalignmentAndExcess) {
  SimDevice device(with_capacity(8 * MiB));
  ASSERT_EQ(device.allocate_at(pointer(kBase + 2 * MiB), 2 * MiB), Status::ok);

  EXPECT_EQ(device.allocate_at(pointer(kBase + 2 * MiB), 2 * MiB), Status::invalid_argument);
  EXPECT_THAT(device.last_error(), HasSubstr("overlaps"));
  EXPECT_EQ(device.allocate_at(pointer(kBase), 4 * MiB), Status::invalid_argument);
  EXPECT_EQ(device.allocate_at(pointer(kBase), 2 * MiB + 1), Status::invalid_argument)
      << "charged as 4 MiB, so it overlaps";
  EXPECT_EQ(device.allocate_at(pointer(kBase + 4096), 4096), Status::invalid_argument);
  EXPECT_THAT(device.last_error(), HasSubstr("aligned"));
  EXPECT_EQ(device.allocate_at(nullptr, 2 * MiB), Status::invalid_argument);
  EXPECT_EQ(device.allocate_at(pointer(kBase), 0), Status::invalid_argument);
  EXPECT_EQ(device.allocate_at(pointer(kBase + 16 * MiB), 8 * MiB), Status::out_of_memory);
  EXPECT_THAT(device.last_error(), HasSubstr("out of memory"));

  EXPECT_EQ(device.used_bytes(), 2 * MiB);
  EXPECT_EQ(device.live_segments(), 1u);
  EXPECT_EQ(device.allocate_at(pointer(kBase + 16 * MiB), 6 * MiB), Status::ok);
  EXPECT_EQ(device.used_bytes(), 8 * MiB);
}

// --- reserve_at and the reservation plan ---------------------------------------------------------

TEST(SimDevice, ReserveAtTakesAGivenRangeAndRefusesOverlap) {
  SimDevice device(with_capacity(8 * MiB));
  ASSERT_EQ(device.reserve_at(pointer(kBase + 4 * MiB), 8 * MiB), Status::ok)
      << device.last_error();
  EXPECT_EQ(device.live_reservations(), 1u);
  EXPECT_EQ(device.used_bytes(), 0u) << "address space only";
  EXPECT_EQ(device.counters().of(DeviceOp::reserve), 0u) << "reserve_at is not a contract call";
  EXPECT_EQ(device.reserve_at(pointer(kBase + 10 * MiB), 4 * MiB), Status::invalid_argument);
  EXPECT_THAT(device.last_error(), HasSubstr("overlaps"));
  EXPECT_EQ(device.reserve_at(pointer(kBase + 4096), 2 * MiB), Status::invalid_argument);
  EXPECT_EQ(device.reserve_at(pointer(kBase), 2 * MiB + 4096), Status::invalid_argument);
  EXPECT_EQ(device.reserve_at(nullptr, 2 * MiB), Status::invalid_argument);
  // reserve goes around it; the range is released as any reservation.
  void* va = nullptr;
  ASSERT_EQ(device.reserve(6 * MiB, 0, &va), Status::ok);
  EXPECT_EQ(address(va), kBase + 12 * MiB);
  EXPECT_EQ(device.release_reservation(pointer(kBase + 4 * MiB), 8 * MiB), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 6 * MiB), Status::ok);
  EXPECT_EQ(device.live_reservations(), 0u);
}

TEST(SimDevice, ReservationPlanPlacesReservesWhereItCan) {
  SimDevice device(with_capacity(8 * MiB));
  std::vector<std::uintptr_t> plan{kBase + 20 * MiB, kBase + 22 * MiB, kBase + 1};
  std::size_t next = 0;
  device.set_reservation_plan([&](std::size_t) { return next < plan.size() ? plan[next++] : 0; });
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  ASSERT_EQ(device.reserve(4 * MiB, 0, &a), Status::ok);
  EXPECT_EQ(address(a), kBase + 20 * MiB);
  ASSERT_EQ(device.reserve(4 * MiB, 0, &b), Status::ok);
  EXPECT_EQ(address(b), kBase) << "the planned range overlaps the first: the lowest free one";
  ASSERT_EQ(device.reserve(2 * MiB, 0, &c), Status::ok);
  EXPECT_EQ(address(c), kBase + 4 * MiB) << "a misaligned plan is ignored";
}

// --- the virtual clock ---------------------------------------------------------------------------

TEST(SimDevice, StreamsAreNumberedAndUnknownOnesAreRejected) {
  SimDevice device(with_capacity(8 * MiB));
  EXPECT_EQ(device.create_stream(), Stream{1});
  EXPECT_EQ(device.create_stream(), Stream{2});
  EXPECT_TRUE(device.stream_idle(default_stream));

  const Stream unknown{42};
  EXPECT_THROW(device.launch(unknown, 10), InvalidArgument);
  EXPECT_THROW(device.stream_done_at(unknown), InvalidArgument);
  EXPECT_THROW(device.stream_idle(unknown), InvalidArgument);
  const Event event = create_event(device);
  EXPECT_EQ(device.record_event(event, unknown), Status::invalid_argument);
  EXPECT_EQ(device.last_error(), "sim:0 record_event: unknown stream 0x2a");
  EXPECT_EQ(device.stream_wait_event(unknown, event), Status::invalid_argument);
  EXPECT_EQ(device.synchronize_stream(unknown), Status::invalid_argument);
}

TEST(SimDevice, LaunchedWorkCompletesWhenTheClockPassesIt) {
  SimDevice device(with_capacity(8 * MiB));
  const Stream stream = device.create_stream();
  device.launch(stream, 100);
  device.launch(stream, 50);  // queued behind the first
  EXPECT_EQ(device.stream_done_at(stream), 150u);
  EXPECT_FALSE(device.stream_idle(stream));

  const Event event = create_event(device);
  ASSERT_EQ(device.record_event(event, stream), Status::ok);
  EXPECT_EQ(device.query_event(event), Status::not_ready);
  device.advance(149);
  EXPECT_EQ(device.query_event(event), Status::not_ready);
  device.advance(1);
  EXPECT_EQ(device.query_event(event), Status::ok);
  EXPECT_TRUE(device.stream_idle(stream));

  device.launch(stream, 10);  // starts now, not at the stream's old completion time
  EXPECT_EQ(device.stream_done_at(stream), 160u);
  EXPECT_EQ(device.counters().failed(DeviceOp::query_event), 0u) << "not_ready is no failure";
}

TEST(SimDevice, EventCapturesOnlyWorkSubmittedBeforeTheRecord) {
  SimDevice device(with_capacity(8 * MiB));
  const Stream stream = device.create_stream();
  device.launch(stream, 100);
  const Event event = create_event(device);
  ASSERT_EQ(device.record_event(event, stream), Status::ok);
  device.launch(stream, 1000);
  ASSERT_EQ(device.synchronize_event(event), Status::ok);
  EXPECT_EQ(device.now(), 100u);
  EXPECT_FALSE(device.stream_idle(stream));

  ASSERT_EQ(device.record_event(event, stream), Status::ok);  // re-recorded: later work
  EXPECT_EQ(device.query_event(event), Status::not_ready);
  ASSERT_EQ(device.synchronize_event(event), Status::ok);
  EXPECT_EQ(device.now(), 1100u);
}

TEST(SimDevice, RecordOnAnIdleStreamIsReadyAtOnce) {
  SimDevice device(with_capacity(8 * MiB));
  device.advance(500);
  const Event event = create_event(device);
  ASSERT_EQ(device.record_event(event, default_stream), Status::ok);
  EXPECT_EQ(device.query_event(event), Status::ok);
  ASSERT_EQ(device.synchronize_event(event), Status::ok);
  EXPECT_EQ(device.now(), 500u);
}

TEST(SimDevice, NeverRecordedEventsAreComplete) {
  SimDevice device(with_capacity(8 * MiB));
  const Stream stream = device.create_stream();
  device.launch(stream, 100);
  const Event event = create_event(device);
  EXPECT_EQ(device.query_event(event), Status::ok);
  EXPECT_EQ(device.synchronize_event(event), Status::ok);
  EXPECT_EQ(device.now(), 0u);
  EXPECT_EQ(device.stream_wait_event(stream, event), Status::ok);
  EXPECT_EQ(device.stream_done_at(stream), 100u);
}

TEST(SimDevice, StreamWaitEventDelaysTheWaitingStreamOnly) {
  SimDevice device(with_capacity(8 * MiB));
  const Stream producer = device.create_stream();
  const Stream consumer = device.create_stream();
  device.launch(producer, 100);
  const Event event = create_event(device);
  ASSERT_EQ(device.record_event(event, producer), Status::ok);
  ASSERT_EQ(device.stream_wait_event(consumer, event), Status::ok);
  EXPECT_EQ(device.now(), 0u) << "a device-side wait does not block the host";
  EXPECT_EQ(device.stream_done_at(consumer), 100u);

  device.launch(consumer, 10);
  EXPECT_EQ(device.stream_done_at(consumer), 110u);
  ASSERT_EQ(device.synchronize_stream(consumer), Status::ok);
  EXPECT_EQ(device.now(), 110u);
  EXPECT_TRUE(device.stream_idle(producer));
}

TEST(SimDevice, SynchronizeStreamWaitsForThatStreamOnly) {
  SimDevice device(with_capacity(8 * MiB));
  const Stream fast = device.create_stream();
  const Stream slow = device.create_stream();
  device.launch(fast, 10);
  device.launch(slow, 1000);
  ASSERT_EQ(device.synchronize_stream(fast), Status::ok);
  EXPECT_EQ(device.now(), 10u);
  ASSERT_EQ(device.synchronize_device(), Status::ok);
  EXPECT_EQ(device.now(), 1000u);
  ASSERT_EQ(device.synchronize_stream(fast), Status::ok);
  EXPECT_EQ(device.now(), 1000u) << "the clock never goes back";
}

TEST(SimDevice, DeallocateSynchronisesTheDevice) {
  SimDevice device(with_capacity(8 * MiB));
  const Stream stream = device.create_stream();
  void* segment = allocate(device, 1);
  device.launch(stream, 700);
  device.launch(default_stream, 300);
  ASSERT_EQ(device.deallocate(segment), Status::ok);
  EXPECT_EQ(device.now(), 700u);
  EXPECT_TRUE(device.stream_idle(stream));
}

TEST(SimDevice, UnknownAndDestroyedEventsAreInvalid) {
  SimDevice device(with_capacity(8 * MiB));
  const Event event = create_event(device);
  const Event other = create_event(device);
  EXPECT_NE(event, other);
  EXPECT_EQ(device.live_events(), 2u);
  ASSERT_EQ(device.destroy_event(event), Status::ok);
  EXPECT_EQ(device.live_events(), 1u);

  EXPECT_EQ(device.destroy_event(event), Status::invalid_argument);
  EXPECT_EQ(device.query_event(event), Status::invalid_argument);
  EXPECT_EQ(device.synchronize_event(event), Status::invalid_argument);
  EXPECT_EQ(device.stream_wait_event(default_stream, event), Status::invalid_argument);
  EXPECT_EQ(device.record_event(Event{0x12}, default_stream), Status::invalid_argument);
  EXPECT_EQ(device.last_error(), "sim:0 record_event: unknown event 0x12");
  EXPECT_EQ(device.create_event(nullptr), Status::invalid_argument);
  EXPECT_EQ(device.live_events(), 1u);
}

// --- fault injection and counters ----------------------------------------------------------------

TEST(SimDevice, FailNthFailsExactlyThatCallOnce) {
  SimDevice device(unpacked(64 * MiB));
  device.fail_nth(DeviceOp::allocate, 3);
  allocate(device, 1);
  allocate(device, 1);
  void* ptr = nullptr;
  EXPECT_EQ(device.allocate(1, &ptr), Status::out_of_memory);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_EQ(device.last_error(), "sim:0 allocate: injected fault (out_of_memory)");
  EXPECT_EQ(device.used_bytes(), 4 * MiB) << "an injected failure has no side effect";
  allocate(device, 1);
  allocate(device, 1);

  const SimCounters counters = device.counters();
  EXPECT_EQ(counters.of(DeviceOp::allocate), 5u);
  EXPECT_EQ(counters.failed(DeviceOp::allocate), 1u);
}

TEST(SimDevice, InjectedFaultsHaveNoSideEffects) {
  SimDevice device(with_capacity(64 * MiB));
  const Stream stream = device.create_stream();
  void* segment = allocate(device, 1);
  device.launch(stream, 100);
  device.fail_nth(DeviceOp::deallocate, 1, Status::device_error);
  EXPECT_EQ(device.deallocate(segment), Status::device_error);
  EXPECT_EQ(device.now(), 0u);
  EXPECT_EQ(device.live_segments(), 1u);

  const Event event = create_event(device);
  device.fail_nth(DeviceOp::record_event, 1, Status::device_error);
  EXPECT_EQ(device.record_event(event, stream), Status::device_error);
  EXPECT_EQ(device.query_event(event), Status::ok) << "the failed record captured nothing";

  device.fail_nth(DeviceOp::create_event, 1);
  Event untouched{};
  EXPECT_EQ(device.create_event(&untouched), Status::out_of_memory);
  EXPECT_EQ(untouched, Event{});
  EXPECT_EQ(device.live_events(), 1u);
}

std::vector<bool> failure_pattern(std::uint64_t seed, int calls) {
  SimDeviceOptions options = with_capacity(64 * MiB);
  options.seed = seed;
  SimDevice device(options);
  device.fail_with_probability(DeviceOp::create_event, 0.3);
  std::vector<bool> failed;
  for (int i = 0; i < calls; ++i) {
    Event event;
    failed.push_back(device.create_event(&event) != Status::ok);
  }
  EXPECT_EQ(device.counters().of(DeviceOp::create_event), static_cast<std::uint64_t>(calls));
  return failed;
}

TEST(SimDevice, ProbabilisticFaultsAreRepeatableForASeed) {
  const std::vector<bool> first = failure_pattern(7, 400);
  EXPECT_EQ(first, failure_pattern(7, 400));
  EXPECT_NE(first, failure_pattern(8, 400));
  const auto failures = std::count(first.begin(), first.end(), true);
  EXPECT_GT(failures, 60);  // 120 expected; these bounds are > 6 standard deviations away
  EXPECT_LT(failures, 180);
}

TEST(SimDevice, ProbabilityZeroAndOneAndClearing) {
  SimDevice device(with_capacity(64 * MiB));
  MemoryInfo info;
  device.fail_with_probability(DeviceOp::memory_info, 1.0, Status::device_error);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(device.memory_info(&info), Status::device_error);
  device.fail_with_probability(DeviceOp::memory_info, 0.0);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(device.memory_info(&info), Status::ok);
  device.fail_with_probability(DeviceOp::memory_info, 1.0);
  device.fail_nth(DeviceOp::allocate, 1);
  device.clear_faults();
  EXPECT_EQ(device.memory_info(&info), Status::ok);
  allocate(device, 1);
  EXPECT_EQ(device.counters().failed(DeviceOp::memory_info), 10u);
}

TEST(SimDevice, FaultArgumentsAreChecked) {
  SimDevice device(with_capacity(8 * MiB));
  EXPECT_THROW(device.fail_nth(DeviceOp::allocate, 0), InvalidArgument);
  EXPECT_THROW(device.fail_nth(DeviceOp::allocate, 1, Status::ok), InvalidArgument);
  EXPECT_THROW(device.fail_with_probability(DeviceOp::map, 1.5), InvalidArgument);
  EXPECT_THROW(device.fail_with_probability(DeviceOp::map, -0.1), InvalidArgument);
}

TEST(SimDevice, CountersCountEveryContractCall) {
  SimDevice device(with_capacity(64 * MiB));
  MemoryInfo info;
  void* segment = allocate(device, 1);
  ASSERT_EQ(device.deallocate(segment), Status::ok);
  void* va = reserve(device, 2 * MiB);
  const PhysicalHandle handle = create_physical(device, 2 * MiB);
  ASSERT_EQ(device.map(va, handle), Status::ok);
  ASSERT_EQ(device.unmap(va, 2 * MiB), Status::ok);
  ASSERT_EQ(device.release_physical(handle), Status::ok);
  ASSERT_EQ(device.release_reservation(va, 2 * MiB), Status::ok);
  const Event event = create_event(device);
  ASSERT_EQ(device.record_event(event, default_stream), Status::ok);
  ASSERT_EQ(device.query_event(event), Status::ok);
  ASSERT_EQ(device.synchronize_event(event), Status::ok);
  ASSERT_EQ(device.stream_wait_event(default_stream, event), Status::ok);
  ASSERT_EQ(device.destroy_event(event), Status::ok);
  ASSERT_EQ(device.synchronize_stream(default_stream), Status::ok);
  ASSERT_EQ(device.synchronize_device(), Status::ok);
  ASSERT_EQ(device.memory_info(&info), Status::ok);
  EXPECT_EQ(device.memory_info(nullptr), Status::invalid_argument);

  const SimCounters counters = device.counters();
  for (int op = 0; op < kDeviceOpCount; ++op) {
    const auto which = static_cast<DeviceOp>(op);
    const std::uint64_t expected_calls = which == DeviceOp::memory_info ? 2 : 1;
    EXPECT_EQ(counters.of(which), expected_calls) << to_string(which);
    EXPECT_EQ(counters.failed(which), which == DeviceOp::memory_info ? 1u : 0u) << to_string(which);
  }
}

// --- virtual memory ------------------------------------------------------------------------------

TEST(SimDevice, ReservationsTakeAddressSpaceNotCapacity) {
  SimDevice device(with_capacity(8 * MiB));
  void* va = reserve(device, 1 * GiB);
  EXPECT_EQ(address(va), kBase);
  EXPECT_EQ(device.used_bytes(), 0u);
  EXPECT_EQ(device.live_reservations(), 1u);
  EXPECT_EQ(address(allocate(device, 1)), kBase + GiB) << "segments avoid reservations";
  EXPECT_EQ(address(reserve(device, 2 * MiB, 8 * MiB)) % (8 * MiB), 0u);
  EXPECT_EQ(device.deallocate(va), Status::invalid_argument) << "a reservation is no segment";
  EXPECT_THAT(device.last_error(), HasSubstr("release_reservation"));
}

TEST(SimDevice, ReserveChecksSizeAndAlignment) {
  SimDevice device(with_capacity(8 * MiB));
  void* va = nullptr;
  EXPECT_EQ(device.reserve(0, 0, &va), Status::invalid_argument);
  EXPECT_EQ(device.reserve(3 * MiB, 0, &va), Status::invalid_argument);
  EXPECT_EQ(device.reserve(2 * MiB, 1 * MiB, &va), Status::invalid_argument);
  EXPECT_EQ(device.reserve(2 * MiB, 6 * MiB, &va), Status::invalid_argument);
  EXPECT_EQ(device.reserve(2 * MiB, 0, nullptr), Status::invalid_argument);
  EXPECT_EQ(va, nullptr);
  EXPECT_EQ(device.live_reservations(), 0u);
}

TEST(SimDevice, ReleaseReservationMustNameAWholeUnmappedReservation) {
  SimDevice device(with_capacity(8 * MiB));
  void* va = reserve(device, 4 * MiB);
  void* segment = allocate(device, 1);
  EXPECT_EQ(device.release_reservation(va, 2 * MiB), Status::invalid_argument);
  EXPECT_EQ(device.release_reservation(static_cast<char*>(va) + 2 * MiB, 2 * MiB),
            Status::invalid_argument);
  EXPECT_EQ(device.release_reservation(segment, 2 * MiB), Status::invalid_argument);
  const PhysicalHandle handle = create_physical(device, 2 * MiB);
  ASSERT_EQ(device.map(static_cast<char*>(va) + 2 * MiB, handle), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 4 * MiB), Status::invalid_argument);
  EXPECT_THAT(device.last_error(), HasSubstr("still has mappings"));
  ASSERT_EQ(device.unmap(static_cast<char*>(va) + 2 * MiB, 2 * MiB), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 4 * MiB), Status::ok);
  EXPECT_EQ(device.live_reservations(), 0u);
}

TEST(SimDevice, PhysicalMemoryIsChargedUntilReleasedAndUnmapped) {
  SimDevice device(with_capacity(16 * MiB));
  void* va = reserve(device, 8 * MiB);
  char* base = static_cast<char*>(va);
  const PhysicalHandle handle = create_physical(device, 4 * MiB);
  EXPECT_EQ(device.used_bytes(), 4 * MiB);
  EXPECT_EQ(device.live_physical(), 1u);
  // The same memory mapped twice: two references to one handle, charged once.
  ASSERT_EQ(device.map(base, handle), Status::ok);
  ASSERT_EQ(device.map(base + 4 * MiB, handle), Status::ok);
  EXPECT_EQ(device.used_bytes(), 4 * MiB);

  ASSERT_EQ(device.unmap(base, 4 * MiB), Status::ok);
  EXPECT_EQ(device.used_bytes(), 4 * MiB) << "not released yet";
  ASSERT_EQ(device.release_physical(handle), Status::ok);
  EXPECT_EQ(device.used_bytes(), 4 * MiB) << "released but still mapped";
  EXPECT_EQ(device.live_physical(), 1u);
  EXPECT_EQ(device.map(base, handle), Status::invalid_argument) << "handle released";
  EXPECT_EQ(device.release_physical(handle), Status::invalid_argument) << "double release";
  ASSERT_EQ(device.unmap(base + 4 * MiB, 4 * MiB), Status::ok);
  EXPECT_EQ(device.used_bytes(), 0u);
  EXPECT_EQ(device.live_physical(), 0u);
  EXPECT_EQ(device.peak_used_bytes(), 4 * MiB);
}

TEST(SimDevice, CreatePhysicalChecksSizeAndCapacity) {
  SimDevice device(with_capacity(8 * MiB));
  PhysicalHandle handle;
  EXPECT_EQ(device.create_physical(0, &handle), Status::invalid_argument);
  EXPECT_EQ(device.create_physical(MiB, &handle), Status::invalid_argument);
  EXPECT_EQ(device.create_physical(2 * MiB, nullptr), Status::invalid_argument);
  allocate(device, 4 * MiB);
  EXPECT_EQ(device.create_physical(6 * MiB, &handle), Status::out_of_memory);
  EXPECT_THAT(device.last_error(), HasSubstr("4.00 MiB free of 8.00 MiB"));
  const PhysicalHandle fits = create_physical(device, 4 * MiB);
  EXPECT_NE(fits.handle, 0u);
  EXPECT_EQ(fits.bytes, 4 * MiB);
  EXPECT_EQ(device.used_bytes(), 8 * MiB);
}

TEST(SimDevice, MapChecksRangeHandleAndOverlap) {
  SimDevice device(with_capacity(16 * MiB));
  char* first = static_cast<char*>(reserve(device, 4 * MiB));
  char* second = static_cast<char*>(reserve(device, 4 * MiB));
  ASSERT_EQ(second, first + 4 * MiB) << "adjacent reservations, to test a straddling map";
  const PhysicalHandle handle = create_physical(device, 4 * MiB);
  const PhysicalHandle small = create_physical(device, 2 * MiB);

  EXPECT_EQ(device.map(first + 2 * MiB, handle), Status::invalid_argument)
      << "straddles two reservations";
  EXPECT_THAT(device.last_error(), HasSubstr("not inside one reservation"));
  const PhysicalHandle across[] = {small, small, small};
  EXPECT_EQ(device.map_run(first + 2 * MiB, across, 3), Status::invalid_argument)
      << "a run that straddles two reservations";
  EXPECT_EQ(device.map(first + 2 * MiB, small), Status::ok) << "the run left nothing mapped";
  ASSERT_EQ(device.unmap(first + 2 * MiB, 2 * MiB), Status::ok);
  EXPECT_EQ(device.map(first, PhysicalHandle{handle.handle, 2 * MiB}), Status::not_supported)
      << "part of the handle";
  EXPECT_THAT(device.last_error(), HasSubstr("mapped only whole"));
  EXPECT_EQ(device.map(first, PhysicalHandle{handle.handle, 0}), Status::not_supported);
  EXPECT_EQ(device.map(first, PhysicalHandle{handle.handle, 6 * MiB}), Status::invalid_argument)
      << "more than the handle";
  EXPECT_EQ(device.map(first, PhysicalHandle{99, 2 * MiB}), Status::invalid_argument);
  EXPECT_THAT(device.last_error(), HasSubstr("unknown or released physical handle"));
  EXPECT_EQ(device.map(first + MiB, small), Status::invalid_argument) << "misaligned";
  EXPECT_EQ(device.map(pointer(kBase + GiB), small), Status::invalid_argument) << "not reserved";

  ASSERT_EQ(device.map(first, handle), Status::ok);
  EXPECT_EQ(device.map(first + 2 * MiB, small), Status::invalid_argument);
  EXPECT_THAT(device.last_error(), HasSubstr("already mapped"));
  ASSERT_EQ(device.unmap(first, 4 * MiB), Status::ok);
  const SimCounters counters = device.counters();
  EXPECT_EQ(counters.failed(DeviceOp::map), 9u) << "every refusal is a failed call";
}

TEST(SimDevice, UnmapMustCoverWholeMappingsExactly) {
  SimDevice device(with_capacity(16 * MiB));
  char* va = static_cast<char*>(reserve(device, 8 * MiB));
  const PhysicalHandle low = create_physical(device, 2 * MiB);
  const PhysicalHandle high = create_physical(device, 4 * MiB);
  ASSERT_EQ(device.map(va, low), Status::ok);
  ASSERT_EQ(device.map(va + 2 * MiB, high), Status::ok);

  EXPECT_EQ(device.unmap(va + 2 * MiB, 2 * MiB), Status::invalid_argument) << "part of one";
  EXPECT_THAT(device.last_error(), HasSubstr("would unmap part of the mapping"));
  EXPECT_EQ(device.unmap(va, 4 * MiB), Status::invalid_argument) << "ends inside the second";
  EXPECT_EQ(device.unmap(va, 8 * MiB), Status::invalid_argument) << "runs past the last";
  EXPECT_EQ(device.unmap(va + 6 * MiB, 2 * MiB), Status::invalid_argument) << "nothing there";

  ASSERT_EQ(device.release_physical(low), Status::ok);
  ASSERT_EQ(device.release_physical(high), Status::ok);
  EXPECT_EQ(device.used_bytes(), 6 * MiB) << "failed unmaps changed nothing";
  ASSERT_EQ(device.unmap(va, 6 * MiB), Status::ok) << "two consecutive mappings at once";
  EXPECT_EQ(device.used_bytes(), 0u);
  EXPECT_EQ(device.release_reservation(va, 8 * MiB), Status::ok);
}

TEST(SimDevice, VirtualMemoryCanBeSwitchedOff) {
  SimDeviceOptions options = with_capacity(8 * MiB);
  options.virtual_memory = false;
  SimDevice device(options);
  EXPECT_FALSE(device.supports_virtual_memory());
  void* va = nullptr;
  PhysicalHandle handle;
  EXPECT_EQ(device.reserve(2 * MiB, 0, &va), Status::not_supported);
  EXPECT_THAT(device.last_error(), HasSubstr("reserve: virtual memory is not supported"));
  EXPECT_EQ(device.release_reservation(pointer(kBase), 2 * MiB), Status::not_supported);
  EXPECT_EQ(device.create_physical(2 * MiB, &handle), Status::not_supported);
  EXPECT_EQ(device.release_physical(handle), Status::not_supported);
  EXPECT_EQ(device.map(pointer(kBase), handle), Status::not_supported);
  EXPECT_EQ(device.unmap(pointer(kBase), 2 * MiB), Status::not_supported);
  EXPECT_EQ(device.used_bytes(), 0u);
}

// --- threads -------------------------------------------------------------------------------------

TEST(SimDevice, ConcurrentAllocationsNeverCollideAndAllReturn) {
  SimDevice device(with_capacity(1 * GiB));
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&device, &failures, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<void*> held;
      for (int round = 0; round < kRounds; ++round) {
        void* ptr = nullptr;
        if (device.allocate(1 + rng() % (6 * MiB), &ptr) != Status::ok) ++failures[t];
        else held.push_back(ptr);
        if (held.size() > 8 || (round % 3 == 0 && !held.empty())) {
          if (device.deallocate(held.front()) != Status::ok) ++failures[t];
          held.erase(held.begin());
        }
        Event event;
        if (device.create_event(&event) != Status::ok ||
            device.record_event(event, default_stream) != Status::ok ||
            device.destroy_event(event) != Status::ok) {
          ++failures[t];
        }
      }
      for (void* ptr : held) {
        if (device.deallocate(ptr) != Status::ok) ++failures[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_EQ(device.used_bytes(), 0u);
  EXPECT_EQ(device.live_segments(), 0u);
  EXPECT_EQ(device.live_events(), 0u);
  EXPECT_EQ(device.counters().of(DeviceOp::allocate), std::uint64_t{kThreads * kRounds});
  EXPECT_EQ(device.counters().of(DeviceOp::deallocate), std::uint64_t{kThreads * kRounds});
}

TEST(SimDevice, LastErrorBelongsToTheCallingThreadAndDevice) {
  SimDevice device(with_capacity(8 * MiB));
  SimDevice other(with_capacity(8 * MiB));
  void* ptr = nullptr;
  ASSERT_EQ(device.allocate(0, &ptr), Status::invalid_argument);
  const std::string mine = device.last_error();
  EXPECT_FALSE(mine.empty());
  EXPECT_EQ(other.last_error(), "") << "another device's failure";
  std::string seen_elsewhere = "unset";
  std::thread([&] { seen_elsewhere = device.last_error(); }).join();
  EXPECT_EQ(seen_elsewhere, "");
  ASSERT_EQ(device.allocate(1, &ptr), Status::ok);
  EXPECT_EQ(device.last_error(), mine) << "a success keeps the last failure";
}

}  // namespace
}  // namespace cistern

namespace cistern {
namespace {

TEST(SimDeviceAddressPlan, PlacesSegmentsWherePlannedWhenPossible) {
  SimDeviceOptions o;
  o.capacity = 64 * MiB;
  SimDevice device(o);
  const std::uintptr_t wanted = o.base_address + 10 * o.granularity;
  device.set_address_plan([&](std::size_t bytes) { return bytes == 4 * MiB ? wanted : 0; });
  void* a = nullptr;
  ASSERT_EQ(device.allocate(4 * MiB, &a), Status::ok);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a), wanted);
  void* b = nullptr;  // the planned address is taken now: the lowest free one is used
  ASSERT_EQ(device.allocate(4 * MiB, &b), Status::ok);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b), o.base_address);
  void* c = nullptr;  // no plan for this size
  ASSERT_EQ(device.allocate(2 * MiB, &c), Status::ok);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(c), o.base_address + 4 * MiB);
  device.set_address_plan([&](std::size_t) { return wanted + 1; });  // misaligned: ignored
  void* d = nullptr;
  ASSERT_EQ(device.allocate(2 * MiB, &d), Status::ok);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(d), o.base_address + 6 * MiB);
  for (void* p : {a, b, c, d}) EXPECT_EQ(device.deallocate(p), Status::ok);
}

}  // namespace
}  // namespace cistern
