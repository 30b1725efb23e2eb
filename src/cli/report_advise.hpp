// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// What `cistern advise` prints and writes: a table, a JSON document, an HTML report.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/report.hpp"
#include "replay/advise.hpp"

namespace cistern::cli {

/// Per trace: the baseline, the `rows` best configurations (rank, shared by equal figures;
/// min_capacity, saving against the
/// baseline, cudaMalloc calls, page maps, simulated device ms, the PYTORCH_ALLOC_CONF string),
/// a row for cistern's own allocator, cistern's figure against the best setting in words, and
/// the shell lines that set the best one (`export PYTORCH_ALLOC_CONF='...'`, then the older
/// PYTORCH_CUDA_ALLOC_CONF as a comment).
std::string format_advice_table(const std::vector<replay::Advice>& advice, std::size_t rows);

/// `{"results": [{"trace", "device", "baseline": {"config", "min_capacity"}, "defaults": {...},
/// "best": {"config", "min_capacity", "device_allocs", "device_maps", "device_ms"},
/// "variables": {"PYTORCH_ALLOC_CONF": best config, "PYTORCH_CUDA_ALLOC_CONF": the same} ("" =
/// leave unset), "cistern": {"policy": "cistern", "min_capacity", "device_allocs",
/// "device_maps", "device_ms", "saving_vs_best" (fraction of best's min_capacity, negative when
/// cistern needs more)} (or {"policy", "min_capacity": null, "error"}), "seconds",
/// "candidates": [{as best, "rank"}, ...]}]}`, candidates best first; candidates with the same
/// figures share a rank (AdviceCandidate::rank).
nlohmann::ordered_json advice_json(const std::vector<replay::Advice>& advice);

/// One trace's section of the HTML report: the `rows` best configurations as a table.
std::string advice_section_html(const replay::Advice& advice, std::size_t rows);

/// A self-contained HTML page with every trace's section.
std::string format_advice_html(const std::vector<replay::Advice>& advice, const ReportInfo& info);

}  // namespace cistern::cli
