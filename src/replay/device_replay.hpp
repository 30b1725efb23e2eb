// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Replay on a given device - a real GPU (`cistern replay --backend cuda`) rather than the
// engine's own simulated one - with the real time of every device call measured beside the
// cost model's simulated price:
//
//   CudaDevice gpu;                                   // the CLI wires the CUDA hooks
//   DeviceResult r = replay::run_on_device(trace, policy, gpu, hooks, options);
//
// The replay itself is the engine's (the same compiled plan, cold start, OOMs counted, the
// trace's synchronisations and empty_cache() calls replayed); what differs is that the device is
// the caller's and that nothing here knows it is CUDA: streams and the optional write of every
// allocation come through `DeviceHooks`, so this file builds and is tested without a GPU. Every
// allocation still live at the end is freed and the cache emptied, so that one replay leaves the
// device as it found it for the next.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "cistern/device.hpp"
#include "replay/engine.hpp"
#include "trace/trace.hpp"

namespace cistern::replay {

/// What a replay on a device needs besides the device contract.
struct DeviceHooks {
  /// A new stream for one of the trace's streams (recorded stream 0 with handle 0 is replayed on
  /// the default stream instead). Required when the trace has other streams.
  std::function<Stream()> create_stream;
  /// Returns a stream from `create_stream` at the end of the replay. Optional.
  std::function<void(Stream)> destroy_stream;
  /// Optional: writes all of [ptr, ptr + bytes) on `stream` (a `cudaMemsetAsync`), so that a bad
  /// pointer faults instead of passing unnoticed. Throws `cistern::Error` when it cannot.
  std::function<void(void* ptr, std::size_t bytes, Stream stream)> touch;
  /// Optional: waits for all work at the end and throws `cistern::Error` on an asynchronous
  /// failure (a write that faulted).
  std::function<void()> finish;
};

/// Real (wall-clock) time of the device calls of one replay, by kind. Measured around each call
/// of the allocator under test; a `deallocate` that synchronises the device includes the wait.
struct DeviceTimes {
  double segment_ms = 0;  ///< allocate + deallocate (cudaMalloc / cudaFree)
  double vmm_ms = 0;      ///< reserve, create, map, unmap, releases
  double event_ms = 0;    ///< create, record, query, wait, synchronise, destroy
  double total_ms() const noexcept { return segment_ms + vmm_ms + event_ms; }
};

/// One replay on a device: the engine's row plus what only a device run has.
struct DeviceResult {
  /// As `run` reports it; `device_ms` is the cost model's price of the calls made, `capacity`
  /// the device's total memory, `ns_per_op` the host time per alloc/free including device calls.
  Result result;
  std::string device;  ///< the device's name(), e.g. "cuda:0 NVIDIA H200"
  DeviceTimes real;    ///< measured device-call time
  /// Host time per alloc/free without the measured device calls: the allocator's own cost.
  std::optional<double> allocator_ns_per_op;
  std::uint64_t touched_bytes = 0;  ///< bytes written through `DeviceHooks::touch`
};

/// Replays `trace` with `policy` on `device` (cold start only; `options.capacity`, timeline and
/// segment map are ignored, `check_invariants` and `costs` are honoured). A replay that cannot
/// finish (the allocator rejects a call, a write faults) gives a row with `result.error` set.
/// Throws `InvalidArgument` for a warm start.
DeviceResult run_on_device(const trace::Trace& trace, const Policy& policy, Device& device,
                           const DeviceHooks& hooks, const Options& options);

}  // namespace cistern::replay
