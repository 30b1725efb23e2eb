// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern replay --backend cuda`: the same replays on a real GPU (replay/device_replay.hpp),
// with the device calls' real time beside the cost model's simulated one.
//
// `open_cuda_backend` is the only part that knows CUDA (cuda_backend.cpp); built without the
// CUDA toolkit it throws, and the command exits with kExitNoDevice, as it does on a machine
// without a GPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cistern/device.hpp"
#include "replay/device_replay.hpp"
#include "replay/engine.hpp"
#include "trace/trace.hpp"

namespace cistern::cli {

/// A device to replay on and the hooks a replay needs on it.
struct DeviceBackend {
  std::unique_ptr<Device> device;
  replay::DeviceHooks hooks;
  /// Why the device lacks what it would normally have ("" if nothing), e.g. virtual memory.
  std::string note;
};

/// Opens CUDA device `ordinal` (made the current device; a CudaVmmDevice where the driver supports
/// virtual memory, else a CudaDevice and a `note` saying why) with streams from
/// `cudaStreamCreateWithFlags(cudaStreamNonBlocking)`; `touch`: every allocation is written with
/// `cudaMemsetAsync` on its stream. Throws `cistern::DeviceError` when no GPU can be used or
/// cistern was built without CUDA, `cistern::InvalidArgument` for an ordinal that does not exist.
DeviceBackend open_cuda_backend(int ordinal, bool touch);

/// What `cistern replay --backend cuda` was asked for.
struct DeviceReplayRequest {
  std::vector<const trace::Trace*> traces;
  std::vector<replay::Policy> policies;
  replay::Options options;
  int device = 0;
  bool touch = false;
  std::string json;  ///< "" none, "-" stdout, else a file
  bool quiet = false;
};

/// Runs every (trace, policy) pair one after the other on the GPU, prints the table and writes
/// the JSON. Returns the exit status (kExitNoDevice when the GPU cannot be opened).
int run_device_replay(const DeviceReplayRequest& request);

/// The results as a table (one row per trace and policy) with simulated and real device time.
std::string format_device_table(const std::vector<replay::DeviceResult>& results);
/// The results as JSON: {"backend", "device", "virtual_memory", "device_note", "touch",
/// "cost_model" (the model of the simulated figures), "results": [...]}.
std::string format_device_json(const std::vector<replay::DeviceResult>& results,
                               const DeviceBackend& backend, bool touch,
                               const replay::CostModel& costs);

}  // namespace cistern::cli
