// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The CUDA backends of the device contract (device.hpp):
//
//   cistern::CudaDevice device;                 // cudaMalloc / cudaFree on device 0
//   cistern::CachingAllocator allocator(device);
//   cistern::CudaVmmDevice vmm({1});            // device 1, with the driver's virtual memory
//
// `CudaDevice` works over the CUDA runtime: segments from `cudaMalloc`/`cudaFree`, events from a
// pool of `cudaEventDisableTiming` events, and streams as the program's own `cudaStream_t`
// values (never created, owned or destroyed here; 0, `cuda_legacy_stream` and
// `cuda_per_thread_stream` name the default streams). Every call runs with the device made
// current and the caller's current device restored afterwards, so one process can hold one
// device object per GPU. `CudaVmmDevice` adds the driver's virtual-memory API
// (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, ...), which it finds at run
// time through `cudaGetDriverEntryPointByVersion`: nothing links against libcuda.
//
// Failures come back as a `Status` with the detail in `last_error()`: the operation, the CUDA
// call, and the error's name and description, e.g.
//   "cuda:0 create_physical(2.00 MiB): cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY (out of
//   memory)".
// Constructing a device where no GPU can be used throws `cistern::DeviceError` saying why.
//
// At process exit, after the CUDA runtime has shut down (`cudaErrorCudartUnloading`), returning
// memory, events and mappings quietly does nothing and succeeds: the driver reclaims everything
// with the process, so a static allocator may be destroyed late without crashing or printing.
//
// Availability: these classes are compiled into the library only when it was built with the CUDA
// toolkit; the target `cistern::cistern` then defines `CISTERN_HAS_CUDA` for its users. Without
// it this header still compiles but nothing it declares may be used (the link would fail):
//
//   #ifdef CISTERN_HAS_CUDA
//   cistern::CudaDevice device;
//   #endif
//
// This header needs no CUDA header: it compiles in plain C++ and in .cu files alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cistern/device.hpp"

namespace cistern {

namespace detail {
struct CudaApi;
struct CudaDeviceState;
struct CudaVmmState;
}  // namespace detail

/// The legacy default stream, `cudaStreamLegacy`: synchronises with every blocking stream. The
/// null stream (`cistern::default_stream`, handle 0) means the same to cistern, which is
/// compiled without per-thread default streams.
inline constexpr Stream cuda_legacy_stream{std::uintptr_t{0x1}};
/// The calling thread's default stream, `cudaStreamPerThread`. Code built with
/// `--default-stream per-thread` must pass this (not 0) to name its default stream.
inline constexpr Stream cuda_per_thread_stream{std::uintptr_t{0x2}};

/// Construction options of the CUDA backends.
struct CudaDeviceOptions {
  /// The CUDA device ordinal, as `cudaSetDevice` takes it.
  int device = 0;
  /// At most this many destroyed events are kept for reuse by `create_event`.
  std::size_t event_pool_limit = 1024;
};

/// The device contract over the CUDA runtime: `cudaMalloc` segments, pooled events, the
/// program's streams. No virtual memory (`supports_virtual_memory()` is false). Thread-safe.
class CudaDevice : public Device {
 public:
  /// Opens device `options.device`. Throws `DeviceError` if no CUDA device can be used (no GPU,
  /// no driver, a driver too old for the runtime) and `InvalidArgument` if the ordinal does not
  /// exist; the message says which and what to check.
  explicit CudaDevice(CudaDeviceOptions options = {});
  /// For tests: the same backend over another implementation of the CUDA API, which must
  /// outlive the device. `detail::CudaApi` is internal to cistern.
  CudaDevice(const detail::CudaApi& api, CudaDeviceOptions options);
  /// Destroys the pooled events. Memory still allocated is left to its owner.
  ~CudaDevice() override;

  /// The number of CUDA devices this process can use; 0 when there is no GPU or no usable
  /// driver. Never throws.
  static int device_count() noexcept;

  // --- the device contract -----------------------------------------------------------------------
  int index() const noexcept override;
  /// "cuda:<ordinal> <product name>", e.g. "cuda:0 NVIDIA H200".
  std::string name() const override;
  /// 2 MiB: the unit in which `cudaMalloc` takes device memory on current GPUs.
  std::size_t granularity() const noexcept override;
  Status memory_info(MemoryInfo* info) noexcept override;
  std::string last_error() const override;
  Status allocate(std::size_t bytes, void** ptr) noexcept override;
  Status deallocate(void* ptr) noexcept override;
  bool supports_virtual_memory() const noexcept override;
  Status reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept override;
  Status release_reservation(void* va, std::size_t bytes) noexcept override;
  Status create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept override;
  Status release_physical(PhysicalHandle handle) noexcept override;
  Status map(void* va, PhysicalHandle handle) noexcept override;
  Status unmap(void* va, std::size_t bytes) noexcept override;
  Status create_event(Event* event) noexcept override;
  Status destroy_event(Event event) noexcept override;
  Status record_event(Event event, Stream stream) noexcept override;
  Status query_event(Event event) noexcept override;
  Status synchronize_event(Event event) noexcept override;
  Status stream_wait_event(Stream stream, Event event) noexcept override;
  Status synchronize_stream(Stream stream) noexcept override;
  Status synchronize_device() noexcept override;

