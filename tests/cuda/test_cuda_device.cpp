// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CudaDevice and CudaVmmDevice without a GPU: every code path of the backends over the test-only
// stand-in for the CUDA runtime and driver (fake_cuda_api.hpp), the device conformance suite
// included, and the no-device error of the real runtime on a machine without a GPU. The same
// backends on a real GPU: test_cuda_gpu.cpp (label gpu).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/cuda_device.hpp"
#include "cistern/errors.hpp"
#include "cuda/cuda_device_state.hpp"
#include "device_conformance.hpp"
#include "fake_cuda_api.hpp"

namespace cistern {
namespace {

using fake_cuda::fake;

// --- the conformance suite over the fake -------------------------------------------------------------

/// Streams of the fake are plain handles; any value but the special ones names a stream.
template <class Backend>
struct FakeFactoryOf {
  static bool available() { return true; }
  static std::unique_ptr<Device> make() {
    fake_cuda::reset();
    return std::make_unique<Backend>(fake_cuda::fake_runtime_api(), CudaDeviceOptions{});
  }
  static Stream make_stream(Device&) {
    static std::uintptr_t next = 0x5000;
    return Stream(next += 0x10);
  }
  static void destroy_stream(Device&, Stream) {}
  /// The CUDA call behind each operation fails once, with the error the driver or runtime would
  /// give for it.
  static bool fail_next(Device&, DeviceOp op) {
    switch (op) {
      case DeviceOp::reserve:
        fake().fail_next("cuMemAddressReserve", CUDA_ERROR_OUT_OF_MEMORY);
        break;
      case DeviceOp::create_physical:
        fake().fail_next("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY);
        break;
      case DeviceOp::map: fake().fail_next("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY); break;
      case DeviceOp::unmap: fake().fail_next("cuMemUnmap", CUDA_ERROR_UNKNOWN); break;
      case DeviceOp::release_physical: fake().fail_next("cuMemRelease", CUDA_ERROR_UNKNOWN); break;
      case DeviceOp::release_reservation:
        fake().fail_next("cuMemAddressFree", CUDA_ERROR_UNKNOWN);
        break;
      case DeviceOp::record_event: fake().fail_next("cudaEventRecord", cudaErrorUnknown); break;
      case DeviceOp::query_event: fake().fail_next("cudaEventQuery", cudaErrorUnknown); break;
      case DeviceOp::synchronize_event:
        fake().fail_next("cudaEventSynchronize", cudaErrorUnknown);
        break;
      case DeviceOp::synchronize_stream:
        fake().fail_next("cudaStreamSynchronize", cudaErrorUnknown);
        break;
      default: return false;
    }
    return true;
  }
  static constexpr std::size_t kFreeMemoryDriftGranules = 0;  // the fake's accounting is exact
};

struct FakeCudaFactory : FakeFactoryOf<CudaDevice> {};
struct FakeCudaVmmFactory : FakeFactoryOf<CudaVmmDevice> {};

}  // namespace

namespace conformance {
INSTANTIATE_TYPED_TEST_SUITE_P(FakeCuda, DeviceConformance, ::testing::Types<FakeCudaFactory>);
INSTANTIATE_TYPED_TEST_SUITE_P(FakeCudaVmm, DeviceConformance,
                               ::testing::Types<FakeCudaVmmFactory>);
}  // namespace conformance

namespace {

class FakeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override { fake_cuda::reset(); }

