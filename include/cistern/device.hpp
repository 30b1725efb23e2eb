// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The device contract: the only place that touches memory, stream and event APIs.
//
// A backend (SimDevice, CudaDevice, CudaVmmDevice) implements this small interface and nothing
// else. Every call is noexcept and reports failure through a `Status`; the caller (the
// allocator) turns failures into exceptions. `last_error()` gives the detail of the most recent
// failure on the calling thread (for CUDA: the error name and the operation).
//
// Semantics every backend must honour, checked by the conformance suite (tests/device_conformance):
//
// * Segments. `allocate(bytes)` returns a pointer aligned to at least 256 bytes that overlaps no
//   live segment, or `out_of_memory` leaving nothing behind. The backend charges its capacity in
//   whole units of `granularity()` (2 MiB on current GPUs). `deallocate` is device-synchronising,
//   as `cudaFree` is: all work on all streams completes before the memory is returned.
// * Virtual memory (optional, `supports_virtual_memory()`), with the CUDA driver's rules (each one
//   a conformance test that the simulated, the fake-driver and the real backend all run).
//   `reserve` takes address space only; `create_physical` takes capacity and returns a handle
//   that knows its size. `map` maps a handle whole, at offset 0, at a granule-aligned address of
//   one reservation, and makes it accessible: the driver refuses a map of part of a handle or at
//   an offset into it (CUDA_ERROR_NOT_SUPPORTED), so the contract offers neither. One handle may
//   be mapped at several addresses at once (the same memory seen twice). `map_run` maps several
//   handles side by side and makes the run accessible in one step (PyTorch's expansion of a
//   segment); each stays a mapping of its own. `unmap` covers whole mappings only - one or
//   several side by side - and refuses a range that would cut one (CUDA_ERROR_INVALID_VALUE): a
//   handle is the smallest unit that can be unmapped. A physical handle may be released while
//   mapped; its memory returns to the device only when the last mapping is gone (as with
//   `cuMemRelease`). `unmap` does not wait for work that still uses the memory (neither does
//   `cuMemUnmap`): the caller synchronises first.
// * Streams and events. Work submitted to a stream runs in order. `record_event(e, s)` captures
//   the work submitted to `s` so far; `query_event(e)` returns `ok` once it has completed and
//   `not_ready` before; `synchronize_event` blocks the host until it has. `stream_wait_event(s, e)`
//   makes work submitted to `s` later wait for the event on the device, without blocking the
//   host. An event can be re-recorded or destroyed as soon as the call that used it returns.
#pragma once

#include <cstddef>
#include <string>

#include "cistern/types.hpp"

namespace cistern {

/// The outcome of a device call.
enum class Status : int {
  ok = 0,            ///< success (for `query_event`: the event has completed)
  not_ready,         ///< `query_event` only: the captured work has not completed yet
  out_of_memory,     ///< the device cannot provide the memory; nothing was allocated
  invalid_argument,  ///< a precondition was violated (bad pointer, misaligned size, ...)
  not_supported,     ///< the backend does not implement the operation
  device_error,      ///< any other failure (driver error, device lost, ...)
};

/// The name of a status, e.g. "out_of_memory".
const char* to_string(Status status) noexcept;

/// Every operation of the contract, for counters and fault injection.
enum class DeviceOp : int {
  allocate,
  deallocate,
  reserve,
  release_reservation,
  create_physical,
  release_physical,
  map,
  unmap,
  create_event,
  destroy_event,
  record_event,
  query_event,
  synchronize_event,
  stream_wait_event,
  synchronize_stream,
  synchronize_device,
  memory_info,
};

/// The number of `DeviceOp` values.
inline constexpr int kDeviceOpCount = static_cast<int>(DeviceOp::memory_info) + 1;

/// The name of an operation, e.g. "record_event".
const char* to_string(DeviceOp op) noexcept;

/// Free and total device memory, as `cudaMemGetInfo` reports them.
struct MemoryInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};

