// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The three renderings of replay results: the text table (terminal), JSON (scripts), and a
// self-contained HTML report (people). All of them take the results grouped per trace; none
// of them runs anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "replay/engine.hpp"

namespace cistern::cli {

/// The results of one trace: every policy's row (PyTorch's "recorded" row first, if any) and
/// what the report says about the trace itself.
struct TraceResults {
  std::string trace;   ///< the path as the user wrote it
  std::string format;  ///< "pytorch", "lifetimes", ...
  int device = 0;
  std::string start = "cold";  ///< "cold" or "warm"
  std::uint64_t peak_live = 0;
  std::uint64_t allocations = 0;  ///< alloc events in the window
  std::uint64_t events = 0;       ///< all events in the window
  std::uint64_t live_before = 0;  ///< bytes live when the window opened
  std::vector<replay::Result> results;
  /// The trace itself, for what the report derives from its events (the largest live
  /// allocations at a moment, their call stacks); null when the rows came without it.
  const trace::Trace* source = nullptr;
};

/// Groups `results` (in any order) by trace and device, keeping the first-seen order of traces
/// and putting the "recorded" row first in each group. `traces` supplies the per-trace facts;
/// it is matched by source path and device.
std::vector<TraceResults> group_results(const std::vector<const trace::Trace*>& traces,
                                        std::vector<replay::Result> results,
                                        const std::string& start);

// --- text table ---------------------------------------------------------------------------------

/// The table printed by `cistern replay`: one block per trace, one row per policy, sizes in
/// human units. Fits a 100-column terminal for policy labels up to 22 characters; longer
/// labels get a line of their own.
std::string format_table(const std::vector<TraceResults>& traces, std::uint64_t capacity);

/// The PyTorch settings of a torch row that make it more than plain `torch` on PyTorch's
/// defaults, each with where it came from: "expandable_segments:True (recorded)"; "" when the
/// row ran PyTorch's defaults and its policy gave no setting (and for other policies).
std::string format_settings(const replay::Result& r);

/// "4.01%" for an overhead fraction, "-" for none.
std::string format_percent(const std::optional<double>& fraction);
/// "1.032" for min_capacity / peak_live, "-" when either is missing or zero.
std::string format_ratio(const std::optional<std::uint64_t>& min_capacity, std::uint64_t peak_live);

// --- JSON ---------------------------------------------------------------------------------------

/// `{"version": ..., "cost_model": ..., "results": [row, ...]}` with one row per result, sizes in
/// bytes and null where a figure was not computed; `cost_model` is the model that priced
/// device_ms (`cost_model_json`). Fields of a row: trace, device, policy, start, settings (torch:
/// per PyTorch setting its value and source - recorded, given or default; null for other
/// policies), capacity, peak_live, peak_reserved, overhead, min_capacity, events, ooms,
/// device_allocs, device_frees, maps, unmaps, handle_creates, handle_releases, syncs, [passes:
/// with --repeat, per pass
/// peak_reserved, device_allocs, device_frees, maps, unmaps], ns_per_op, device_ms, error.
std::string format_json(const std::vector<TraceResults>& traces, const replay::CostModel& costs);
/// `{"name": "h200", "fields": {"alloc_ns": ..., ...}}`: which model priced a run and its every
/// field in ns (a file that `cistern replay --cost-model FILE` reads back).
nlohmann::ordered_json cost_model_json(const replay::CostModel& costs);
/// One result as a row of `format_json` (the fields above).
nlohmann::ordered_json result_json(const replay::Result& r);

// --- HTML ---------------------------------------------------------------------------------------

/// Facts about the run that the HTML report prints in its header.
struct ReportInfo {
  std::string version;       ///< cistern's version
  std::string generated;     ///< when, as text (ISO 8601)
  std::string command_line;  ///< how the report was made
  std::uint64_t capacity = 0;
};

/// The present time for a report's header: "2026-01-31 12:00 UTC".
std::string now_iso8601();

/// A self-contained HTML page (inline CSS, SVG and a little JS; nothing fetched): per trace a
/// memory timeline (live bytes and every policy's reserved bytes), the results table, the
/// segment map at each policy's peak, and where the memory went: the largest live allocations
/// with their call stacks at each policy's peak and, with a slider, at any timeline point.
std::string format_html(const std::vector<TraceResults>& traces, const ReportInfo& info);

}  // namespace cistern::cli
