// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// bench_vmm's summaries, cost-model figures and output (see vmm_costs.hpp).
#include "vmm_costs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <numeric>
#include <utility>

namespace cistern::bench {
namespace {

using Json = nlohmann::ordered_json;

/// Published figures for the same calls (../shared/reference/vmm-and-planning.md section 4):
/// kvcached's bench_vmm on an A100 with 2 MiB pages, and a second sample (GPU not stated).
struct Published {
  const char* name;
  const char* figure;
};
constexpr Published kPublished[] = {
    {"reserve", "19 (8 GB range)"}, {"create_2mib", "193 (p99 381); 7.6"},
    {"map_2mib", "1.45; 1.05"},     {"set_access_2mib", "36; 20.8"},
    {"unmap_2mib", "25.6; 11.5"},
};

const char* published_figure(const std::string& name) {
  for (const Published& p : kPublished) {
    if (name == p.name) return p.figure;
  }
  return "";
}

/// The median of a series in ns, or null.
Json median_of(const std::vector<CallSeries>& series, const std::string& name) {
  const CallSeries* s = find_series(series, name);
  return s != nullptr ? Json(summarize(s->ns).median) : Json(nullptr);
}

/// The sum of medians, or null if one is missing.
Json sum_of(const std::vector<CallSeries>& series, std::initializer_list<std::string> names) {
  double total = 0;
  for (const std::string& name : names) {
    const Json median = median_of(series, name);
    if (median.is_null()) return nullptr;
    total += median.get<double>();
  }
  return total;
}

/// `fixed_ns` and `per_mib_ns` of the calls "<prefix>_<n>mib" measured at several sizes: a line
/// through the medians at the smallest and the largest size (the model's own derivation: exact
/// at both ends, docs/cost-model.md); null where fewer than two sizes were measured.
std::pair<Json, Json> size_fit(const std::vector<CallSeries>& series, const std::string& prefix) {
  std::vector<std::pair<double, double>> points;
  for (const CallSeries& s : series) {
    if (s.name.rfind(prefix + "_", 0) != 0 || s.ns.empty() || s.bytes == 0) continue;
    // "<prefix>_<digits>mib" only: not the spans ("unmap_8x2mib") of the per-mapping fits.
    const std::string size = s.name.substr(prefix.size() + 1);
    if (size.find('x') != std::string::npos) continue;
    points.emplace_back(static_cast<double>(s.bytes) / (1024.0 * 1024.0), summarize(s.ns).median);
  }
  if (points.size() < 2) return {nullptr, nullptr};
  const auto [small, large] = std::minmax_element(points.begin(), points.end());
  if (large->first <= small->first) return {nullptr, nullptr};
  const LinearFit fit = fit_line({*small, *large});
  return {fit.fixed_ns, fit.per_mib_ns};
}

/// The per-mapping fit of one call over 1, 8, 64, 512 mappings of 2 MiB ("<prefix>_<n>x2mib") and
/// its one handle mapped whole ("<prefix>_1x1024mib"), as the JSON of `fits`.
Json mapping_fit(const std::vector<CallSeries>& series, const std::string& prefix) {
  Json fit;
  Json points = Json::array();
  std::vector<std::pair<double, double>> n_ns;
  for (const std::size_t n : kSpanMappings) {
    const Json median = median_of(series, prefix + "_" + std::to_string(n) + "x2mib");
    if (median.is_null()) continue;
    points.push_back({n, median});
    n_ns.emplace_back(static_cast<double>(n), median.get<double>());
  }
  fit["points"] = std::move(points);
  if (n_ns.size() >= 2) {
    const SlopeFit line = fit_relative(n_ns);
    fit["intercept_ns"] = line.intercept_ns;
    fit["slope_ns"] = line.slope_ns;
  } else {
    fit["intercept_ns"] = nullptr;
    fit["slope_ns"] = nullptr;
  }
  fit["whole_handle_mib"] = kWholeHandleMiB;
  fit["whole_handle_ns"] =
      median_of(series, prefix + "_1x" + std::to_string(kWholeHandleMiB) + "mib");
  return fit;
}

/// The model's fixed part and part per MiB of a call priced per mapping: a line through a 2 MiB
/// mapping's share (the fit's slope) and the handle mapped whole; null where either is missing.
std::pair<Json, Json> per_mapping_fields(const Json& fit) {
  if (fit["slope_ns"].is_null() || fit["whole_handle_ns"].is_null()) return {nullptr, nullptr};
  const LinearFit line =
      fit_line({{2.0, fit["slope_ns"].get<double>()},
                {static_cast<double>(kWholeHandleMiB), fit["whole_handle_ns"].get<double>()}});
  return {line.fixed_ns, line.per_mib_ns};
}

std::string us(const Json& ns) {
  if (ns.is_null()) return "-";
  char text[32];
  const double us = ns.get<double>() / 1000.0;
  std::snprintf(text, sizeof text, "%.2f", std::abs(us) < 0.005 ? 0.0 : us);  // no "-0.00"
  return text;
}

std::string rounded(const Json& ns) {
  return ns.is_null() ? "-" : std::to_string(std::lround(ns.get<double>()));
}

std::string size_text(std::size_t bytes) {
  if (bytes == 0) return "";
  char text[32];
  std::snprintf(text, sizeof text, "%.0f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

}  // namespace

CallSummary summarize(std::vector<double> ns) {
  CallSummary s;
  if (ns.empty()) return s;
  std::sort(ns.begin(), ns.end());
  const std::size_t n = ns.size();
  s.samples = n;
  s.median = n % 2 == 1 ? ns[n / 2] : (ns[n / 2 - 1] + ns[n / 2]) / 2;
  const auto rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(n)));
  s.p99 = ns[std::max<std::size_t>(rank, 1) - 1];
  s.mean = std::accumulate(ns.begin(), ns.end(), 0.0) / static_cast<double>(n);
  s.min = ns.front();
  s.max = ns.back();
  return s;
}

LinearFit fit_line(const std::vector<std::pair<double, double>>& mib_ns) {
  LinearFit fit;
  if (mib_ns.empty()) return fit;
  const auto n = static_cast<double>(mib_ns.size());
  double mean_x = 0;
  double mean_y = 0;
  for (const auto& [x, y] : mib_ns) {
    mean_x += x / n;
    mean_y += y / n;
  }
  double covariance = 0;
  double variance = 0;
  for (const auto& [x, y] : mib_ns) {
    covariance += (x - mean_x) * (y - mean_y);
    variance += (x - mean_x) * (x - mean_x);
  }
  fit.per_mib_ns = variance > 0 ? std::max(0.0, covariance / variance) : 0.0;
  fit.fixed_ns = std::max(0.0, mean_y - fit.per_mib_ns * mean_x);
  return fit;
}

const CallSeries* find_series(const std::vector<CallSeries>& series, const std::string& name) {
  for (const CallSeries& s : series) {
    if (s.name == name && !s.ns.empty()) return &s;
  }
  return nullptr;
}

SlopeFit fit_relative(const std::vector<std::pair<double, double>>& n_ns) {
  double w = 0;
  double wx = 0;
  double wy = 0;
  double wxx = 0;
  double wxy = 0;
  for (const auto& [x, y] : n_ns) {
    if (!(y > 0)) continue;  // a time of 0 carries no relative error
    const double weight = 1.0 / (y * y);
    w += weight;
    wx += weight * x;
    wy += weight * y;
    wxx += weight * x * x;
    wxy += weight * x * y;
  }
  SlopeFit fit;
  const double determinant = w * wxx - wx * wx;
  if (!(determinant > 1e-12 * w * wxx)) return fit;  // fewer than two distinct n
  fit.slope_ns = (w * wxy - wx * wy) / determinant;
  fit.intercept_ns = (wy - fit.slope_ns * wx) / w;
  return fit;
}

Json cost_model(const std::vector<CallSeries>& series) {
  Json fits;
  fits["set_access_per_mapping"] = mapping_fit(series, "set_access");
  fits["unmap_per_mapping"] = mapping_fit(series, "unmap");

  // Every field of replay::CostModel, in its order.
  Json fields;
  const auto [alloc_fixed, alloc_per_mib] = size_fit(series, "cuda_malloc");
  const auto [free_fixed, free_per_mib] = size_fit(series, "cuda_free");
  fields["alloc_ns"] = alloc_fixed;
  fields["alloc_ns_per_mib"] = alloc_per_mib;
  fields["free_ns"] = free_fixed;
  fields["free_ns_per_mib"] = free_per_mib;
  fields["reserve_ns"] = median_of(series, "reserve");
  fields["release_reservation_ns"] = median_of(series, "address_free");
  const auto [create_fixed, create_per_mib] = size_fit(series, "create");
  const auto [release_fixed, release_per_mib] = size_fit(series, "release");
  fields["create_ns"] = create_fixed;
  fields["create_ns_per_mib"] = create_per_mib;
  fields["release_ns"] = release_fixed;
  fields["release_ns_per_mib"] = release_per_mib;
  fields["map_ns"] = median_of(series, "map_2mib");
  const auto [access_fixed, access_per_mib] = per_mapping_fields(fits["set_access_per_mapping"]);
  const auto [unmap_fixed, unmap_per_mib] = per_mapping_fields(fits["unmap_per_mapping"]);
  fields["access_ns"] = access_fixed;
  fields["access_ns_per_mib"] = access_per_mib;
  fields["unmap_ns"] = unmap_fixed;
  fields["unmap_ns_per_mib"] = unmap_per_mib;
  fields["event_record_ns"] = median_of(series, "event_record");
  fields["event_query_ns"] = median_of(series, "event_query");
  fields["sync_stream_ns"] = median_of(series, "stream_sync");
  fields["sync_event_ns"] = median_of(series, "event_sync");
  fields["sync_device_ns"] = median_of(series, "device_sync");

  Json calls;
  for (const char* size : {"2mib", "20mib"}) {
    const std::string s = size;
    calls["create_ns_" + s] = median_of(series, "create_" + s);
    calls["release_ns_" + s] = median_of(series, "release_" + s);
    // One map of the device contract: cuMemMap and cuMemSetAccess of one handle.
    calls["map_call_ns_" + s] = sum_of(series, {"map_" + s, "set_access_" + s});
    calls["unmap_call_ns_" + s] = median_of(series, "unmap_" + s);
  }
  calls["query_sync_pair_ns"] = median_of(series, "query_sync_pair");

  Json model;
  model["fields"] = std::move(fields);
  model["fits"] = std::move(fits);
  model["calls"] = std::move(calls);
  return model;
}

std::string fits_text(const Json& results) {
  std::string text;
  for (const auto& [key, call] :
       {std::pair<const char*, const char*>{"set_access_per_mapping", "cuMemSetAccess"},
        {"unmap_per_mapping", "cuMemUnmap"}}) {
    const Json& fit = results["cost_model"]["fits"][key];
    text += std::string("bench_vmm: ") + call + " over n mappings of 2 MiB:";
    for (const Json& point : fit["points"]) {
      text += " " + std::to_string(point[0].get<std::size_t>()) + ": " + us(point[1]) + " us;";
    }
    text += " per mapping " + us(fit["slope_ns"]) + " us, intercept " + us(fit["intercept_ns"]) +
            " us (least squares of relative errors); one " +
            std::to_string(fit["whole_handle_mib"].get<std::size_t>()) +
            " MiB handle mapped whole: " + us(fit["whole_handle_ns"]) + " us\n";
  }
  return text;
}

Json results_json(const Json& environment, const std::vector<CallSeries>& series, int repetitions) {
  Json doc;
  doc["environment"] = environment;
  doc["repetitions"] = repetitions;
  doc["calls"] = Json::array();
  for (const CallSeries& s : series) {
    const CallSummary summary = summarize(s.ns);
    Json row;
    row["name"] = s.name;
    row["call"] = s.call;
    row["bytes"] = s.bytes;
    row["samples"] = summary.samples;
    row["median_ns"] = summary.median;
    row["p99_ns"] = summary.p99;
    row["mean_ns"] = summary.mean;
    row["min_ns"] = summary.min;
    row["max_ns"] = summary.max;
    doc["calls"].push_back(std::move(row));
  }
  doc["cost_model"] = cost_model(series);
  return doc;
}

std::string results_markdown(const Json& results) {
  const Json& env = results["environment"];
  std::string md = "## Virtual-memory call costs (bench_vmm)\n\n";
  md += "Device: " + env["device"].get<std::string>() + ", CUDA runtime " +
        std::to_string(env["cuda_runtime"].get<int>()) + ", driver " +
        std::to_string(env["cuda_driver"].get<int>()) + "; " +
        std::to_string(results["repetitions"].get<int>()) +
        " repetitions per call, one thread, each call timed alone. Published: "
        "../shared/reference/vmm-and-planning.md section 4 (A100; a second sample).\n\n";
  md +=
      "| name | call | size | median us | p99 us | min us | samples | published us |\n"
      "|---|---|---:|---:|---:|---:|---:|---|\n";
  for (const Json& row : results["calls"]) {
    const std::string name = row["name"];
    md += "| " + name + " | " + row["call"].get<std::string>() + " | " +
          size_text(row["bytes"].get<std::size_t>()) + " | " + us(row["median_ns"]) + " | " +
          us(row["p99_ns"]) + " | " + us(row["min_ns"]) + " | " +
          std::to_string(row["samples"].get<std::size_t>()) + " | " + published_figure(name) +
          " |\n";
  }
  md +=
      "\n### For the cost model (replay::CostModel, docs/cost-model.md; medians, ns; "
      "`cistern replay --cost-model bench_vmm.json` reads them)\n\n"
      "| field | measured ns |\n|---|---:|\n";
  for (const auto& [key, value] : results["cost_model"]["fields"].items()) {
    md += "| `" + key + "` | " + rounded(value) + " |\n";
  }
  md +=
      "\nPer-mapping fits (one call over n mappings of 2 MiB; least squares of the relative "
      "errors; the handle mapped whole beside them):\n\n"
      "| call | n: median us | per mapping us | intercept us | whole handle us |\n"
      "|---|---|---:|---:|---:|\n";
  for (const auto& [key, fit] : results["cost_model"]["fits"].items()) {
    std::string points;
    for (const Json& point : fit["points"]) {
      points += (points.empty() ? "" : ", ") + std::to_string(point[0].get<std::size_t>()) + ": " +
                us(point[1]);
    }
    md += "| " + key;
    md += " | " + points;
    md += " | " + us(fit["slope_ns"]);
    md += " | " + us(fit["intercept_ns"]);
    md += " | " + us(fit["whole_handle_ns"]);
    md += " (" + std::to_string(fit["whole_handle_mib"].get<std::size_t>()) + " MiB) |\n";
  }
  md += "\nFiner figures (a model that prices handles, map calls and syncs apart):\n\n";
  md += "| figure | measured ns |\n|---|---:|\n";
  for (const auto& [key, value] : results["cost_model"]["calls"].items()) {
    md += "| `" + key + "` | " + rounded(value) + " |\n";
  }
  return md;
}

}  // namespace cistern::bench