  // --- observation ---------------------------------------------------------------------------------

  /// Segments from `allocate` not yet returned.
  std::size_t live_segments() const;
  /// Events handed out by `create_event` and not yet destroyed.
  std::size_t live_events() const;
  /// Destroyed events kept for reuse.
  std::size_t pooled_events() const;
  /// Whether the CUDA runtime has been seen shutting down; from then on returning resources
  /// does nothing.
  bool runtime_shut_down() const noexcept;

 protected:
  /// The shared state, for `CudaVmmDevice`.
  detail::CudaDeviceState& state() const noexcept { return *state_; }

 private:
  std::unique_ptr<detail::CudaDeviceState> state_;
};

/// `CudaDevice` plus the driver's virtual-memory API: `reserve`, `create_physical`, `map` (with
/// read-write access for this device), `unmap` and the releases, in units of the driver's
/// minimum allocation granularity, with the driver's rules: a handle is mapped only whole, at
/// offset 0 (one `cuMemMap` of `handle.bytes`, one `cuMemSetAccess`), at one or several
/// addresses; `map_run` is one `cuMemMap` per handle and one `cuMemSetAccess` over the run; an
/// `unmap` takes whole mappings, several side by side in one `cuMemUnmap`. Reservations,
/// physical handles and mappings are tracked, so that what the driver would refuse is refused
/// before it sees it: a handle claiming less than its size with `not_supported` (the driver's
/// CUDA_ERROR_NOT_SUPPORTED), a misaligned, overlapping or unreserved range or an unknown handle
/// with `invalid_argument`. Thread-safe.
class CudaVmmDevice final : public CudaDevice {
 public:
  /// Opens the device and the driver's virtual-memory functions. Throws as `CudaDevice` does,
  /// and `DeviceError` if the driver lacks a function or the device does not support virtual
  /// memory management.
  explicit CudaVmmDevice(CudaDeviceOptions options = {});
  /// For tests: over another implementation of the CUDA API (see `CudaDevice`).
  CudaVmmDevice(const detail::CudaApi& api, CudaDeviceOptions options);
  /// Forgets the tracking. Live mappings and handles are left to their owner (or the process).
  ~CudaVmmDevice() override;

  /// "cuda:<ordinal> <product name> (vmm)".
  std::string name() const override;
  /// The driver's minimum allocation granularity for this device (2 MiB on current GPUs).
  std::size_t granularity() const noexcept override;
  bool supports_virtual_memory() const noexcept override;
  Status reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept override;
  Status release_reservation(void* va, std::size_t bytes) noexcept override;
  Status create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept override;
  Status release_physical(PhysicalHandle handle) noexcept override;
  Status map(void* va, PhysicalHandle handle) noexcept override;
  Status map_run(void* va, const PhysicalHandle* handles, std::size_t count) noexcept override;
  Status unmap(void* va, std::size_t bytes) noexcept override;

  /// Live reservations, physical handles (not yet released) and mappings.
  std::size_t live_reservations() const;
  std::size_t live_physical() const;
  std::size_t live_mappings() const;

 private:
  std::unique_ptr<detail::CudaVmmState> vmm_;
};

/// What `open_cuda_device` opened.
struct CudaDeviceChoice {
  /// A `CudaVmmDevice` when `virtual_memory`, else a `CudaDevice`.
  std::unique_ptr<CudaDevice> device;
  /// Whether the device is a `CudaVmmDevice`, on which the allocator's page engine runs.
  bool virtual_memory = false;
  /// Why it is not ("" when it is): the error `CudaVmmDevice` gave, e.g. that the GPU does not
  /// support virtual memory management or that the driver lacks a function.
  std::string without_virtual_memory;
};

/// Opens CUDA device `options.device` as the plug-in and `cistern replay --backend cuda` do: a
/// `CudaVmmDevice` where the driver and GPU support virtual memory management, otherwise a
/// `CudaDevice` (saying why in the result). Throws what `CudaDevice` throws when no GPU can be
/// used or the ordinal does not exist.
CudaDeviceChoice open_cuda_device(CudaDeviceOptions options = {});
/// For tests: the same over another implementation of the CUDA API (see `CudaDevice`).
CudaDeviceChoice open_cuda_device(const detail::CudaApi& api, CudaDeviceOptions options);

}  // namespace cistern
