// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// SimDevice: a simulated GPU that implements the whole device contract without CUDA.
//
// It is what the replay engine runs on and what every allocator test runs on, so its accounting
// follows a real GPU: capacity is charged in whole granules (2 MiB by default, as the driver
// does), addresses are unique, aligned and never overlap a live segment, and a failed allocation
// leaves nothing behind. Streams are simulated on a virtual clock: work submitted with `launch`
// completes only when the clock is advanced past it or when the host synchronises, so that code
// which reuses memory across streams is really tested against pending work.
//
// Fault injection makes any operation fail on its Nth call or with a probability, and counters
// record every call. All methods are thread-safe. Memory calls share one lock; stream and event
// calls (record, query, wait, synchronise, launch) take none unless a fault is armed for them,
// so threads that drive their own streams and events - an allocator's cross-stream frees - do
// not wait for each other on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cistern/device.hpp"

namespace cistern {

/// Construction options of a `SimDevice`.
struct SimDeviceOptions {
  std::size_t capacity = 80 * GiB;               ///< physical memory, bytes
  std::size_t granularity = 2 * MiB;             ///< allocation granularity, a power of two >= 512
  int index = 0;                                 ///< the device ordinal it reports
  std::uintptr_t base_address = 0x7f0000000000;  ///< lowest address handed out (granule aligned)
  std::size_t address_space = std::size_t{1} << 44;  ///< size of the simulated address space
  bool virtual_memory = true;                        ///< whether the VMM operations are supported
  /// Pack allocations of at most half a granule into shared granules at 512-byte alignment, as
  /// the CUDA driver does for small cudaMalloc requests (each granule charged once); false:
  /// every allocation is charged whole granules.
  bool pack_small_allocations = true;
  std::uint64_t seed = 0x5eed;  ///< seed of the fault-injection random generator
};

/// Per-operation call counters.
struct SimCounters {
  std::uint64_t calls[kDeviceOpCount] = {};     ///< calls made, including failed ones
  std::uint64_t failures[kDeviceOpCount] = {};  ///< calls that returned an error status
  /// Calls of one operation.
  std::uint64_t of(DeviceOp op) const noexcept { return calls[static_cast<int>(op)]; }
  /// Failed calls of one operation.
  std::uint64_t failed(DeviceOp op) const noexcept { return failures[static_cast<int>(op)]; }
};

/// A simulated device. See the file comment.
class SimDevice final : public Device {
 public:
  explicit SimDevice(SimDeviceOptions options = {});
  ~SimDevice() override;

  // --- the device contract -----------------------------------------------------------------------
  int index() const noexcept override;
  std::string name() const override;
  std::size_t granularity() const noexcept override;
  Status memory_info(MemoryInfo* info) noexcept override;
  std::string last_error() const override;
  Status allocate(std::size_t bytes, void** ptr) noexcept override;
  Status deallocate(void* ptr) noexcept override;
  bool supports_virtual_memory() const noexcept override;
  Status reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept override;
  Status release_reservation(void* va, std::size_t bytes) noexcept override;
  Status create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept override;
  Status release_physical(PhysicalHandle handle) noexcept override;
  Status map(void* va, PhysicalHandle handle) noexcept override;
  Status map_run(void* va, const PhysicalHandle* handles, std::size_t count) noexcept override;
  Status unmap(void* va, std::size_t bytes) noexcept override;
  Status create_event(Event* event) noexcept override;
  Status destroy_event(Event event) noexcept override;
  Status record_event(Event event, Stream stream) noexcept override;
  Status query_event(Event event) noexcept override;
  Status synchronize_event(Event event) noexcept override;
  Status stream_wait_event(Stream stream, Event event) noexcept override;
  Status synchronize_stream(Stream stream) noexcept override;
  Status synchronize_device() noexcept override;

  // --- simulation ----------------------------------------------------------------------------------

  /// Creates a new simulated stream. The default stream (handle 0) always exists; any other
  /// handle must come from here.
  Stream create_stream();
  /// Submits work of `duration_ns` simulated nanoseconds to `stream`; it starts when the
  /// stream's earlier work (and any event it waits for) is done.
  void launch(Stream stream, std::uint64_t duration_ns);
  /// Advances the simulated clock.
  void advance(std::uint64_t ns);
  /// The simulated clock, in nanoseconds.
  std::uint64_t now() const;
  /// The time at which all work submitted to `stream` so far completes.
  std::uint64_t stream_done_at(Stream stream) const;
  /// Whether all work submitted to `stream` has completed at the current time.
  bool stream_idle(Stream stream) const;

  /// Takes a segment at a given address (for replaying a recorded allocator state). Fails with
  /// `invalid_argument` if the range is misaligned or overlaps anything live, `out_of_memory` if
  /// the capacity would be exceeded.
  Status allocate_at(void* address, std::size_t bytes) noexcept;

  /// Lets `allocate` place segments where a recorded run placed them: for a segment of
  /// `bytes` (granule-rounded) the plan returns a preferred address, or 0 for none. A preferred
  /// address that is misaligned or not free is ignored (the lowest free address is used).
  /// Called under the device's lock: the plan must not call back into the device.
  void set_address_plan(std::function<std::uintptr_t(std::size_t bytes)> plan);

  /// Takes an address range at a given address, as `reserve` would (for replaying a recorded
  /// allocator's expandable segments). Fails with `invalid_argument` if the range is misaligned
  /// or overlaps anything live. Not counted as a call.
  Status reserve_at(void* address, std::size_t bytes) noexcept;

  /// Lets `reserve` place address ranges where a recorded run placed them: for a range of
  /// `bytes` the plan returns a preferred address, or 0 for none. A preferred address that is
  /// not aligned to the requested alignment or not free is ignored. Called under the device's
  /// lock: the plan must not call back into the device.
  void set_reservation_plan(std::function<std::uintptr_t(std::size_t bytes)> plan);

  // --- fault injection -----------------------------------------------------------------------------

  /// Makes the `nth` call of `op` from now on (1 = the next one) fail with `status`.
  void fail_nth(DeviceOp op, std::uint64_t nth, Status status = Status::out_of_memory);
  /// Makes each call of `op` fail with probability `p` (seeded, so repeatable).
  void fail_with_probability(DeviceOp op, double p, Status status = Status::out_of_memory);
  /// Removes all injected faults.
  void clear_faults();

  // --- observation ---------------------------------------------------------------------------------

  /// Call and failure counters of every operation.
  SimCounters counters() const;
  /// Physical bytes in use (segments and physical handles, in whole granules).
  std::size_t used_bytes() const;
  /// The highest `used_bytes()` seen.
  std::size_t peak_used_bytes() const;
  /// Live allocations from `allocate`/`allocate_at` (packed small ones included).
  std::size_t live_segments() const;
  /// Live reservations, physical handles and events.
  std::size_t live_reservations() const;
  std::size_t live_physical() const;
  std::size_t live_events() const;
  /// The total capacity.
  std::size_t capacity() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace cistern
