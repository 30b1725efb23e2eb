// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The real CUDA API tables: the runtime cistern links, and the driver functions found through
// the runtime's cudaGetDriverEntryPointByVersion (see cuda_api.hpp).
#include "cuda/cuda_api.hpp"

#include <fmt/format.h>

#include "cistern/errors.hpp"

namespace cistern::detail {
namespace {

CudaApi bind_runtime() noexcept {
  CudaApi api;
  api.get_device_count = &::cudaGetDeviceCount;
  api.get_device = &::cudaGetDevice;
  api.set_device = &::cudaSetDevice;
  api.get_device_properties = &::cudaGetDeviceProperties;
  api.mem_get_info = &::cudaMemGetInfo;
  api.device_malloc = &::cudaMalloc;
  api.device_free = &::cudaFree;
  api.event_create_with_flags = &::cudaEventCreateWithFlags;
  api.event_destroy = &::cudaEventDestroy;
  api.event_record = &::cudaEventRecord;
  api.event_query = &::cudaEventQuery;
  api.event_synchronize = &::cudaEventSynchronize;
  api.stream_wait_event = &::cudaStreamWaitEvent;
  api.stream_synchronize = &::cudaStreamSynchronize;
  api.device_synchronize = &::cudaDeviceSynchronize;
  api.get_last_error = &::cudaGetLastError;
  api.get_error_name = &::cudaGetErrorName;
  api.get_error_string = &::cudaGetErrorString;
  api.get_driver_entry_point_by_version = &::cudaGetDriverEntryPointByVersion;
  return api;
}

const char* describe(cudaDriverEntryPointQueryResult result) {
  switch (result) {
    case cudaDriverEntryPointSuccess: return "found, but the pointer is null";
    case cudaDriverEntryPointSymbolNotFound: return "the driver does not have it";
    case cudaDriverEntryPointVersionNotSufficent: return "the driver is too old";
  }
  return "unknown query result";
}

/// Looks one driver function up into `*slot`; throws DeviceError if it cannot be had.
template <class Function>
void load(const CudaApi& api, const char* symbol, Function* slot) {
  void* pointer = nullptr;
  auto query = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error = api.get_driver_entry_point_by_version(
      symbol, &pointer, kCudaDriverAbiVersion, cudaEnableDefault, &query);
  if (error != cudaSuccess) {
    (void)api.get_last_error();  // do not leave our failure for the program's next check
    throw DeviceError("open",
                      fmt::format("cistern: cannot find the CUDA driver function {}: "
                                  "cudaGetDriverEntryPointByVersion({}, {}) failed: {} ({})",
                                  symbol, symbol, kCudaDriverAbiVersion, api.get_error_name(error),
                                  api.get_error_string(error)));
  }
  if (pointer == nullptr || query != cudaDriverEntryPointSuccess) {
    throw DeviceError("open", fmt::format("cistern: cannot find the CUDA driver function {} "
                                          "(ABI of CUDA {}.{}): {}",
                                          symbol, kCudaDriverAbiVersion / 1000,
                                          kCudaDriverAbiVersion % 1000 / 10, describe(query)));
  }
  *slot = reinterpret_cast<Function>(pointer);
}

}  // namespace

const CudaApi& cuda_runtime_api() noexcept {
  static const CudaApi api = bind_runtime();
  return api;
}

CudaDriverApi load_cuda_driver_api(const CudaApi& api) {
  CudaDriverApi driver;
  load(api, "cuGetErrorName", &driver.get_error_name);
  load(api, "cuGetErrorString", &driver.get_error_string);
  load(api, "cuDeviceGet", &driver.device_get);
  load(api, "cuDeviceGetAttribute", &driver.device_get_attribute);
  load(api, "cuMemGetAllocationGranularity", &driver.mem_get_allocation_granularity);
  load(api, "cuMemAddressReserve", &driver.mem_address_reserve);
  load(api, "cuMemAddressFree", &driver.mem_address_free);
  load(api, "cuMemCreate", &driver.mem_create);
  load(api, "cuMemRelease", &driver.mem_release);
  load(api, "cuMemMap", &driver.mem_map);
  load(api, "cuMemUnmap", &driver.mem_unmap);
  load(api, "cuMemSetAccess", &driver.mem_set_access);
  return driver;
}

}  // namespace cistern::detail
