// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// What the engine's source files share: the entry points of engine.hpp taking a compiled plan,
// so that run_all and the capacity search compile each trace once and replay it many times.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "replay/engine.hpp"
#include "replay/metered_device.hpp"
#include "replay/plan.hpp"

namespace cistern::replay::detail {

/// `run` on a plan compiled from `trace`.
Result run_plan(const trace::Trace& trace, const Plan& plan, const Policy& policy,
                const Options& options);

/// `search_min_capacity` on a plan compiled from `trace` (without error).
CapacitySearch search_plan(const trace::Trace& trace, const Plan& plan, const Policy& policy,
                           const Options& options);

/// `recorded` on a plan compiled from `trace`.
std::optional<Result> recorded_plan(const trace::Trace& trace, const Plan& plan,
                                    const Options& options);

/// Throws `InvalidArgument` if `policy` cannot begin with `start`, naming the policies that can.
void require_start(const Policy& policy, Start start);

/// The fields every row of a trace shares: trace, device, policy, start, peak_live, events.
Result result_header(const trace::Trace& trace, const Plan& plan, const std::string& policy,
                     const std::string& start);

/// Copies a replay's device-call counts and their simulated time into its row.
void set_device_calls(Result& row, const DeviceCalls& calls);

/// About `points` points of the timeline, evenly spaced over the events, always including the
/// events after which live bytes and reserved bytes first reach their peaks.
/// `reserved_after[i]` is the reserved bytes after event i.
std::vector<TimelinePoint> sample_timeline(const trace::Trace& trace, const Plan& plan,
                                           const std::vector<std::uint64_t>& reserved_after,
                                           std::size_t points, std::size_t peak_reserved_event);

}  // namespace cistern::replay::detail
