// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Recording a trace from the allocator itself: its event history (`record_history(true)`, see
// cistern/history.hpp) turned into a `Trace`, which `write_native_file` stores in cistern's own
// format and every replay reads back. The history holds what PyTorch's memory history holds, so
// the conversion follows the PyTorch snapshot reader: one allocation per address lifetime,
// frees that completed later than requested kept as `deferred_frees`, segment events and
// out-of-memory errors as the recording allocator's own records.
#pragma once

#include <string>
#include <vector>

#include "cistern/history.hpp"
#include "cistern/stacks.hpp"
#include "cistern/stats.hpp"
#include "trace/trace.hpp"

namespace cistern::trace {

/// The trace of `history`, as `CachingAllocator::history()` returns it (oldest first).
///
/// A block freed in the history but allocated before recording began becomes a `live_before`
/// block of the size its free names. Blocks allocated before recording and never freed in it are
/// invisible to the history: pass the snapshot taken when recording began as `at_start` to keep
/// them (as `live_before` blocks, with the segments it lists as the recorded initial segments and
/// initial reserved bytes); without it they are left out. `source` names the trace in messages.
///
/// With `stacks` (the table the entries' `HistoryEntry::stack` ids name, as a `DeviceRecord`
/// carries it) the trace keeps each allocation's stack (`Trace::alloc_stacks`).
///
/// Throws `cistern::InvalidArgument` naming the entry if the history is inconsistent (an alloc
/// at a live address, a second free of one allocation), which a complete history never is.
Trace trace_from_history(const std::vector<HistoryEntry>& history, const Snapshot* at_start,
                         int device, const std::string& source = "allocator history",
                         const StackTable* stacks = nullptr);

}  // namespace cistern::trace
