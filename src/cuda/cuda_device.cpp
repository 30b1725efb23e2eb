// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CudaDevice: the device contract over the CUDA runtime (include/cistern/cuda_device.hpp).
//
// Segments and events are tracked so that a pointer or event this device never handed out is
// refused with `invalid_argument` before CUDA sees it (cudaFree of an interior pointer, a double
// destroy that would put one event in the pool twice). Streams are the program's: record, wait
// and synchronise pass them through unchanged. Every method runs its body through
// `CudaDeviceState::call`, so that running out of host memory becomes a status, never an escape
// from a noexcept function.
#include "cistern/cuda_device.hpp"

#include <fmt/format.h>

#include <string>

#include "cuda/cuda_device_state.hpp"

namespace cistern {

using detail::CudaDeviceState;
using detail::hex;

namespace {

// The public stream constants must be the runtime's.
static_assert(sizeof(cudaStream_t) == sizeof(std::uintptr_t), "a Stream holds a cudaStream_t");

constexpr std::size_t kSegmentGranularity = 2 * MiB;

cudaEvent_t native_event(Event event) noexcept {
  return reinterpret_cast<cudaEvent_t>(event.handle);
}

cudaStream_t native_stream(Stream stream) noexcept { return stream.native<CUstream_st>(); }

std::string describe(Event event) { return fmt::format("event {}", hex(event.handle)); }

std::string describe(Stream stream) { return fmt::format("stream {}", hex(stream.handle)); }

Status unsupported_vmm(CudaDeviceState& state, DeviceOp op) noexcept {
  return state.fail(Status::not_supported, op,
                    "virtual memory is not supported by CudaDevice (use CudaVmmDevice)");
}

/// An event for `create_event` without creating one: a pooled event, or after the shutdown a
/// stand-in that never reaches CUDA. Null when a new event must be created. Registers it as live.
cudaEvent_t reuse_event(CudaDeviceState& state) {
  const std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.event_pool.empty()) {
    cudaEvent_t event = state.event_pool.back();
    state.events.insert(event);  // may throw: then the event stays in the pool
    state.event_pool.pop_back();
    return event;
  }
  if (!state.skip_release()) return nullptr;
  auto* stand_in = reinterpret_cast<cudaEvent_t>(state.next_stand_in);
  state.events.insert(stand_in);
  state.next_stand_in += 2;
  return stand_in;
}

/// Destroys an event for good (the pool is full, its work is pending, or the device goes away).
Status destroy_native_event(CudaDeviceState& state, cudaEvent_t event) noexcept {
  const cudaError_t error = state.api.event_destroy(event);
  if (error == cudaSuccess) return Status::ok;
  return state.runtime_failure(error, DeviceOp::destroy_event, "cudaEventDestroy",
                               [&] { return fmt::format("destroy_event({})", hex(event)); });
}

/// Keeps a destroyed event for reuse if its captured work is complete (so that a reused event
/// reads as complete until recorded again, as a new one does) and the pool has room.
bool pool_event(CudaDeviceState& state, cudaEvent_t event) {
  const cudaError_t done = state.api.event_query(event);
  if (done != cudaSuccess) {
    if (done != cudaErrorNotReady) (void)state.api.get_last_error();  // the destroy reports it
    return false;
  }
  const std::lock_guard<std::mutex> lock(state.mutex);
  if (state.event_pool.size() >= state.options.event_pool_limit) return false;
  state.event_pool.push_back(event);
  return true;
}

}  // namespace

CudaDevice::CudaDevice(CudaDeviceOptions options)
    : CudaDevice(detail::cuda_runtime_api(), options) {}

CudaDevice::CudaDevice(const detail::CudaApi& api, CudaDeviceOptions options)
    : state_(std::make_unique<CudaDeviceState>(api, options)) {}

CudaDevice::~CudaDevice() {
  CudaDeviceState& s = *state_;
  for (cudaEvent_t event : s.event_pool) {
    if (s.skip_release()) break;  // set by the first destroy that meets the shutdown
    (void)destroy_native_event(s, event);
  }
}

int CudaDevice::device_count() noexcept {
  return detail::cuda_device_count(detail::cuda_runtime_api());
}

int CudaDevice::index() const noexcept { return state_->ordinal(); }

std::string CudaDevice::name() const {
  return fmt::format("cuda:{} {}", state_->ordinal(), state_->product);
}

std::size_t CudaDevice::granularity() const noexcept { return kSegmentGranularity; }

std::string CudaDevice::last_error() const { return detail::last_error_of(*state_); }

