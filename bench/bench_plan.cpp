// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The planner's benchmark (issue 10's targets): MiniMalloc's challenging set A..K at a time limit
// per instance, with greedy by size beside; the SOMAS lists; and a synthetic instance of a
// million buffers. Prints a table and writes JSON:
//
//   bench_plan [--time-limit S] [--out FILE] [--smoke] [--buffers N]
//
// --smoke: one small instance of each kind and a 0.2 s limit (CTest runs it).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "plan/planner.hpp"
#include "plan/trace_buffers.hpp"
#include "support/trace_sizes.hpp"
#include "trace/readers.hpp"

namespace {

struct Args {
  double time_limit_s = 60;
  std::string out = "bench_plan.json";
  bool smoke = false;
  std::size_t synthetic_buffers = 1'000'000;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--time-limit" && has_value) args.time_limit_s = std::atof(argv[++i]);
    else if (a == "--out" && has_value) args.out = argv[++i];
    else if (a == "--buffers" && has_value)
      args.synthetic_buffers = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--smoke") args.smoke = true;
    else {
      std::cerr << "usage: bench_plan [--time-limit S] [--out FILE] [--smoke] [--buffers N]\n";
      std::exit(2);
    }
  }
  if (args.smoke) {
    args.time_limit_s = 0.2;
    args.synthetic_buffers = 20000;
  }
  return args;
}

/// A training-step-like instance: one allocation every two ticks; most buffers short-lived
/// (activations), some for a while, a few for long (weights, optimizer state); sizes
/// log-uniform from 512 B to 64 MiB in 512-byte steps. Fixed seed.
std::vector<cistern::plan::Buffer> synthetic(std::size_t n) {
  std::mt19937_64 rng(20261203);
  std::geometric_distribution<std::uint64_t> shortlived(1.0 / 50), medium(1.0 / 1000),
      longlived(1.0 / 100000);
  std::uniform_real_distribution<double> log_size(9, 26), pick(0, 1);
  std::vector<cistern::plan::Buffer> buffers;
  buffers.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double p = pick(rng);
    const std::uint64_t length = 1 + (p < 0.9     ? shortlived(rng)
                                      : p < 0.999 ? medium(rng)
                                                  : longlived(rng));
    const auto size = static_cast<std::uint64_t>(std::exp2(log_size(rng))) / 512 * 512 + 512;
    buffers.push_back({2 * i, 2 * i + length, size});
  }
  return buffers;
}

/// A placement and the processor time its planning took: the wall time (Placement::seconds)
/// depends on what else the machine runs.
struct Timed {
  cistern::plan::Placement placement;
  double cpu_seconds;
};

Timed timed_plan(const std::vector<cistern::plan::Buffer>& buffers,
                 const cistern::plan::Options& options) {
  const std::clock_t start = std::clock();
  cistern::plan::Placement p = cistern::plan::plan(buffers, options);
  return {std::move(p), static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC};
}

nlohmann::json row(const std::string& name, const Timed& timed,
                   std::optional<std::uint64_t> capacity, std::size_t buffers) {
  const cistern::plan::Placement& p = timed.placement;
  nlohmann::json r = {
      {"cpu_seconds", timed.cpu_seconds}, {"trace", name},        {"arena", p.arena},
      {"peak_live", p.peak_live},         {"capacity", nullptr},  {"seconds", p.seconds},
      {"greedy_arena", p.greedy_arena},   {"optimal", p.optimal}, {"buffers", buffers},
      {"search_nodes", p.nodes}};
  if (capacity) {
    r["capacity"] = *capacity;
    r["solved"] = p.arena <= *capacity;  // met the capacity: solved exactly, as MiniMalloc
  }
  const double cap = capacity ? static_cast<double>(*capacity) : 0;
  std::cout << fmt::format(
      "{:<28} {:>8} {:>14} {:>14} {:>14} {:>8.4f} {:>8} {:>8.2f} {:>8.2f} {:>4}\n", name, buffers,
      p.peak_live, p.greedy_arena, p.arena,
      static_cast<double>(p.arena) / static_cast<double>(p.peak_live),
      capacity ? fmt::format("{:.4f}", static_cast<double>(p.arena) / cap) : std::string("-"),
      p.seconds, timed.cpu_seconds, p.optimal ? "yes" : "no");
  std::cout.flush();
  return r;
}

