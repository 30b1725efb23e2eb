// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern replay --backend cuda`: the replays one after the other on the GPU, and their table
// and JSON (see device_replay.hpp).
#include "cli/device_replay.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cistern/errors.hpp"
#include "cli/cli.hpp"
#include "cli/progress.hpp"
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

Json row(const replay::DeviceResult& d) {
  const replay::Result& r = d.result;
  Json j = result_json(r);  // the simulated replay's fields, then the measured ones
  j["allocator_ns_per_op"] = or_null(d.allocator_ns_per_op);
  j["device_real_ms"] = r.error.empty() ? Json(d.real.total_ms()) : Json(nullptr);
  j["device_real_segment_ms"] = d.real.segment_ms;
  j["device_real_vmm_ms"] = d.real.vmm_ms;
  j["device_real_event_ms"] = d.real.event_ms;
  j["touched_bytes"] = d.touched_bytes;
  return j;
}

std::string ms(const std::optional<double>& value) {
  return value ? fmt::format("{:.1f}", *value) : std::string("-");
}

std::string ns(const std::optional<double>& value) {
  return value ? fmt::format("{:.0f}", *value) : std::string("-");
}

/// 3 if a replay could not finish, else 4 if one ran out of memory, else 0; says why on stderr.
int exit_status(const std::vector<replay::DeviceResult>& results) {
  bool failed = false;
  bool oom = false;
  for (const replay::DeviceResult& d : results) {
    if (!d.result.error.empty()) {
      std::cerr << "cistern: " << d.result.trace << ": " << d.result.policy << ": "
                << d.result.error << "\n";
      failed = true;
    }
    oom = oom || d.result.ooms > 0;
  }
  if (failed) return kExitBadInput;
  if (oom) {
    std::cerr << "cistern: out of memory: some replays failed allocations on the GPU (the ooms "
                 "column)\n";
    return kExitOutOfMemory;
  }
  return kExitOk;
}

}  // namespace

std::string format_device_table(const std::vector<replay::DeviceResult>& results) {
  std::string out = fmt::format(
      "{:<28} {:<22} {:>11} {:>11} {:>9} {:>5} {:>13} {:>8} {:>8} {:>10} "
      "{:>10}\n",
      "trace", "policy", "peak_live", "reserved", "overhead", "ooms", "allocs/frees", "ns/op",
      "alloc ns", "sim ms", "real ms");
  for (const replay::DeviceResult& d : results) {
    const replay::Result& r = d.result;
    const std::string trace = std::filesystem::path(r.trace).filename().string();
    if (!r.error.empty()) {
      out += fmt::format("{:<28} {:<22} error: {}\n", trace, r.policy, r.error);
      continue;
    }
    out += fmt::format(
        "{:<28} {:<22} {:>11} {:>11} {:>9} {:>5} {:>13} {:>8} {:>8} {:>10} {:>10}\n", trace,
        r.policy, format_bytes(r.peak_live), format_bytes(r.peak_reserved.value_or(0)),
        format_percent(r.overhead), r.ooms, fmt::format("{}/{}", r.device_allocs, r.device_frees),
        ns(r.ns_per_op), ns(d.allocator_ns_per_op), ms(r.device_ms), ms(d.real.total_ms()));
  }
  return out;
}

std::string format_device_json(const std::vector<replay::DeviceResult>& results,
                               const DeviceBackend& backend, bool touch,
                               const replay::CostModel& costs) {
  Json rows = Json::array();
  for (const replay::DeviceResult& d : results) rows.push_back(row(d));
  Json doc;
  doc["version"] = CISTERN_VERSION;
  doc["backend"] = "cuda";
  doc["device"] = backend.device->name();
  doc["virtual_memory"] = backend.device->supports_virtual_memory();
  doc["device_note"] = backend.note;
  doc["touch"] = touch;
  doc["cost_model"] = cost_model_json(costs);  // what priced the simulated device_ms
  doc["results"] = std::move(rows);
  return doc.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

int run_device_replay(const DeviceReplayRequest& request) {
  DeviceBackend backend;
  try {
    backend = open_cuda_backend(request.device, request.touch);
  } catch (const DeviceError& e) {
    std::cerr << e.what() << "\n";
    return kExitNoDevice;
  }
  const std::string device = backend.device->name();
  if (!request.quiet) std::cerr << "cistern: replaying on " << device << "\n";
  if (!backend.note.empty()) std::cerr << "cistern: " << device << ": " << backend.note << "\n";
  std::vector<replay::DeviceResult> results;
  Progress progress("replay on " + device, !request.quiet);
  const std::size_t total = request.traces.size() * request.policies.size();
  for (const trace::Trace* t : request.traces) {
    for (const replay::Policy& policy : request.policies) {
      results.push_back(
          replay::run_on_device(*t, policy, *backend.device, backend.hooks, request.options));
      progress.update(results.size(), total);
    }
  }
  progress.finish();
  const bool stdout_taken = request.json == "-";
  if (!stdout_taken && !request.quiet) std::cout << format_device_table(results);
  if (!request.json.empty()) {
    write_output(request.json,
                 format_device_json(results, backend, request.touch, request.options.costs),
                 "--json");
  }
  return exit_status(results);
}

}  // namespace cistern::cli
