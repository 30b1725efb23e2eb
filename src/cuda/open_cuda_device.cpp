// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// open_cuda_device: the CUDA backend a GPU program gets by default
// (include/cistern/cuda_device.hpp).
//
// CudaVmmDevice is tried first, because the allocator's page engine needs it; it refuses to open
// (DeviceError) on a GPU without virtual memory management or with a driver that lacks one of its
// functions, and then CudaDevice serves, with cudaMalloc segments. Where no GPU can be used at
// all, CudaDevice's own error is the one the caller sees.
#include <memory>
#include <string>

#include "cistern/cuda_device.hpp"
#include "cistern/errors.hpp"
#include "cuda/cuda_api.hpp"

namespace cistern {

CudaDeviceChoice open_cuda_device(const detail::CudaApi& api, CudaDeviceOptions options) {
  CudaDeviceChoice choice;
  try {
    choice.device = std::make_unique<CudaVmmDevice>(api, options);
    choice.virtual_memory = true;
    return choice;
  } catch (const DeviceError& e) {
    choice.without_virtual_memory = e.what();
  }
  choice.device = std::make_unique<CudaDevice>(api, options);
  return choice;
}

CudaDeviceChoice open_cuda_device(CudaDeviceOptions options) {
  return open_cuda_device(detail::cuda_runtime_api(), options);
}

}  // namespace cistern