nlohmann::json plan_file(const std::string& path, const std::string& name, double limit,
                         std::optional<std::uint64_t> capacity) {
  const cistern::trace::Trace trace = cistern::trace::read_trace(path);
  const cistern::plan::TraceBuffers tb = cistern::plan::buffers_of(trace);
  cistern::plan::Options options;
  options.time_limit_s = limit;
  return row(name, timed_plan(tb.buffers, options), capacity, tb.buffers.size());
}

/// MiniMalloc's set in one line and one object: how many instances met their capacity, and the
/// arena / capacity of the others, with greedy by size's beside.
nlohmann::json minimalloc_summary(const nlohmann::json& results) {
  std::size_t instances = 0;
  std::size_t solved = 0;
  double worst = 0;
  double greedy_best = 1e300;
  double greedy_worst = 0;
  for (const nlohmann::json& r : results) {
    if (r["capacity"].is_null()) continue;
    const double cap = r["capacity"].get<double>();
    ++instances;
    solved += r["solved"].get<bool>() ? 1 : 0;
    if (!r["solved"].get<bool>()) worst = std::max(worst, r["arena"].get<double>() / cap);
    greedy_best = std::min(greedy_best, r["greedy_arena"].get<double>() / cap);
    greedy_worst = std::max(greedy_worst, r["greedy_arena"].get<double>() / cap);
  }
  std::cout << fmt::format(
      "minimalloc: {} of {} solved at their capacity; the rest at most {:.4f} x it (greedy by "
      "size: {:.4f}-{:.4f} x)\n",
      solved, instances, worst, greedy_best, greedy_worst);
  return {{"instances", instances},
          {"solved", solved},
          {"worst_unsolved_ratio",
           instances == solved ? nlohmann::json(nullptr) : nlohmann::json(worst)}};
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const std::string traces = cistern::testing::shared_dir() + "/traces";
  std::cout << fmt::format("{:<28} {:>8} {:>14} {:>14} {:>14} {:>8} {:>8} {:>8} {:>8} {:>4}\n",
                           "trace", "buffers", "peak_live", "greedy", "arena", "/live", "/cap",
                           "seconds", "cpu_s", "opt");
  nlohmann::json results = nlohmann::json::array();
  if (std::filesystem::is_directory(traces)) {
    const std::string letters = args.smoke ? "A" : "ABCDEFGHIJK";
    for (const char letter : letters) {
      const std::string name = fmt::format("minimalloc/{}.1048576.csv", letter);
      results.push_back(plan_file(traces + "/" + name, name, args.time_limit_s, 1048576));
    }
    for (const char* list : {"somas/resnet50.csv", "somas/tiny_bert.csv", "somas/bert_base.csv"}) {
      if (args.smoke && std::string(list) != "somas/resnet50.csv") continue;
      results.push_back(plan_file(traces + "/" + list, list, args.time_limit_s, std::nullopt));
    }
  } else {
    std::cout << "(no shared traces at " << traces << ": the synthetic instance only)\n";
  }
  const std::vector<cistern::plan::Buffer> buffers = synthetic(args.synthetic_buffers);
  cistern::plan::Options options;
  options.time_limit_s = args.time_limit_s;
  const std::string name = fmt::format("synthetic/{}", buffers.size());
  results.push_back(row(name, timed_plan(buffers, options), std::nullopt, buffers.size()));
  const nlohmann::json summary = minimalloc_summary(results);
  std::ofstream out(args.out);
  out << nlohmann::json{{"time_limit_s", args.time_limit_s},
                        {"minimalloc", summary},
                        {"results", results}}
             .dump(2)
      << "\n";
  if (!out) {
    std::cerr << "bench_plan: cannot write " << args.out << "\n";
    return 1;
  }
  std::cout << "wrote " << args.out << "\n";
  return 0;
}