Status CudaDevice::memory_info(MemoryInfo* info) noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::memory_info, [&] {
    if (info == nullptr) return s.invalid(DeviceOp::memory_info, "the result is null");
    const auto guard = s.guard();
    if (guard.error() != cudaSuccess) return s.guard_failure(guard, DeviceOp::memory_info);
    const cudaError_t error = s.api.mem_get_info(&info->free, &info->total);
    if (error == cudaSuccess) return Status::ok;
    return s.runtime_failure(error, DeviceOp::memory_info, "cudaMemGetInfo",
                             [] { return std::string("memory_info"); });
  });
}

// --- segments --------------------------------------------------------------------------------------

Status CudaDevice::allocate(std::size_t bytes, void** ptr) noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::allocate, [&] {
    if (ptr == nullptr) return s.invalid(DeviceOp::allocate, "the result pointer is null");
    if (bytes == 0)
      return s.invalid(DeviceOp::allocate, "allocate(0 bytes): the size must be positive");
    void* memory = nullptr;
    {
      const auto guard = s.guard();
      if (guard.error() != cudaSuccess) return s.guard_failure(guard, DeviceOp::allocate);
      const cudaError_t error = s.api.device_malloc(&memory, bytes);
      if (error != cudaSuccess) {
        return s.runtime_failure(error, DeviceOp::allocate, "cudaMalloc",
                                 [&] { return fmt::format("allocate({})", format_bytes(bytes)); });
      }
    }
    try {
      const std::lock_guard<std::mutex> lock(s.mutex);
      s.segments.emplace(reinterpret_cast<std::uintptr_t>(memory), bytes);
    } catch (...) {
      (void)s.api.device_free(memory);  // out of host memory: nothing may be left behind
      throw;
    }
    *ptr = memory;
    return Status::ok;
  });
}

Status CudaDevice::deallocate(void* ptr) noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::deallocate, [&] {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    std::size_t bytes = 0;
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      const auto found = s.segments.find(address);
      if (found == s.segments.end()) {
        return s.invalid(DeviceOp::deallocate,
                         fmt::format("deallocate({}): not a live segment from allocate", hex(ptr)));
      }
      bytes = found->second;
      s.segments.erase(found);
    }
    if (s.skip_release()) return Status::ok;
    const auto guard = s.guard();
    Status status = Status::ok;
    if (guard.error() != cudaSuccess) {
      status = s.guard_failure(guard, DeviceOp::deallocate);
    } else if (const cudaError_t error = s.api.device_free(ptr);  // synchronises the device
               error != cudaSuccess) {
      status = s.runtime_failure(error, DeviceOp::deallocate, "cudaFree", [&] {
        return fmt::format("deallocate({}, {})", hex(ptr), format_bytes(bytes));
      });
    }
    if (status != Status::ok) {
      // Still allocated as far as anyone knows: keep tracking it so that a retry can return it.
      const std::lock_guard<std::mutex> lock(s.mutex);
      s.segments.emplace(address, bytes);
    }
    return status;
  });
}

std::size_t CudaDevice::live_segments() const {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->segments.size();
}

// --- virtual memory: not on this backend -----------------------------------------------------------

bool CudaDevice::supports_virtual_memory() const noexcept { return false; }

Status CudaDevice::reserve(std::size_t, std::size_t, void**) noexcept {
  return unsupported_vmm(*state_, DeviceOp::reserve);
}

Status CudaDevice::release_reservation(void*, std::size_t) noexcept {
  return unsupported_vmm(*state_, DeviceOp::release_reservation);
}

Status CudaDevice::create_physical(std::size_t, PhysicalHandle*) noexcept {
  return unsupported_vmm(*state_, DeviceOp::create_physical);
}

Status CudaDevice::release_physical(PhysicalHandle) noexcept {
  return unsupported_vmm(*state_, DeviceOp::release_physical);
}

Status CudaDevice::map(void*, PhysicalHandle) noexcept {
  return unsupported_vmm(*state_, DeviceOp::map);
}

Status CudaDevice::unmap(void*, std::size_t) noexcept {
  return unsupported_vmm(*state_, DeviceOp::unmap);
}

// --- events ----------------------------------------------------------------------------------------

Status CudaDevice::create_event(Event* event) noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::create_event, [&] {
    if (event == nullptr) return s.invalid(DeviceOp::create_event, "the result event is null");
    cudaEvent_t native = reuse_event(s);
    if (native == nullptr) {
      const auto guard = s.guard();  // an event belongs to the device current at its creation
      if (guard.error() != cudaSuccess) return s.guard_failure(guard, DeviceOp::create_event);
      const cudaError_t error = s.api.event_create_with_flags(&native, cudaEventDisableTiming);
      if (error != cudaSuccess) {
        return s.runtime_failure(error, DeviceOp::create_event, "cudaEventCreateWithFlags",
                                 [] { return std::string("create_event"); });
      }
      try {
        const std::lock_guard<std::mutex> lock(s.mutex);
        s.events.insert(native);
      } catch (...) {
        (void)s.api.event_destroy(native);
        throw;
      }
    }
    event->handle = reinterpret_cast<std::uintptr_t>(native);
    return Status::ok;
  });
}

