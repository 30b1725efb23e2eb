// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// PyTorch's CUDA caching allocator behind a few extern "C" functions, for bench_gpu (which loads
// this library with dlopen, so that it never links libtorch nor shares its C++ ABI settings).
// Built by scripts/gpu-check.sh against the installed PyTorch (bench/torch_shim/CMakeLists.txt).
// Every allocation is on the current stream of the device (its default stream), as bench_gpu
// uses the default stream for every allocator.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstddef>

namespace alloc = c10::cuda::CUDACachingAllocator;

extern "C" {

/// Makes `device` current and initialises the allocator; 0 on success.
int cistern_torch_init(int device) {
  try {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    alloc::init(c10::cuda::device_count());
    return 0;
  } catch (...) {
    return 1;
  }
}

/// `bytes` on the current stream, or nullptr (out of memory, or any other failure).
void* cistern_torch_alloc(std::size_t bytes) {
  try {
    return alloc::raw_alloc(bytes);
  } catch (...) {
    return nullptr;
  }
}

void cistern_torch_free(void* ptr) {
  try {
    alloc::raw_delete(ptr);
  } catch (...) {
  }
}

void cistern_torch_empty_cache() {
  try {
    alloc::emptyCache();
  } catch (...) {
  }
}

/// The peak of reserved bytes (all pools) since the last reset.
long long cistern_torch_peak_reserved(int device) {
  try {
    return static_cast<long long>(
        alloc::getDeviceStats(static_cast<c10::DeviceIndex>(device)).reserved_bytes[0].peak);
  } catch (...) {
    return -1;
  }
}

void cistern_torch_reset_peak(int device) {
  try {
    alloc::resetPeakStats(static_cast<c10::DeviceIndex>(device));
  } catch (...) {
  }
}

}  // extern "C"
