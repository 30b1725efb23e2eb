// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern replay --json`: one flat row per (trace, policy), sizes in bytes, null where a figure
// was not computed, keys in a fixed order so that diffs of two runs read well.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/report.hpp"

#ifndef CISTERN_VERSION
#define CISTERN_VERSION "unknown"
#endif

namespace cistern::cli {
namespace {

using Json = nlohmann::ordered_json;

template <class T>
Json or_null(const std::optional<T>& value) {
  return value ? Json(*value) : Json(nullptr);
}

}  // namespace

nlohmann::ordered_json result_json(const replay::Result& r) {
  Json j;
  j["trace"] = r.trace;
  j["device"] = r.device;
  j["policy"] = r.policy;
  j["start"] = r.start;
  if (r.settings.empty()) {
    j["settings"] = nullptr;
  } else {
    Json settings = Json::object();
    for (const replay::SettingUse& use : r.settings) {
      settings[use.key] = {{"value", use.value}, {"source", replay::to_string(use.source)}};
    }
    j["settings"] = std::move(settings);
  }
  j["capacity"] = or_null(r.capacity);
  j["peak_live"] = r.peak_live;
  j["peak_reserved"] = or_null(r.peak_reserved);
  j["overhead"] = or_null(r.overhead);
  j["min_capacity"] = or_null(r.min_capacity);
  if (r.at_min_capacity) {
    const replay::AtCapacity& m = *r.at_min_capacity;
    j["at_min_capacity"] = {{"device_allocs", m.device_allocs},
                            {"device_frees", m.device_frees},
                            {"maps", m.maps},
                            {"unmaps", m.unmaps},
                            {"handle_creates", m.handle_creates},
                            {"syncs", m.syncs},
                            {"device_ms", m.device_ms}};
  }
  j["events"] = r.events;
  j["ooms"] = r.ooms;
  j["device_allocs"] = r.device_allocs;
  j["device_frees"] = r.device_frees;
  j["maps"] = r.device_maps;
  j["unmaps"] = r.device_unmaps;
  j["handle_creates"] = r.handle_creates;
  j["handle_releases"] = r.handle_releases;
  j["syncs"] = r.syncs;
  if (!r.passes.empty()) {
    Json passes = Json::array();
    for (const replay::PassResult& p : r.passes) {
      Json pass;
      pass["peak_reserved"] = p.peak_reserved;
      pass["device_allocs"] = p.device_allocs;
      pass["device_frees"] = p.device_frees;
      pass["maps"] = p.maps;
      pass["unmaps"] = p.unmaps;
      pass["device_calls"] = p.device_calls;
      pass["device_ms"] = p.device_ms;
      if (p.planned) {
        pass["recorded"] = p.recorded;
        pass["plan_hits"] = p.plan_hits;
        pass["idle_fits"] = p.idle_fits;
        pass["fallbacks"] = p.fallbacks;
      }
      passes.push_back(std::move(pass));
    }
    j["passes"] = std::move(passes);
  }
  j["ns_per_op"] = or_null(r.ns_per_op);
  j["device_ms"] = or_null(r.device_ms);
  j["error"] = r.error.empty() ? Json(nullptr) : Json(r.error);
  return j;
}

nlohmann::ordered_json cost_model_json(const replay::CostModel& costs) {
  Json fields = Json::object();
  for (const replay::CostModel::Field& f : replay::CostModel::fields()) {
    fields[f.name] = costs.*f.value;
  }
  return {{"name", costs.name}, {"fields", std::move(fields)}};
}

std::string format_json(const std::vector<TraceResults>& traces, const replay::CostModel& costs) {
  Json rows = Json::array();
  for (const TraceResults& t : traces)
    for (const replay::Result& r : t.results) rows.push_back(result_json(r));
  Json doc;
  doc["version"] = CISTERN_VERSION;
  doc["cost_model"] = cost_model_json(costs);
  doc["results"] = std::move(rows);
  // Invalid UTF-8 in a path must not abort the report: replace it.
  return doc.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace cistern::cli
