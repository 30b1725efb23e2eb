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

/// `fixed_ns` and `per_mib_ns` of the calls "<prefix>_<n>mib" measured at several sizes.
std::pair<Json, Json> size_fit(const std::vector<CallSeries>& series, const std::string& prefix) {
  std::vector<std::pair<double, double>> points;
  for (const CallSeries& s : series) {
    if (s.name.rfind(prefix + "_", 0) != 0 || s.ns.empty() || s.bytes == 0) continue;
    points.emplace_back(static_cast<double>(s.bytes) / (1024.0 * 1024.0), summarize(s.ns).median);
  }
  if (points.size() < 2) return {nullptr, nullptr};
  const LinearFit fit = fit_line(points);
  return {fit.fixed_ns, fit.per_mib_ns};
}

std::string us(const Json& ns) {
  if (ns.is_null()) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", ns.get<double>() / 1000.0);
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

Json cost_model(const std::vector<CallSeries>& series) {
  Json fields;
  const auto [alloc_fixed, alloc_per_mib] = size_fit(series, "cuda_malloc");
  const auto [free_fixed, free_per_mib] = size_fit(series, "cuda_free");
  fields["alloc_ns"] = alloc_fixed;
  fields["alloc_ns_per_mib"] = alloc_per_mib;
  fields["free_ns"] = free_fixed;
  fields["free_ns_per_mib"] = free_per_mib;
  // Handles as segments: a fixed cost per call and a cost per MiB, fitted over the sizes timed
  // (null where fewer than two sizes were); maps, access grants and unmaps per call.
  const auto [create_fixed, create_per_mib] = size_fit(series, "create");
  const auto [release_fixed, release_per_mib] = size_fit(series, "release");
  fields["create_ns"] = create_fixed;
  fields["create_ns_per_mib"] = create_per_mib;
  fields["release_ns"] = release_fixed;
  fields["release_ns_per_mib"] = release_per_mib;
  fields["map_ns"] = median_of(series, "map_2mib");
  fields["access_ns"] = median_of(series, "set_access_2mib");
  fields["unmap_ns"] = median_of(series, "unmap_2mib");
  // Each further mapping one cuMemUnmap covers: ten mappings in one call against one alone.
  const Json one = median_of(series, "unmap_2mib");
  const Json ten = median_of(series, "unmap_10x2mib");
  fields["unmap_extra_ns"] =
      one.is_null() || ten.is_null()
          ? Json()
          : Json(std::max(0.0, (ten.get<double>() - one.get<double>()) / 9.0));
  fields["event_ns"] = median_of(series, "event_query");

  Json calls;
  calls["reserve_ns"] = median_of(series, "reserve");
  calls["release_reservation_ns"] = median_of(series, "address_free");
  for (const char* size : {"2mib", "20mib"}) {
    const std::string s = size;
    calls["create_ns_" + s] = median_of(series, "create_" + s);
    calls["release_ns_" + s] = median_of(series, "release_" + s);
    // One map of the device contract: cuMemMap and cuMemSetAccess over the run.
    calls["map_call_ns_" + s] = sum_of(series, {"map_" + s, "set_access_" + s});
    calls["unmap_call_ns_" + s] = median_of(series, "unmap_" + s);
  }
  calls["set_access_10x2mib_ns"] = median_of(series, "set_access_10x2mib");
  calls["unmap_10x2mib_ns"] = median_of(series, "unmap_10x2mib");
  calls["event_record_ns"] = median_of(series, "event_record");
  calls["event_query_ns"] = median_of(series, "event_query");
  calls["sync_ns"] = median_of(series, "stream_sync");
  calls["query_sync_pair_ns"] = median_of(series, "query_sync_pair");
  calls["device_sync_ns"] = median_of(series, "device_sync");

  Json model;
  model["fields"] = std::move(fields);
  model["calls"] = std::move(calls);
  return model;
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
      "\n### For the cost model (replay::CostModel, docs/cost-model.md; medians, ns)\n\n"
      "| field | measured ns |\n|---|---:|\n";
  for (const auto& [key, value] : results["cost_model"]["fields"].items()) {
    md += "| `" + key + "` | " + rounded(value) + " |\n";
  }
  md += "\nFiner figures (a model that prices handles, map calls and syncs apart):\n\n";
  md += "| figure | measured ns |\n|---|---:|\n";
  for (const auto& [key, value] : results["cost_model"]["calls"].items()) {
    md += "| `" + key + "` | " + rounded(value) + " |\n";
  }
  return md;
}

}  // namespace cistern::bench
