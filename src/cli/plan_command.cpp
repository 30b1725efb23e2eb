// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern plan TRACE...`: plan every allocation of each trace into one arena (src/plan) and
// report the arena against the lower bound (peak live) and against the capacity a minimalloc
// file names (`<name>.<capacity>.csv`); write the plan (docs/plan-format.md) and JSON rows.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "cistern/types.hpp"
#include "cli/cli.hpp"
#include "cli/trace_args.hpp"
#include "plan/planner.hpp"
#include "plan/trace_buffers.hpp"
#include "trace/readers.hpp"

namespace cistern::cli {
namespace {

struct PlanArgs {
  std::vector<std::string> traces;
  TraceArgs input;
  double time_limit_s = 1;
  std::uint64_t node_limit = 0;
  std::string capacity;
  std::string alignment = "1";
  std::string page_size;
  std::string out;
  std::string json;
};

/// One trace's outcome.
struct Row {
  std::string trace;
  std::size_t buffers = 0;
  plan::Placement placement;
  std::optional<std::uint64_t> capacity;
};

/// The capacity a minimalloc benchmark file names: "A.1048576.csv" -> 1048576.
std::optional<std::uint64_t> capacity_in_name(const std::string& path) {
  static const std::regex pattern(R"(.*\.([0-9]{1,18})\.csv(\.gz)?)");
  std::smatch match;
  const std::string name = std::filesystem::path(path).filename().string();
  if (!std::regex_match(name, match, pattern)) return std::nullopt;
  return std::stoull(match[1].str());
}

std::uint64_t bytes_flag(const std::string& text, const char* flag) {
  try {
    return parse_bytes(text);
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("{}: {}", flag, e.what()));
  }
}

plan::Options planner_options(const PlanArgs& args) {
  plan::Options options;
  options.time_limit_s = args.time_limit_s;
  options.node_limit = args.node_limit;
  options.alignment = bytes_flag(args.alignment, "--alignment");
  if (!args.page_size.empty()) options.page_size = bytes_flag(args.page_size, "--page-size");
  return options;
}

std::string ratio(std::uint64_t a, std::optional<std::uint64_t> b) {
  if (!b || *b == 0) return "-";
  return fmt::format("{:.4f}", static_cast<double>(a) / static_cast<double>(*b));
}

void print_table(const std::vector<Row>& rows, bool pages) {
  std::cout << fmt::format("{:<40} {:>8} {:>14} {:>14} {:>14} {:>8} {:>14} {:>8} {:>8} {:>8}{}\n",
                           "trace", "buffers", "peak_live", "greedy", "arena", "/live", "capacity",
                           "/cap", "optimal", "seconds", pages ? "    pages" : "");
  for (const Row& r : rows) {
    const plan::Placement& p = r.placement;
    std::cout << fmt::format(
        "{:<40} {:>8} {:>14} {:>14} {:>14} {:>8} {:>14} {:>8} {:>8} {:>8.3f}{}\n", r.trace,
        r.buffers, p.peak_live, p.greedy_arena, p.arena, ratio(p.arena, p.peak_live),
        r.capacity ? std::to_string(*r.capacity) : "-", ratio(p.arena, r.capacity),
        p.optimal ? "yes" : "no", p.seconds, pages ? fmt::format(" {:>8}", p.peak_pages) : "");
  }
}

std::string json_rows(const std::vector<Row>& rows, const plan::Options& options) {
  nlohmann::json results = nlohmann::json::array();
  for (const Row& r : rows) {
    const plan::Placement& p = r.placement;
    nlohmann::json row = {{"trace", r.trace},         {"arena", p.arena},
                          {"peak_live", p.peak_live}, {"capacity", nullptr},
                          {"seconds", p.seconds},     {"greedy_arena", p.greedy_arena},
                          {"buffers", r.buffers},     {"optimal", p.optimal},
                          {"search_nodes", p.nodes},  {"peak_pages", nullptr}};
    if (r.capacity) row["capacity"] = *r.capacity;
    if (options.page_size != 0) row["peak_pages"] = p.peak_pages;
    results.push_back(std::move(row));
  }
  return nlohmann::json{{"results", results}}.dump(2) + "\n";
}

int run_plan(const PlanArgs& args) {
  if (!args.out.empty() && args.traces.size() != 1) {
    throw UsageError("--out writes one plan: give exactly one trace with it");
  }
  const plan::Options options = planner_options(args);
  std::optional<std::uint64_t> capacity;
  if (!args.capacity.empty()) capacity = bytes_flag(args.capacity, "--capacity");
  const trace::ReadOptions read = read_options(args.input);
  check_output_path(args.out, "--out");
  check_output_path(args.json, "--json");
  std::vector<Row> rows;
  for (const std::string& path : args.traces) {
    const trace::Trace trace = trace::read_trace(path, read);
    trace::require_history(trace);
    const plan::TraceBuffers buffers = plan::buffers_of(trace);
    Row row{path, buffers.buffers.size(), plan::plan(buffers.buffers, options),
            capacity ? capacity : capacity_in_name(path)};
    if (!args.out.empty()) {
      write_output(args.out, plan::format_plan(buffers, row.placement, path, options.alignment),
                   "--out");
    }
    rows.push_back(std::move(row));
  }
  if (args.out != "-" && args.json != "-") print_table(rows, options.page_size != 0);
  if (!args.json.empty()) write_output(args.json, json_rows(rows, options), "--json");
  return kExitOk;
}

}  // namespace

Command add_plan_command(CLI::App& parent) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* app = parent.add_subcommand(
      "plan",
      "Plan every allocation of each trace into one arena ahead of time (greedy by size, then "
      "a search) and report the arena against peak_live and the capacity a minimalloc file "
      "names");
  app->add_option("traces", args->traces, "Trace files (any format cistern reads)")->required();
  add_trace_options(*app, args->input);
  app->add_option("--time-limit", args->time_limit_s,
                  "Seconds of improvement search per trace after greedy by size (0: greedy only)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--node-limit", args->node_limit,
                  "Search nodes per trace (0: none); unlike the time limit, the same on every "
                  "machine");
  app->add_option("--capacity", args->capacity,
                  "Compare every arena with this many bytes (default: the capacity in a "
                  "minimalloc file name, NAME.CAPACITY.csv)");
  app->add_option("--alignment", args->alignment,
                  "Every offset a multiple of this, sizes rounded up to it (a power of two)")
      ->capture_default_str();
  app->add_option("--page-size", args->page_size,
                  "Plan for an arena of virtual-memory pages of this size (e.g. 2MiB): prefer "
                  "the placement that touches the fewest pages at its peak");
  app->add_option("--out", args->out, "Write the plan (docs/plan-format.md) to FILE (- stdout)");
  app->add_option("--json", args->json, "Write JSON results to FILE (- for stdout)");
  app->footer(kExitCodesHelp);
  return {app, [args](const std::string&) { return run_plan(*args); }};
}

}  // namespace cistern::cli