Status CudaDevice::destroy_event(Event event) noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::destroy_event, [&] {
    cudaEvent_t native = native_event(event);
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      if (s.events.erase(native) == 0) {
        return s.invalid(DeviceOp::destroy_event,
                         fmt::format("{} was not created by this device or is already destroyed",
                                     describe(event)));
      }
    }
    if (s.skip_release()) return Status::ok;
    if (pool_event(s, native)) return Status::ok;
    return destroy_native_event(s, native);
  });
}

Status CudaDevice::record_event(Event event, Stream stream) noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::record_event, [&] {
    if (event.handle == 0) return s.invalid(DeviceOp::record_event, "the null event");
    if (s.skip_release()) return Status::ok;
    const auto guard = s.guard();  // stream 0 is the current device's default stream
    if (guard.error() != cudaSuccess) return s.guard_failure(guard, DeviceOp::record_event);
    const cudaError_t error = s.api.event_record(native_event(event), native_stream(stream));
    if (error == cudaSuccess) return Status::ok;
    return s.runtime_failure(error, DeviceOp::record_event, "cudaEventRecord", [&] {
      return fmt::format("record_event({}, {})", describe(event), describe(stream));
    });
  });
}

Status CudaDevice::query_event(Event event) noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::query_event, [&] {
    if (event.handle == 0) return s.invalid(DeviceOp::query_event, "the null event");
    if (s.skip_release()) return Status::ok;
    const cudaError_t error = s.api.event_query(native_event(event));
    if (error == cudaSuccess) return Status::ok;
    if (error == cudaErrorNotReady) return Status::not_ready;
    return s.runtime_failure(error, DeviceOp::query_event, "cudaEventQuery",
                             [&] { return fmt::format("query_event({})", describe(event)); });
  });
}

Status CudaDevice::synchronize_event(Event event) noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::synchronize_event, [&] {
    if (event.handle == 0) return s.invalid(DeviceOp::synchronize_event, "the null event");
    if (s.skip_release()) return Status::ok;
    const cudaError_t error = s.api.event_synchronize(native_event(event));
    if (error == cudaSuccess) return Status::ok;
    return s.runtime_failure(error, DeviceOp::synchronize_event, "cudaEventSynchronize",
                             [&] { return fmt::format("synchronize_event({})", describe(event)); });
  });
}

Status CudaDevice::stream_wait_event(Stream stream, Event event) noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::stream_wait_event, [&] {
    if (event.handle == 0) return s.invalid(DeviceOp::stream_wait_event, "the null event");
    if (s.skip_release()) return Status::ok;
    const auto guard = s.guard();
    if (guard.error() != cudaSuccess) return s.guard_failure(guard, DeviceOp::stream_wait_event);
    const cudaError_t error =
        s.api.stream_wait_event(native_stream(stream), native_event(event), 0);
    if (error == cudaSuccess) return Status::ok;
    return s.runtime_failure(error, DeviceOp::stream_wait_event, "cudaStreamWaitEvent", [&] {
      return fmt::format("stream_wait_event({}, {})", describe(stream), describe(event));
    });
  });
}

Status CudaDevice::synchronize_stream(Stream stream) noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::synchronize_stream, [&] {
    if (s.skip_release()) return Status::ok;
    const auto guard = s.guard();
    if (guard.error() != cudaSuccess) return s.guard_failure(guard, DeviceOp::synchronize_stream);
    const cudaError_t error = s.api.stream_synchronize(native_stream(stream));
    if (error == cudaSuccess) return Status::ok;
    return s.runtime_failure(error, DeviceOp::synchronize_stream, "cudaStreamSynchronize", [&] {
      return fmt::format("synchronize_stream({})", describe(stream));
    });
  });
}

Status CudaDevice::synchronize_device() noexcept {
  CudaDeviceState& s = *state_;
  return s.call(DeviceOp::synchronize_device, [&] {
    if (s.skip_release()) return Status::ok;
    const auto guard = s.guard();
    if (guard.error() != cudaSuccess) return s.guard_failure(guard, DeviceOp::synchronize_device);
    const cudaError_t error = s.api.device_synchronize();
    if (error == cudaSuccess) return Status::ok;
    return s.runtime_failure(error, DeviceOp::synchronize_device, "cudaDeviceSynchronize",
                             [] { return std::string("synchronize_device"); });
  });
}

std::size_t CudaDevice::live_events() const {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->events.size();
}

std::size_t CudaDevice::pooled_events() const {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->event_pool.size();
}

bool CudaDevice::runtime_shut_down() const noexcept { return state_->skip_release(); }

}  // namespace cistern
