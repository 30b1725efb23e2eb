// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// What bench_vmm reports, apart from the measuring itself (which needs a GPU): the times of single
// calls summarised (median, p99, ...), the cost model's figures derived from them, and the JSON
// and markdown output. Kept apart so that `bench_vmm --self-test` checks all of it without a GPU.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cistern::bench {

/// The times of one kind of call, one sample per call.
struct CallSeries {
  std::string name;        ///< e.g. "create_2mib"
  std::string call;        ///< the API function, e.g. "cuMemCreate"
  std::size_t bytes = 0;   ///< the size the call was made with (0: none)
  std::vector<double> ns;  ///< one sample per call
};

/// Order statistics of a series. `p99` is the nearest-rank 99th percentile (the smallest sample
/// at or above 99% of them); `median` averages the two middle samples of an even count.
struct CallSummary {
  std::size_t samples = 0;
  double median = 0;
  double p99 = 0;
  double mean = 0;
  double min = 0;
  double max = 0;
};

/// Summarises `ns` (any order). All zero for no samples.
CallSummary summarize(std::vector<double> ns);

/// A straight line through (MiB, ns) points by least squares: `fixed_ns + per_mib_ns x MiB`,
/// both clamped at 0 (a measurement noisier than the slope must not give a negative price).
struct LinearFit {
  double fixed_ns = 0;
  double per_mib_ns = 0;
};
LinearFit fit_line(const std::vector<std::pair<double, double>>& mib_ns);

/// The measured series by name; nullptr when absent or empty.
const CallSeries* find_series(const std::vector<CallSeries>& series, const std::string& name);

/// The cost model's figures (docs/cost-model.md) from the measured medians, in ns. Two parts:
/// "fields" holds the fields the model has (alloc_ns, alloc_ns_per_mib, free_ns, free_ns_per_mib,
/// create_ns, create_ns_per_mib, release_ns, release_ns_per_mib, map_ns, access_ns, unmap_ns,
/// unmap_extra_ns, event_ns), each a drop-in replacement for its default;
/// "calls" the finer figures a model that prices handle creation, per-call mapping and reclaim's
/// synchronisations apart takes (create_ns_2mib, map_call_ns_20mib, sync_ns, ...). A figure whose
/// series was not measured is null.
nlohmann::ordered_json cost_model(const std::vector<CallSeries>& series);

/// The whole result: environment, every series' summary, and the cost model.
nlohmann::ordered_json results_json(const nlohmann::ordered_json& environment,
                                    const std::vector<CallSeries>& series, int repetitions);

/// The result as markdown: the calls beside the published figures, then the cost model's table.
std::string results_markdown(const nlohmann::ordered_json& results);

}  // namespace cistern::bench
