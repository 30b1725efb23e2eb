// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CudaDevice and CudaVmmDevice on a real GPU (CTest label gpu): the device conformance suite that
// SimDevice passes, memory that is really usable, the caching allocator over the runtime, and a
// quiet process exit after the runtime has shut down. Every test skips itself where no GPU can be
// used, so the file builds and "passes" on any machine with the CUDA toolkit.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/cuda_device.hpp"
#include "cistern/errors.hpp"
#include "device_conformance.hpp"

namespace cistern {
namespace {

bool have_gpu() { return CudaDevice::device_count() > 0; }

/// Real streams: non-blocking, so that they do not synchronise with the legacy default stream.
template <class Backend>
struct CudaFactoryOf {
  static bool available() { return have_gpu(); }
  static std::unique_ptr<Device> make() { return std::make_unique<Backend>(); }
  static Stream make_stream(Device&) {
    cudaStream_t stream = nullptr;
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    return stream;
  }
  static void destroy_stream(Device&, Stream stream) {
    EXPECT_EQ(cudaStreamDestroy(stream.native<CUstream_st>()), cudaSuccess);
  }
  static bool fail_next(Device&, DeviceOp) { return false; }  // a real driver fails on its own
  /// The driver's free figure moves on its own: on an H200 it grew by 2 MiB (one granule)
  /// between two reads with no call of ours between them (../shared/reference/h200/README.md),
  /// as the driver takes and returns memory for its own use. Two granules either way covers
  /// that; a leak of one or two granules then goes unseen here, but the simulated and fake
  /// devices run the same tests with no drift and catch it.
  static constexpr std::size_t kFreeMemoryDriftGranules = 2;
};

struct CudaFactory : CudaFactoryOf<CudaDevice> {};
struct CudaVmmFactory : CudaFactoryOf<CudaVmmDevice> {};

}  // namespace

namespace conformance {
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, DeviceConformance, ::testing::Types<CudaFactory>);
INSTANTIATE_TYPED_TEST_SUITE_P(CudaVmm, DeviceConformance, ::testing::Types<CudaVmmFactory>);
}  // namespace conformance

