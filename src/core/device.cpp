// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Names of the device contract's enumerations, spelled exactly as the enumerators so that a
// message can be searched for in the source, and the contract's default `map_run`.
#include "cistern/device.hpp"

#include <cstdint>

namespace cistern {

const char* to_string(Status status) noexcept {
  switch (status) {
    case Status::ok: return "ok";
    case Status::not_ready: return "not_ready";
    case Status::out_of_memory: return "out_of_memory";
    case Status::invalid_argument: return "invalid_argument";
    case Status::not_supported: return "not_supported";
    case Status::device_error: return "device_error";
  }
  return "unknown_status";  // only reachable through a cast of an out-of-range integer
}

const char* to_string(DeviceOp op) noexcept {
  switch (op) {
    case DeviceOp::allocate: return "allocate";
    case DeviceOp::deallocate: return "deallocate";
    case DeviceOp::reserve: return "reserve";
    case DeviceOp::release_reservation: return "release_reservation";
    case DeviceOp::create_physical: return "create_physical";
    case DeviceOp::release_physical: return "release_physical";
    case DeviceOp::map: return "map";
    case DeviceOp::unmap: return "unmap";
    case DeviceOp::create_event: return "create_event";
    case DeviceOp::destroy_event: return "destroy_event";
    case DeviceOp::record_event: return "record_event";
    case DeviceOp::query_event: return "query_event";
    case DeviceOp::synchronize_event: return "synchronize_event";
    case DeviceOp::stream_wait_event: return "stream_wait_event";
    case DeviceOp::synchronize_stream: return "synchronize_stream";
    case DeviceOp::synchronize_device: return "synchronize_device";
    case DeviceOp::memory_info: return "memory_info";
  }
  return "unknown_op";  // only reachable through a cast of an out-of-range integer
}

Status Device::map_run(void* va, const PhysicalHandle* handles, std::size_t count) noexcept {
  const auto start = reinterpret_cast<std::uintptr_t>(va);
  std::uintptr_t at = start;
  for (std::size_t i = 0; i < count; ++i) {
    const Status status = map(reinterpret_cast<void*>(at), handles[i]);
    if (status != Status::ok) {
      // All or nothing: undo the handles already mapped (nothing has used them yet) - in one
      // unmap, and where that fails, mapping by mapping, so that one failed call does not leave
      // mappings the caller takes for undone.
      if (at != start && unmap(va, at - start) != Status::ok) {
        std::uintptr_t back = start;
        for (std::size_t j = 0; j < i; back += handles[j++].bytes) {
          (void)unmap(reinterpret_cast<void*>(back), handles[j].bytes);
        }
      }
      return status;
    }
    at += handles[i].bytes;
  }
  return Status::ok;
}

}  // namespace cistern
