// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// A trace's allocations as buffers to plan, and a plan written as text (docs/plan-format.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/planner.hpp"
#include "trace/trace.hpp"

namespace cistern::plan {

/// Every allocation of a trace as a buffer on the clock of event positions: a block live before
/// the window from 0, an allocation at events[i] from i + 1, freed at events[j] until j + 1, never
/// freed until events.size() + 1. The trace's order of frees and allocations is kept exactly, so
/// the lower bound equals `trace.peak_live()`.
struct TraceBuffers {
  std::vector<Buffer> buffers;
  std::vector<std::uint64_t> ids;      ///< the trace's allocation id of each buffer
  std::vector<std::uint32_t> streams;  ///< the allocating stream (index into Trace::streams)
  /// The recorded time (Event::time) of the allocation and of the free, for the plan file. A
  /// block live before the window starts at the first event's time; one never freed ends one
  /// after the last event's time. For lifetime lists these are the file's lower and upper.
  std::vector<std::int64_t> lower_time, upper_time;
};

/// See TraceBuffers. `trace` must pass `Trace::check()`.
TraceBuffers buffers_of(const trace::Trace& trace);

/// The plan as text (docs/plan-format.md): a header naming the trace and the figures, then one
/// line `id,lower,upper,size,offset` per buffer.
std::string format_plan(const TraceBuffers& buffers, const Placement& placement,
                        const std::string& source, std::uint64_t alignment);

}  // namespace cistern::plan
