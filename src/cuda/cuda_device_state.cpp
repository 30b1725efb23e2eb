// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The shared state of the CUDA backends: opening a device, the device guard, and turning CUDA
// errors into statuses and messages (see cuda_device_state.hpp).
#include "cuda/cuda_device_state.hpp"

#include <fmt/format.h>

#include "cistern/errors.hpp"

namespace cistern::detail {
namespace {

/// The most recent failure on this thread and the device (serial) that reported it.
struct LastError {
  std::uint64_t device = 0;
  std::string detail;
};
thread_local LastError t_last_error;

std::atomic<std::uint64_t> g_next_serial{1};

constexpr const char* kNoDeviceAdvice =
    "Check that this machine has an NVIDIA GPU and driver (nvidia-smi lists the GPU), that "
    "CUDA_VISIBLE_DEVICES does not hide it, and that the driver is at least as new as the CUDA "
    "runtime cistern was built with";

[[noreturn]] void throw_no_device(const CudaApi& api, cudaError_t error) {
  (void)api.get_last_error();
  throw DeviceError(
      "open", fmt::format("cistern: no CUDA device can be used: cudaGetDeviceCount "
                          "failed: {} ({}). {}.",
                          api.get_error_name(error), api.get_error_string(error), kNoDeviceAdvice));
}

/// Checks the ordinal and reads the product name.
std::string open_device(const CudaApi& api, int ordinal) {
  int count = 0;
  const cudaError_t error = api.get_device_count(&count);
  if (error != cudaSuccess) throw_no_device(api, error);
  if (count <= 0) {
    throw DeviceError("open", fmt::format("cistern: no CUDA device can be used: the CUDA runtime "
                                          "sees none. {}.",
                                          kNoDeviceAdvice));
  }
  if (ordinal < 0 || ordinal >= count) {
    throw InvalidArgument(
        fmt::format("cistern: CUDA device {} does not exist: this process sees "
                    "{} device{} (ordinals 0 to {})",
                    ordinal, count, count == 1 ? "" : "s", count - 1));
  }
  cudaDeviceProp properties{};
  const cudaError_t read = api.get_device_properties(&properties, ordinal);
  if (read != cudaSuccess) {
    (void)api.get_last_error();
    throw DeviceError("open",
                      fmt::format("cistern: cannot read the properties of CUDA device {}: "
                                  "cudaGetDeviceProperties failed: {} ({})",
                                  ordinal, api.get_error_name(read), api.get_error_string(read)));
  }
  properties.name[sizeof(properties.name) - 1] = '\0';
  return properties.name;
}

}  // namespace

Status status_of(cudaError_t error) noexcept {
  switch (error) {
    case cudaSuccess: return Status::ok;
    case cudaErrorNotReady: return Status::not_ready;
    case cudaErrorMemoryAllocation: return Status::out_of_memory;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle: return Status::invalid_argument;
    case cudaErrorNotSupported: return Status::not_supported;
    default: return Status::device_error;
  }
}

Status status_of(CUresult error) noexcept {
  switch (error) {
    case CUDA_SUCCESS: return Status::ok;
    case CUDA_ERROR_NOT_READY: return Status::not_ready;
    case CUDA_ERROR_OUT_OF_MEMORY: return Status::out_of_memory;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_INVALID_HANDLE: return Status::invalid_argument;
    case CUDA_ERROR_NOT_SUPPORTED: return Status::not_supported;
    default: return Status::device_error;
  }
}

bool completes_at_shutdown(DeviceOp op) noexcept {
  switch (op) {
    case DeviceOp::deallocate:
    case DeviceOp::release_reservation:
    case DeviceOp::release_physical:
    case DeviceOp::unmap:
    case DeviceOp::destroy_event:
    case DeviceOp::record_event:
    case DeviceOp::stream_wait_event:
    case DeviceOp::query_event:
    case DeviceOp::synchronize_event:
    case DeviceOp::synchronize_stream:
    case DeviceOp::synchronize_device: return true;
    default: return false;
  }
}

int cuda_device_count(const CudaApi& api) noexcept {
  int count = 0;
  if (api.get_device_count(&count) != cudaSuccess) {
    (void)api.get_last_error();
    return 0;
  }
  return count > 0 ? count : 0;
}

CudaDeviceGuard::CudaDeviceGuard(const CudaApi& api, int device, bool make_current) noexcept
    : api_(api) {
  int current = -1;
  error_ = api.get_device(&current);
  if (error_ != cudaSuccess) return;
  if (current == device && !make_current) return;
  failed_call_ = "cudaSetDevice";
  error_ = api.set_device(device);
  if (error_ == cudaSuccess && current != device) previous_ = current;
}

CudaDeviceGuard::~CudaDeviceGuard() {
  if (previous_ >= 0 && api_.set_device(previous_) != cudaSuccess) {
    (void)api_.get_last_error();  // not the program's error either
  }
}

CudaDeviceState::CudaDeviceState(const CudaApi& cuda, const CudaDeviceOptions& opts)
    : api(cuda),
      options(opts),
      product(open_device(cuda, opts.device)),
      serial(g_next_serial.fetch_add(1)) {}

Status CudaDeviceState::fail(Status status, const std::string& what) noexcept {
  try {
    t_last_error.detail = fmt::format("cuda:{} {}", options.device, what);
  } catch (...) {
    t_last_error.detail.clear();  // no memory for a message: better empty than stale
  }
  t_last_error.device = serial;
  return status;
}

Status CudaDeviceState::fail(Status status, DeviceOp op, const std::string& what) noexcept {
  try {
    return fail(status, fmt::format("{}: {}", to_string(op), what));
  } catch (...) {
    return fail(status, std::string());
  }
}

Status CudaDeviceState::guard_failure(const CudaDeviceGuard& guard, DeviceOp op) noexcept {
  return runtime_failure(guard.error(), op, guard.failed_call(), [&] {
    return fmt::format("{} (making device {} current)", to_string(op), options.device);
  });
}

Status CudaDeviceState::at_shutdown(DeviceOp op, const char* call) noexcept {
  shut_down.store(true, std::memory_order_relaxed);
  if (completes_at_shutdown(op)) return Status::ok;
  try {
    return fail(Status::device_error, op,
                fmt::format("{}: CUDA is shutting down (the process is exiting)", call));
  } catch (...) {
    return fail(Status::device_error, op, std::string());
  }
}

std::string CudaDeviceState::describe_failure(const std::string& what, const char* call,
                                              const char* name, const char* description) {
  return fmt::format("{}: {} failed: {} ({})", what, call, name != nullptr ? name : "?",
                     description != nullptr ? description : "no description");
}

std::string last_error_of(const CudaDeviceState& state) {
  return t_last_error.device == state.serial ? t_last_error.detail : std::string();
}

std::string hex(const void* ptr) { return hex(reinterpret_cast<std::uintptr_t>(ptr)); }

std::string hex(std::uintptr_t value) { return fmt::format("{:#x}", value); }

}  // namespace cistern::detail
