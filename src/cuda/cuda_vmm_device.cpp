// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CudaVmmDevice: the virtual-memory part of the device contract over the driver API
// (include/cistern/cuda_device.hpp).
//
// The driver's functions come from cudaGetDriverEntryPointByVersion (cuda_api.cpp). Physical
// memory is pinned device memory of this GPU (`cuMemCreate`, no shareable handle), mapped with
// read-write access for this GPU only. The driver maps a handle only whole, at offset 0 (a map at
// an offset or of part of a handle is CUDA_ERROR_NOT_SUPPORTED on an H200), so every map is of
// the whole handle. Reservations, handles and mappings are tracked here and every request is
// checked against them first, so that the contract's refusals never depend on what a driver
// version happens to accept, and a failed call changes nothing. An unmap of several mappings side
// by side is one `cuMemUnmap` over the range (the driver takes a range of whole mappings, as
// measured on an H200), so that reclaim pays one call per run. A driver that refuses the range
// (CUDA_ERROR_INVALID_VALUE, nothing unmapped) gets the mappings one by one instead; if it fails
// part way, the range stays tracked as mapped and the same call can be retried. `unmap` does not
// wait for work that still uses the memory (`cuMemUnmap` does not): the caller synchronises its
// users first.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cistern/cuda_device.hpp"
#include "cistern/errors.hpp"
#include "cuda/cuda_device_state.hpp"

