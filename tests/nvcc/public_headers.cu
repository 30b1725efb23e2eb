// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Every public header must compile in a .cu file under nvcc -std=c++17 (STYLE.md, habit 1). CI
// compiles this file and never runs it:
//   nvcc -std=c++17 -Iinclude -c tests/nvcc/public_headers.cu -o /tmp/public_headers.o
// .ci/run also checks that every include/cistern/*.hpp is included below.
#include "cistern/allocator.hpp"
#include "cistern/caching_allocator.hpp"
#include "cistern/cccl_resource.hpp"
#include "cistern/config.hpp"
#include "cistern/cuda_device.hpp"
#include "cistern/device.hpp"
#include "cistern/device_allocator.hpp"
#include "cistern/device_buffer.hpp"
#include "cistern/errors.hpp"
#include "cistern/history.hpp"
#include "cistern/pass_through_allocator.hpp"
#include "cistern/plugin.h"
#include "cistern/pytorch_snapshot.hpp"
#include "cistern/sim_device.hpp"
#include "cistern/stacks.hpp"
#include "cistern/stats.hpp"
#include "cistern/stream_scope.hpp"
#include "cistern/types.hpp"

// External linkage: every function is compiled and kept, none is ever called.
namespace cistern_nvcc_check {

static_assert(cistern::MiB == 1024 * cistern::KiB, "byte units");
static_assert(sizeof(cistern::Stream) == sizeof(cudaStream_t), "a Stream holds a cudaStream_t");

__global__ void fill(float* data, float value, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) data[i] = value;
}

// What a user's CUDA code does: a caching allocator on a device, RAII buffers on a CUDA stream,
// a kernel launched on the buffer's stream.
void typical_use(cistern::Device& device, cudaStream_t native, int n) {
  cistern::CachingAllocator allocator(device, cistern::Config::parse("max_split_size_mb:512"));
  const cistern::Stream stream = native;  // implicit, as from any cudaStream_t
  cistern::DeviceBuffer buffer(static_cast<std::size_t>(n) * sizeof(float), stream, allocator);
  const cudaStream_t launch_stream = buffer.stream().native<CUstream_st>();
  fill<<<(n + 255) / 256, 256, 0, launch_stream>>>(buffer.data_as<float>(), 1.0f, n);
  auto one = cistern::make_device_unique<int>(allocator, stream);
  auto many = cistern::make_device_unique<double[]>(static_cast<std::size_t>(n), allocator);
  const cistern::Stats stats = allocator.stats();
  (void)stats.get(cistern::StatKind::allocated_bytes, cistern::StatPool::all).current;
  (void)one;
  (void)many;
}

void scoped_defaults(cistern::Allocator& allocator, cudaStream_t native) {
  cistern::StreamScope on(native);
  cistern::AllocatorScope with(allocator);
  cistern::DeviceBuffer buffer(1 << 20);
}

void errors_and_snapshots(cistern::CachingAllocator& allocator) {
  try {
    allocator.deallocate(nullptr, cistern::default_stream);
  } catch (const cistern::OutOfMemory& e) {
    (void)e.info().requested;
  } catch (const cistern::Error& e) {
    (void)e.what();
  }
  for (const cistern::SegmentInfo& segment : allocator.snapshot().segments) {
    for (const cistern::BlockInfo& block : segment.blocks) (void)cistern::to_string(block.state);
  }
}

void simulated() {
  cistern::SimDeviceOptions options;
  options.capacity = 4 * cistern::GiB;
  cistern::SimDevice device(options);
  typical_use(device, device.create_stream().native<CUstream_st>(), 1024);
  (void)cistern::to_string(cistern::Status::out_of_memory);
  (void)cistern::options_markdown();
  cistern::HistoryEntry entry;
  entry.action = cistern::HistoryEntry::Action::segment_alloc;
  (void)cistern::to_string(entry.action);
  cistern::StackTable stacks;
  const std::uint32_t frame = stacks.frame_id("train.py", 42, "forward");
  (void)stacks.stack(stacks.stack_id({frame})).size();
}

// The CCCL adaptor and the plug-in's C ABI, as CUDA code would use them.
#if CCCL_MAJOR_VERSION * 1000 + CCCL_MINOR_VERSION >= 3001
static_assert(cuda::mr::resource<cistern::cccl::memory_resource>, "cuda::mr adaptor");
#else
static_assert(cuda::mr::async_resource<cistern::cccl::memory_resource>, "cuda::mr adaptor");
#endif
void plugin_and_cccl(cistern::CachingAllocator& allocator, cudaStream_t native) {
  cistern::cccl::memory_resource resource(allocator);
  void* p = resource.allocate_async(256, cuda::stream_ref(native));
  resource.deallocate_async(p, 256, cuda::stream_ref(native));
  void* r = resource.allocate(cuda::stream_ref(native), 256, 256);  // CCCL 3.1's stream-first form
  resource.deallocate(cuda::stream_ref(native), r, 256, 256);
  void* q = cistern_malloc(256, 0, native);
  cistern_free(q, 256, 0, native);
  (void)cistern::pytorch_snapshot_pickle(allocator);
}

}  // namespace cistern_nvcc_check
