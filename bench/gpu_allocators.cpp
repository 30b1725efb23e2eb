// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The allocators of bench_gpu but CUB's (gpu_allocators_cub.cu): see gpu_allocators.hpp.
#include "gpu_allocators.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "cistern/caching_allocator.hpp"
#include "cistern/config.hpp"
#include "cistern/cuda_device.hpp"
#include "cistern/errors.hpp"

namespace cistern::bench {

void check_cuda(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return;
  (void)cudaGetLastError();
  throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(error) + " (" +
                           cudaGetErrorString(error) + ")");
}

namespace {

/// cistern's allocator on the device the plug-in would open (open_cuda_device), with the page
/// engine on (`vmm:true`, which needs a CudaVmmDevice) or off (`vmm:false`: cudaMalloc segments).
class CisternAllocator final : public GpuAllocator {
 public:
  CisternAllocator(int device, bool vmm)
      : name_(vmm ? "cistern vmm:true" : "cistern vmm:false"),
        config_(Config::parse(vmm ? "vmm:true" : "vmm:false")),
        device_(open_device(device, vmm)),
        allocator_(*device_, config_) {}
  std::string name() const override { return name_; }
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    try {
      void* ptr = allocator_.allocate(bytes, stream);
      peak_ = std::max<std::uint64_t>(peak_, allocator_.reserved_bytes());
      return ptr;
    } catch (const OutOfMemory&) {
      return nullptr;
    }
  }
  void deallocate(void* ptr, std::size_t, cudaStream_t stream) override {
    allocator_.deallocate(ptr, stream);
  }
  void release_cache() override { allocator_.empty_cache(); }
  std::optional<std::uint64_t> peak_reserved() override { return peak_; }
  void reset_peak() override { peak_ = allocator_.reserved_bytes(); }

 private:
  static std::unique_ptr<CudaDevice> open_device(int device, bool vmm) {
    CudaDeviceOptions options;
    options.device = device;
    CudaDeviceChoice choice = open_cuda_device(options);
    if (vmm && !choice.virtual_memory) {
      throw std::runtime_error("the page engine needs virtual memory: " +
                               choice.without_virtual_memory);
    }
    return std::move(choice.device);
  }
  std::string name_;
  Config config_;
  std::unique_ptr<CudaDevice> device_;
  CachingAllocator allocator_;
  std::uint64_t peak_ = 0;
};

/// No cache: every allocation is a cudaMalloc, every free a (device-synchronising) cudaFree.
class CudaMallocAllocator final : public GpuAllocator {
 public:
  std::string name() const override { return "cudaMalloc"; }
  void* allocate(std::size_t bytes, cudaStream_t) override {
    void* ptr = nullptr;
    const cudaError_t error = cudaMalloc(&ptr, bytes);
    if (error == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check_cuda(error, "cudaMalloc");
    return ptr;
  }
  void deallocate(void* ptr, std::size_t, cudaStream_t) override {
    check_cuda(cudaFree(ptr), "cudaFree");
  }
  void release_cache() override {}
};

/// Stream-ordered allocation from a pool of its own whose release threshold is unlimited, so
/// that freed memory stays in the pool (the fair, caching configuration of cudaMallocAsync).
class CudaMallocAsyncAllocator final : public GpuAllocator {
 public:
  explicit CudaMallocAsyncAllocator(int device) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check_cuda(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
    std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
    check_cuda(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
               "cudaMemPoolSetAttribute(ReleaseThreshold)");
  }
  ~CudaMallocAsyncAllocator() override { (void)cudaMemPoolDestroy(pool_); }
  std::string name() const override { return "cudaMallocAsync"; }
  void* allocate(std::size_t bytes, cudaStream_t stream) override {
    void* ptr = nullptr;
    const cudaError_t error = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream);
    if (error == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check_cuda(error, "cudaMallocFromPoolAsync");
    return ptr;
  }
  void deallocate(void* ptr, std::size_t, cudaStream_t stream) override {
    check_cuda(cudaFreeAsync(ptr, stream), "cudaFreeAsync");
  }
  void release_cache() override {
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check_cuda(cudaMemPoolTrimTo(pool_, 0), "cudaMemPoolTrimTo");
  }
  std::optional<std::uint64_t> peak_reserved() override {
    std::uint64_t high = 0;
    check_cuda(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &high),
               "cudaMemPoolGetAttribute(ReservedMemHigh)");
    return high;
  }
  void reset_peak() override {
    std::uint64_t zero = 0;
    check_cuda(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero),
               "cudaMemPoolSetAttribute(ReservedMemHigh)");
  }

 private:
  cudaMemPool_t pool_ = nullptr;
};

/// PyTorch's CUDACachingAllocator through bench/torch_shim (extern "C" functions).
class TorchAllocator final : public GpuAllocator {
 public:
  TorchAllocator(const std::string& path, int device) : device_(device) {
    library_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library_ == nullptr) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    bind(init_, "cistern_torch_init");
    bind(alloc_, "cistern_torch_alloc");
    bind(free_, "cistern_torch_free");
    bind(empty_cache_, "cistern_torch_empty_cache");
    bind(peak_, "cistern_torch_peak_reserved");
    bind(reset_peak_, "cistern_torch_reset_peak");
    if (init_(device) != 0) throw std::runtime_error("cistern_torch_init failed");
  }
  // The library stays loaded: libtorch does not support being unloaded.
  ~TorchAllocator() override = default;
  std::string name() const override { return "torch"; }
  void* allocate(std::size_t bytes, cudaStream_t) override { return alloc_(bytes); }
  void deallocate(void* ptr, std::size_t, cudaStream_t) override { free_(ptr); }
  void release_cache() override { empty_cache_(); }
  std::optional<std::uint64_t> peak_reserved() override {
    return static_cast<std::uint64_t>(peak_(device_));
  }
  void reset_peak() override { reset_peak_(device_); }

 private:
  template <class Function>
  void bind(Function*& slot, const char* symbol) {
    slot = reinterpret_cast<Function*>(dlsym(library_, symbol));
    if (slot == nullptr) throw std::runtime_error(std::string("the shim lacks ") + symbol);
  }

  int device_;
  void* library_ = nullptr;
  int (*init_)(int) = nullptr;
  void* (*alloc_)(std::size_t) = nullptr;
  void (*free_)(void*) = nullptr;
  void (*empty_cache_)() = nullptr;
  long long (*peak_)(int) = nullptr;
  void (*reset_peak_)(int) = nullptr;
};

}  // namespace

std::unique_ptr<GpuAllocator> make_cistern_allocator(int device, bool vmm) {
  return std::make_unique<CisternAllocator>(device, vmm);
}
std::unique_ptr<GpuAllocator> make_cuda_malloc_allocator() {
  return std::make_unique<CudaMallocAllocator>();
}
std::unique_ptr<GpuAllocator> make_cuda_malloc_async_allocator(int device) {
  return std::make_unique<CudaMallocAsyncAllocator>(device);
}
std::unique_ptr<GpuAllocator> make_torch_allocator(const std::string& shim_path, int device) {
  return std::make_unique<TorchAllocator>(shim_path, device);
}

}  // namespace cistern::bench
