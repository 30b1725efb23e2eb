// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// ForwardingDevice: a Device that passes every call to another one (its upstream) unchanged -
// the base of the replay's adaptors, as RMM's resource adaptors wrap an upstream resource.
//
// An adaptor derives from it and overrides only the calls it changes: the meter counts and
// prices the allocator's calls, the timer measures them, the recorder notes segment events.
// Adaptors stack (allocator -> meter -> timer -> device), each seeing the calls of the one above.
#pragma once

#include <cstddef>
#include <string>

#include "cistern/device.hpp"

namespace cistern::replay {

/// See the file comment. As thread-safe as its upstream; adaptors that keep counts say otherwise.
class ForwardingDevice : public Device {
 public:
  /// Forwards to `upstream`, which must outlive this device.
  explicit ForwardingDevice(Device& upstream) noexcept : upstream_(upstream) {}

  /// The device every call goes to.
  Device& upstream() const noexcept { return upstream_; }

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

 private:
  Device& upstream_;
};

}  // namespace cistern::replay