namespace {

#define CISTERN_REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device on this machine"

/// The first `bytes` of device memory at `ptr`, copied to the host.
std::vector<unsigned char> read_back(const void* ptr, std::size_t bytes) {
  std::vector<unsigned char> host(bytes);
  EXPECT_EQ(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

std::size_t count_of(const std::vector<unsigned char>& bytes, unsigned char value) {
  std::size_t n = 0;
  for (unsigned char b : bytes) n += b == value ? 1 : 0;
  return n;
}

TEST(CudaGpu, NameAndCapacityAreTheRuntimes) {
  CISTERN_REQUIRE_GPU();
  CudaDevice device;
  cudaDeviceProp properties{};
  ASSERT_EQ(cudaGetDeviceProperties(&properties, 0), cudaSuccess);
  EXPECT_EQ(device.name(), std::string("cuda:0 ") + properties.name);
  MemoryInfo info;
  ASSERT_EQ(device.memory_info(&info), Status::ok);
  EXPECT_EQ(info.total, properties.totalGlobalMem);
}

TEST(CudaGpu, DriverRuleAccessOverSeveralWholeMappingsMakesOneUsableRange) {
  // map_run: one cuMemMap per handle and one cuMemSetAccess over the run; the whole run is then
  // usable as one range, across the boundaries of its mappings.
  CISTERN_REQUIRE_GPU();
  CudaVmmDevice device;
  const std::size_t granule = device.granularity();
  void* va = nullptr;
  PhysicalHandle handles[3];
  ASSERT_EQ(device.reserve(4 * granule, 0, &va), Status::ok) << device.last_error();
  ASSERT_EQ(device.create_physical(granule, &handles[0]), Status::ok) << device.last_error();
  ASSERT_EQ(device.create_physical(2 * granule, &handles[1]), Status::ok) << device.last_error();
  ASSERT_EQ(device.create_physical(granule, &handles[2]), Status::ok) << device.last_error();
  ASSERT_EQ(device.map_run(va, handles, 3), Status::ok) << device.last_error();
  // One memset across the boundaries of the three mappings.
  ASSERT_EQ(cudaMemset(va, 0x5a, 4 * granule), cudaSuccess);
  EXPECT_EQ(count_of(read_back(va, 4 * granule), 0x5a), 4 * granule);
  EXPECT_EQ(device.unmap(va, 4 * granule), Status::ok) << device.last_error();
  for (const PhysicalHandle handle : handles)
    EXPECT_EQ(device.release_physical(handle), Status::ok);
  EXPECT_EQ(device.release_reservation(va, 4 * granule), Status::ok);
}

TEST(CudaGpu, DriverRuleOneHandleMapsAtTwoAddressesAsTheSameMemory) {
  // What a stitched or rebuilt range relies on: a handle mapped at a second address while the
  // first mapping stays is the same memory, written through one address and read through the
  // other, and a released handle's memory stays usable until its last mapping goes.
  CISTERN_REQUIRE_GPU();
  CudaVmmDevice device;
  const std::size_t granule = device.granularity();
  void* first = nullptr;
  void* second = nullptr;
  PhysicalHandle handle;
  ASSERT_EQ(device.reserve(2 * granule, 0, &first), Status::ok) << device.last_error();
  ASSERT_EQ(device.reserve(2 * granule, 0, &second), Status::ok) << device.last_error();
  ASSERT_EQ(device.create_physical(2 * granule, &handle), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(first, handle), Status::ok) << device.last_error();
  ASSERT_EQ(device.map(second, handle), Status::ok) << device.last_error();
  char* upper = static_cast<char*>(first) + granule;
  char* second_upper = static_cast<char*>(second) + granule;
  ASSERT_EQ(cudaMemset(first, 0x11, granule), cudaSuccess);
  ASSERT_EQ(cudaMemset(upper, 0x22, granule), cudaSuccess);
  EXPECT_EQ(count_of(read_back(second, granule), 0x11), granule);
  EXPECT_EQ(count_of(read_back(second_upper, granule), 0x22), granule);
  ASSERT_EQ(cudaMemset(second_upper, 0x33, granule), cudaSuccess);
  EXPECT_EQ(count_of(read_back(upper, granule), 0x33), granule);
  EXPECT_EQ(count_of(read_back(first, granule), 0x11), granule);
  // Released while mapped: the memory stays usable until its last mapping goes.
  EXPECT_EQ(device.release_physical(handle), Status::ok) << device.last_error();
  EXPECT_EQ(device.unmap(first, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(count_of(read_back(second_upper, granule), 0x33), granule);
  EXPECT_EQ(device.unmap(second, 2 * granule), Status::ok) << device.last_error();
  EXPECT_EQ(device.release_reservation(first, 2 * granule), Status::ok);
  EXPECT_EQ(device.release_reservation(second, 2 * granule), Status::ok);
}

TEST(CudaGpu, CachingAllocatorOnTheVmmDeviceKeepsDataIntactUnderATightLimit) {
  // The allocator over CudaVmmDevice with its defaults (the page engine, where the build has it)
  // and a limit well below what the pattern would need without reusing freed pages: blocks
  // freed on one stream back a larger request on another, and the live blocks keep their bytes.
  CISTERN_REQUIRE_GPU();
  Config config;
  try {
    // Live blocks need at most 40 MiB at any time; keeping every freed page would need 56.
    config = Config::parse("vmm:true,memory_limit_mb:48");
  } catch (const ConfigError& e) {
    GTEST_SKIP() << "this build has no page engine: " << e.what();
  }
  CudaVmmDevice device;
  cudaStream_t first = nullptr;
  cudaStream_t second = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking), cudaSuccess);
  {
    CachingAllocator allocator(device, config);
    constexpr int kBlocks = 8;
    const std::size_t bytes = 4 * MiB;
    const std::size_t large_bytes = 24 * MiB;
    std::vector<void*> blocks;
    for (int i = 0; i < kBlocks; ++i) {
      blocks.push_back(allocator.allocate(bytes, first));
      ASSERT_EQ(cudaMemsetAsync(blocks.back(), 0x40 + i, bytes, first), cudaSuccess);
    }
    // Freed on `first` while its writes may still run: their pages may back `second`'s block
    // only once those writes have completed.
    for (int i = 1; i < kBlocks; i += 2) allocator.deallocate(blocks[i], first);
    void* large = allocator.allocate(large_bytes, second);
    ASSERT_EQ(cudaMemsetAsync(large, 0x7e, large_bytes, second), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(count_of(read_back(large, large_bytes), 0x7e), large_bytes);
    for (int i = 0; i < kBlocks; i += 2) {
      EXPECT_EQ(count_of(read_back(blocks[i], bytes), static_cast<unsigned char>(0x40 + i)), bytes)
          << "live block " << i;
      allocator.deallocate(blocks[i], first);
    }
    allocator.deallocate(large, second);
    allocator.check();
    allocator.empty_cache();
    EXPECT_EQ(allocator.reserved_bytes(), 0u);
    EXPECT_EQ(device.live_segments(), 0u);
    EXPECT_EQ(device.live_mappings(), 0u);
    EXPECT_EQ(device.live_physical(), 0u);
  }
  EXPECT_EQ(cudaStreamDestroy(first), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(second), cudaSuccess);
}

// The engine on the real driver under a limit: random requests on two streams, each block
// written with its own byte when it is handed out and read back (first and last bytes) before it
// is freed, check() as it goes. Near the limit the engine reclaims handles across streams, gives
// large free handles back under small requests and maps reclaimed handles again; none of it may
// touch a live block's bytes, and the driver must accept every map and unmap it makes.
TEST(CudaGpu, TheEngineKeepsEveryLiveBlockIntactNearTheLimit) {
  CISTERN_REQUIRE_GPU();
  CudaVmmDevice device;
  cudaStream_t streams[2] = {nullptr, nullptr};
  for (cudaStream_t& s : streams) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  }
  {
    CachingAllocator allocator(device, Config::parse("vmm:true,memory_limit_mb:256"));
    struct Live {
      void* ptr;
      std::size_t bytes;
      int stream;
      unsigned char value;
    };
    std::vector<Live> live;
    std::uint64_t state = 42;
    const auto next = [&state] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return state >> 33;
    };
    std::size_t ooms = 0;
    const auto verify_and_free = [&](std::size_t i) {
      const Live l = live[i];
      ASSERT_EQ(cudaStreamSynchronize(streams[l.stream]), cudaSuccess);
      unsigned char ends[2] = {0, 0};
      ASSERT_EQ(cudaMemcpy(&ends[0], l.ptr, 1, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(
          cudaMemcpy(&ends[1], static_cast<char*>(l.ptr) + l.bytes - 1, 1, cudaMemcpyDeviceToHost),
          cudaSuccess);
      EXPECT_EQ(ends[0], l.value) << "first byte of a live block of " << l.bytes;
      EXPECT_EQ(ends[1], l.value) << "last byte of a live block of " << l.bytes;
      allocator.deallocate(l.ptr, streams[l.stream]);
      live[i] = live.back();
      live.pop_back();
    };
    for (int step = 0; step < 600; ++step) {
      if (!live.empty() && (next() % 100 < 45 || live.size() > 40)) {
        verify_and_free(next() % live.size());
      } else {
        const std::size_t kind = next() % 10;
        const std::size_t bytes = kind < 4   ? 1 + next() % MiB
                                  : kind < 8 ? MiB + next() % (12 * MiB)
                                             : 12 * MiB + next() % (48 * MiB);
        const int s = static_cast<int>(next() % 2);
        const auto value = static_cast<unsigned char>(next() % 255 + 1);
        try {
          void* p = allocator.allocate(bytes, streams[s]);
          ASSERT_EQ(cudaMemsetAsync(p, value, bytes, streams[s]), cudaSuccess);
          live.push_back({p, bytes, s, value});
        } catch (const OutOfMemory&) {
          ++ooms;
        }
      }
      if (step % 50 == 0) allocator.check();
    }
    while (!live.empty()) verify_and_free(live.size() - 1);
    allocator.check();
    EXPECT_GT(allocator.stats().num_pages_reclaimed, 0) << "the limit never made it reclaim";
    std::printf("engine near the limit: %zu requests refused, %lld granules reclaimed\n", ooms,
                static_cast<long long>(allocator.stats().num_pages_reclaimed));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    allocator.empty_cache();
    EXPECT_EQ(allocator.reserved_bytes(), 0u);
    EXPECT_EQ(device.live_mappings(), 0u);
    EXPECT_EQ(device.live_physical(), 0u);
  }
  for (cudaStream_t s : streams) EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(CudaGpu, CachingAllocatorReusesMemoryAcrossStreamsSafely) {
  CISTERN_REQUIRE_GPU();
  CudaDevice device;
  cudaStream_t first = nullptr;
  cudaStream_t second = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking), cudaSuccess);
  {
    CachingAllocator allocator(device);
    const std::size_t bytes = 1 * MiB;
    void* a = allocator.allocate(bytes, first);
    ASSERT_EQ(cudaMemsetAsync(a, 0x11, bytes, first), cudaSuccess);
    allocator.deallocate(a, first);
    // The same stream may reuse the block at once: a cache hit, no new segment.
    void* again = allocator.allocate(bytes, first);
    EXPECT_EQ(again, a);
    EXPECT_EQ(device.live_segments(), 1u);
    allocator.deallocate(again, first);
    // Another stream gets memory only once the first stream's work is known to be done.
    void* b = allocator.allocate(bytes, second);
    ASSERT_EQ(cudaMemsetAsync(b, 0x22, bytes, second), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(second), cudaSuccess);
    EXPECT_EQ(count_of(read_back(b, bytes), 0x22), bytes);
    allocator.deallocate(b, second);
    allocator.empty_cache();
    EXPECT_EQ(device.live_segments(), 0u);
  }
  EXPECT_EQ(device.live_events(), 0u);
  EXPECT_EQ(cudaStreamDestroy(first), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(second), cudaSuccess);
}

TEST(CudaGpu, AnOrdinalPastTheLastDeviceIsAnInvalidArgument) {
  CISTERN_REQUIRE_GPU();
  CudaDeviceOptions options;
  options.device = CudaDevice::device_count();
  EXPECT_THROW(CudaDevice{options}, InvalidArgument);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// A cache that outlives the CUDA runtime. The holders are namespace-scope objects whose
// destructors are registered before main, hence before anything CUDA registers for its own
// teardown, so at exit they run after it: the allocator returns its cached segment to a runtime
// that may already be gone (cudaErrorCudartUnloading), which must be quiet.
std::unique_ptr<CudaDevice> g_exit_device;
std::unique_ptr<CachingAllocator> g_exit_allocator;

/// Run in a fresh process (death-test style "threadsafe" re-executes the test binary).
[[noreturn]] void exit_with_a_static_cache() {
  g_exit_device = std::make_unique<CudaDevice>();
  g_exit_allocator = std::make_unique<CachingAllocator>(*g_exit_device);
  void* ptr = g_exit_allocator->allocate(4 * MiB, default_stream);
  g_exit_allocator->deallocate(ptr, default_stream);  // cached: returned only at exit
  std::exit(0);
}

TEST(CudaGpu, ACacheDestroyedAfterTheRuntimeExitsQuietly) {
  CISTERN_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(exit_with_a_static_cache(), ::testing::ExitedWithCode(0), "^$");
}

}  // namespace
}  // namespace cistern