  static CudaDeviceOptions on(int ordinal) {
    CudaDeviceOptions options;
    options.device = ordinal;
    return options;
  }
  static std::unique_ptr<CudaDevice> open(int ordinal = 0) {
    return std::make_unique<CudaDevice>(fake_cuda::fake_runtime_api(), on(ordinal));
  }
  static std::unique_ptr<CudaVmmDevice> open_vmm(int ordinal = 0) {
    return std::make_unique<CudaVmmDevice>(fake_cuda::fake_runtime_api(), on(ordinal));
  }
  /// The message of the DeviceError (or other cistern::Error) that opening throws.
  template <class Backend = CudaDevice>
  static std::string open_error(int ordinal = 0) {
    try {
      Backend device(fake_cuda::fake_runtime_api(), on(ordinal));
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }
};

// --- opening -------------------------------------------------------------------------------------------

TEST_F(FakeCudaTest, NoDeviceIsAClearDeviceErrorAndClearsTheRuntimeError) {
  fake().device_count_error = cudaErrorNoDevice;
  EXPECT_THROW(open(), DeviceError);
  const std::string message = open_error();
  EXPECT_NE(message.find("cistern: no CUDA device can be used: cudaGetDeviceCount failed: "
                         "cudaErrorNoDevice (no CUDA-capable device is detected)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("nvidia-smi"), std::string::npos) << message;
  EXPECT_EQ(fake().last_error, cudaSuccess) << "cistern's failure must not linger";
}

TEST_F(FakeCudaTest, ZeroDevicesIsADeviceError) {
  fake().device_count = 0;
  EXPECT_THROW(open(), DeviceError);
  EXPECT_NE(open_error().find("the CUDA runtime sees none"), std::string::npos);
}

TEST_F(FakeCudaTest, AMissingOrdinalIsAnInvalidArgumentThatNamesTheRange) {
  EXPECT_THROW(open(2), InvalidArgument);
  EXPECT_NE(open_error(5).find("CUDA device 5 does not exist: this process sees 2 devices "
                               "(ordinals 0 to 1)"),
            std::string::npos);
  EXPECT_THROW(open(-1), InvalidArgument);
}

TEST_F(FakeCudaTest, DeviceCountIsZeroOnAnyError) {
  EXPECT_EQ(detail::cuda_device_count(fake_cuda::fake_runtime_api()), 2);
  fake().device_count_error = cudaErrorInsufficientDriver;
  EXPECT_EQ(detail::cuda_device_count(fake_cuda::fake_runtime_api()), 0);
  EXPECT_EQ(fake().last_error, cudaSuccess);
}

TEST_F(FakeCudaTest, DescribesItself) {
  const auto device = open(1);
  EXPECT_EQ(device->index(), 1);
  EXPECT_EQ(device->name(), "cuda:1 Fake GPU 1");
  EXPECT_EQ(device->granularity(), 2 * MiB);
  EXPECT_FALSE(device->supports_virtual_memory());
  MemoryInfo info;
  ASSERT_EQ(device->memory_info(&info), Status::ok);
  EXPECT_EQ(info.free, 64 * MiB);
  EXPECT_EQ(info.total, 64 * MiB);
}

// --- segments -------------------------------------------------------------------------------------------

TEST_F(FakeCudaTest, CallsRunOnTheDeviceAndRestoreTheCallersDevice) {
  const auto device = open(1);
  fake().calls.clear();
  void* ptr = nullptr;
  ASSERT_EQ(device->allocate(3 * MiB, &ptr), Status::ok);
  EXPECT_TRUE(fake().called_with("cudaMalloc", "dev=1 3145728"));
  EXPECT_EQ(fake_cuda::current_device(), 0);
  MemoryInfo info;
  ASSERT_EQ(device->memory_info(&info), Status::ok);
  EXPECT_EQ(info.free, 60 * MiB);  // charged in 2 MiB units
  ASSERT_EQ(device->deallocate(ptr), Status::ok);
  EXPECT_TRUE(fake().called_with("cudaFree", "dev=1"));
  EXPECT_EQ(fake_cuda::current_device(), 0);
  EXPECT_EQ(device->live_segments(), 0u);
}

TEST_F(FakeCudaTest, NoDeviceSwitchWhenTheDeviceIsAlreadyCurrent) {
  const auto device = open(0);
  fake().calls.clear();
  void* ptr = nullptr;
  ASSERT_EQ(device->allocate(1, &ptr), Status::ok);
  EXPECT_EQ(fake().count("cudaSetDevice"), 0u);
  ASSERT_EQ(device->deallocate(ptr), Status::ok);
}

TEST_F(FakeCudaTest, OutOfMemoryNamesTheCallAndTheErrorAndClearsIt) {
  const auto device = open();
  void* ptr = nullptr;
  EXPECT_EQ(device->allocate(128 * MiB, &ptr), Status::out_of_memory);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_EQ(device->last_error(),
            "cuda:0 allocate(128.00 MiB): cudaMalloc failed: cudaErrorMemoryAllocation "
            "(out of memory)");
  EXPECT_EQ(fake().last_error, cudaSuccess);
  EXPECT_EQ(device->live_segments(), 0u);
}

TEST_F(FakeCudaTest, LastErrorIsPerDevice) {
  const auto first = open(0);
  const auto second = open(1);
  void* ptr = nullptr;
  EXPECT_EQ(first->allocate(0, &ptr), Status::invalid_argument);
  EXPECT_EQ(first->last_error(), "cuda:0 allocate: allocate(0 bytes): the size must be positive");
  EXPECT_EQ(second->last_error(), "");
}

TEST_F(FakeCudaTest, DeallocateOfAForeignPointerNeverReachesCuda) {
  const auto device = open();
  fake().calls.clear();
  int local = 0;
  EXPECT_EQ(device->deallocate(&local), Status::invalid_argument);
  EXPECT_EQ(fake().count("cudaFree"), 0u);
  EXPECT_NE(device->last_error().find("not a live segment from allocate"), std::string::npos);
}

TEST_F(FakeCudaTest, AFailedFreeKeepsTheSegmentSoThatARetryReturnsIt) {
  const auto device = open();
  void* ptr = nullptr;
  ASSERT_EQ(device->allocate(MiB, &ptr), Status::ok);
  fake().fail_next("cudaFree", cudaErrorIllegalAddress);
  EXPECT_EQ(device->deallocate(ptr), Status::device_error);
  EXPECT_NE(device->last_error().find("cudaFree failed: cudaErrorIllegalAddress"),
            std::string::npos)
      << device->last_error();
  EXPECT_EQ(device->live_segments(), 1u);
  EXPECT_EQ(device->deallocate(ptr), Status::ok);
  EXPECT_EQ(device->live_segments(), 0u);
  EXPECT_EQ(fake().used, 0u);
}

TEST_F(FakeCudaTest, ADeviceThatCannotBeMadeCurrentFailsTheCall) {
  const auto device = open(1);
  fake().fail_next("cudaSetDevice", cudaErrorInvalidDevice);
  void* ptr = nullptr;
  EXPECT_EQ(device->allocate(MiB, &ptr), Status::invalid_argument);
  EXPECT_EQ(device->last_error(),
            "cuda:1 allocate (making device 1 current): cudaSetDevice failed: "
            "cudaErrorInvalidDevice (fake error description)");
  EXPECT_EQ(fake().count("cudaMalloc"), 0u);
}

TEST_F(FakeCudaTest, AFailedRestoreOfTheCallersDeviceLeavesNoErrorBehind) {
  const auto device = open(1);
  fake().fail_next("cudaSetDevice", cudaSuccess);       // making device 1 current works
  fake().fail_next("cudaSetDevice", cudaErrorUnknown);  // going back to device 0 does not
  void* ptr = nullptr;
  ASSERT_EQ(device->allocate(MiB, &ptr), Status::ok);
  EXPECT_EQ(fake().count("cudaSetDevice"), 2u);
  EXPECT_EQ(fake().last_error, cudaSuccess);
  ASSERT_EQ(device->deallocate(ptr), Status::ok);
}

// --- events ---------------------------------------------------------------------------------------------

TEST_F(FakeCudaTest, EventsAreCreatedWithoutTimingOnTheirDevice) {
  const auto device = open(1);
  Event event;
  ASSERT_EQ(device->create_event(&event), Status::ok);
  EXPECT_TRUE(fake().called_with("cudaEventCreateWithFlags", "dev=1 flags=2"));
  EXPECT_EQ(cudaEventDisableTiming, 2);
  EXPECT_EQ(device->live_events(), 1u);
  EXPECT_EQ(device->destroy_event(event), Status::ok);
}

TEST_F(FakeCudaTest, DestroyedEventsArePooledAndReused) {
  const auto device = open();
  Event first;
  ASSERT_EQ(device->create_event(&first), Status::ok);
  ASSERT_EQ(device->destroy_event(first), Status::ok);
  EXPECT_EQ(device->pooled_events(), 1u);
  EXPECT_EQ(device->live_events(), 0u);
  EXPECT_EQ(fake().count("cudaEventDestroy"), 0u);
  Event second;
  ASSERT_EQ(device->create_event(&second), Status::ok);
  EXPECT_EQ(second, first);
  EXPECT_EQ(fake().events_created, 1u);
  EXPECT_EQ(device->pooled_events(), 0u);
  EXPECT_EQ(device->destroy_event(second), Status::ok);
}

TEST_F(FakeCudaTest, AnEventWithPendingWorkIsDestroyedNotPooled) {
  const auto device = open();
  const Stream busy(std::uintptr_t{0x7000});
  fake().busy_streams.insert(busy.native<CUstream_st>());
  Event event;
  ASSERT_EQ(device->create_event(&event), Status::ok);
  ASSERT_EQ(device->record_event(event, busy), Status::ok);
  EXPECT_EQ(device->query_event(event), Status::not_ready);
  ASSERT_EQ(device->destroy_event(event), Status::ok);
  EXPECT_EQ(device->pooled_events(), 0u);
  EXPECT_EQ(fake().count("cudaEventDestroy"), 1u);
  EXPECT_TRUE(fake().events.empty());
}

TEST_F(FakeCudaTest, ThePoolKeepsAtMostItsLimit) {
  CudaDeviceOptions options;
  options.event_pool_limit = 1;
  CudaDevice device(fake_cuda::fake_runtime_api(), options);
  Event a;
  Event b;
  ASSERT_EQ(device.create_event(&a), Status::ok);
  ASSERT_EQ(device.create_event(&b), Status::ok);
  ASSERT_EQ(device.destroy_event(a), Status::ok);
  ASSERT_EQ(device.destroy_event(b), Status::ok);
  EXPECT_EQ(device.pooled_events(), 1u);
  EXPECT_EQ(fake().count("cudaEventDestroy"), 1u);
  EXPECT_EQ(fake().events.size(), 1u);
}

TEST_F(FakeCudaTest, DestroyingTheDeviceDestroysThePooledEvents) {
  {
    const auto device = open();
    Event event;
    ASSERT_EQ(device->create_event(&event), Status::ok);
    ASSERT_EQ(device->destroy_event(event), Status::ok);
    EXPECT_EQ(fake().events.size(), 1u);
  }
  EXPECT_TRUE(fake().events.empty());
}

TEST_F(FakeCudaTest, DoubleDestroyIsInvalidAndNeverPoolsAnEventTwice) {
  const auto device = open();
  Event event;
  ASSERT_EQ(device->create_event(&event), Status::ok);
  ASSERT_EQ(device->destroy_event(event), Status::ok);
  EXPECT_EQ(device->destroy_event(event), Status::invalid_argument);
  EXPECT_EQ(device->pooled_events(), 1u);
}

TEST_F(FakeCudaTest, StreamsPassThroughUnchanged) {
  const auto device = open(1);
  Event event;
  ASSERT_EQ(device->create_event(&event), Status::ok);
  ASSERT_EQ(device->record_event(event, cuda_per_thread_stream), Status::ok);
  EXPECT_TRUE(fake().called_with("cudaEventRecord", "dev=1 stream=0x2"));
  ASSERT_EQ(device->stream_wait_event(cuda_legacy_stream, event), Status::ok);
  EXPECT_TRUE(fake().called_with("cudaStreamWaitEvent", "dev=1 stream=0x1 flags=0"));
  ASSERT_EQ(device->synchronize_stream(Stream(std::uintptr_t{0x4242})), Status::ok);
  EXPECT_TRUE(fake().called_with("cudaStreamSynchronize", "dev=1 stream=0x4242"));
  ASSERT_EQ(device->synchronize_device(), Status::ok);
  EXPECT_TRUE(fake().called_with("cudaDeviceSynchronize", "dev=1"));
  EXPECT_EQ(fake_cuda::current_device(), 0);
  EXPECT_EQ(device->destroy_event(event), Status::ok);
}

TEST_F(FakeCudaTest, AWaitedEventCompletesWhenTheStreamIsSynchronized) {
  const auto device = open();
  const Stream producer(std::uintptr_t{0x7000});
  const Stream consumer(std::uintptr_t{0x7100});
  fake().busy_streams.insert(producer.native<CUstream_st>());
  Event event;
  ASSERT_EQ(device->create_event(&event), Status::ok);
  ASSERT_EQ(device->record_event(event, producer), Status::ok);
  ASSERT_EQ(device->stream_wait_event(consumer, event), Status::ok);
  EXPECT_EQ(device->query_event(event), Status::not_ready);
  ASSERT_EQ(device->synchronize_event(event), Status::ok);
  EXPECT_EQ(device->query_event(event), Status::ok);
  EXPECT_EQ(device->destroy_event(event), Status::ok);
}

TEST_F(FakeCudaTest, ARuntimeErrorOfAnEventCallIsReportedWithTheEvent) {
  const auto device = open();
  Event event;
  ASSERT_EQ(device->create_event(&event), Status::ok);
  fake().fail_next("cudaEventQuery", cudaErrorIllegalAddress);
  EXPECT_EQ(device->query_event(event), Status::device_error);
  EXPECT_NE(device->last_error().find("cuda:0 query_event(event 0x"), std::string::npos)
      << device->last_error();
  EXPECT_NE(device->last_error().find("cudaEventQuery failed: cudaErrorIllegalAddress"),
            std::string::npos);
  EXPECT_EQ(fake().last_error, cudaSuccess);
  EXPECT_EQ(device->destroy_event(event), Status::ok);
}

// --- the process exit: CUDA has shut down --------------------------------------------------------------

TEST_F(FakeCudaTest, AfterTheRuntimeShutDownReturningSucceedsQuietlyAndTakingFails) {
  auto device = open(1);
  void* ptr = nullptr;
  ASSERT_EQ(device->allocate(MiB, &ptr), Status::ok);
  Event pooled;
  Event live;
  ASSERT_EQ(device->create_event(&pooled), Status::ok);
  ASSERT_EQ(device->create_event(&live), Status::ok);
  ASSERT_EQ(device->destroy_event(pooled), Status::ok);
  fake().unloading = true;
  fake().calls.clear();

  EXPECT_EQ(device->deallocate(ptr), Status::ok);  // the guard meets the shutdown
  EXPECT_TRUE(device->runtime_shut_down());
  EXPECT_EQ(device->live_segments(), 0u);
  EXPECT_EQ(device->record_event(live, default_stream), Status::ok);
  EXPECT_EQ(device->query_event(live), Status::ok);
  EXPECT_EQ(device->synchronize_event(live), Status::ok);
  EXPECT_EQ(device->stream_wait_event(default_stream, live), Status::ok);
  EXPECT_EQ(device->synchronize_stream(default_stream), Status::ok);
  EXPECT_EQ(device->synchronize_device(), Status::ok);
  EXPECT_EQ(device->destroy_event(live), Status::ok);
  Event stand_in;
  EXPECT_EQ(device->create_event(&stand_in), Status::ok);  // the pooled one
  Event another;
  EXPECT_EQ(device->create_event(&another), Status::ok);  // a stand-in
  EXPECT_EQ(device->destroy_event(another), Status::ok);
  EXPECT_EQ(device->destroy_event(stand_in), Status::ok);
  EXPECT_EQ(device->allocate(MiB, &ptr), Status::device_error);
  EXPECT_EQ(device->last_error(),
            "cuda:1 allocate: cudaGetDevice: CUDA is shutting down (the process is exiting)");
  device.reset();  // no event is destroyed through CUDA any more
  for (const std::string& call : fake().calls) {
    EXPECT_TRUE(call.rfind("cudaGetDevice ", 0) == 0 || call == "cudaGetLastError") << call;
  }
}

TEST_F(FakeCudaTest, ACachingAllocatorOutlivingTheRuntimeIsDestroyedQuietly) {
  auto device = open();
  auto allocator = std::make_unique<CachingAllocator>(*device);
  void* ptr = allocator->allocate(MiB, default_stream);
  allocator->deallocate(ptr, default_stream);  // cached, not returned
  EXPECT_EQ(device->live_segments(), 1u);
  fake().unloading = true;
  allocator.reset();
  EXPECT_EQ(device->live_segments(), 0u);
  EXPECT_EQ(fake().count("cudaFree"), 0u);
  device.reset();
}

// --- CudaVmmDevice ---------------------------------------------------------------------------------------

TEST_F(FakeCudaTest, VmmFindsItsDriverFunctionsByVersion) {
  const auto device = open_vmm(1);
  EXPECT_EQ(fake().symbols_asked.size(), 12u);
  for (const std::string& asked : fake().symbols_asked) {
    EXPECT_NE(asked.find("@12000"), std::string::npos) << asked;
  }
  EXPECT_EQ(device->name(), "cuda:1 Fake GPU 1 (vmm)");
  EXPECT_EQ(device->granularity(), 2 * MiB);
  EXPECT_TRUE(device->supports_virtual_memory());
  EXPECT_EQ(fake().last_properties.type, CU_MEM_ALLOCATION_TYPE_PINNED);
  EXPECT_EQ(fake().last_properties.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(fake().last_properties.location.id, 1);
}

TEST_F(FakeCudaTest, VmmOpenNamesAMissingOrTooNewDriverFunction) {
  fake().missing_symbols.insert("cuMemMap");
  EXPECT_THROW(open_vmm(), DeviceError);
  EXPECT_NE(open_error<CudaVmmDevice>().find("cannot find the CUDA driver function cuMemMap "
                                             "(ABI of CUDA 12.0): the driver does not have it"),
            std::string::npos);
  fake_cuda::reset();
  fake().too_new_symbols.insert("cuMemSetAccess");
  EXPECT_NE(open_error<CudaVmmDevice>().find("cuMemSetAccess (ABI of CUDA 12.0): the driver is "
                                             "too old"),
            std::string::npos);
  fake_cuda::reset();
  fake().fail_next("cudaGetDriverEntryPointByVersion", cudaErrorInsufficientDriver);
  EXPECT_NE(open_error<CudaVmmDevice>().find("cudaGetDriverEntryPointByVersion(cuGetErrorName, "
                                             "12000) failed: cudaErrorInsufficientDriver"),
            std::string::npos);
  EXPECT_EQ(fake().last_error, cudaSuccess);
}

TEST_F(FakeCudaTest, VmmOpenRefusesADeviceWithoutVirtualMemory) {
  fake().vmm_supported = 0;
  EXPECT_NE(open_error<CudaVmmDevice>(1).find("CUDA device 1 (Fake GPU 1) does not support "
                                              "virtual memory management; use CudaDevice"),
            std::string::npos);
}

TEST_F(FakeCudaTest, VmmDriverCallsGetAContextOnAFreshThread) {
  const auto device = open_vmm(1);
  Status reserved = Status::device_error;
  Status created = Status::device_error;
  Status mapped = Status::device_error;
  Status unmapped = Status::device_error;
  int device_after = -1;
  void* va = nullptr;
  PhysicalHandle handle;
  // A thread that never called CUDA has no current context, which the driver calls need.
  std::thread([&] {
    reserved = device->reserve(4 * MiB, 0, &va);
    created = device->create_physical(2 * MiB, &handle);
    mapped = device->map(va, handle);
    unmapped = device->unmap(va, 2 * MiB);
    device_after = fake_cuda::current_device();
  }).join();
  EXPECT_EQ(reserved, Status::ok) << device->last_error();
  EXPECT_EQ(created, Status::ok);
  EXPECT_EQ(mapped, Status::ok);
  EXPECT_EQ(unmapped, Status::ok);
  EXPECT_EQ(device_after, 0) << "the thread's device is restored";
  EXPECT_TRUE(fake().called_with("cuMemAddressReserve", "dev=1 4194304 alignment=2097152"));
  EXPECT_TRUE(fake().called_with("cuMemCreate", "dev=1 2097152"));
  EXPECT_EQ(device->release_physical(handle), Status::ok);
  EXPECT_EQ(device->release_reservation(va, 4 * MiB), Status::ok);
}

// --- the fake driver's own rules: what cuMemMap, cuMemSetAccess and cuMemUnmap answer on an H200 -----
//
// The backends' tests rely on the fake refusing exactly what the driver refuses, with the same
// CUresult (../shared/reference/vmm-and-planning.md, section 4). These call the fake directly.

/// The fake's driver functions (the calling thread needs a current context: `enter()`).
struct FakeDriver {
  static void enter() { fake_cuda::has_context() = true; }
  static CUdeviceptr reserve(std::size_t bytes) {
    CUdeviceptr va = 0;
    EXPECT_EQ(fake_cuda::impl::cu_mem_address_reserve(&va, bytes, 0, 0, 0), CUDA_SUCCESS);
    return va;
  }
  static CUmemGenericAllocationHandle create(std::size_t bytes) {
    CUmemGenericAllocationHandle handle = 0;
    const CUmemAllocationProp properties{};
    EXPECT_EQ(fake_cuda::impl::cu_mem_create(&handle, bytes, &properties, 0), CUDA_SUCCESS);
    return handle;
  }
  static CUresult map(CUdeviceptr va, std::size_t bytes, std::size_t offset,
                      CUmemGenericAllocationHandle handle) {
    return fake_cuda::impl::cu_mem_map(va, bytes, offset, handle, 0);
  }
  static CUresult unmap(CUdeviceptr va, std::size_t bytes) {
    return fake_cuda::impl::cu_mem_unmap(va, bytes);
  }
  static CUresult set_access(CUdeviceptr va, std::size_t bytes) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return fake_cuda::impl::cu_mem_set_access(va, bytes, &access, 1);
  }
};

TEST_F(FakeCudaTest, DriverRuleFakeCuMemMapTakesAWholeHandleAtOffsetZeroOnly) {
  FakeDriver::enter();
  const CUdeviceptr va = FakeDriver::reserve(16 * MiB);
  const CUmemGenericAllocationHandle handle = FakeDriver::create(16 * MiB);
  EXPECT_EQ(FakeDriver::map(va, 2 * MiB, 2 * MiB, handle), CUDA_ERROR_NOT_SUPPORTED)
      << "one granule at a non-zero offset into a 16 MiB handle";
  EXPECT_EQ(FakeDriver::map(va, 8 * MiB, 0, handle), CUDA_ERROR_NOT_SUPPORTED)
      << "8 of 16 MiB at offset 0";
  EXPECT_EQ(FakeDriver::map(va, 8 * MiB, 8 * MiB, handle), CUDA_ERROR_NOT_SUPPORTED)
      << "the second half";
  EXPECT_TRUE(fake().mappings.empty()) << "a refused map mapped";
  EXPECT_EQ(FakeDriver::map(va, 32 * MiB, 0, handle), CUDA_ERROR_INVALID_VALUE) << "past its end";
  EXPECT_EQ(FakeDriver::map(va, 16 * MiB, 0, handle), CUDA_SUCCESS);
  EXPECT_EQ(fake().physical.at(handle).mappings, 1u);
  EXPECT_EQ(FakeDriver::unmap(va, 16 * MiB), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, DriverRuleFakeCuMemUnmapOfPartOfAMappingIsInvalidAndChangesNothing) {
  FakeDriver::enter();
  const CUdeviceptr va = FakeDriver::reserve(16 * MiB);
  const CUmemGenericAllocationHandle handle = FakeDriver::create(16 * MiB);
  ASSERT_EQ(FakeDriver::map(va, 16 * MiB, 0, handle), CUDA_SUCCESS);
  EXPECT_EQ(FakeDriver::unmap(va, 8 * MiB), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(FakeDriver::unmap(va + 2 * MiB, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(FakeDriver::unmap(va + 8 * MiB, 8 * MiB), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(FakeDriver::unmap(va, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fake().mappings.size(), 1u);
  EXPECT_EQ(FakeDriver::unmap(va, 16 * MiB), CUDA_SUCCESS);
  EXPECT_TRUE(fake().mappings.empty());
}

TEST_F(FakeCudaTest, DriverRuleFakeCuMemMapTakesOneHandleAtASecondAddress) {
  FakeDriver::enter();
  const CUdeviceptr first = FakeDriver::reserve(4 * MiB);
  const CUdeviceptr second = FakeDriver::reserve(4 * MiB);
  const CUmemGenericAllocationHandle handle = FakeDriver::create(4 * MiB);
  ASSERT_EQ(FakeDriver::map(first, 4 * MiB, 0, handle), CUDA_SUCCESS);
  EXPECT_EQ(FakeDriver::map(second, 4 * MiB, 0, handle), CUDA_SUCCESS);
  EXPECT_EQ(fake().physical.at(handle).mappings, 2u);
  EXPECT_EQ(fake().used, 4 * MiB) << "the memory is taken once";
  EXPECT_EQ(fake_cuda::impl::cu_mem_release(handle), CUDA_SUCCESS);
  EXPECT_EQ(FakeDriver::unmap(first, 4 * MiB), CUDA_SUCCESS);
  EXPECT_EQ(fake().used, 4 * MiB) << "released, still mapped once";
  EXPECT_EQ(FakeDriver::unmap(second, 4 * MiB), CUDA_SUCCESS);
  EXPECT_EQ(fake().used, 0u) << "the last mapping is gone";
}

TEST_F(FakeCudaTest, DriverRuleFakeCuMemSetAccessAndUnmapTakeSeveralWholeMappingsButNoHole) {
  FakeDriver::enter();
  // [0, 2) and [2, 6) side by side, a hole at [6, 8), then [8, 10) (MiB from the reservation).
  const CUdeviceptr va = FakeDriver::reserve(10 * MiB);
  ASSERT_EQ(FakeDriver::map(va, 2 * MiB, 0, FakeDriver::create(2 * MiB)), CUDA_SUCCESS);
  ASSERT_EQ(FakeDriver::map(va + 2 * MiB, 4 * MiB, 0, FakeDriver::create(4 * MiB)), CUDA_SUCCESS);
  ASSERT_EQ(FakeDriver::map(va + 8 * MiB, 2 * MiB, 0, FakeDriver::create(2 * MiB)), CUDA_SUCCESS);
  EXPECT_EQ(FakeDriver::set_access(va, 6 * MiB), CUDA_SUCCESS) << "two whole mappings";
  EXPECT_EQ(FakeDriver::set_access(va, 4 * MiB), CUDA_ERROR_INVALID_VALUE) << "part of the second";
  EXPECT_EQ(FakeDriver::set_access(va, 10 * MiB), CUDA_ERROR_INVALID_VALUE) << "over the hole";
  EXPECT_EQ(FakeDriver::set_access(va + 6 * MiB, 2 * MiB), CUDA_ERROR_INVALID_VALUE) << "the hole";
  EXPECT_EQ(FakeDriver::unmap(va, 4 * MiB), CUDA_ERROR_INVALID_VALUE) << "part of the second";
  EXPECT_EQ(FakeDriver::unmap(va, 10 * MiB), CUDA_ERROR_INVALID_VALUE) << "over the hole";
  EXPECT_EQ(fake().mappings.size(), 3u) << "a refused unmap unmapped";
  EXPECT_EQ(FakeDriver::unmap(va, 6 * MiB), CUDA_SUCCESS) << "two whole mappings in one call";
  EXPECT_EQ(fake().mappings.size(), 1u);
  EXPECT_EQ(FakeDriver::unmap(va + 8 * MiB, 2 * MiB), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, DriverRuleFakeCuMemMapOnlyIntoUnmappedReservedSpace) {
  FakeDriver::enter();
  const CUdeviceptr va = FakeDriver::reserve(6 * MiB);
  const CUmemGenericAllocationHandle mapped = FakeDriver::create(4 * MiB);
  const CUmemGenericAllocationHandle other = FakeDriver::create(2 * MiB);
  ASSERT_EQ(FakeDriver::map(va + 2 * MiB, 4 * MiB, 0, mapped), CUDA_SUCCESS);
  EXPECT_EQ(FakeDriver::map(va + 2 * MiB, 2 * MiB, 0, other), CUDA_ERROR_INVALID_VALUE)
      << "its first granule";
  EXPECT_EQ(FakeDriver::map(va + 4 * MiB, 2 * MiB, 0, other), CUDA_ERROR_INVALID_VALUE)
      << "its last granule";
  EXPECT_EQ(FakeDriver::map(va + 6 * MiB, 2 * MiB, 0, other), CUDA_ERROR_INVALID_VALUE)
      << "past the reservation";
  EXPECT_EQ(FakeDriver::map(va + MiB, 2 * MiB, 0, other), CUDA_ERROR_INVALID_VALUE) << "misaligned";
  EXPECT_EQ(FakeDriver::map(va, 2 * MiB, 0, other), CUDA_SUCCESS);
  EXPECT_EQ(FakeDriver::unmap(va, 6 * MiB), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, VmmMapGrantsReadWriteAccessToItsDevice) {
  const auto device = open_vmm(1);
  void* va = nullptr;
  PhysicalHandle handle;
  ASSERT_EQ(device->reserve(4 * MiB, 0, &va), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &handle), Status::ok);
  fake().calls.clear();
  ASSERT_EQ(device->map(va, handle), Status::ok) << device->last_error();
  // One cuMemMap of the whole handle at offset 0, one cuMemSetAccess over it.
  EXPECT_EQ(fake().count("cuMemMap"), 1u);
  EXPECT_TRUE(fake().called_with(
      "cuMemMap",
      fmt::format("dev=1 {:#x} {} offset=0", reinterpret_cast<std::uintptr_t>(va), 2 * MiB)));
  EXPECT_EQ(fake().count("cuMemSetAccess"), 1u);
  const fake_cuda::FakeMapping& mapping = fake().mappings.at(reinterpret_cast<std::uintptr_t>(va));
  EXPECT_TRUE(mapping.accessible);
  EXPECT_EQ(mapping.access.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(mapping.access.location.id, 1);
  EXPECT_EQ(mapping.access.flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(device->live_mappings(), 1u);
  EXPECT_EQ(device->unmap(va, 2 * MiB), Status::ok);
  EXPECT_EQ(device->release_physical(handle), Status::ok);
  EXPECT_EQ(device->release_reservation(va, 4 * MiB), Status::ok);
  EXPECT_EQ(fake().used, 0u);
}

TEST_F(FakeCudaTest, VmmMapRunIsOneMapPerHandleAndOneSetAccessOverTheRun) {
  const auto device = open_vmm();
  void* va = nullptr;
  PhysicalHandle handles[3];
  ASSERT_EQ(device->reserve(8 * MiB, 0, &va), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &handles[0]), Status::ok);
  ASSERT_EQ(device->create_physical(4 * MiB, &handles[1]), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &handles[2]), Status::ok);
  const auto base = reinterpret_cast<std::uintptr_t>(va);
  fake().calls.clear();
  ASSERT_EQ(device->map_run(va, handles, 3), Status::ok) << device->last_error();
  EXPECT_EQ(fake().count("cuMemMap"), 3u);
  EXPECT_TRUE(
      fake().called_with("cuMemMap", fmt::format("dev=0 {:#x} {} offset=0", base, 2 * MiB)));
  EXPECT_TRUE(fake().called_with("cuMemMap",
                                 fmt::format("dev=0 {:#x} {} offset=0", base + 2 * MiB, 4 * MiB)));
  EXPECT_TRUE(fake().called_with("cuMemMap",
                                 fmt::format("dev=0 {:#x} {} offset=0", base + 6 * MiB, 2 * MiB)));
  EXPECT_EQ(fake().count("cuMemSetAccess"), 1u);
  EXPECT_TRUE(fake().called_with("cuMemSetAccess", fmt::format("dev=0 {:#x} {}", base, 8 * MiB)));
  EXPECT_EQ(device->live_mappings(), 3u);
  for (const auto& [start, mapping] : fake().mappings) EXPECT_TRUE(mapping.accessible) << start;
  // Each handle is a mapping of its own; the run unmaps in one call.
  EXPECT_EQ(device->unmap(va, 4 * MiB), Status::invalid_argument) << "part of the second";
  fake().calls.clear();
  EXPECT_EQ(device->unmap(va, 8 * MiB), Status::ok) << device->last_error();
  EXPECT_EQ(fake().count("cuMemUnmap"), 1u);
  for (const PhysicalHandle handle : handles)
    EXPECT_EQ(device->release_physical(handle), Status::ok);
  EXPECT_EQ(device->release_reservation(va, 8 * MiB), Status::ok);
  EXPECT_EQ(fake().used, 0u);
}

TEST_F(FakeCudaTest, VmmMapRunThatTheDriverRefusesPartWayLeavesNothingMapped) {
  const auto device = open_vmm();
  void* va = nullptr;
  PhysicalHandle handles[3];
  ASSERT_EQ(device->reserve(6 * MiB, 0, &va), Status::ok);
  for (PhysicalHandle& handle : handles) {
    ASSERT_EQ(device->create_physical(2 * MiB, &handle), Status::ok);
  }
  // The driver's answer to a map it cannot make (as to a part of a handle) at the third handle.
  fake().fail_next("cuMemMap", CUDA_SUCCESS, 2);
  fake().fail_next("cuMemMap", CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(device->map_run(va, handles, 3), Status::not_supported);
  EXPECT_NE(device->last_error().find("cuMemMap failed: CUDA_ERROR_NOT_SUPPORTED"),
            std::string::npos)
      << device->last_error();
  EXPECT_TRUE(fake().mappings.empty()) << "the first two were not unmapped";
  EXPECT_EQ(device->live_mappings(), 0u);
  EXPECT_EQ(fake().count("cuMemSetAccess"), 0u);
  // The same run maps afterwards.
  ASSERT_EQ(device->map_run(va, handles, 3), Status::ok) << device->last_error();
  EXPECT_EQ(device->unmap(va, 6 * MiB), Status::ok);
  for (const PhysicalHandle handle : handles)
    EXPECT_EQ(device->release_physical(handle), Status::ok);
  EXPECT_EQ(device->release_reservation(va, 6 * MiB), Status::ok);
}

TEST_F(FakeCudaTest, VmmAFailedSetAccessLeavesNothingMapped) {
  const auto device = open_vmm();
  void* va = nullptr;
  PhysicalHandle handle;
  ASSERT_EQ(device->reserve(2 * MiB, 0, &va), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &handle), Status::ok);
  fake().fail_next("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(device->map(va, handle), Status::invalid_argument);
  EXPECT_EQ(device->last_error(),
            fmt::format("cuda:0 map({:#x}, handle {:#x} of 2.00 MiB): cuMemSetAccess "
                        "failed: CUDA_ERROR_INVALID_VALUE (fake driver error description)",
                        reinterpret_cast<std::uintptr_t>(va), handle.handle));
  EXPECT_TRUE(fake().mappings.empty());
  EXPECT_EQ(device->live_mappings(), 0u);
  // The range can be mapped again.
  EXPECT_EQ(device->map(va, handle), Status::ok);
  EXPECT_EQ(device->unmap(va, 2 * MiB), Status::ok);
}

TEST_F(FakeCudaTest, VmmOutOfMemoryNamesTheDriverError) {
  const auto device = open_vmm();
  PhysicalHandle handle;
  EXPECT_EQ(device->create_physical(128 * MiB, &handle), Status::out_of_memory);
  EXPECT_EQ(device->last_error(),
            "cuda:0 create_physical(128.00 MiB): cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY "
            "(out of memory)");
  EXPECT_EQ(device->live_physical(), 0u);
}

TEST_F(FakeCudaTest, VmmUnknownDriverErrorsAreStillNamed) {
  const auto device = open_vmm();
  void* va = nullptr;
  fake().fail_next("cuMemAddressReserve", 12345);  // no CUresult has this value
  EXPECT_EQ(device->reserve(2 * MiB, 0, &va), Status::device_error);
  EXPECT_EQ(device->last_error(),
            "cuda:0 reserve(2.00 MiB, alignment 2097152): cuMemAddressReserve failed: "
            "CUresult 12345 (unknown error)");
}

TEST_F(FakeCudaTest, VmmUnmapsSeveralMappingsInOneCall) {
  const auto device = open_vmm();
  void* va = nullptr;
  PhysicalHandle a;
  PhysicalHandle b;
  ASSERT_EQ(device->reserve(8 * MiB, 0, &va), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &a), Status::ok);
  ASSERT_EQ(device->create_physical(4 * MiB, &b), Status::ok);
  ASSERT_EQ(device->map(va, a), Status::ok);
  ASSERT_EQ(device->map(static_cast<char*>(va) + 2 * MiB, b), Status::ok);
  fake().calls.clear();
  ASSERT_EQ(device->unmap(va, 6 * MiB), Status::ok) << device->last_error();
  EXPECT_EQ(fake().count("cuMemUnmap"), 1u);
  EXPECT_TRUE(fake().called_with(
      "cuMemUnmap", fmt::format("{:#x} {}", reinterpret_cast<std::uintptr_t>(va), 6 * MiB)));
  EXPECT_TRUE(fake().mappings.empty());
  EXPECT_EQ(device->live_mappings(), 0u);
  EXPECT_EQ(device->release_physical(a), Status::ok);
  EXPECT_EQ(device->release_physical(b), Status::ok);
  EXPECT_EQ(device->release_reservation(va, 8 * MiB), Status::ok);
}

TEST_F(FakeCudaTest, VmmUnmapFallsBackToOneCallPerMappingWhenTheDriverRefusesTheRange) {
  const auto device = open_vmm();
  void* va = nullptr;
  PhysicalHandle a[3];
  ASSERT_EQ(device->reserve(8 * MiB, 0, &va), Status::ok);
  char* base = static_cast<char*>(va);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(device->create_physical(2 * MiB, &a[i]), Status::ok);
    ASSERT_EQ(device->map(base + i * 2 * MiB, a[i]), Status::ok);
  }
  fake().calls.clear();
  fake().fail_next("cuMemUnmap", CUDA_ERROR_INVALID_VALUE);  // the range as a whole
  ASSERT_EQ(device->unmap(va, 6 * MiB), Status::ok) << device->last_error();
  EXPECT_EQ(fake().count("cuMemUnmap"), 1u + 3u);
  EXPECT_TRUE(fake().mappings.empty());
  EXPECT_EQ(device->live_mappings(), 0u);
  for (const PhysicalHandle handle : a) EXPECT_EQ(device->release_physical(handle), Status::ok);
  EXPECT_EQ(device->release_reservation(va, 8 * MiB), Status::ok);
  EXPECT_EQ(fake().used, 0u);
}

TEST_F(FakeCudaTest, VmmAFailedUnmapOfSeveralMappingsInOneCallChangesNothing) {
  const auto device = open_vmm();
  void* va = nullptr;
  PhysicalHandle a;
  PhysicalHandle b;
  ASSERT_EQ(device->reserve(4 * MiB, 0, &va), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &a), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &b), Status::ok);
  char* base = static_cast<char*>(va);
  ASSERT_EQ(device->map(base, a), Status::ok);
  ASSERT_EQ(device->map(base + 2 * MiB, b), Status::ok);
  fake().fail_next("cuMemUnmap", CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(device->unmap(va, 4 * MiB), Status::device_error);
  EXPECT_NE(device->last_error().find("of 2 mappings in one call: cuMemUnmap failed: "
                                      "CUDA_ERROR_UNKNOWN"),
            std::string::npos)
      << device->last_error();
  EXPECT_EQ(device->live_mappings(), 2u);
  EXPECT_EQ(fake().mappings.size(), 2u);
  EXPECT_EQ(device->unmap(va, 4 * MiB), Status::ok) << device->last_error();
  EXPECT_EQ(device->release_physical(a), Status::ok);
  EXPECT_EQ(device->release_physical(b), Status::ok);
  EXPECT_EQ(device->release_reservation(va, 4 * MiB), Status::ok);
  EXPECT_EQ(fake().used, 0u);
}

TEST_F(FakeCudaTest, VmmAnUnmapThatFailsPartWayLeavesTheRangeMappedForARetry) {
  const auto device = open_vmm();
  void* va = nullptr;
  PhysicalHandle a;
  PhysicalHandle b;
  ASSERT_EQ(device->reserve(8 * MiB, 0, &va), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &a), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &b), Status::ok);
  char* base = static_cast<char*>(va);
  // The same handle twice, then another.
  ASSERT_EQ(device->map(base, a), Status::ok);
  ASSERT_EQ(device->map(base + 2 * MiB, a), Status::ok);
  ASSERT_EQ(device->map(base + 4 * MiB, b), Status::ok);
  // A driver that takes one mapping per call: the range as a whole is refused, then the first
  // mapping's cuMemUnmap succeeds and the second fails.
  fake().fail_next("cuMemUnmap", CUDA_ERROR_INVALID_VALUE);
  fake().fail_next("cuMemUnmap", CUDA_SUCCESS);
  fake().fail_next("cuMemUnmap", CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(device->unmap(base, 6 * MiB), Status::device_error);
  EXPECT_NE(
      device->last_error().find(fmt::format("at the mapping [{:#x}, {:#x}): cuMemUnmap "
                                            "failed: CUDA_ERROR_UNKNOWN",
                                            reinterpret_cast<std::uintptr_t>(base + 2 * MiB),
                                            reinterpret_cast<std::uintptr_t>(base + 4 * MiB))),
      std::string::npos)
      << device->last_error();
  EXPECT_EQ(fake().mappings.size(), 2u) << "the driver unmapped the first mapping";
  // To the caller nothing changed: the range is still mapped, and the same call is retried.
  EXPECT_EQ(device->live_mappings(), 3u);
  EXPECT_EQ(device->map(base, b), Status::invalid_argument);
  EXPECT_EQ(device->release_reservation(va, 8 * MiB), Status::invalid_argument);
  fake().calls.clear();
  EXPECT_EQ(device->unmap(base, 6 * MiB), Status::ok) << device->last_error();
  EXPECT_EQ(fake().count("cuMemUnmap"), 2u) << "the first mapping is not unmapped twice";
  EXPECT_TRUE(fake().mappings.empty());
  EXPECT_EQ(device->live_mappings(), 0u);
  EXPECT_EQ(device->release_physical(a), Status::ok);
  EXPECT_EQ(device->release_physical(b), Status::ok);
  EXPECT_EQ(device->release_reservation(va, 8 * MiB), Status::ok);
  EXPECT_EQ(fake().used, 0u);
}

TEST_F(FakeCudaTest, VmmRefusesBadRangesBeforeTheDriverSeesThem) {
  const auto device = open_vmm();
  void* va = nullptr;
  void* other = nullptr;
  PhysicalHandle handle;
  PhysicalHandle small;
  ASSERT_EQ(device->reserve(4 * MiB, 0, &va), Status::ok);
  ASSERT_EQ(device->reserve(4 * MiB, 0, &other), Status::ok);
  ASSERT_EQ(device->create_physical(4 * MiB, &handle), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &small), Status::ok);
  char* base = static_cast<char*>(va);
  ASSERT_EQ(device->map(base, handle), Status::ok);
  fake().calls.clear();

  EXPECT_EQ(device->map(base + 2 * MiB, small), Status::invalid_argument);
  EXPECT_NE(device->last_error().find("part of the range is already mapped"), std::string::npos);
  EXPECT_EQ(device->map(other, PhysicalHandle{handle.handle, 2 * MiB}), Status::not_supported);
  EXPECT_NE(device->last_error().find("the driver maps a handle only whole"), std::string::npos)
      << device->last_error();
  EXPECT_EQ(device->map(other, PhysicalHandle{handle.handle, 8 * MiB}), Status::invalid_argument);
  EXPECT_NE(device->last_error().find("8.00 MiB is more than the handle's 4.00 MiB"),
            std::string::npos)
      << device->last_error();
  EXPECT_EQ(device->map(other, PhysicalHandle{0x999, 2 * MiB}), Status::invalid_argument);
  EXPECT_NE(device->last_error().find("unknown or released physical handle 0x999"),
            std::string::npos);
  EXPECT_EQ(device->map(static_cast<char*>(other) + MiB, small), Status::invalid_argument);
  EXPECT_NE(device->last_error().find("must be a multiple of the granularity"), std::string::npos);
  EXPECT_EQ(device->map(static_cast<char*>(other) + 2 * MiB, handle), Status::invalid_argument);
  EXPECT_NE(device->last_error().find("not inside one reservation"), std::string::npos);
  const PhysicalHandle run[] = {small, small, small};
  EXPECT_EQ(device->map_run(other, run, 3), Status::invalid_argument);
  EXPECT_NE(device->last_error().find("not inside one reservation"), std::string::npos);
  const PhysicalHandle part_in_run[] = {small, PhysicalHandle{handle.handle, 2 * MiB}};
  EXPECT_EQ(device->map_run(other, part_in_run, 2), Status::not_supported);
  EXPECT_NE(device->last_error().find("map_run handle 1 of 2"), std::string::npos);
  EXPECT_EQ(device->map_run(other, run, 0), Status::invalid_argument);
  EXPECT_EQ(device->unmap(base, 2 * MiB), Status::invalid_argument);
  EXPECT_NE(device->last_error().find("would unmap part of the mapping"), std::string::npos);
  EXPECT_EQ(device->unmap(base + 2 * MiB, 2 * MiB), Status::invalid_argument);
  EXPECT_NE(device->last_error().find("is not the start of a mapping"), std::string::npos);
  EXPECT_EQ(device->unmap(base, 8 * MiB), Status::invalid_argument);
  EXPECT_EQ(device->release_reservation(va, 2 * MiB), Status::invalid_argument);
  EXPECT_EQ(device->release_reservation(va, 4 * MiB), Status::invalid_argument);
  EXPECT_NE(device->last_error().find("still has mappings"), std::string::npos);
  EXPECT_EQ(device->reserve(3 * MiB, 0, &va), Status::invalid_argument);
  EXPECT_EQ(device->reserve(4 * MiB, 3 * MiB, &va), Status::invalid_argument);
  EXPECT_EQ(device->create_physical(MiB, &handle), Status::invalid_argument);
  for (const std::string& call : fake().calls) {
    EXPECT_EQ(call.rfind("cuMem", 0), std::string::npos) << "reached the driver: " << call;
  }
  EXPECT_EQ(device->live_mappings(), 1u);
  EXPECT_EQ(device->unmap(base, 4 * MiB), Status::ok);
}

TEST_F(FakeCudaTest, VmmAFailedReleaseKeepsTrackingForARetry) {
  const auto device = open_vmm();
  void* va = nullptr;
  PhysicalHandle handle;
  ASSERT_EQ(device->reserve(2 * MiB, 0, &va), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &handle), Status::ok);
  fake().fail_next("cuMemAddressFree", CUDA_ERROR_UNKNOWN);
  fake().fail_next("cuMemRelease", CUDA_ERROR_UNKNOWN);
  EXPECT_EQ(device->release_reservation(va, 2 * MiB), Status::device_error);
  EXPECT_EQ(device->release_physical(handle), Status::device_error);
  EXPECT_NE(device->last_error().find("cuMemRelease failed: CUDA_ERROR_UNKNOWN"),
            std::string::npos);
  EXPECT_EQ(device->live_reservations(), 1u);
  EXPECT_EQ(device->live_physical(), 1u);
  EXPECT_EQ(device->release_reservation(va, 2 * MiB), Status::ok);
  EXPECT_EQ(device->release_physical(handle), Status::ok);
  EXPECT_EQ(fake().used, 0u);
}

TEST_F(FakeCudaTest, VmmAfterTheDriverShutDownReturningSucceedsAndMappingFails) {
  const auto device = open_vmm();
  void* va = nullptr;
  PhysicalHandle handle;
  PhysicalHandle spare;
  ASSERT_EQ(device->reserve(4 * MiB, 0, &va), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &handle), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &spare), Status::ok);
  ASSERT_EQ(device->map(va, handle), Status::ok);
  fake().deinitialized = true;

  EXPECT_EQ(device->map(static_cast<char*>(va) + 2 * MiB, spare), Status::device_error);
  EXPECT_EQ(device->last_error(),
            "cuda:0 map: cuMemMap: CUDA is shutting down (the process is exiting)");
  EXPECT_EQ(device->unmap(va, 2 * MiB), Status::ok);
  EXPECT_TRUE(device->runtime_shut_down());
  EXPECT_EQ(device->release_physical(handle), Status::ok);
  EXPECT_EQ(device->release_physical(spare), Status::ok);
  EXPECT_EQ(device->release_reservation(va, 4 * MiB), Status::ok);
  EXPECT_EQ(device->live_mappings(), 0u);
  EXPECT_EQ(device->live_physical(), 0u);
  EXPECT_EQ(device->live_reservations(), 0u);
}

TEST_F(FakeCudaTest, VmmUnmapWhenTheRuntimeShutDownForgetsTheMappings) {
  const auto device = open_vmm(1);
  void* va = nullptr;
  PhysicalHandle handle;
  ASSERT_EQ(device->reserve(2 * MiB, 0, &va), Status::ok);
  ASSERT_EQ(device->create_physical(2 * MiB, &handle), Status::ok);
  ASSERT_EQ(device->map(va, handle), Status::ok);
  fake().unloading = true;  // the device guard meets the shutdown before the driver does
  EXPECT_EQ(device->unmap(va, 2 * MiB), Status::ok);
  EXPECT_EQ(device->live_mappings(), 0u);
  EXPECT_EQ(device->release_reservation(va, 2 * MiB), Status::ok);
  EXPECT_EQ(device->release_physical(handle), Status::ok);
}

// --- open_cuda_device: the backend the plug-in and --backend cuda choose ---------------------------

// The textbook case of fragmentation on the stand-in driver, which refuses what an H200's driver
// refuses (a map of part of a handle or at an offset, an unmap that cuts a mapping): a 3 GiB block
// comes and goes, 100 MiB blocks (odd sizes) fill the 4 GiB device, every other one is freed, and
// 1.5 GiB - which only the holes together hold - is served with the defaults, as PyTorch's
// expandable segments serve it.
TEST_F(FakeCudaTest, VmmTheHolesOfFreedBlocksServeALargeRequest) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  fake().capacity = 4096 * kMiB;
  auto device = open_vmm();
  CachingAllocator alloc(*device, Config());
  ASSERT_TRUE(alloc.uses_virtual_memory());
  const Stream s;
  alloc.deallocate(alloc.allocate(3072 * kMiB + 4097, s), s);
  std::vector<void*> blocks;
  for (int i = 0; i < 30; ++i) blocks.push_back(alloc.allocate(100 * kMiB + 1000, s));
  for (std::size_t i = 1; i < blocks.size(); i += 2) alloc.deallocate(blocks[i], s);
  void* big = nullptr;
  ASSERT_NO_THROW(big = alloc.allocate(1536 * kMiB + 12345, s));
  alloc.check();
  alloc.deallocate(big, s);
  for (std::size_t i = 0; i < blocks.size(); i += 2) alloc.deallocate(blocks[i], s);
  alloc.empty_cache();
  EXPECT_EQ(fake().used, 0u);
}

TEST_F(FakeCudaTest, OpenCudaDeviceTakesVirtualMemoryWhereTheDriverHasIt) {
  const CudaDeviceChoice choice = open_cuda_device(fake_cuda::fake_runtime_api(), on(1));
  ASSERT_NE(choice.device, nullptr);
  EXPECT_TRUE(choice.virtual_memory);
  EXPECT_EQ(choice.without_virtual_memory, "");
  EXPECT_NE(dynamic_cast<CudaVmmDevice*>(choice.device.get()), nullptr);
  EXPECT_TRUE(choice.device->supports_virtual_memory());
  EXPECT_EQ(choice.device->name(), "cuda:1 Fake GPU 1 (vmm)");
}

TEST_F(FakeCudaTest, OpenCudaDeviceFallsBackToCudaMallocAndSaysWhy) {
  fake().vmm_supported = 0;
  CudaDeviceChoice choice = open_cuda_device(fake_cuda::fake_runtime_api(), on(1));
  ASSERT_NE(choice.device, nullptr);
  EXPECT_FALSE(choice.virtual_memory);
  EXPECT_EQ(dynamic_cast<CudaVmmDevice*>(choice.device.get()), nullptr);
  EXPECT_FALSE(choice.device->supports_virtual_memory());
  EXPECT_EQ(choice.device->name(), "cuda:1 Fake GPU 1");
  EXPECT_NE(choice.without_virtual_memory.find("does not support virtual memory management"),
            std::string::npos)
      << choice.without_virtual_memory;
  void* ptr = nullptr;
  EXPECT_EQ(choice.device->allocate(MiB, &ptr), Status::ok) << "the fallback is usable";
  EXPECT_EQ(choice.device->deallocate(ptr), Status::ok);

  fake_cuda::reset();
  fake().missing_symbols.insert("cuMemCreate");
  choice = open_cuda_device(fake_cuda::fake_runtime_api(), on(0));
  EXPECT_FALSE(choice.virtual_memory);
  EXPECT_NE(choice.without_virtual_memory.find("cuMemCreate"), std::string::npos)
      << choice.without_virtual_memory;
  EXPECT_EQ(fake().last_error, cudaSuccess) << "the failed attempt must not linger";
}

TEST_F(FakeCudaTest, OpenCudaDeviceWithoutAGpuThrowsCudaDevicesError) {
  fake().device_count_error = cudaErrorNoDevice;
  try {
    (void)open_cuda_device(fake_cuda::fake_runtime_api(), on(0));
    FAIL() << "opened a device without a GPU";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("cistern: no CUDA device can be used"), std::string::npos)
        << e.what();
  }
  fake_cuda::reset();
  EXPECT_THROW((void)open_cuda_device(fake_cuda::fake_runtime_api(), on(5)), InvalidArgument);
}

// --- the real runtime on this machine ---------------------------------------------------------------

TEST(CudaRuntime, WithoutAGpuOpeningIsAClearDeviceError) {
  if (CudaDevice::device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  try {
    CudaDevice device;
    FAIL() << "opened a device on a machine without one";
  } catch (const DeviceError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cistern: no CUDA device can be used"), std::string::npos) << message;
    EXPECT_NE(message.find("nvidia-smi"), std::string::npos) << message;
  }
  // (Without a driver every runtime call, cudaGetLastError too, keeps returning the
  // initialisation error: there is no "last error" for cistern to clear.)
  EXPECT_THROW(CudaVmmDevice{}, DeviceError);
}

}  // namespace
}  // namespace cistern
