// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Writing cistern's state as a PyTorch memory snapshot: the pickle that
// `torch.cuda.memory._dump_snapshot` writes, so that PyTorch's tools open it - the memory viewer
// page (pytorch.org/memory_viz) and `python -m torch.cuda._memory_viz trace|segments|stats FILE`.
//
//   cistern::CachingAllocator allocator(device);
//   allocator.record_history(true);              // for the timeline (device_traces)
//   ... run ...
//   cistern::write_pytorch_snapshot("snapshot.pickle", allocator);
//
// The pickle holds only builtin values (dicts, lists, str, int, bool, tuple), as PyTorch's does:
// `pickle.load` reads it without torch. Keys (reference section 7):
//
// * `segments`: per segment `device`, `address`, `total_size`, `allocated_size`, `active_size`,
//   `requested_size`, `stream`, `segment_type` ("large"/"small"), `segment_pool_id` ((0, 0)),
//   `is_expandable`, `frames` ([]), and `blocks`: `address`, `size`, `requested_size`, `state`
//   ("active_allocated", "active_pending_free", "inactive"), `frames` (an allocated block's: those
//   of the history's last alloc at its address, [] when none).
// * `device_traces`: one list per device up to the highest device written, each the recorded
//   history: `action`, `addr`, `size`, `stream`, `time_us`, `frames` (the entry's stack from
//   `DeviceRecord::stacks`, innermost first, each {filename, line, name}; [] for stack 0),
//   `compile_context` ("N/A"); an `oom` entry carries `device_free` instead of `addr`.
// * `allocator_settings`: `PYTORCH_CUDA_ALLOC_CONF` (cistern's configuration string),
//   `max_split_size` (-1: unlimited), `garbage_collection_threshold`, `expandable_segments`,
//   `release_lock_on_cudamalloc`, `roundup_power2_divisions` (a dict keyed "1", "2", ...,
//   "32768": MiB interval starts).
// * `external_annotations`: [].
//
// The allocator records no stack frames (it does not unwind): `HistoryEntry::stack` is filled in
// by whoever knows the caller's stack - the plug-in from Python (cistern.torch.record_history(
// stacks="python")), a replay from its trace's frames - and the viewer shows them per block.
#pragma once

#include <string>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/config.hpp"
#include "cistern/history.hpp"
#include "cistern/stacks.hpp"
#include "cistern/stats.hpp"

namespace cistern {

/// One device's part of a snapshot: its segments and its event history.
struct DeviceRecord {
  int device = 0;                     ///< the device ordinal (index into device_traces)
  Snapshot snapshot;                  ///< segments and blocks (each segment's own `device` is kept)
  std::vector<HistoryEntry> history;  ///< oldest first; empty when none was recorded
  StackTable stacks;                  ///< the stacks `history`'s entries name (HistoryEntry::stack)
};

/// The snapshot of several devices (one allocator each) as the bytes of a PyTorch pickle.
/// `config` fills `allocator_settings`. Throws `InvalidArgument` for a negative device.
std::string pytorch_snapshot_pickle(const std::vector<DeviceRecord>& devices, const Config& config);

/// One allocator's state (its `snapshot()` and `history()`) as the bytes of a PyTorch pickle.
std::string pytorch_snapshot_pickle(const DeviceAllocator& allocator);

/// Writes `pytorch_snapshot_pickle(devices, config)` to `path` (replacing it). Throws
/// `cistern::InvalidArgument` naming the path and the OS reason if it cannot be written.
void write_pytorch_snapshot(const std::string& path, const std::vector<DeviceRecord>& devices,
                            const Config& config);

/// Writes one allocator's state to `path` as a PyTorch snapshot.
void write_pytorch_snapshot(const std::string& path, const DeviceAllocator& allocator);

}  // namespace cistern
