// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The CUDA side of `cistern replay --backend cuda` (see device_replay.hpp): a CudaVmmDevice where
// the driver supports virtual memory (else a CudaDevice), real streams, and the optional write of
// every allocation. Built without the CUDA toolkit, opening
// throws a DeviceError that says so.
#include <fmt/format.h>

#include <memory>
#include <utility>

#include "cistern/errors.hpp"
#include "cli/device_replay.hpp"

#ifdef CISTERN_HAS_CUDA
#include <cuda_runtime_api.h>

#include "cistern/cuda_device.hpp"
#endif

namespace cistern::cli {

#ifdef CISTERN_HAS_CUDA

namespace {

/// The byte every allocation is filled with under --touch.
constexpr int kTouchByte = 0xa5;

void check(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return;
  (void)cudaGetLastError();
  throw Error(
      fmt::format("{} failed: {} ({})", call, cudaGetErrorName(error), cudaGetErrorString(error)));
}

Stream create_stream() {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return stream;
}

void destroy_stream(Stream stream) { (void)cudaStreamDestroy(stream.native<CUstream_st>()); }

void touch(void* ptr, std::size_t bytes, Stream stream) {
  check(cudaMemsetAsync(ptr, kTouchByte, bytes, stream.native<CUstream_st>()),
        "cudaMemsetAsync (--touch)");
}

/// Waits for the replay's work; a write through a bad pointer surfaces here.
void finish() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (end of the replay)"); }

}  // namespace

DeviceBackend open_cuda_backend(int ordinal, bool touch_allocations) {
  CudaDeviceOptions options;
  options.device = ordinal;
  DeviceBackend backend;
  CudaDeviceChoice choice = open_cuda_device(options);
  backend.device = std::move(choice.device);
  if (!choice.virtual_memory) {
    backend.note = "no virtual memory, so cudaMalloc segments without the page engine (" +
                   choice.without_virtual_memory + ")";
  }
  // The streams, the writes and the final synchronisation go to this device.
  if (const cudaError_t error = cudaSetDevice(ordinal); error != cudaSuccess) {
    (void)cudaGetLastError();
    throw DeviceError(
        "open", fmt::format("cudaSetDevice({}) failed: {}", ordinal, cudaGetErrorName(error)));
  }
  backend.hooks.create_stream = create_stream;
  backend.hooks.destroy_stream = destroy_stream;
  if (touch_allocations) backend.hooks.touch = touch;
  backend.hooks.finish = finish;
  return backend;
}

#else

DeviceBackend open_cuda_backend(int /*ordinal*/, bool /*touch*/) {
  throw DeviceError("open",
                    "cistern: --backend cuda: this cistern was built without the CUDA toolkit "
                    "(configure with CUDA 12.5 or newer installed to get the CUDA backends)");
}

#endif

}  // namespace cistern::cli
