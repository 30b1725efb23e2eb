// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// A stand-in for the part of the CUDA runtime and driver API that the CUDA backends call
// (src/cuda/cuda_api.hpp), for testing them without a GPU. Test-only: never linked into cistern.
//
// It models what the backends rely on, and checks how they call it:
//   - devices: a count (or the error cudaGetDeviceCount gives), names, one shared capacity
//     charged in 2 MiB units by cudaMalloc and cuMemCreate;
//   - the current device per thread (cudaGetDevice says 0 on a fresh thread, as CUDA does) and
//     whether the thread has a current context, which only cudaSetDevice gives and which the
//     driver's virtual-memory calls require (CUDA_ERROR_INVALID_CONTEXT otherwise);
//   - events: real handles, the flags they were created with, pending work: an event recorded on
//     a stream marked busy reads cudaErrorNotReady until that stream, the event or the device
//     is synchronised;
//   - the driver's virtual memory with the driver's own rules and result codes, as measured on an
//     H200 (../shared/reference/vmm-and-planning.md, section 4) and documented: cuMemMap maps a
//     handle only whole, at offset 0 (a non-zero offset or a size other than the handle's is
//     CUDA_ERROR_NOT_SUPPORTED), inside one reservation and over nothing mapped; a handle may be
//     mapped at several addresses; cuMemSetAccess and cuMemUnmap take a range of whole mappings
//     side by side (a hole or part of a mapping is CUDA_ERROR_INVALID_VALUE); memory of a
//     released handle returns with its last mapping;
//   - entry points found by name through cudaGetDriverEntryPointByVersion;
//   - the runtime's last-error slot;
//   - failure injection: the next call(s) of a named function return a chosen error;
//   - shutdown: once `unloading` is set every runtime call returns cudaErrorCudartUnloading,
//     and once `deinitialized` is set every driver call returns CUDA_ERROR_DEINITIALIZED.
// Every call is logged as "<function> dev=<current device>" (plus arguments for some), so tests
// can check which device a call ran on and that no call was made at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda/cuda_api.hpp"

namespace cistern::fake_cuda {

/// One fake event.
struct FakeEvent {
  unsigned int flags = 0;
  bool pending = false;
  cudaStream_t stream = nullptr;
};

/// A mapping made by cuMemMap.
struct FakeMapping {
  std::size_t bytes = 0;
  CUmemGenericAllocationHandle handle = 0;
  bool accessible = false;
  CUmemAccessDesc access{};
};

/// Physical memory made by cuMemCreate.
struct FakePhysical {
  std::size_t bytes = 0;
  std::size_t mappings = 0;
  bool released = false;
};

/// The whole fake state. Tests set the knobs, call the backends, and read the rest.
struct FakeCuda {
  // --- knobs ---
  int device_count = 2;
  cudaError_t device_count_error = cudaSuccess;
  std::size_t capacity = 64 * 1024 * 1024;
  std::size_t granularity = 2 * 1024 * 1024;
  int vmm_supported = 1;
  bool unloading = false;                 ///< every runtime call returns cudaErrorCudartUnloading
  bool deinitialized = false;             ///< every driver call returns CUDA_ERROR_DEINITIALIZED
  std::set<std::string> missing_symbols;  ///< entry points the driver does not have
  std::set<std::string> too_new_symbols;  ///< entry points the driver has only in newer ABIs
  std::set<cudaStream_t> busy_streams;    ///< work recorded on these is pending
  /// Errors the next calls of a function return, in order (runtime and driver codes as int).
  std::map<std::string, std::deque<int>> failures;

  // --- state ---
  std::size_t used = 0;
  std::map<std::uintptr_t, std::size_t> allocations;  ///< cudaMalloc'd base -> charged bytes
  std::uintptr_t next_address = 0x7f0000000000;
  std::map<cudaEvent_t, std::unique_ptr<FakeEvent>> events;
  std::size_t events_created = 0;
  cudaError_t last_error = cudaSuccess;
  std::map<std::uintptr_t, std::size_t> reservations;
  std::uintptr_t next_reservation = 0x7e0000000000;
  std::map<CUmemGenericAllocationHandle, FakePhysical> physical;
  CUmemGenericAllocationHandle next_handle = 0x100;
  std::map<std::uintptr_t, FakeMapping> mappings;
  CUmemAllocationProp last_properties{};  ///< what cuMemCreate / the granularity query saw
  std::vector<std::string> calls;
  std::vector<std::string> symbols_asked;  ///< "<symbol>@<version>" per entry-point lookup

