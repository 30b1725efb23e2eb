// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// MeteredDevice: forwarding, counting and pricing (see metered_device.hpp).
#include "replay/metered_device.hpp"

namespace cistern::replay::detail {

MeteredDevice::MeteredDevice(SimDevice& device, const CostModel& costs)
    : device_(device), costs_(costs) {}

void MeteredDevice::note_segment(std::uintptr_t address, std::size_t bytes) {
  segment_bytes_[address] = bytes;
}

// --- segments -----------------------------------------------------------------------------------------

Status MeteredDevice::allocate(std::size_t bytes, void** ptr) noexcept {
  const Status status = device_.allocate(bytes, ptr);
  calls_.ns += costs_.alloc_ns;
  if (status != Status::ok) return status;
  ++calls_.allocs;
  calls_.ns += costs_.alloc_size_ns(bytes);
  try {
    segment_bytes_[reinterpret_cast<std::uintptr_t>(*ptr)] = bytes;
  } catch (...) {
    // Out of host memory for the meter's own map: the free will be priced at its fixed cost.
  }
  return status;
}

Status MeteredDevice::deallocate(void* ptr) noexcept {
  const Status status = device_.deallocate(ptr);
  calls_.ns += costs_.free_ns;
  if (status != Status::ok) return status;
  ++calls_.frees;
  const auto it = segment_bytes_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it != segment_bytes_.end()) {
    calls_.ns += costs_.free_size_ns(it->second);
    segment_bytes_.erase(it);
  }
  return status;
}

// --- virtual memory: priced per granule at map and unmap, where the model puts the cost -------------

Status MeteredDevice::map(void* va, std::size_t bytes, PhysicalHandle handle,
                          std::size_t offset) noexcept {
  const Status status = device_.map(va, bytes, handle, offset);
  if (status != Status::ok) {
    calls_.ns += costs_.map_ns;
    return status;
  }
  ++calls_.maps;
  calls_.ns += costs_.map_granules_ns(bytes, device_.granularity());
  return status;
}

Status MeteredDevice::unmap(void* va, std::size_t bytes) noexcept {
  const Status status = device_.unmap(va, bytes);
  if (status != Status::ok) {
    calls_.ns += costs_.unmap_ns;
    return status;
  }
  ++calls_.unmaps;
  calls_.ns += costs_.unmap_granules_ns(bytes, device_.granularity());
  return status;
}

Status MeteredDevice::reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept {
  return device_.reserve(bytes, alignment, va);
}
Status MeteredDevice::release_reservation(void* va, std::size_t bytes) noexcept {
  return device_.release_reservation(va, bytes);
}
Status MeteredDevice::create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept {
  return device_.create_physical(bytes, handle);
}
Status MeteredDevice::release_physical(PhysicalHandle handle) noexcept {
  return device_.release_physical(handle);
}

// --- events: one price for record, query, wait and host wait ------------------------------------------

Status MeteredDevice::event_call(Status status) noexcept {
  calls_.ns += costs_.event_ns;
  return status;
}

Status MeteredDevice::record_event(Event event, Stream stream) noexcept {
  return event_call(device_.record_event(event, stream));
}
Status MeteredDevice::query_event(Event event) noexcept {
  return event_call(device_.query_event(event));
}
Status MeteredDevice::synchronize_event(Event event) noexcept {
  return event_call(device_.synchronize_event(event));
}
Status MeteredDevice::stream_wait_event(Stream stream, Event event) noexcept {
  return event_call(device_.stream_wait_event(stream, event));
}
Status MeteredDevice::create_event(Event* event) noexcept { return device_.create_event(event); }
Status MeteredDevice::destroy_event(Event event) noexcept { return device_.destroy_event(event); }

// --- the rest is forwarded unpriced ----------------------------------------------------------------------

int MeteredDevice::index() const noexcept { return device_.index(); }
std::string MeteredDevice::name() const { return device_.name(); }
std::size_t MeteredDevice::granularity() const noexcept { return device_.granularity(); }
Status MeteredDevice::memory_info(MemoryInfo* info) noexcept { return device_.memory_info(info); }
std::string MeteredDevice::last_error() const { return device_.last_error(); }
bool MeteredDevice::supports_virtual_memory() const noexcept {
  return device_.supports_virtual_memory();
}
Status MeteredDevice::synchronize_stream(Stream stream) noexcept {
  return device_.synchronize_stream(stream);
}
Status MeteredDevice::synchronize_device() noexcept { return device_.synchronize_device(); }

}  // namespace cistern::replay::detail