namespace cistern {
namespace detail {

/// One mapping: [start, end) backed by the whole of a physical handle.
struct CudaMapping {
  std::uintptr_t end = 0;
  CUmemGenericAllocationHandle handle = 0;
  /// Already unmapped by the driver during an `unmap` of several mappings that then failed at a
  /// later one. It stays tracked, so that the failed call changed nothing the caller can see and
  /// its retry (the same range) succeeds; the retry skips it.
  bool unmapped = false;
};

/// The virtual-memory state of a CudaVmmDevice. Invariants: reservations are disjoint; every
/// mapping lies inside one reservation, and mappings are disjoint; `physical` holds the handles
/// created and not yet released (a released handle may still be mapped: the driver keeps its
/// memory until the last mapping goes).
struct CudaVmmState {
  CudaDriverApi driver;
  std::size_t granularity = 0;
  /// Guards the tracking below. `map` and `unmap` hold it across their driver calls, so that no
  /// other thread sees a range half mapped; the driver calls never call back into the device.
  mutable std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> reservations;                      ///< start -> bytes
  std::unordered_map<CUmemGenericAllocationHandle, std::size_t> physical;  ///< handle -> bytes
  std::map<std::uintptr_t, CudaMapping> mappings;                          ///< start -> mapping
};

}  // namespace detail

using detail::CudaDeviceState;
using detail::CudaVmmState;
using detail::hex;

namespace {

bool is_power_of_two(std::size_t value) { return value != 0 && (value & (value - 1)) == 0; }

std::uintptr_t address_of(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

/// Pinned memory on the device, as cuMemCreate and cuMemGetAllocationGranularity take it.
CUmemAllocationProp allocation_properties(int ordinal) {
  CUmemAllocationProp properties{};
  properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  properties.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  properties.location.id = ordinal;
  return properties;
}

/// The driver's name and description of an error ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory").
std::pair<std::string, std::string> driver_error_text(const detail::CudaDriverApi& driver,
                                                      CUresult error) {
  const char* name = nullptr;
  const char* description = nullptr;
  if (driver.get_error_name == nullptr || driver.get_error_name(error, &name) != CUDA_SUCCESS ||
      name == nullptr) {
    return {fmt::format("CUresult {}", static_cast<int>(error)), "unknown error"};
  }
  if (driver.get_error_string == nullptr ||
      driver.get_error_string(error, &description) != CUDA_SUCCESS || description == nullptr) {
    description = "no description";
  }
  return {name, description};
}

/// The status of a failed driver call `call` made for `op`, with the detail recorded; `what()`
/// describes the request and runs only here, on the failure path.
template <class What>
Status driver_failure(CudaDeviceState& state, const CudaVmmState& vmm, CUresult error, DeviceOp op,
                      const char* call, What&& what) noexcept {
  if (error == CUDA_ERROR_DEINITIALIZED) return state.at_shutdown(op, call);
  const Status status = detail::status_of(error);
  try {
    const auto [name, description] = driver_error_text(vmm.driver, error);
    return state.fail(
        status, CudaDeviceState::describe_failure(what(), call, name.c_str(), description.c_str()));
  } catch (...) {
    return state.fail(status, op, call);
  }
}

/// Loads the driver table and checks that the device supports virtual memory management.
std::unique_ptr<CudaVmmState> open_vmm(const CudaDeviceState& state) {
  auto opened = std::make_unique<CudaVmmState>();
  CudaVmmState& vmm = *opened;
  vmm.driver = detail::load_cuda_driver_api(state.api);
  const int ordinal = state.ordinal();
  auto fail = [&](const char* call, CUresult error) {
    const auto [name, description] = driver_error_text(vmm.driver, error);
    return DeviceError("open", fmt::format("cistern: CUDA device {}: {} failed: {} ({})", ordinal,
                                           call, name, description));
  };
  CUdevice device = 0;
  if (const CUresult error = vmm.driver.device_get(&device, ordinal); error != CUDA_SUCCESS) {
    throw fail("cuDeviceGet", error);
  }
  int supported = 0;
  if (const CUresult error = vmm.driver.device_get_attribute(
          &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
      error != CUDA_SUCCESS) {
    throw fail("cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", error);
  }
  if (supported == 0) {
    throw DeviceError("open", fmt::format("cistern: CUDA device {} ({}) does not support virtual "
                                          "memory management; use CudaDevice instead",
                                          ordinal, state.product));
  }
  const CUmemAllocationProp properties = allocation_properties(ordinal);
  if (const CUresult error = vmm.driver.mem_get_allocation_granularity(
          &vmm.granularity, &properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      error != CUDA_SUCCESS) {
    throw fail("cuMemGetAllocationGranularity", error);
  }
  if (!is_power_of_two(vmm.granularity)) {
    throw DeviceError("open", fmt::format("cistern: CUDA device {}: the allocation granularity {} "
                                          "is not a power of two",
                                          ordinal, vmm.granularity));
  }
  return opened;
}

/// The reservation that contains [start, start + bytes), if one does.
std::optional<std::uintptr_t> containing_reservation(const CudaVmmState& vmm, std::uintptr_t start,
                                                     std::size_t bytes) {
  const auto next = vmm.reservations.upper_bound(start);
  if (next == vmm.reservations.begin()) return std::nullopt;
  const auto [base, size] = *std::prev(next);
  if (start - base >= size || size - (start - base) < bytes) return std::nullopt;
  return base;
}

/// Whether [start, end) overlaps a mapping.
bool overlaps_mapping(const CudaVmmState& vmm, std::uintptr_t start, std::uintptr_t end) {
  const auto next = vmm.mappings.lower_bound(start);
  if (next != vmm.mappings.end() && next->first < end) return true;
  return next != vmm.mappings.begin() && std::prev(next)->second.end > start;
}

/// A request refused before the driver sees it: the status and why.
struct Refusal {
  Status status = Status::invalid_argument;
  std::string why;
};

/// Why mapping `handle` whole at `start` must be refused, if it must, as the driver would refuse
/// it: an unknown or released handle; a `bytes` smaller than the handle's size (part of a
/// handle: `not_supported`, as cuMemMap's CUDA_ERROR_NOT_SUPPORTED) or larger; a range outside
/// one reservation, or one already mapped. Sets `bytes` to the handle's size.
std::optional<Refusal> refuse_map(const CudaVmmState& vmm, std::uintptr_t start,
                                  PhysicalHandle handle, std::size_t& bytes) {
  const auto found = vmm.physical.find(handle.handle);
  if (found == vmm.physical.end()) {
    return Refusal{Status::invalid_argument,
                   fmt::format("map: unknown or released physical handle {}", hex(handle.handle))};
  }
  bytes = found->second;
  if (handle.bytes < bytes) {
    return Refusal{Status::not_supported,
                   fmt::format("map({}, handle {} of {}): {} is part of the handle; the driver "
                               "maps a handle only whole, from its offset 0",
                               hex(start), hex(handle.handle), format_bytes(bytes),
                               format_bytes(handle.bytes))};
  }
  if (handle.bytes > bytes) {
    return Refusal{
        Status::invalid_argument,
        fmt::format("map({}, handle {}): {} is more than the handle's {}", hex(start),
                    hex(handle.handle), format_bytes(handle.bytes), format_bytes(bytes))};
  }
  if (start % vmm.granularity != 0 || start > std::numeric_limits<std::uintptr_t>::max() - bytes) {
    return Refusal{Status::invalid_argument,
                   fmt::format("map({}, {}): the address must be a multiple of the granularity "
                               "({})",
                               hex(start), format_bytes(bytes), format_bytes(vmm.granularity))};
  }
  if (!containing_reservation(vmm, start, bytes)) {
    return Refusal{Status::invalid_argument,
                   fmt::format("map({}, {}): the range is not inside one reservation", hex(start),
                               format_bytes(bytes))};
  }
  if (overlaps_mapping(vmm, start, start + bytes)) {
    return Refusal{Status::invalid_argument,
                   fmt::format("map({}, {}): part of the range is already mapped", hex(start),
                               format_bytes(bytes))};
  }
  return std::nullopt;
}

/// Read-write access for the device `s` drives.
CUmemAccessDesc read_write(const CudaDeviceState& s) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = s.ordinal();
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

}  // namespace

CudaVmmDevice::CudaVmmDevice(CudaDeviceOptions options)
    : CudaVmmDevice(detail::cuda_runtime_api(), options) {}

CudaVmmDevice::CudaVmmDevice(const detail::CudaApi& api, CudaDeviceOptions options)
    : CudaDevice(api, options), vmm_(open_vmm(state())) {}

CudaVmmDevice::~CudaVmmDevice() = default;

std::string CudaVmmDevice::name() const { return CudaDevice::name() + " (vmm)"; }

std::size_t CudaVmmDevice::granularity() const noexcept { return vmm_->granularity; }

bool CudaVmmDevice::supports_virtual_memory() const noexcept { return true; }

Status CudaVmmDevice::reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept {
  CudaDeviceState& s = state();
  CudaVmmState& vmm = *vmm_;
  return s.call(DeviceOp::reserve, [&] {
    if (va == nullptr) return s.invalid(DeviceOp::reserve, "the result pointer is null");
    if (alignment == 0) alignment = vmm.granularity;
    if (bytes == 0 || bytes % vmm.granularity != 0) {
      return s.invalid(DeviceOp::reserve,
                       fmt::format("reserve({}): the size must be a positive multiple of the "
                                   "granularity ({})",
                                   bytes, format_bytes(vmm.granularity)));
    }
    if (!is_power_of_two(alignment) || alignment < vmm.granularity) {
      return s.invalid(DeviceOp::reserve,
                       fmt::format("reserve: alignment {} must be a power of two multiple of the "
                                   "granularity ({})",
                                   alignment, format_bytes(vmm.granularity)));
    }
    CUdeviceptr address = 0;
    {
      const auto guard = s.guard(true);
      if (guard.error() != cudaSuccess) return s.guard_failure(guard, DeviceOp::reserve);
      const CUresult error = vmm.driver.mem_address_reserve(&address, bytes, alignment, 0, 0);
      if (error != CUDA_SUCCESS) {
        return driver_failure(s, vmm, error, DeviceOp::reserve, "cuMemAddressReserve", [&] {
          return fmt::format("reserve({}, alignment {})", format_bytes(bytes), alignment);
        });
      }
    }
    try {
      const std::lock_guard<std::mutex> lock(vmm.mutex);
      vmm.reservations.emplace(static_cast<std::uintptr_t>(address), bytes);
    } catch (...) {
      (void)vmm.driver.mem_address_free(address, bytes);
      throw;
    }
    *va = reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
    return Status::ok;
  });
}

Status CudaVmmDevice::release_reservation(void* va, std::size_t bytes) noexcept {
  CudaDeviceState& s = state();
  CudaVmmState& vmm = *vmm_;
  return s.call(DeviceOp::release_reservation, [&] {
    const std::uintptr_t start = address_of(va);
    {
      const std::lock_guard<std::mutex> lock(vmm.mutex);
      const auto found = vmm.reservations.find(start);
      if (found == vmm.reservations.end() || found->second != bytes) {
        return s.invalid(DeviceOp::release_reservation,
                         fmt::format("release_reservation({}, {}): not a live reservation of "
                                     "that address and size",
                                     hex(va), format_bytes(bytes)));
      }
      if (overlaps_mapping(vmm, start, start + bytes)) {
        return s.invalid(DeviceOp::release_reservation,
                         fmt::format("release_reservation({}): the reservation still has "
                                     "mappings; unmap them first",
                                     hex(va)));
      }
      vmm.reservations.erase(found);
    }
    if (s.skip_release()) return Status::ok;
    const CUresult error = vmm.driver.mem_address_free(start, bytes);
    if (error == CUDA_SUCCESS) return Status::ok;
    const Status status = driver_failure(
        s, vmm, error, DeviceOp::release_reservation, "cuMemAddressFree",
        [&] { return fmt::format("release_reservation({}, {})", hex(va), format_bytes(bytes)); });
    if (status != Status::ok) {
      const std::lock_guard<std::mutex> lock(vmm.mutex);
      vmm.reservations.emplace(start, bytes);  // still reserved: a retry can release it
    }
    return status;
  });
}

Status CudaVmmDevice::create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept {
  CudaDeviceState& s = state();
  CudaVmmState& vmm = *vmm_;
  return s.call(DeviceOp::create_physical, [&] {
    if (handle == nullptr) return s.invalid(DeviceOp::create_physical, "the result handle is null");
    if (bytes == 0 || bytes % vmm.granularity != 0) {
      return s.invalid(DeviceOp::create_physical,
                       fmt::format("create_physical({}): the size must be a positive multiple of "
                                   "the granularity ({})",
                                   bytes, format_bytes(vmm.granularity)));
    }
    const CUmemAllocationProp properties = allocation_properties(s.ordinal());
    CUmemGenericAllocationHandle created = 0;
    {
      const auto guard = s.guard(true);
      if (guard.error() != cudaSuccess) return s.guard_failure(guard, DeviceOp::create_physical);
      const CUresult error = vmm.driver.mem_create(&created, bytes, &properties, 0);
      if (error != CUDA_SUCCESS) {
        return driver_failure(s, vmm, error, DeviceOp::create_physical, "cuMemCreate", [&] {
          return fmt::format("create_physical({})", format_bytes(bytes));
        });
      }
    }
    try {
      const std::lock_guard<std::mutex> lock(vmm.mutex);
      vmm.physical.emplace(created, bytes);
    } catch (...) {
      (void)vmm.driver.mem_release(created);
      throw;
    }
    handle->handle = created;
    handle->bytes = bytes;
    return Status::ok;
  });
}

Status CudaVmmDevice::release_physical(PhysicalHandle handle) noexcept {
  CudaDeviceState& s = state();
  CudaVmmState& vmm = *vmm_;
  return s.call(DeviceOp::release_physical, [&] {
    const CUmemGenericAllocationHandle native = handle.handle;
    std::size_t bytes = 0;
    {
      const std::lock_guard<std::mutex> lock(vmm.mutex);
      const auto found = vmm.physical.find(native);
      if (found == vmm.physical.end()) {
        return s.invalid(
            DeviceOp::release_physical,
            fmt::format("release_physical: unknown or already released handle {}", hex(native)));
      }
      bytes = found->second;
      vmm.physical.erase(found);
    }
    if (s.skip_release()) return Status::ok;
    // Releasing needs no current context; the memory stays while a mapping uses it.
    const CUresult error = vmm.driver.mem_release(native);
    if (error == CUDA_SUCCESS) return Status::ok;
    const Status status = driver_failure(
        s, vmm, error, DeviceOp::release_physical, "cuMemRelease",
        [&] { return fmt::format("release_physical({}, {})", hex(native), format_bytes(bytes)); });
    if (status != Status::ok) {
      const std::lock_guard<std::mutex> lock(vmm.mutex);
      vmm.physical.emplace(native, bytes);
    }
    return status;
  });
}

// A map is a run of one handle: the same checks, driver calls and tracking.
Status CudaVmmDevice::map(void* va, PhysicalHandle handle) noexcept {
  return map_run(va, &handle, 1);
}

// One cuMemMap per handle (each whole, at offset 0), then one cuMemSetAccess over the run, as
// PyTorch grows an expandable segment. Any failure unmaps the handles mapped so far: nothing of
// the run is left.
Status CudaVmmDevice::map_run(void* va, const PhysicalHandle* handles, std::size_t count) noexcept {
  CudaDeviceState& s = state();
  CudaVmmState& vmm = *vmm_;
  return s.call(DeviceOp::map, [&] {
    const std::uintptr_t start = address_of(va);
    if (count == 0 || handles == nullptr) {
      return s.invalid(DeviceOp::map, fmt::format("map_run({}): no handle to map", hex(va)));
    }
    const std::lock_guard<std::mutex> lock(vmm.mutex);  // held across the driver calls
    // Every handle's size as tracked; the run is checked whole (each handle against the ones
    // before it too) before the driver sees any of it.
    std::vector<std::size_t> sizes(count);
    std::uintptr_t at = start;
    for (std::size_t i = 0; i < count; at += sizes[i++]) {
      if (auto refusal = refuse_map(vmm, at, handles[i], sizes[i])) {
        return s.fail(refusal->status, DeviceOp::map,
                      count == 1
                          ? refusal->why
                          : fmt::format("map_run handle {} of {}: {}", i, count, refusal->why));
      }
      if (i > 0 && !containing_reservation(vmm, start, at + sizes[i] - start)) {
        return s.invalid(DeviceOp::map, fmt::format("map_run({}, {} handles): the run is not "
                                                    "inside one reservation",
                                                    hex(va), count));
      }
    }
    const std::size_t total = at - start;
    const auto describe = [&] {
      if (count == 1) {  // a plain map
        return fmt::format("map({}, handle {} of {})", hex(va), hex(handles[0].handle),
                           format_bytes(total));
      }
      return fmt::format("map_run({}, {} in {} handles)", hex(va), format_bytes(total), count);
    };
    const auto undo = [&](std::size_t mapped) {
      std::uintptr_t back = start;
      for (std::size_t j = 0; j < mapped; back += sizes[j++]) {
        (void)vmm.driver.mem_unmap(back, sizes[j]);
      }
    };
    const auto guard = s.guard(true);
    if (guard.error() != cudaSuccess) return s.guard_failure(guard, DeviceOp::map);
    at = start;
    for (std::size_t i = 0; i < count; at += sizes[i++]) {
      const CUresult mapped = vmm.driver.mem_map(at, sizes[i], 0, handles[i].handle, 0);
      if (mapped != CUDA_SUCCESS) {
        undo(i);
        return driver_failure(s, vmm, mapped, DeviceOp::map, "cuMemMap", describe);
      }
    }
    const CUmemAccessDesc access = read_write(s);
    const CUresult accessible = vmm.driver.mem_set_access(start, total, &access, 1);
    if (accessible != CUDA_SUCCESS) {
      undo(count);
      return driver_failure(s, vmm, accessible, DeviceOp::map, "cuMemSetAccess", describe);
    }
    std::size_t tracked = 0;
    try {
      at = start;
      for (; tracked < count; at += sizes[tracked++]) {
        vmm.mappings.emplace(at, detail::CudaMapping{at + sizes[tracked], handles[tracked].handle});
      }
    } catch (...) {
      at = start;
      for (std::size_t j = 0; j < tracked; at += sizes[j++]) vmm.mappings.erase(at);
      undo(count);
      throw;
    }
    return Status::ok;
  });
}

Status CudaVmmDevice::unmap(void* va, std::size_t bytes) noexcept {
  CudaDeviceState& s = state();
  CudaVmmState& vmm = *vmm_;
  return s.call(DeviceOp::unmap, [&] {
    const std::uintptr_t start = address_of(va);
    const std::size_t unit = vmm.granularity;
    if (bytes == 0 || start % unit != 0 || bytes % unit != 0 ||
        start > std::numeric_limits<std::uintptr_t>::max() - bytes) {
      return s.invalid(DeviceOp::unmap,
                       fmt::format("unmap({}, {}): address and size must be multiples of the "
                                   "granularity and the size positive",
                                   hex(va), bytes));
    }
    const std::uintptr_t end = start + bytes;
    const std::lock_guard<std::mutex> lock(vmm.mutex);  // held across the driver calls
    // Check the whole range before unmapping anything, so that a refusal changes nothing.
    const auto first = vmm.mappings.find(start);
    auto last = first;
    for (std::uintptr_t cursor = start; cursor < end; cursor = (last++)->second.end) {
      if (last == vmm.mappings.end() || last->first != cursor) {
        return s.invalid(DeviceOp::unmap,
                         fmt::format("unmap({}, {}): {} is not the start of a mapping", hex(va),
                                     format_bytes(bytes), hex(cursor)));
      }
      if (last->second.end > end) {
        return s.invalid(
            DeviceOp::unmap,
            fmt::format("unmap({}, {}): would unmap part of the mapping [{}, {})", hex(va),
                        format_bytes(bytes), hex(last->first), hex(last->second.end)));
      }
    }
    if (s.skip_release()) {
      vmm.mappings.erase(first, last);
      return Status::ok;
    }
    const auto guard = s.guard(true);
    if (guard.error() != cudaSuccess) {
      const Status status = s.guard_failure(guard, DeviceOp::unmap);
      if (status == Status::ok) vmm.mappings.erase(first, last);  // shut down: nothing is mapped
      return status;
    }
    if (std::next(first) != last &&
        std::none_of(first, last, [](const auto& m) { return m.second.unmapped; })) {
      const CUresult error = vmm.driver.mem_unmap(start, bytes);
      if (error == CUDA_SUCCESS) {
        vmm.mappings.erase(first, last);
        return Status::ok;
      }
      if (error != CUDA_ERROR_INVALID_VALUE) {
        const Status status = driver_failure(s, vmm, error, DeviceOp::unmap, "cuMemUnmap", [&] {
          return fmt::format("unmap({}, {}) of {} mappings in one call", hex(va),
                             format_bytes(bytes), std::distance(first, last));
        });
        if (status != Status::ok) return status;  // the whole range stays tracked: retry it
        vmm.mappings.erase(first, last);          // shut down: nothing is mapped any more
        return Status::ok;
      }
      // Refused as a whole: this driver wants one call per mapping.
    }
    for (auto it = first; it != last; ++it) {
      if (it->second.unmapped) continue;  // by an earlier, failed call of this unmap
      const std::uintptr_t piece = it->first;
      const CUresult error = vmm.driver.mem_unmap(piece, it->second.end - piece);
      if (error == CUDA_SUCCESS) {
        it->second.unmapped = true;
        continue;
      }
      const Status status = driver_failure(s, vmm, error, DeviceOp::unmap, "cuMemUnmap", [&] {
        return fmt::format("unmap({}, {}) at the mapping [{}, {})", hex(va), format_bytes(bytes),
                           hex(piece), hex(it->second.end));
      });
      if (status != Status::ok) return status;  // the whole range stays tracked: retry it
      break;                                    // shut down: nothing is mapped any more
    }
    vmm.mappings.erase(first, last);
    return Status::ok;
  });
}

std::size_t CudaVmmDevice::live_reservations() const {
  const std::lock_guard<std::mutex> lock(vmm_->mutex);
  return vmm_->reservations.size();
}

std::size_t CudaVmmDevice::live_physical() const {
  const std::lock_guard<std::mutex> lock(vmm_->mutex);
  return vmm_->physical.size();
}

std::size_t CudaVmmDevice::live_mappings() const {
  const std::lock_guard<std::mutex> lock(vmm_->mutex);
  return vmm_->mappings.size();
}

}  // namespace cistern
