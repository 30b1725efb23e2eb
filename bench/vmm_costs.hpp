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

/// A straight line `intercept_ns + slope_ns x n` through (n, ns) points by least squares of the
/// relative errors (weights 1/ns^2), so that a call over one mapping counts as much as one over
/// 512. Not clamped: an intercept near 0 says that the call costs per mapping and nothing per
/// call. Both zero for fewer than two distinct n.
struct SlopeFit {
  double intercept_ns = 0;
  double slope_ns = 0;
};
SlopeFit fit_relative(const std::vector<std::pair<double, double>>& n_ns);

/// The numbers of 2 MiB mappings that bench_vmm times one cuMemSetAccess and one cuMemUnmap over
/// (series "set_access_<n>x2mib", "unmap_<n>x2mib"); and the handle mapped whole beside them
/// (series "set_access_1x1024mib", "unmap_1x1024mib": one handle of 512 granules).
constexpr std::size_t kSpanMappings[] = {1, 8, 64, 512};
constexpr std::size_t kWholeHandleMiB = 1024;

/// The measured series by name; nullptr when absent or empty.
const CallSeries* find_series(const std::vector<CallSeries>& series, const std::string& name);

/// The cost model's figures (docs/cost-model.md) from the measured medians, in ns. Three parts:
/// "fields" holds every field of `replay::CostModel` (`cistern replay --cost-model
/// bench_vmm.json` reads them; null where the series behind a field was not measured):
/// alloc_ns/_per_mib, free_ns/_per_mib, create_ns/_per_mib, release_ns/_per_mib (a line through
/// the smallest and the largest size measured), reserve_ns, release_reservation_ns, map_ns (one
/// 2 MiB cuMemMap), access_ns/_per_mib and unmap_ns/_per_mib (per mapping covered: a line through
/// a 2 MiB mapping's share - the slope of `fits` - and the handle mapped whole), event_record_ns,
/// event_query_ns, sync_stream_ns, sync_event_ns, sync_device_ns;
/// "fits" the per-mapping fits of cuMemSetAccess and cuMemUnmap ({"points": [[n, ns], ...],
/// "intercept_ns", "slope_ns", "whole_handle_mib", "whole_handle_ns"});
/// "calls" finer figures (create_ns_2mib, map_call_ns_20mib, query_sync_pair_ns, ...).
nlohmann::ordered_json cost_model(const std::vector<CallSeries>& series);

/// The per-mapping fits as lines of text, for bench_vmm's output.
std::string fits_text(const nlohmann::ordered_json& results);

/// The whole result: environment, every series' summary, and the cost model.
nlohmann::ordered_json results_json(const nlohmann::ordered_json& environment,
                                    const std::vector<CallSeries>& series, int repetitions);

/// The result as markdown: the calls beside the published figures, then the cost model's table.
std::string results_markdown(const nlohmann::ordered_json& results);

}  // namespace cistern::bench