/// The backend contract. Implementations must be thread-safe: the allocator calls them from
/// several threads at once (never for the same event concurrently).
class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  /// The device ordinal.
  virtual int index() const noexcept = 0;
  /// A short description such as "sim:0 (80.00 GiB)" or "cuda:0 NVIDIA H200".
  virtual std::string name() const = 0;
  /// The allocation granularity: segments are charged, and VMM sizes aligned, in these units.
  virtual std::size_t granularity() const noexcept = 0;
  /// Free and total memory.
  virtual Status memory_info(MemoryInfo* info) noexcept = 0;
  /// The detail of the most recent failure on the calling thread ("" if none).
  virtual std::string last_error() const = 0;

  // --- segments (cudaMalloc / cudaFree) ---------------------------------------------------------

  /// Obtains a segment of `bytes` (> 0). On `out_of_memory` nothing is allocated.
  virtual Status allocate(std::size_t bytes, void** ptr) noexcept = 0;
  /// Returns a segment obtained from `allocate`. Synchronises the device first.
  virtual Status deallocate(void* ptr) noexcept = 0;

  // --- virtual memory (cuMemAddressReserve / cuMemCreate / cuMemMap) ------------------------------

  /// Whether the virtual-memory operations below are available.
  virtual bool supports_virtual_memory() const noexcept = 0;
  /// Reserves `bytes` of address space aligned to `alignment` (0: granularity). Takes no capacity.
  virtual Status reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept = 0;
  /// Releases a whole reservation; it must have no mappings left.
  virtual Status release_reservation(void* va, std::size_t bytes) noexcept = 0;
  /// Creates `bytes` of physical memory (charged to the capacity).
  virtual Status create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept = 0;
  /// Releases a physical handle; memory returns once no mapping uses it.
  virtual Status release_physical(PhysicalHandle handle) noexcept = 0;
  /// Maps the whole of `handle` - [va, va + handle.bytes), from its offset 0 - into a
  /// reservation and makes it accessible (one cuMemMap and one cuMemSetAccess). A handle whose
  /// `bytes` is not its size is refused: `not_supported` when smaller (the driver maps no part
  /// of a handle), `invalid_argument` otherwise.
  virtual Status map(void* va, PhysicalHandle handle) noexcept = 0;
  /// Maps `count` handles whole, one after another from `va` - each a mapping of its own - and
  /// makes the whole run accessible in one step: one cuMemMap per handle and one cuMemSetAccess
  /// over the run, as PyTorch grows an expandable segment (the access grant still costs per
  /// mapping it covers on current drivers). All or nothing: on failure none is mapped. The
  /// default maps handle by handle through `map` and, on a failure, unmaps what it mapped in one
  /// `unmap`, or where that fails mapping by mapping: only a device that fails those too keeps
  /// a mapping.
  virtual Status map_run(void* va, const PhysicalHandle* handles, std::size_t count) noexcept;
  /// Unmaps [va, va+bytes), which must be exactly covered by whole earlier mappings; a range that
  /// would cut a mapping is `invalid_argument` and changes nothing.
  virtual Status unmap(void* va, std::size_t bytes) noexcept = 0;

  // --- streams and events ------------------------------------------------------------------------

  /// Creates an event without timing (as `cudaEventDisableTiming`).
  virtual Status create_event(Event* event) noexcept = 0;
  /// Destroys an event.
  virtual Status destroy_event(Event event) noexcept = 0;
  /// Captures the work submitted to `stream` so far.
  virtual Status record_event(Event event, Stream stream) noexcept = 0;
  /// `ok` if the captured work has completed, `not_ready` if not.
  virtual Status query_event(Event event) noexcept = 0;
  /// Blocks until the captured work has completed.
  virtual Status synchronize_event(Event event) noexcept = 0;
  /// Makes later work on `stream` wait (on the device) for the event.
  virtual Status stream_wait_event(Stream stream, Event event) noexcept = 0;
  /// Blocks until all work submitted to `stream` has completed.
  virtual Status synchronize_stream(Stream stream) noexcept = 0;
  /// Blocks until all work on the device has completed.
  virtual Status synchronize_device() noexcept = 0;
};

}  // namespace cistern
