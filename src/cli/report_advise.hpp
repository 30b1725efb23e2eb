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

/// Per trace: the baseline, the `rows` best configurations (min_capacity, saving against the
/// baseline, cudaMalloc calls, page maps, simulated device ms, the PYTORCH_CUDA_ALLOC_CONF), and
/// cistern's own figure.
std::string format_advice_table(const std::vector<replay::Advice>& advice, std::size_t rows);

/// `{"results": [{"trace", "device", "baseline": {"config", "min_capacity"}, "defaults": {...},
/// "best": {...}, "cistern": {"min_capacity"}, "seconds", "candidates": [{"config",
/// "min_capacity", "device_allocs", "device_maps", "device_ms"}, ...]}]}`, best first.
nlohmann::ordered_json advice_json(const std::vector<replay::Advice>& advice);

/// One trace's section of the HTML report: the `rows` best configurations as a table.
std::string advice_section_html(const replay::Advice& advice, std::size_t rows);

/// A self-contained HTML page with every trace's section.
std::string format_advice_html(const std::vector<replay::Advice>& advice, const ReportInfo& info);

}  // namespace cistern::cli
