// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The three renderings of `cistern advise`: the table, the JSON document and the HTML report.
#include "cli/report_advise.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cistern/types.hpp"
#include "cli/report_html_assets.hpp"
#include "cli/report_html_util.hpp"

namespace cistern::cli {
namespace {

/// The variable PyTorch reads its allocator options from, and the older name (the only one
/// PyTorch 2.9 and earlier read; later releases read it too, ahead of the new one).
constexpr const char* kVariable = "PYTORCH_ALLOC_CONF";
constexpr const char* kOldVariable = "PYTORCH_CUDA_ALLOC_CONF";

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

/// "0.37% less than" / "1.20% more than" / "the same as": `value` against `reference`.
std::string relative_text(std::uint64_t value, std::uint64_t reference) {
  if (value == reference || reference == 0) return "the same as";
  const double delta = std::abs(static_cast<double>(value) - static_cast<double>(reference)) /
                       static_cast<double>(reference);
  return fmt::format("{:.2f}% {} than", 100.0 * delta, value < reference ? "less" : "more");
}

/// The shell lines that set `config`: the variable, then the older one as a comment.
std::string export_lines(const std::string& config, const std::string& indent) {
  if (config.empty()) {
    return fmt::format("{}PyTorch's defaults need the least: leave {} and {} unset\n", indent,
                       kVariable, kOldVariable);
  }
  return fmt::format(
      "{0}export {1}='{3}'\n"
      "{0}# PyTorch 2.9 and earlier read only {2}; where it is set, it wins:\n"
      "{0}# export {2}='{3}'\n",
      indent, kVariable, kOldVariable, config);
}

/// cistern's figure against the best PyTorch setting, in words.
std::string cistern_text(const replay::Advice& a) {
  if (!a.cistern.error.empty())
    return fmt::format("cistern (its defaults) could not replay it: {}", a.cistern.error);
  if (a.candidates.empty())
    return fmt::format("cistern (its defaults) needs {}", format_bytes(a.cistern.min_capacity));
  const replay::AdviceCandidate& best = a.candidates.front();
  return fmt::format("cistern (its defaults) needs {}, {} the best PyTorch setting ({})",
                     format_bytes(a.cistern.min_capacity),
                     relative_text(a.cistern.min_capacity, best.min_capacity),
                     format_bytes(best.min_capacity));
}

nlohmann::ordered_json config_json(const replay::AdviceCandidate& c) {
  return {{"config", c.config}, {"min_capacity", c.min_capacity}};
}

nlohmann::ordered_json figures_json(const replay::AdviceCandidate& c) {
  return {{"config", c.config},
          {"min_capacity", c.min_capacity},
          {"device_allocs", c.device_allocs},
          {"device_maps", c.device_maps},
          {"device_ms", c.device_ms}};
}

/// cistern's row: its figures, and its saving against the best PyTorch setting (a fraction of
/// that setting's min_capacity; negative when cistern needs more).
nlohmann::ordered_json cistern_json(const replay::Advice& a) {
  nlohmann::ordered_json out;
  out["policy"] = "cistern";
  if (!a.cistern.error.empty()) {
    out["min_capacity"] = nullptr;
    out["error"] = a.cistern.error;
    return out;
  }
  out["min_capacity"] = a.cistern.min_capacity;
  out["device_allocs"] = a.cistern.device_allocs;
  out["device_maps"] = a.cistern.device_maps;
  out["device_ms"] = a.cistern.device_ms;
  if (a.candidates.empty() || a.candidates.front().min_capacity == 0) {
    out["saving_vs_best"] = nullptr;
  } else {
    const auto best = static_cast<double>(a.candidates.front().min_capacity);
    out["saving_vs_best"] = (best - static_cast<double>(a.cistern.min_capacity)) / best;
  }
  return out;
}

}  // namespace

std::string format_advice_table(const std::vector<replay::Advice>& advice, std::size_t rows) {
  std::string out;
  for (const replay::Advice& a : advice) {
    out += fmt::format("{} (device {}): {} configurations in {:.1f} s\n", a.trace, a.device,
                       a.candidates.size(), a.seconds);
    out += fmt::format("  baseline (the trace's settings): {} needs {}\n", shown(a.baseline.config),
                       format_bytes(a.baseline.min_capacity));
    out += fmt::format("  {:>7} {:>12} {:>8} {:>10} {:>6} {:>10}  {}\n", "rank", "min_capacity",
                       "saving", "cudaMalloc", "maps", "device_ms", kVariable);
    for (std::size_t i = 0; i < a.candidates.size() && i < rows; ++i) {
      const replay::AdviceCandidate& c = a.candidates[i];
      out += fmt::format("  {:>7} {:>12} {:>8} {:>10} {:>6} {:>10.2f}  {}\n", c.rank,
                         format_bytes(c.min_capacity),
                         saving_text(c.min_capacity, a.baseline.min_capacity), c.device_allocs,
                         c.device_maps, c.device_ms, shown(c.config));
    }
    if (a.cistern.error.empty()) {
      out += fmt::format("  {:>7} {:>12} {:>8} {:>10} {:>6} {:>10.2f}  {}\n", "cistern",
                         format_bytes(a.cistern.min_capacity),
                         saving_text(a.cistern.min_capacity, a.baseline.min_capacity),
                         a.cistern.device_allocs, a.cistern.device_maps, a.cistern.device_ms,
                         "(cistern's own allocator, its defaults)");
    }
    out += "  " + cistern_text(a) + "\n";
    if (!a.candidates.empty()) out += export_lines(a.candidates.front().config, "  ");
    out += "\n";
  }
  return out;
}

nlohmann::ordered_json advice_json(const std::vector<replay::Advice>& advice) {
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const replay::Advice& a : advice) {
    nlohmann::ordered_json candidates = nlohmann::ordered_json::array();
    for (const replay::AdviceCandidate& c : a.candidates) {
      candidates.push_back(figures_json(c));
      candidates.back()["rank"] = c.rank;
    }
    nlohmann::ordered_json row;
    row["trace"] = a.trace;
    row["device"] = a.device;
    row["baseline"] = config_json(a.baseline);
    row["defaults"] = config_json(a.defaults);
    if (a.candidates.empty()) {
      row["best"] = nullptr;
      row["variables"] = nullptr;
    } else {
      row["best"] = figures_json(a.candidates.front());
      // What to set: "" means leave the variable unset (PyTorch's defaults).
      row["variables"] = {{kVariable, a.candidates.front().config},
                          {kOldVariable, a.candidates.front().config}};
    }
    row["cistern"] = cistern_json(a);
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
      "<p class=\"meta\">baseline (the trace's settings) <code>{}</code> needs <b>{}</b>; {}; "
      "{} configurations searched in {:.1f} s</p>",
      html::esc(shown(a.baseline.config)), format_bytes(a.baseline.min_capacity),
      html::esc(cistern_text(a)), a.candidates.size(), a.seconds);
  if (!a.candidates.empty())
    out += "<pre>" + html::esc(export_lines(a.candidates.front().config, "")) + "</pre>";
  out += fmt::format(
      "<table><thead><tr><th>rank</th><th>{}</th><th>min capacity</th><th>saving</th>"
      "<th>cudaMalloc</th><th>maps</th><th>device ms</th></tr></thead><tbody>",
      kVariable);
  for (std::size_t i = 0; i < a.candidates.size() && i < rows; ++i) {
    const replay::AdviceCandidate& c = a.candidates[i];
    out += fmt::format(
        "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{:.2f}</td></tr>",
        c.rank, html::esc(shown(c.config)), format_bytes(c.min_capacity),
        saving_text(c.min_capacity, a.baseline.min_capacity), c.device_allocs, c.device_maps,
        c.device_ms);
  }
  if (a.cistern.error.empty()) {
    out += fmt::format(
        "<tr><td>cistern</td><td>(cistern's own allocator, its defaults)</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{:.2f}</td></tr>",
        format_bytes(a.cistern.min_capacity),
        saving_text(a.cistern.min_capacity, a.baseline.min_capacity), a.cistern.device_allocs,
        a.cistern.device_maps, a.cistern.device_ms);
  }
  return out + "</tbody></table></section>";
}

std::string format_advice_html(const std::vector<replay::Advice>& advice, const ReportInfo& info) {
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>cistern advise report</title><style>";
  out += html_assets::kStyle;
  out += fmt::format("</style></head><body><main><h1>Which {}?</h1>", kVariable);
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
      "time are those of a replay on a device of the run's capacity. The last row is cistern's "
      "own allocator with its default options, replayed the same way. PyTorch reads its "
      "options from PYTORCH_ALLOC_CONF; releases up to 2.9 read only PYTORCH_CUDA_ALLOC_CONF, "
      "and later ones still read it first when it is set.</p></main></body></html>\n";
  return out;
}

}  // namespace cistern::cli
