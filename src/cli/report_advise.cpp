// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The three renderings of `cistern advise`: the table, the JSON document and the HTML report.
#include "cli/report_advise.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "cistern/types.hpp"
#include "cli/report_html_assets.hpp"
#include "cli/report_html_util.hpp"

namespace cistern::cli {
namespace {

/// A configuration as the user would write it; PyTorch's defaults have no string.
std::string shown(const std::string& config) {
  return config.empty() ? "(PyTorch's defaults)" : config;
}

/// How much less `value` is than `baseline` ("3.2%"; negative when it is more).
std::string saving_text(std::uint64_t value, std::uint64_t baseline) {
  if (baseline == 0) return "-";
  const double saving =
      (static_cast<double>(baseline) - static_cast<double>(value)) / static_cast<double>(baseline);
  return fmt::format("{:.2f}%", 100.0 * saving);
}

nlohmann::ordered_json config_json(const replay::AdviceCandidate& c) {
  return {{"config", c.config}, {"min_capacity", c.min_capacity}};
}

}  // namespace

std::string format_advice_table(const std::vector<replay::Advice>& advice, std::size_t rows) {
  std::string out;
  for (const replay::Advice& a : advice) {
    out += fmt::format("{} (device {}): {} configurations in {:.1f} s\n", a.trace, a.device,
                       a.candidates.size(), a.seconds);
    out += fmt::format("  baseline (the trace's settings): {} needs {}\n", shown(a.baseline.config),
                       format_bytes(a.baseline.min_capacity));
    out += fmt::format("  {:>4} {:>12} {:>8} {:>8} {:>10}  {}\n", "rank", "min_capacity", "saving",
                       "cudaMalloc", "device_ms", "PYTORCH_CUDA_ALLOC_CONF");
    for (std::size_t i = 0; i < a.candidates.size() && i < rows; ++i) {
      const replay::AdviceCandidate& c = a.candidates[i];
      out += fmt::format("  {:>4} {:>12} {:>8} {:>10} {:>6} {:>10.2f}  {}\n", i + 1,
                         format_bytes(c.min_capacity),
                         saving_text(c.min_capacity, a.baseline.min_capacity), c.device_allocs,
                         c.device_maps, c.device_ms, shown(c.config));
    }
    out += fmt::format("  cistern (its defaults) needs {} ({} below the baseline)\n\n",
                       format_bytes(a.cistern_min_capacity),
                       saving_text(a.cistern_min_capacity, a.baseline.min_capacity));
  }
  return out;
}

nlohmann::ordered_json advice_json(const std::vector<replay::Advice>& advice) {
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const replay::Advice& a : advice) {
    nlohmann::ordered_json candidates = nlohmann::ordered_json::array();
    for (const replay::AdviceCandidate& c : a.candidates) {
      candidates.push_back({{"config", c.config},
                            {"min_capacity", c.min_capacity},
                            {"device_allocs", c.device_allocs},
                            {"device_maps", c.device_maps},
                            {"device_ms", c.device_ms}});
    }
    nlohmann::ordered_json row;
    row["trace"] = a.trace;
    row["device"] = a.device;
    row["baseline"] = config_json(a.baseline);
    row["defaults"] = config_json(a.defaults);
    row["best"] =
        a.candidates.empty() ? nlohmann::ordered_json(nullptr) : config_json(a.candidates.front());
    row["cistern"] = {{"min_capacity", a.cistern_min_capacity}};
    row["seconds"] = a.seconds;
    row["candidates"] = std::move(candidates);
    results.push_back(std::move(row));
  }
  return {{"results", std::move(results)}};
}

std::string advice_section_html(const replay::Advice& a, std::size_t rows) {
  std::string out =
      fmt::format("<section><h2>{} &middot; device {}</h2>", html::esc(a.trace), a.device);
  out += fmt::format(
      "<p class=\"meta\">baseline (the trace's settings) <code>{}</code> needs <b>{}</b>; "
      "cistern needs <b>{}</b> ({}); {} configurations searched in {:.1f} s</p>",
      html::esc(shown(a.baseline.config)), format_bytes(a.baseline.min_capacity),
      format_bytes(a.cistern_min_capacity),
      saving_text(a.cistern_min_capacity, a.baseline.min_capacity), a.candidates.size(), a.seconds);
  out +=
      "<table><thead><tr><th>rank</th><th>PYTORCH_CUDA_ALLOC_CONF</th><th>min capacity</th>"
      "<th>saving</th><th>cudaMalloc</th><th>maps</th><th>device ms</th></tr></thead><tbody>";
  for (std::size_t i = 0; i < a.candidates.size() && i < rows; ++i) {
    const replay::AdviceCandidate& c = a.candidates[i];
    out += fmt::format(
        "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{:.2f}</td></tr>",
        i + 1, html::esc(shown(c.config)), format_bytes(c.min_capacity),
        saving_text(c.min_capacity, a.baseline.min_capacity), c.device_allocs, c.device_maps,
        c.device_ms);
  }
  return out + "</tbody></table></section>";
}

std::string format_advice_html(const std::vector<replay::Advice>& advice, const ReportInfo& info) {
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>cistern advise report</title><style>";
  out += html_assets::kStyle;
  out += "</style></head><body><main><h1>Which PYTORCH_CUDA_ALLOC_CONF?</h1>";
  out += fmt::format("<p class=\"meta\">cistern {} &middot; {}</p>", html::esc(info.version),
                     html::esc(info.generated));
  if (!info.command_line.empty())
    out += "<p class=\"meta\"><code>" + html::esc(info.command_line) + "</code></p>";
  for (const replay::Advice& a : advice) out += advice_section_html(a, 25);
  out +=
      "<h3>How to read this</h3><p class=\"note\">Each configuration of PyTorch's caching "
      "allocator was replayed on cistern's emulation of it, from an empty device. <b>Min "
      "capacity</b> is the smallest device (to 2 MiB) on which the whole trace runs without an "
      "out-of-memory error; <b>saving</b> is how much smaller that is than the trace's own "
      "settings need. cudaMalloc calls, page mappings (expandable segments) and their simulated "
      "time are those of a replay on a device of the run's capacity.</p></main></body></html>\n";
  return out;
}

}  // namespace cistern::cli
