// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// MeteredDevice: counting and pricing (see metered_device.hpp).
#include "replay/metered_device.hpp"

namespace cistern::replay::detail {

MeteredDevice::MeteredDevice(Device& upstream, const CostModel& costs)
    : ForwardingDevice(upstream), costs_(costs) {}

void MeteredDevice::note_segment(std::uintptr_t address, std::size_t bytes) {
  segment_bytes_[address] = bytes;
}

// cudaMemGetInfo: a driver query, priced as an event query (not counted as a call that changes
// anything).
Status MeteredDevice::memory_info(MemoryInfo* info) noexcept {
  calls_.ns += costs_.event_query_ns;
  return upstream().memory_info(info);
}

// --- segments -----------------------------------------------------------------------------------------

Status MeteredDevice::allocate(std::size_t bytes, void** ptr) noexcept {
  const Status status = upstream().allocate(bytes, ptr);
  if (status != Status::ok) {
    calls_.ns += costs_.alloc_ns;
    return status;
  }
  ++calls_.allocs;
  calls_.ns += costs_.alloc_price(bytes);
  try {
    segment_bytes_[reinterpret_cast<std::uintptr_t>(*ptr)] = bytes;
  } catch (...) {
    // Out of host memory for the meter's own map: the free will be priced at its fixed cost.
  }
  return status;
}

Status MeteredDevice::deallocate(void* ptr) noexcept {
  const Status status = upstream().deallocate(ptr);
  const auto it = status == Status::ok ? segment_bytes_.find(reinterpret_cast<std::uintptr_t>(ptr))
                                       : segment_bytes_.end();
  if (it == segment_bytes_.end()) {
    calls_.ns += costs_.free_ns;
  } else {
    calls_.ns += costs_.free_price(it->second);
    segment_bytes_.erase(it);
  }
  if (status == Status::ok) ++calls_.frees;
  return status;
}

// --- virtual memory: address space and handles per call, handles by size; cuMemMap per mapping,
// the access grant and the unmap per mapping covered, each by the mapping's size -----------------

Status MeteredDevice::reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept {
  const Status status = upstream().reserve(bytes, alignment, va);
  calls_.ns += costs_.reserve_ns;
  if (status == Status::ok) ++calls_.reserves;
  return status;
}

Status MeteredDevice::release_reservation(void* va, std::size_t bytes) noexcept {
  const Status status = upstream().release_reservation(va, bytes);
  calls_.ns += costs_.release_reservation_ns;
  if (status == Status::ok) ++calls_.unreserves;
  return status;
}

Status MeteredDevice::create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept {
  const Status status = upstream().create_physical(bytes, handle);
  if (status != Status::ok) {
    calls_.ns += costs_.create_ns;
    return status;
  }
  ++calls_.creates;
  calls_.ns += costs_.create_price(bytes);
  try {
    handle_bytes_[handle->handle] = bytes;
  } catch (...) {
    // Out of host memory: the release will be priced at its fixed cost only.
  }
  return status;
}

Status MeteredDevice::release_physical(PhysicalHandle handle) noexcept {
  const Status status = upstream().release_physical(handle);
  const auto it = status == Status::ok ? handle_bytes_.find(handle.handle) : handle_bytes_.end();
  if (it == handle_bytes_.end()) {
    calls_.ns += costs_.release_ns;
  } else {
    calls_.ns += costs_.release_price(it->second);
    handle_bytes_.erase(it);
  }
  if (status == Status::ok) ++calls_.releases;
  return status;
}

void MeteredDevice::note_mapping(const void* va, std::size_t bytes) noexcept {
  const auto start = reinterpret_cast<std::uintptr_t>(va);
  try {
    mappings_[start] = start + bytes;
  } catch (...) {
    // Out of host memory for the meter's own map: an unmap covering it is priced as one mapping.
  }
}

// One cuMemMap and the access grant of one mapping of the handle's size. A failure costs the
// fixed parts of both.
Status MeteredDevice::map(void* va, PhysicalHandle handle) noexcept {
  const Status status = upstream().map(va, handle);
  if (status != Status::ok) {
    calls_.ns += costs_.map_ns + costs_.access_ns;
    return status;
  }
  ++calls_.maps;
  calls_.ns += costs_.map_ns + costs_.access_price(handle.bytes);
  note_mapping(va, handle.bytes);
  return status;
}

// One cuMemMap per handle and one cuMemSetAccess over the run, which costs per mapping it covers:
// n maps and n access grants, each by its handle's size. A failure costs the fixed parts of the
// whole run (at most what a driver would have done before it stopped).
Status MeteredDevice::map_run(void* va, const PhysicalHandle* handles, std::size_t count) noexcept {
  const Status status = upstream().map_run(va, handles, count);
  if (status != Status::ok) {
    calls_.ns += (costs_.map_ns + costs_.access_ns) * static_cast<double>(count);
    return status;
  }
  calls_.maps += count;
  auto* at = static_cast<char*>(va);
  for (std::size_t i = 0; i < count; at += handles[i++].bytes) {
    calls_.ns += costs_.map_ns + costs_.access_price(handles[i].bytes);
    note_mapping(at, handles[i].bytes);
  }
  return status;
}

// Per mapping the range covers, each by its size, whether one call covers them or several. A
// range of mappings the meter did not see made is priced as one mapping of its size; a refused
// unmap costs one mapping's fixed part.
Status MeteredDevice::unmap(void* va, std::size_t bytes) noexcept {
  const Status status = upstream().unmap(va, bytes);
  if (status != Status::ok) {
    calls_.ns += costs_.unmap_ns;
    return status;
  }
  ++calls_.unmaps;
  const auto start = reinterpret_cast<std::uintptr_t>(va);
  const auto first = mappings_.lower_bound(start);
  auto last = first;
  std::size_t covered = 0;
  for (; last != mappings_.end() && last->first < start + bytes; ++last) {
    calls_.ns += costs_.unmap_price(last->second - last->first);
    ++covered;
  }
  mappings_.erase(first, last);
  if (covered == 0) calls_.ns += costs_.unmap_price(bytes);
  return status;
}

// --- events and synchronisations ------------------------------------------------------------------------

Status MeteredDevice::event_call(Status status, double ns) noexcept {
  calls_.ns += ns;
  if (status == Status::ok || status == Status::not_ready) ++calls_.events;
  return status;
}

Status MeteredDevice::sync_call(Status status, double ns) noexcept {
  calls_.ns += ns;
  if (status == Status::ok) ++calls_.syncs;
  return status;
}

// Creating and destroying an event are counted but not priced (pooled by the allocators).
Status MeteredDevice::create_event(Event* event) noexcept {
  return event_call(upstream().create_event(event), 0);
}
Status MeteredDevice::destroy_event(Event event) noexcept {
  return event_call(upstream().destroy_event(event), 0);
}
Status MeteredDevice::record_event(Event event, Stream stream) noexcept {
  return event_call(upstream().record_event(event, stream), costs_.event_record_ns);
}
Status MeteredDevice::query_event(Event event) noexcept {
  return event_call(upstream().query_event(event), costs_.event_query_ns);
}
// Enqueues one command in a stream, as a record does (not measured on its own).
Status MeteredDevice::stream_wait_event(Stream stream, Event event) noexcept {
  return event_call(upstream().stream_wait_event(stream, event), costs_.event_record_ns);
}
Status MeteredDevice::synchronize_event(Event event) noexcept {
  return sync_call(upstream().synchronize_event(event), costs_.sync_event_ns);
}
Status MeteredDevice::synchronize_stream(Stream stream) noexcept {
  return sync_call(upstream().synchronize_stream(stream), costs_.sync_stream_ns);
}
Status MeteredDevice::synchronize_device() noexcept {
  return sync_call(upstream().synchronize_device(), costs_.sync_device_ns);
}

}  // namespace cistern::replay::detail
