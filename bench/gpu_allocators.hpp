// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The allocators bench_gpu compares on a real GPU, behind one small interface: cistern's
// CachingAllocator with its page engine (on a CudaVmmDevice) and without it, raw
// cudaMalloc/cudaFree, cudaMallocAsync from a pool that keeps everything (release threshold
// unlimited), CUB's CachingDeviceAllocator (CCCL, default bins), and PyTorch's CUDA caching
// allocator through a small shim library loaded at run time (bench/torch_shim), so that
// bench_gpu never links libtorch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace cistern::bench {

/// One allocator under test, on one device and the stream it is given.
class GpuAllocator {
 public:
  virtual ~GpuAllocator() = default;
  GpuAllocator() = default;
  GpuAllocator(const GpuAllocator&) = delete;
  GpuAllocator& operator=(const GpuAllocator&) = delete;

  /// The row name, e.g. "cistern", "cudaMallocAsync".
  virtual std::string name() const = 0;
  /// `bytes` on `stream`, or nullptr when the device is out of memory.
  virtual void* allocate(std::size_t bytes, cudaStream_t stream) = 0;
  /// Frees `ptr` (from `allocate(bytes, stream)`) on `stream`.
  virtual void deallocate(void* ptr, std::size_t bytes, cudaStream_t stream) = 0;
  /// Returns every cached byte to the device.
  virtual void release_cache() = 0;
  /// The highest reserved bytes since the last `reset_peak`, if the allocator can tell.
  virtual std::optional<std::uint64_t> peak_reserved() { return std::nullopt; }
  virtual void reset_peak() {}
};

/// Throws std::runtime_error naming the call when `error` is not cudaSuccess.
void check_cuda(cudaError_t error, const char* call);

/// cistern with the page engine on (`vmm:true`, on a CudaVmmDevice) or off (`vmm:false`). Throws
/// std::runtime_error when the device has no virtual memory and `vmm` is asked for, ConfigError
/// when this cistern has no `vmm` option.
std::unique_ptr<GpuAllocator> make_cistern_allocator(int device, bool vmm);
std::unique_ptr<GpuAllocator> make_cuda_malloc_allocator();
std::unique_ptr<GpuAllocator> make_cuda_malloc_async_allocator(int device);
std::unique_ptr<GpuAllocator> make_cub_allocator(int device);
/// PyTorch's allocator through the shim at `shim_path`; throws std::runtime_error saying why it
/// cannot be loaded.
std::unique_ptr<GpuAllocator> make_torch_allocator(const std::string& shim_path, int device);

}  // namespace cistern::bench
