// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The requested allocation sizes of the real traces in ../shared/traces, for tests and
// benchmarks that want realistic size distributions without replaying whole traces.
// Everything here throws `cistern::InvalidArgument` naming the file on a missing or malformed
// trace; callers that may run without the shared folder check `traces_available` first.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace cistern::testing {

/// The shared folder: the environment variable CISTERN_SHARED_DIR when set and not empty, else
/// the CISTERN_SHARED_DIR compile definition (CMake sets it to "<repo>/../shared"), else
/// "../shared".
std::string shared_dir();

/// True if `<shared_dir>/traces` is a directory.
bool traces_available(const std::string& shared_dir);

/// The sizes of one trace file. `name` is its path below `<shared_dir>/traces`, such as
/// "pytorch/DeComFL/memory.pickle.gz".
struct TraceSizes {
  std::string name;
  std::vector<std::size_t> sizes;
};

/// A PyTorch memory snapshot (pickle, possibly gzipped): the `size` of every `alloc` event in
/// `device_traces`, device 0 first, each device's events in recorded order.
std::vector<std::size_t> pytorch_snapshot_sizes(const std::string& path);

/// A lifetime list (`id,lower,upper,size` with a header line): the sizes in allocation order,
/// that is by `lower`, ties in file order. Sizes are returned as written: bytes for SOMAS, and
/// minimalloc's normalised units (2^20 of them fill its intended capacity) for minimalloc.
std::vector<std::size_t> lifetime_csv_sizes(const std::string& path);

/// A Kineto (PyTorch profiler) trace, JSON, possibly gzipped: the `Bytes` of every CUDA
/// (`Device Type` 1) `[memory]` event with `Bytes` > 0, in time order (`ts`, ties by `Ev Idx`).
/// The file's own order is not time order. These are PyTorch's rounded block sizes.
std::vector<std::size_t> kineto_sizes(const std::string& path);

/// Every PyTorch snapshot under `<shared_dir>/traces/pytorch`, sorted by path.
std::vector<TraceSizes> load_pytorch_trace_sizes(const std::string& shared_dir);
/// Every lifetime list under `<shared_dir>/traces/somas`, sorted by path.
std::vector<TraceSizes> load_somas_trace_sizes(const std::string& shared_dir);
/// Every lifetime list under `<shared_dir>/traces/minimalloc`, sorted by path.
std::vector<TraceSizes> load_minimalloc_trace_sizes(const std::string& shared_dir);
/// Every Kineto trace under `<shared_dir>/traces/kineto`, sorted by path.
std::vector<TraceSizes> load_kineto_trace_sizes(const std::string& shared_dir);

/// All of the above, one entry per file: PyTorch, SOMAS, minimalloc, then Kineto.
std::vector<TraceSizes> load_all_trace_sizes(const std::string& shared_dir);

/// The sizes of every real trace concatenated, in the order of `load_all_trace_sizes`.
std::vector<std::size_t> load_trace_sizes(const std::string& shared_dir);

}  // namespace cistern::testing
