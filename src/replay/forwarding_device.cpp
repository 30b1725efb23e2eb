// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// ForwardingDevice: every call, forwarded once (see forwarding_device.hpp).
#include "replay/forwarding_device.hpp"

namespace cistern::replay {

int ForwardingDevice::index() const noexcept { return upstream_.index(); }
std::string ForwardingDevice::name() const { return upstream_.name(); }
std::size_t ForwardingDevice::granularity() const noexcept { return upstream_.granularity(); }
Status ForwardingDevice::memory_info(MemoryInfo* info) noexcept {
  return upstream_.memory_info(info);
}
std::string ForwardingDevice::last_error() const { return upstream_.last_error(); }

Status ForwardingDevice::allocate(std::size_t bytes, void** ptr) noexcept {
  return upstream_.allocate(bytes, ptr);
}
Status ForwardingDevice::deallocate(void* ptr) noexcept { return upstream_.deallocate(ptr); }

bool ForwardingDevice::supports_virtual_memory() const noexcept {
  return upstream_.supports_virtual_memory();
}
Status ForwardingDevice::reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept {
  return upstream_.reserve(bytes, alignment, va);
}
Status ForwardingDevice::release_reservation(void* va, std::size_t bytes) noexcept {
  return upstream_.release_reservation(va, bytes);
}
Status ForwardingDevice::create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept {
  return upstream_.create_physical(bytes, handle);
}
Status ForwardingDevice::release_physical(PhysicalHandle handle) noexcept {
  return upstream_.release_physical(handle);
}
Status ForwardingDevice::map(void* va, PhysicalHandle handle) noexcept {
  return upstream_.map(va, handle);
}
Status ForwardingDevice::map_run(void* va, const PhysicalHandle* handles,
                                 std::size_t count) noexcept {
  return upstream_.map_run(va, handles, count);
}
Status ForwardingDevice::unmap(void* va, std::size_t bytes) noexcept {
  return upstream_.unmap(va, bytes);
}

Status ForwardingDevice::create_event(Event* event) noexcept {
  return upstream_.create_event(event);
}
Status ForwardingDevice::destroy_event(Event event) noexcept {
  return upstream_.destroy_event(event);
}
Status ForwardingDevice::record_event(Event event, Stream stream) noexcept {
  return upstream_.record_event(event, stream);
}
Status ForwardingDevice::query_event(Event event) noexcept { return upstream_.query_event(event); }
Status ForwardingDevice::synchronize_event(Event event) noexcept {
  return upstream_.synchronize_event(event);
}
Status ForwardingDevice::stream_wait_event(Stream stream, Event event) noexcept {
  return upstream_.stream_wait_event(stream, event);
}
Status ForwardingDevice::synchronize_stream(Stream stream) noexcept {
  return upstream_.synchronize_stream(stream);
}
Status ForwardingDevice::synchronize_device() noexcept { return upstream_.synchronize_device(); }

}  // namespace cistern::replay
