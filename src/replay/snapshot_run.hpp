// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// A replay that records what the policy's allocator did, for `cistern replay --snapshot FILE`:
// its segments at the end and its event history, ready for the PyTorch snapshot writer
// (include/cistern/pytorch_snapshot.hpp), so that PyTorch's memory viewer shows any policy's run
// of any trace.
//
// cistern's own allocators (policies cistern and nocache) record their history themselves
// (`CachingAllocator::record_history`: frees that wait for other streams complete when they
// really do). For the others (torch) the replay records it around the allocator: alloc after a
// successful allocate, free_requested and free_completed together before deallocate,
// segment_alloc / segment_free and segment_map / segment_unmap (the pages of expandable
// segments, one entry per range an event maps) from the device calls, on the stream of the event
// that made them, oom for a failed allocation. Times are the
// trace's event times (cistern's own history: the host clock). The replay starts cold.
#pragma once

#include <string>

#include "cistern/config.hpp"
#include "cistern/pytorch_snapshot.hpp"
#include "replay/engine.hpp"
#include "trace/trace.hpp"

namespace cistern::replay {

/// What `record_run` gives.
struct RecordedRun {
  DeviceRecord record;  ///< the trace's device: final segments and the history
  Config config;        ///< the policy's configuration (for allocator_settings)
};

/// Replays `trace` with `policy` on a simulated device of `options.capacity` bytes, recording
/// (see the file comment). Out-of-memory is recorded, not thrown; throws `cistern::Error` if the
/// trace cannot be replayed.
RecordedRun record_run(const trace::Trace& trace, const Policy& policy, const Options& options);

/// The path a policy's snapshot goes to when one run writes several: `path` with `.<label>`
/// (the policy label, characters other than letters, digits, '-' and '_' replaced by '_')
/// and, with several traces, `.<index>` of the trace inserted before the extension:
/// "out.pickle" -> "out.torch.pickle", "out.cistern_max_split_size_mb_256.2.pickle".
std::string snapshot_path(const std::string& path, const std::string& label, std::size_t trace,
                          bool several_policies, bool several_traces);

}  // namespace cistern::replay
