// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CUB's CachingDeviceAllocator (from the installed CCCL) for bench_gpu, in a .cu file because
// CUB's headers are written for nvcc. Default construction, as users get it: bins 8^3 .. 8^7
// bytes (512 B .. 2 MiB), at most 6 MiB cached; larger requests go straight to cudaMalloc.
#include <cub/util_allocator.cuh>

#include "gpu_allocators.hpp"

namespace cistern::bench {
namespace {

class CubAllocator final : public GpuAllocator {
 public:
  explicit CubAllocator(int device) : device_(device) {}
  std::string name() const override { return "cub"; }
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    void* ptr = nullptr;
    const cudaError_t error = cub_.DeviceAllocate(device_, &ptr, bytes, stream);
    if (error == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check_cuda(error, "cub::CachingDeviceAllocator::DeviceAllocate");
    return ptr;
  }
  void deallocate(void* ptr, std::size_t, cudaStream_t) override {
    check_cuda(cub_.DeviceFree(device_, ptr), "cub::CachingDeviceAllocator::DeviceFree");
  }
  void release_cache() override {
    check_cuda(cub_.FreeAllCached(), "cub::CachingDeviceAllocator::FreeAllCached");
  }

 private:
  int device_;
  cub::CachingDeviceAllocator cub_;
};

}  // namespace

std::unique_ptr<GpuAllocator> make_cub_allocator(int device) {
  return std::make_unique<CubAllocator>(device);
}

}  // namespace cistern::bench
