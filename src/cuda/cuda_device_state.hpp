// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// What CudaDevice and CudaVmmDevice share: the API table, the device's identity, the tracking
// of segments and events, the device guard, and the one place where a CUDA error becomes a
// `Status` and a `last_error()` message.
//
// Error handling in one paragraph: a failed call is classified (out of memory, invalid argument,
// not supported, device error), described as "cuda:<n> <what>: <call> failed: <name>
// (<description>)" in a thread-local slot that `last_error()` reads, and, for the runtime, taken
// off the runtime's last-error slot so that the program's own `cudaGetLastError()` does not see
// cistern's failures. `cudaErrorCudartUnloading` / `CUDA_ERROR_DEINITIALIZED` mean the process
// is exiting: from then on every call that returns, orders or waits for something succeeds
// without touching CUDA (the driver reclaims everything, no work will run any more), events are
// stand-ins that never reach CUDA, and calls that would take memory fail.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cistern/cuda_device.hpp"
#include "cistern/device.hpp"
#include "cuda/cuda_api.hpp"

namespace cistern::detail {

/// The status of a runtime error (`cudaErrorNotReady` is `not_ready`).
Status status_of(cudaError_t error) noexcept;
/// The status of a driver error.
Status status_of(CUresult error) noexcept;

/// Whether `op` succeeds silently once CUDA has shut down: it returns something (reclaimed with
/// the process anyway) or orders or waits for work (none will run any more).
bool completes_at_shutdown(DeviceOp op) noexcept;

/// The number of devices `api` reports; 0 on any error (which it clears).
int cuda_device_count(const CudaApi& api) noexcept;

/// Makes a device current for the lifetime of the guard and restores the caller's afterwards.
/// `make_current` also calls cudaSetDevice when the device already is the current one, which
/// the driver API needs: a thread that only ever called the runtime has no current context.
class CudaDeviceGuard {
 public:
  CudaDeviceGuard(const CudaApi& api, int device, bool make_current = false) noexcept;
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
  /// cudaSuccess, or why the device could not be made current.
  cudaError_t error() const noexcept { return error_; }
  /// The call that failed ("cudaGetDevice" or "cudaSetDevice"), when `error()` is not success.
  const char* failed_call() const noexcept { return failed_call_; }

 private:
  const CudaApi& api_;
  int previous_ = -1;  ///< the caller's device, restored if it differs; -1: nothing to restore
  cudaError_t error_ = cudaSuccess;
  const char* failed_call_ = "cudaGetDevice";
};

/// The state of one CudaDevice. Thread-safe: tracking lives behind `mutex`; the CUDA calls
/// themselves are made outside it.
struct CudaDeviceState {
  /// Opens `opts.device` through `cuda`; throws DeviceError / InvalidArgument (see CudaDevice).
  CudaDeviceState(const CudaApi& cuda, const CudaDeviceOptions& opts);

  const CudaApi& api;
  const CudaDeviceOptions options;
  std::string product;         ///< the device's name, e.g. "NVIDIA H200"
  const std::uint64_t serial;  ///< tells devices apart in the thread-local last-error slot
  std::atomic<bool> shut_down{false};

  mutable std::mutex mutex;
  std::unordered_map<std::uintptr_t, std::size_t> segments;  ///< live segment -> bytes
  std::unordered_set<cudaEvent_t> events;                    ///< handed out, not destroyed
  std::vector<cudaEvent_t> event_pool;                       ///< destroyed, kept for reuse
  std::uintptr_t next_stand_in = 1;  ///< the next stand-in event handed out after the shutdown

  int ordinal() const noexcept { return options.device; }
  CudaDeviceGuard guard(bool make_current = false) const noexcept {
    return {api, options.device, make_current};
  }

  /// Runs `body` (which returns a Status), turning an exception into `device_error`.
  template <class Body>
  Status call(DeviceOp op, Body&& body) noexcept {
    try {
      return body();
    } catch (const std::exception& error) {
      return fail(Status::device_error, op, error.what());
    } catch (...) {
      return fail(Status::device_error, op, "unknown exception");
    }
  }

  /// Records "cuda:<n> <what>" as this thread's last error and returns `status`.
  Status fail(Status status, const std::string& what) noexcept;
  /// The same with "<op>: <what>".
  Status fail(Status status, DeviceOp op, const std::string& what) noexcept;
  /// `invalid_argument` with the detail "<op>: <what>".
  Status invalid(DeviceOp op, const std::string& what) noexcept {
    return fail(Status::invalid_argument, op, what);
  }

  /// The status of a failed runtime call `call` made for `op`; `what()` describes the request
  /// (e.g. "allocate(2.00 MiB)") and runs only here, on the failure path.
  template <class What>
  Status runtime_failure(cudaError_t error, DeviceOp op, const char* call, What&& what) noexcept {
    (void)api.get_last_error();  // cistern's failure is not the program's error
    if (error == cudaErrorCudartUnloading) return at_shutdown(op, call);
    try {
      return fail(status_of(error), describe_failure(what(), call, api.get_error_name(error),
                                                     api.get_error_string(error)));
    } catch (...) {
      return fail(status_of(error), op, call);
    }
  }

  /// The status of a guard that could not make the device current, for `op`.
  Status guard_failure(const CudaDeviceGuard& guard, DeviceOp op) noexcept;

  /// Notes that CUDA is shutting down. A call that returns or waits for something succeeds
  /// (`completes_at_shutdown`); one that would take something fails with `device_error`.
  Status at_shutdown(DeviceOp op, const char* call) noexcept;
  /// "<what>: <call> failed: <name> (<description>)"
  static std::string describe_failure(const std::string& what, const char* call, const char* name,
                                      const char* description);

  /// Whether a returning call should skip CUDA because it has shut down.
  bool skip_release() const noexcept { return shut_down.load(std::memory_order_relaxed); }
};

/// This thread's last failure if `state`'s device reported it, else "".
std::string last_error_of(const CudaDeviceState& state);

/// Formats a pointer as the messages show it ("0x7f0000000000").
std::string hex(const void* ptr);
std::string hex(std::uintptr_t value);

}  // namespace cistern::detail
