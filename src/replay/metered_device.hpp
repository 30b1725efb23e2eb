// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// MeteredDevice: an adaptor over the replay's device that counts the device calls an allocator
// makes and prices them with the cost model (the "simulated device time" figure).
//
// The allocator under test is built over the adaptor, so that exactly its own calls are metered:
// the engine's program calls (a trace's synchronize events) and a warm start's placement of the
// recorded cache go to the device directly and cost nothing here. Every call is forwarded
// unchanged (ForwardingDevice); the adaptor only watches the calls that cost something: segments,
// address space, physical handles, mappings, events and synchronisations. Failed calls are priced
// at their fixed cost (a failed cudaMalloc still takes the driver's time) and are not counted as
// calls made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>

#include "replay/engine.hpp"
#include "replay/forwarding_device.hpp"

namespace cistern::replay::detail {

/// Successful calls of an allocator, and their simulated cost.
struct DeviceCalls {
  std::uint64_t allocs = 0;      ///< segments obtained (cudaMalloc)
  std::uint64_t frees = 0;       ///< segments returned (cudaFree)
  std::uint64_t reserves = 0;    ///< address ranges reserved (cuMemAddressReserve)
  std::uint64_t unreserves = 0;  ///< address ranges released (cuMemAddressFree)
  std::uint64_t creates = 0;     ///< physical handles created (cuMemCreate)
  std::uint64_t releases = 0;    ///< physical handles released (cuMemRelease)
  std::uint64_t maps = 0;        ///< map calls
  std::uint64_t unmaps = 0;      ///< unmap calls
  std::uint64_t events = 0;      ///< event create, destroy, record, query and stream waits
  std::uint64_t syncs = 0;       ///< stream, event and device synchronisations
  double ns = 0;                 ///< simulated time of every metered call, failed ones included
};

/// See the file comment. Not thread-safe for counting: one replay, one thread.
class MeteredDevice final : public ForwardingDevice {
 public:
  /// Meters the calls made to it, forwarding them to `upstream`.
  MeteredDevice(Device& upstream, const CostModel& costs);

  /// What has been metered so far.
  const DeviceCalls& calls() const noexcept { return calls_; }
  /// Declares a segment that was placed on the device without this adaptor (a warm start's
  /// recorded cache), so that its later free is priced by its size.
  void note_segment(std::uintptr_t address, std::size_t bytes);
  /// Forgets the calls metered so far, keeping the sizes of live segments and handles: a warm
  /// start that maps the recorded cache through the allocator (expandable segments) is not a
  /// call of the replay.
  void clear_calls() noexcept { calls_ = DeviceCalls{}; }

  Status memory_info(MemoryInfo* info) noexcept override;
  Status allocate(std::size_t bytes, void** ptr) noexcept override;
  Status deallocate(void* ptr) noexcept override;
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

 private:
  void note_mapping(const void* va, std::size_t bytes) noexcept;
  Status event_call(Status status, double ns) noexcept;
  Status sync_call(Status status, double ns) noexcept;

  CostModel costs_;
  DeviceCalls calls_;
  std::unordered_map<std::uintptr_t, std::size_t> segment_bytes_;  // live segments by address
  // Live mappings made through the adaptor, start -> end: an unmap is priced per mapping it
  // covers, each by its size.
  std::map<std::uintptr_t, std::uintptr_t> mappings_;
  std::unordered_map<std::uint64_t, std::size_t> handle_bytes_;  // live handles by handle
};

}  // namespace cistern::replay::detail
