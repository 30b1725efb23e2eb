// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The CUDA functions the CUDA backends call, as two tables of function pointers.
//
// `CudaApi` holds the runtime functions (and `cudaGetDriverEntryPointByVersion`, through which
// the driver functions are found); `CudaDriverApi` holds the driver's virtual-memory functions.
// The backends call CUDA only through these tables, never directly, so that a test can give
// them a stand-in for the whole API and run every code path without a GPU
// (tests/fake_cuda_api.hpp). The real runtime table binds the functions of the CUDA runtime
// that cistern links; the real driver table is filled from `cudaGetDriverEntryPointByVersion`,
// so cistern has no link-time dependency on libcuda.
//
// Every pointer type is spelled from the declaration in the toolkit's headers (decltype of the
// runtime function, the versioned PFN_ typedefs of cudaTypedefs.h), so a signature that changes
// in a new toolkit fails to compile here instead of misbehaving at run time.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

namespace cistern::detail {

/// The CUDA runtime functions the backends use.
struct CudaApi {
  decltype(&::cudaGetDeviceCount) get_device_count = nullptr;
  decltype(&::cudaGetDevice) get_device = nullptr;
  decltype(&::cudaSetDevice) set_device = nullptr;
  decltype(&::cudaGetDeviceProperties) get_device_properties = nullptr;
  decltype(&::cudaMemGetInfo) mem_get_info = nullptr;
  decltype(&::cudaMalloc) device_malloc = nullptr;
  decltype(&::cudaFree) device_free = nullptr;
  decltype(&::cudaEventCreateWithFlags) event_create_with_flags = nullptr;
  decltype(&::cudaEventDestroy) event_destroy = nullptr;
  decltype(&::cudaEventRecord) event_record = nullptr;
  decltype(&::cudaEventQuery) event_query = nullptr;
  decltype(&::cudaEventSynchronize) event_synchronize = nullptr;
  decltype(&::cudaStreamWaitEvent) stream_wait_event = nullptr;
  decltype(&::cudaStreamSynchronize) stream_synchronize = nullptr;
  decltype(&::cudaDeviceSynchronize) device_synchronize = nullptr;
  decltype(&::cudaGetLastError) get_last_error = nullptr;
  decltype(&::cudaGetErrorName) get_error_name = nullptr;
  decltype(&::cudaGetErrorString) get_error_string = nullptr;
  decltype(&::cudaGetDriverEntryPointByVersion) get_driver_entry_point_by_version = nullptr;
};

/// The driver functions of the virtual-memory backend, in the ABI of `kCudaDriverAbiVersion`.
struct CudaDriverApi {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
};

/// The CUDA version whose driver ABI `CudaDriverApi` asks for. Every function above has kept its
/// signature since at least this version, and a CUDA 13 runtime needs a newer driver anyway.
inline constexpr unsigned int kCudaDriverAbiVersion = 12000;

/// The table of the CUDA runtime cistern is linked with.
const CudaApi& cuda_runtime_api() noexcept;

/// Fills the driver table through `api.get_driver_entry_point_by_version`. Throws
/// `cistern::DeviceError` (operation "open") naming the first function that cannot be found and
/// why (not found, driver too old, or the runtime's error).
CudaDriverApi load_cuda_driver_api(const CudaApi& api);

}  // namespace cistern::detail
