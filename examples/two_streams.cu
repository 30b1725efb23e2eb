// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// cistern on a real GPU: a caching allocator over CudaDevice, DeviceBuffers on two streams, a
// kernel on each, and a buffer handed from one stream to the other.
//
//   two_streams [--device N] [--rounds N]
//
// Each round a producer stream fills a fresh buffer, the consumer stream (after waiting for the
// producer with an event) scales it into a buffer of its own, and both buffers go back to the
// allocator on their own streams. The producer's buffer is used by the consumer too
// (`record_stream`), so the allocator reuses its memory on the producer's stream only once the
// consumer's work is done; from the second round on every buffer comes from the cache (no
// cudaMalloc). The program checks the results and prints the allocator's statistics.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/cuda_device.hpp"
#include "cistern/device_buffer.hpp"
#include "cistern/errors.hpp"

namespace {

__global__ void fill(float* data, float value, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) data[i] = value;
}

__global__ void scale(const float* in, float* out, float factor, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i] * factor;
}

void check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "two_streams: %s: %s\n", what, cudaGetErrorString(error));
  std::exit(1);
}

int blocks_for(int n) { return (n + 255) / 256; }

/// One round; returns the consumer's first value as read back on the host.
float round_trip(cistern::CachingAllocator& allocator, cudaStream_t producer, cudaStream_t consumer,
                 cudaEvent_t ready, int n, float value) {
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  cistern::DeviceBuffer input(bytes, producer, allocator);
  fill<<<blocks_for(n), 256, 0, producer>>>(input.data_as<float>(), value, n);
  check(cudaGetLastError(), "fill");
  check(cudaEventRecord(ready, producer), "cudaEventRecord");

  cistern::DeviceBuffer output(bytes, consumer, allocator);
  check(cudaStreamWaitEvent(consumer, ready, 0), "cudaStreamWaitEvent");
  scale<<<blocks_for(n), 256, 0, consumer>>>(input.data_as<float>(), output.data_as<float>(), 2.0f,
                                             n);
  check(cudaGetLastError(), "scale");
  allocator.record_stream(input.data(), consumer);  // the consumer reads `input` too

  float last = 0;
  check(cudaMemcpyAsync(&last, output.data_as<float>() + (n - 1), sizeof last,
                        cudaMemcpyDeviceToHost, consumer),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(consumer), "cudaStreamSynchronize");
  return last;  // `input` and `output` are freed here, on their streams
}

}  // namespace

int main(int argc, char** argv) {
  int device_index = 0;
  int rounds = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--device") == 0) device_index = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
  }
  try {
    cistern::CudaDeviceOptions options;
    options.device = device_index;
    cistern::CudaDevice device(options);
    check(cudaSetDevice(device_index), "cudaSetDevice");
    cistern::CachingAllocator allocator(device);

    cudaStream_t producer = nullptr;
    cudaStream_t consumer = nullptr;
    cudaEvent_t ready = nullptr;
    check(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");

    const int n = 1 << 22;  // 16 MiB of floats
    int wrong = 0;
    for (int round = 0; round < rounds; ++round) {
      const auto value = static_cast<float>(round + 1);
      const float got = round_trip(allocator, producer, consumer, ready, n, value);
      if (got != 2.0f * value) {
        std::fprintf(stderr, "two_streams: round %d: got %g, expected %g\n", round, got,
                     2.0f * value);
        ++wrong;
      }
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

    const cistern::Stats stats = allocator.stats();
    std::printf("%s: %d rounds on two streams, %d wrong\n", device.name().c_str(), rounds, wrong);
    std::printf("  segments allocated (cudaMalloc): %lld\n",
                static_cast<long long>(
                    stats.get(cistern::StatKind::segment, cistern::StatPool::all).allocated));
    std::printf("  reserved now: %s\n", cistern::format_bytes(allocator.reserved_bytes()).c_str());

    allocator.empty_cache();
    check(cudaEventDestroy(ready), "cudaEventDestroy");
    check(cudaStreamDestroy(producer), "cudaStreamDestroy");
    check(cudaStreamDestroy(consumer), "cudaStreamDestroy");
    return wrong == 0 ? 0 : 1;
  } catch (const cistern::Error& e) {
    std::fprintf(stderr, "two_streams: %s\n", e.what());
    return 1;
  }
}