  /// Makes the next `count` calls of `function` fail with `error`.
  template <class Error>
  void fail_next(const std::string& function, Error error, int count = 1) {
    for (int i = 0; i < count; ++i) failures[function].push_back(static_cast<int>(error));
  }
  /// The number of logged calls of `function`.
  std::size_t count(const std::string& function) const;
  /// Whether a call of `function` was logged with this text after the name ("dev=1", ...).
  bool called_with(const std::string& function, const std::string& detail) const;
};

/// The fake's state. `reset()` starts a test afresh (also on the calling thread's device).
FakeCuda& fake();
void reset();
/// The calling thread's current device and whether it has a current context.
int& current_device();
bool& has_context();

/// The runtime table over the fake.
const detail::CudaApi& fake_runtime_api();

// --- implementation -----------------------------------------------------------------------------

namespace impl {

inline std::mutex& mutex() {
  static std::mutex m;
  return m;
}

inline FakeCuda& state() {
  static FakeCuda s;
  return s;
}

inline std::string hex(std::uintptr_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%#llx", static_cast<unsigned long long>(value));
  return buffer;
}

/// Logs a call; returns the injected error for it, or 0.
inline int enter(const char* function, const std::string& detail = {}) {
  FakeCuda& s = state();
  s.calls.push_back(std::string(function) + " dev=" + std::to_string(current_device()) +
                    (detail.empty() ? "" : " " + detail));
  auto found = s.failures.find(function);
  if (found == s.failures.end() || found->second.empty()) return 0;
  const int error = found->second.front();
  found->second.pop_front();
  return error;
}

/// A runtime call's result, kept in the last-error slot as the runtime does.
inline cudaError_t runtime_result(cudaError_t error) {
  if (error != cudaSuccess && error != cudaErrorNotReady) state().last_error = error;
  return error;
}

/// Starts a runtime call: the lock, the log, shutdown and injected failures.
#define CISTERN_FAKE_RUNTIME(function, detail)                                 \
  const std::lock_guard<std::mutex> lock(::cistern::fake_cuda::impl::mutex()); \
  if (const int injected = enter(function, detail)) {                          \
    return runtime_result(static_cast<cudaError_t>(injected));                 \
  }                                                                            \
  if (state().unloading) return cudaErrorCudartUnloading;

/// Starts a driver call: the lock, the log, shutdown, injected failures, a current context.
#define CISTERN_FAKE_DRIVER(function, detail, needs_context)                                \
  const std::lock_guard<std::mutex> lock(::cistern::fake_cuda::impl::mutex());              \
  if (const int injected = enter(function, detail)) return static_cast<CUresult>(injected); \
  if (state().deinitialized) return CUDA_ERROR_DEINITIALIZED;                               \
  if ((needs_context) && !has_context()) return CUDA_ERROR_INVALID_CONTEXT;

inline std::size_t charge(std::size_t bytes) {
  const std::size_t unit = 2 * 1024 * 1024;
  return (bytes + unit - 1) / unit * unit;
}

// --- runtime ---

inline cudaError_t get_device_count(int* count) {
  CISTERN_FAKE_RUNTIME("cudaGetDeviceCount", "");
  if (state().device_count_error != cudaSuccess) {
    return runtime_result(state().device_count_error);
  }
  *count = state().device_count;
  return cudaSuccess;
}

inline cudaError_t get_device(int* device) {
  CISTERN_FAKE_RUNTIME("cudaGetDevice", "");
  *device = current_device();
  return cudaSuccess;
}

inline cudaError_t set_device(int device) {
  CISTERN_FAKE_RUNTIME("cudaSetDevice", "to=" + std::to_string(device));
  if (device < 0 || device >= state().device_count) return runtime_result(cudaErrorInvalidDevice);
  current_device() = device;
  has_context() = true;
  return cudaSuccess;
}

inline cudaError_t get_device_properties(cudaDeviceProp* properties, int device) {
  CISTERN_FAKE_RUNTIME("cudaGetDeviceProperties", "of=" + std::to_string(device));
  if (device < 0 || device >= state().device_count) return runtime_result(cudaErrorInvalidDevice);
  *properties = cudaDeviceProp{};
  std::snprintf(properties->name, sizeof properties->name, "Fake GPU %d", device);
  properties->totalGlobalMem = state().capacity;
  return cudaSuccess;
}

inline cudaError_t mem_get_info(std::size_t* free, std::size_t* total) {
  CISTERN_FAKE_RUNTIME("cudaMemGetInfo", "");
  *free = state().capacity - state().used;
  *total = state().capacity;
  return cudaSuccess;
}

inline cudaError_t device_malloc(void** ptr, std::size_t bytes) {
  CISTERN_FAKE_RUNTIME("cudaMalloc", std::to_string(bytes));
  FakeCuda& s = state();
  const std::size_t charged = charge(bytes);
  if (bytes == 0 || charged > s.capacity - s.used) return runtime_result(cudaErrorMemoryAllocation);
  const std::uintptr_t address = s.next_address;
  s.next_address += charged;
  s.allocations.emplace(address, charged);
  s.used += charged;
  *ptr = reinterpret_cast<void*>(address);
  return cudaSuccess;
}

inline cudaError_t device_free(void* ptr) {
  CISTERN_FAKE_RUNTIME("cudaFree", hex(reinterpret_cast<std::uintptr_t>(ptr)));
  FakeCuda& s = state();
  const auto found = s.allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (found == s.allocations.end()) return runtime_result(cudaErrorInvalidValue);
  s.used -= found->second;
  s.allocations.erase(found);
  for (auto& entry : s.events) entry.second->pending = false;  // cudaFree synchronises
  s.busy_streams.clear();
  return cudaSuccess;
}

inline FakeEvent* find_event(cudaEvent_t event) {
  const auto found = state().events.find(event);
  return found == state().events.end() ? nullptr : found->second.get();
}

inline cudaError_t event_create_with_flags(cudaEvent_t* event, unsigned int flags) {
  CISTERN_FAKE_RUNTIME("cudaEventCreateWithFlags", "flags=" + std::to_string(flags));
  auto created = std::make_unique<FakeEvent>();
  created->flags = flags;
  // A distinct, never dereferenced handle: the address of the fake's own record.
  *event = reinterpret_cast<cudaEvent_t>(created.get());
  state().events.emplace(*event, std::move(created));
  ++state().events_created;
  return cudaSuccess;
}

inline cudaError_t event_destroy(cudaEvent_t event) {
  CISTERN_FAKE_RUNTIME("cudaEventDestroy", "");
  if (state().events.erase(event) == 0) return runtime_result(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

inline cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) {
  CISTERN_FAKE_RUNTIME("cudaEventRecord",
                       "stream=" + hex(reinterpret_cast<std::uintptr_t>(stream)));
  FakeEvent* e = find_event(event);
  if (e == nullptr) return runtime_result(cudaErrorInvalidResourceHandle);
  e->stream = stream;
  e->pending = state().busy_streams.count(stream) > 0;
  return cudaSuccess;
}

inline cudaError_t event_query(cudaEvent_t event) {
  CISTERN_FAKE_RUNTIME("cudaEventQuery", "");
  const FakeEvent* e = find_event(event);
  if (e == nullptr) return runtime_result(cudaErrorInvalidResourceHandle);
  return e->pending ? cudaErrorNotReady : cudaSuccess;
}

inline cudaError_t event_synchronize(cudaEvent_t event) {
  CISTERN_FAKE_RUNTIME("cudaEventSynchronize", "");
  FakeEvent* e = find_event(event);
  if (e == nullptr) return runtime_result(cudaErrorInvalidResourceHandle);
  e->pending = false;
  return cudaSuccess;
}

inline cudaError_t stream_wait_event(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  CISTERN_FAKE_RUNTIME("cudaStreamWaitEvent",
                       "stream=" + hex(reinterpret_cast<std::uintptr_t>(stream)) +
                           " flags=" + std::to_string(flags));
  const FakeEvent* e = find_event(event);
  if (e == nullptr) return runtime_result(cudaErrorInvalidResourceHandle);
  if (e->pending) state().busy_streams.insert(stream);
  return cudaSuccess;
}

inline cudaError_t stream_synchronize(cudaStream_t stream) {
  CISTERN_FAKE_RUNTIME("cudaStreamSynchronize",
                       "stream=" + hex(reinterpret_cast<std::uintptr_t>(stream)));
  state().busy_streams.erase(stream);
  for (auto& entry : state().events) {
    if (entry.second->stream == stream) entry.second->pending = false;
  }
  return cudaSuccess;
}

inline cudaError_t device_synchronize() {
  CISTERN_FAKE_RUNTIME("cudaDeviceSynchronize", "");
  state().busy_streams.clear();
  for (auto& entry : state().events) entry.second->pending = false;
  return cudaSuccess;
}

inline cudaError_t get_last_error() {
  const std::lock_guard<std::mutex> lock(mutex());
  state().calls.push_back("cudaGetLastError");
  const cudaError_t error = state().last_error;
  state().last_error = cudaSuccess;
  return state().unloading ? cudaErrorCudartUnloading : error;
}

inline const char* get_error_name(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorCudartUnloading: return "cudaErrorCudartUnloading";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}

inline const char* get_error_string(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "fake error description";
  }
}

// --- driver ---

inline CUresult cu_get_error_name(CUresult error, const char** name) {
  switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_DEINITIALIZED: *name = "CUDA_ERROR_DEINITIALIZED"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_INVALID_HANDLE: *name = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case CUDA_ERROR_UNKNOWN: *name = "CUDA_ERROR_UNKNOWN"; break;
    default: *name = nullptr; return CUDA_ERROR_INVALID_VALUE;  // as the driver does
  }
  return CUDA_SUCCESS;
}

inline CUresult cu_get_error_string(CUresult error, const char** text) {
  const char* name = nullptr;
  if (cu_get_error_name(error, &name) != CUDA_SUCCESS) {
    *text = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  *text = error == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "fake driver error description";
  return CUDA_SUCCESS;
}

inline CUresult cu_device_get(CUdevice* device, int ordinal) {
  CISTERN_FAKE_DRIVER("cuDeviceGet", std::to_string(ordinal), false);
  if (ordinal < 0 || ordinal >= state().device_count) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

inline CUresult cu_device_get_attribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  CISTERN_FAKE_DRIVER("cuDeviceGetAttribute", "attribute=" + std::to_string(attribute), false);
  if (device < 0 || device >= state().device_count) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute != CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *value = state().vmm_supported;
  return CUDA_SUCCESS;
}

inline CUresult cu_mem_get_allocation_granularity(std::size_t* granularity,
                                                  const CUmemAllocationProp* properties,
                                                  CUmemAllocationGranularity_flags option) {
  CISTERN_FAKE_DRIVER("cuMemGetAllocationGranularity", "option=" + std::to_string(option), false);
  state().last_properties = *properties;
  *granularity = state().granularity;
  return CUDA_SUCCESS;
}

inline CUresult cu_mem_address_reserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment,
                                       CUdeviceptr address, unsigned long long flags) {
  CISTERN_FAKE_DRIVER("cuMemAddressReserve",
                      std::to_string(size) + " alignment=" + std::to_string(alignment), true);
  FakeCuda& s = state();
  if (size == 0 || size % s.granularity != 0 || address != 0 || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (alignment == 0) alignment = s.granularity;  // the driver's default
  const std::uintptr_t base = (s.next_reservation + alignment - 1) / alignment * alignment;
  s.next_reservation = base + size;
  s.reservations.emplace(base, size);
  *ptr = base;
  return CUDA_SUCCESS;
}

inline CUresult cu_mem_address_free(CUdeviceptr ptr, std::size_t size) {
  CISTERN_FAKE_DRIVER("cuMemAddressFree", hex(ptr), false);
  const auto found = state().reservations.find(ptr);
  if (found == state().reservations.end() || found->second != size) return CUDA_ERROR_INVALID_VALUE;
  state().reservations.erase(found);
  return CUDA_SUCCESS;
}

inline CUresult cu_mem_create(CUmemGenericAllocationHandle* handle, std::size_t size,
                              const CUmemAllocationProp* properties, unsigned long long flags) {
  CISTERN_FAKE_DRIVER("cuMemCreate", std::to_string(size), true);
  FakeCuda& s = state();
  s.last_properties = *properties;
  if (size == 0 || size % s.granularity != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (size > s.capacity - s.used) return CUDA_ERROR_OUT_OF_MEMORY;
  s.used += size;
  *handle = s.next_handle++;
  s.physical.emplace(*handle, FakePhysical{size, 0, false});
  return CUDA_SUCCESS;
}

inline void free_physical_if_unused(CUmemGenericAllocationHandle handle) {
  const auto found = state().physical.find(handle);
  if (!found->second.released || found->second.mappings > 0) return;
  state().used -= found->second.bytes;
  state().physical.erase(found);
}

inline CUresult cu_mem_release(CUmemGenericAllocationHandle handle) {
  CISTERN_FAKE_DRIVER("cuMemRelease", hex(handle), false);
  const auto found = state().physical.find(handle);
  if (found == state().physical.end() || found->second.released) return CUDA_ERROR_INVALID_VALUE;
  found->second.released = true;
  free_physical_if_unused(handle);
  return CUDA_SUCCESS;
}

/// Whether [ptr, ptr + size) lies inside one reservation.
inline bool inside_one_reservation(CUdeviceptr ptr, std::size_t size) {
  const auto& reservations = state().reservations;
  auto next = reservations.upper_bound(ptr);
  if (next == reservations.begin()) return false;
  --next;
  return ptr - next->first < next->second && next->second - (ptr - next->first) >= size;
}

inline CUresult cu_mem_map(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                           CUmemGenericAllocationHandle handle, unsigned long long flags) {
  CISTERN_FAKE_DRIVER("cuMemMap",
                      hex(ptr) + " " + std::to_string(size) + " offset=" + std::to_string(offset),
                      true);
  FakeCuda& s = state();
  const auto found = s.physical.find(handle);
  if (found == s.physical.end() || found->second.released || flags != 0 || size == 0 ||
      offset > found->second.bytes || size > found->second.bytes - offset) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (ptr % s.granularity != 0 || size % s.granularity != 0 || offset % s.granularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The H200's answer to a map at an offset into a handle, or of part of one: a handle is mapped
  // whole or not at all.
  if (offset != 0 || size != found->second.bytes) return CUDA_ERROR_NOT_SUPPORTED;
  if (!inside_one_reservation(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  const auto next = s.mappings.lower_bound(ptr);
  if (next != s.mappings.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != s.mappings.begin() && std::prev(next)->first + std::prev(next)->second.bytes > ptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  ++found->second.mappings;
  s.mappings.emplace(ptr, FakeMapping{size, handle, false, {}});
  return CUDA_SUCCESS;
}

inline CUresult cu_mem_unmap(CUdeviceptr ptr, std::size_t size) {
  CISTERN_FAKE_DRIVER("cuMemUnmap", hex(ptr) + " " + std::to_string(size), true);
  // The driver's rule: whole earlier mappings side by side (never part of one), all or nothing.
  FakeCuda& s = state();
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  const CUdeviceptr end = ptr + size;
  auto it = s.mappings.find(ptr);
  for (CUdeviceptr at = ptr; at < end; at += (it++)->second.bytes) {
    if (it == s.mappings.end() || it->first != at || at + it->second.bytes > end) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (it = s.mappings.find(ptr); it != s.mappings.end() && it->first < end;) {
    const CUmemGenericAllocationHandle handle = it->second.handle;
    it = s.mappings.erase(it);
    --s.physical.at(handle).mappings;
    free_physical_if_unused(handle);
  }
  return CUDA_SUCCESS;
}

inline CUresult cu_mem_set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                                  std::size_t count) {
  CISTERN_FAKE_DRIVER("cuMemSetAccess", hex(ptr) + " " + std::to_string(size), true);
  // The driver's rule: a fully mapped range, here made of whole earlier mappings side by side.
  FakeCuda& s = state();
  if (count != 1 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  const CUdeviceptr end = ptr + size;
  auto it = s.mappings.find(ptr);
  for (CUdeviceptr at = ptr; at < end; at += (it++)->second.bytes) {
    if (it == s.mappings.end() || it->first != at || at + it->second.bytes > end) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (it = s.mappings.find(ptr); it != s.mappings.end() && it->first < end; ++it) {
    it->second.accessible = true;
    it->second.access = desc[0];
  }
  return CUDA_SUCCESS;
}

#undef CISTERN_FAKE_RUNTIME
#undef CISTERN_FAKE_DRIVER

/// The driver functions by name, as cudaGetDriverEntryPointByVersion finds them.
inline void* driver_function(const std::string& symbol) {
  static const std::map<std::string, void*> table = {
      {"cuGetErrorName", reinterpret_cast<void*>(&cu_get_error_name)},
      {"cuGetErrorString", reinterpret_cast<void*>(&cu_get_error_string)},
      {"cuDeviceGet", reinterpret_cast<void*>(&cu_device_get)},
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&cu_device_get_attribute)},
      {"cuMemGetAllocationGranularity",
       reinterpret_cast<void*>(&cu_mem_get_allocation_granularity)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&cu_mem_address_reserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&cu_mem_address_free)},
      {"cuMemCreate", reinterpret_cast<void*>(&cu_mem_create)},
      {"cuMemRelease", reinterpret_cast<void*>(&cu_mem_release)},
      {"cuMemMap", reinterpret_cast<void*>(&cu_mem_map)},
      {"cuMemUnmap", reinterpret_cast<void*>(&cu_mem_unmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&cu_mem_set_access)},
  };
  const auto found = table.find(symbol);
  return found == table.end() ? nullptr : found->second;
}

inline cudaError_t get_driver_entry_point_by_version(const char* symbol, void** function,
                                                     unsigned int version, unsigned long long flags,
                                                     cudaDriverEntryPointQueryResult* status) {
  const std::lock_guard<std::mutex> lock(mutex());
  FakeCuda& s = state();
  s.symbols_asked.push_back(std::string(symbol) + "@" + std::to_string(version));
  if (const int injected = enter("cudaGetDriverEntryPointByVersion", symbol)) {
    return runtime_result(static_cast<cudaError_t>(injected));
  }
  if (s.unloading) return cudaErrorCudartUnloading;
  if (flags != cudaEnableDefault) return runtime_result(cudaErrorInvalidValue);
  *function = nullptr;
  if (s.missing_symbols.count(symbol) > 0 || driver_function(symbol) == nullptr) {
    if (status != nullptr) *status = cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;  // as documented: success with a null pointer
  }
  if (s.too_new_symbols.count(symbol) > 0) {
    if (status != nullptr) *status = cudaDriverEntryPointVersionNotSufficent;
    return cudaSuccess;
  }
  *function = driver_function(symbol);
  if (status != nullptr) *status = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}

}  // namespace impl

inline std::size_t FakeCuda::count(const std::string& function) const {
  std::size_t n = 0;
  for (const std::string& call : calls) {
    if (call.compare(0, function.size() + 1, function + " ") == 0 || call == function) ++n;
  }
  return n;
}

inline bool FakeCuda::called_with(const std::string& function, const std::string& detail) const {
  for (const std::string& call : calls) {
    if (call.compare(0, function.size() + 1, function + " ") == 0 &&
        call.find(detail, function.size()) != std::string::npos) {
      return true;
    }
  }
  return false;
}

inline FakeCuda& fake() { return impl::state(); }

inline int& current_device() {
  thread_local int device = 0;
  return device;
}

inline bool& has_context() {
  thread_local bool context = false;
  return context;
}

inline void reset() {
  const std::lock_guard<std::mutex> lock(impl::mutex());
  impl::state() = FakeCuda{};
  current_device() = 0;
  has_context() = false;
}

inline const detail::CudaApi& fake_runtime_api() {
  static const detail::CudaApi api = [] {
    detail::CudaApi table;
    table.get_device_count = &impl::get_device_count;
    table.get_device = &impl::get_device;
    table.set_device = &impl::set_device;
    table.get_device_properties = &impl::get_device_properties;
    table.mem_get_info = &impl::mem_get_info;
    table.device_malloc = &impl::device_malloc;
    table.device_free = &impl::device_free;
    table.event_create_with_flags = &impl::event_create_with_flags;
    table.event_destroy = &impl::event_destroy;
    table.event_record = &impl::event_record;
    table.event_query = &impl::event_query;
    table.event_synchronize = &impl::event_synchronize;
    table.stream_wait_event = &impl::stream_wait_event;
    table.stream_synchronize = &impl::stream_synchronize;
    table.device_synchronize = &impl::device_synchronize;
    table.get_last_error = &impl::get_last_error;
    table.get_error_name = &impl::get_error_name;
    table.get_error_string = &impl::get_error_string;
    table.get_driver_entry_point_by_version = &impl::get_driver_entry_point_by_version;
    return table;
  }();
  return api;
}

}  // namespace cistern::fake_cuda
