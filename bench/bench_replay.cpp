// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The replay engine's speed: whole replays of every shared trace under each policy, and the
// capacity search on the largest traces. Traces are read before the clock starts (parsing is not
// measured); a replay is measured as `replay::run` does it: compiling the trace, a fresh
// simulated device and allocator, every event, and the figures.
//
// Benchmarks:
//   replay/<trace>/<policy>        one replay per iteration. items_per_second: trace events per
//                                  second of the whole run; loop_events_per_second: the same
//                                  over the timed event loop only (the engine's own figure);
//                                  ns_per_op: allocator host time per alloc/free.
//   min_capacity/<trace>/<policy>  one capacity search per iteration (bisection to 2 MiB), on the
//                                  trace with the most events and the one with the highest
//                                  peak_live. Counters: min_capacity (bytes), probes.
//   replay/synthetic/<policy>      a generated trace, so that the benchmark runs without the
//                                  shared traces too.
// <trace> is the path below ../shared/traces; policies are cistern, torch and nocache.
//
// Modes:
//   bench_replay [Google Benchmark flags]   e.g. --benchmark_out=r.json --benchmark_out_format=json
//   bench_replay --smoke                    a quick run for CTest: a few rows, tiny minimum time,
//                                           and a check that every replay ran without error
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "replay/engine.hpp"
#include "support/trace_sizes.hpp"
#include "trace/readers.hpp"

namespace cistern::bench {
namespace {

namespace fs = std::filesystem;
using replay::Policy;
using replay::Result;

const char* const kPolicies[] = {"cistern", "torch", "nocache"};

// --- traces --------------------------------------------------------------------------------------

std::string traces_dir() { return cistern::testing::shared_dir() + "/traces"; }

/// Every trace file below the shared folder, as paths relative to it, sorted.
std::vector<std::string> shared_trace_names() {
  std::vector<std::string> names;
  if (!cistern::testing::traces_available(cistern::testing::shared_dir())) return names;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(traces_dir())) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "README.md") continue;
    names.push_back(fs::relative(e.path(), traces_dir()).generic_string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

/// A generated trace: 2000 rounds of a few allocations of mixed sizes freed in another order.
trace::Trace synthetic_trace() {
  trace::Trace t;
  t.source = "synthetic";
  std::uint64_t id = 0;
  std::uint64_t state = 12345;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;  // (id, size)
  const auto add = [&t](trace::Op op, std::uint64_t which, std::uint64_t size) {
    t.events.push_back({op, 0, which, size, 0, static_cast<std::int64_t>(t.events.size())});
  };
  for (int round = 0; round < 2000; ++round) {
    for (int k = 0; k < 8; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const std::uint64_t size =
          k % 4 == 3 ? (state >> 40) % (64 * MiB) + 1 : (state >> 44) % (1 * MiB) + 1;
      add(trace::Op::alloc, id, size);
      live.emplace_back(id++, size);
    }
    while (live.size() > 24) {
      const std::size_t victim = (state >> 20) % live.size();
      add(trace::Op::free, live[victim].first, live[victim].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    }
  }
  return t;
}

/// Traces by name ("synthetic" or a shared path), each read once, on first use.
const trace::Trace& load(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<trace::Trace>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<trace::Trace>& slot = cache[name];
  if (!slot) {
    slot = std::make_unique<trace::Trace>(
        name == "synthetic" ? synthetic_trace() : trace::read_trace(traces_dir() + "/" + name, {}));
  }
  return *slot;
}

// --- the benchmarks ------------------------------------------------------------------------------

/// Replays that ended in an error (the smoke check fails on any).
std::vector<std::string>& errors() {
  static std::vector<std::string> list;
  return list;
}

/// The allocator calls of a replay that never runs out of memory: every alloc and every free.
std::size_t allocator_calls(const trace::Trace& t) {
  return static_cast<std::size_t>(std::count_if(
      t.events.begin(), t.events.end(),
      [](const trace::Event& e) { return e.op == trace::Op::alloc || e.op == trace::Op::free; }));
}

void bench_replay(benchmark::State& state, const std::string& name,
                  const std::string& policy_text) {
  const trace::Trace& t = load(name);
  const Policy policy = Policy::parse(policy_text);
  const auto calls = static_cast<double>(allocator_calls(t));
  Result last;
  double loop_ns = 0;  // the timed event loops of every iteration
  for (auto _ : state) {
    last = replay::run(t, policy, {});
    benchmark::DoNotOptimize(last.peak_reserved);
    loop_ns += last.ns_per_op.value_or(0) * calls;
  }
  if (!last.error.empty()) {
    errors().push_back(name + " / " + policy_text + ": " + last.error);
    state.SkipWithError(last.error.c_str());
    return;
  }
  const auto events = static_cast<double>(t.events.size());
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(t.events.size()));
  state.counters["events"] = events;
  if (loop_ns > 0) {
    state.counters["ns_per_op"] = loop_ns / (calls * static_cast<double>(state.iterations()));
    state.counters["loop_events_per_second"] =
        events * static_cast<double>(state.iterations()) / loop_ns * 1e9;
  }
  state.counters["peak_reserved"] = static_cast<double>(last.peak_reserved.value_or(0));
  state.counters["device_allocs"] = static_cast<double>(last.device_allocs);
}

void bench_min_capacity(benchmark::State& state, const std::string& name,
                        const std::string& policy_text) {
  const trace::Trace& t = load(name);
  const Policy policy = Policy::parse(policy_text);
  replay::CapacitySearch search;
  try {
    for (auto _ : state) {
      search = replay::search_min_capacity(t, policy, {});
      benchmark::DoNotOptimize(search.capacity);
    }
  } catch (const std::exception& e) {
    errors().push_back(name + " / " + policy_text + ": " + e.what());
    state.SkipWithError(e.what());
    return;
  }
  state.counters["min_capacity"] = static_cast<double>(search.capacity);
  state.counters["probes"] = static_cast<double>(search.probes);
  state.counters["events"] = static_cast<double>(t.events.size());
}

/// The traces with the most events and with the highest peak_live.
std::vector<std::string> largest(const std::vector<std::string>& names) {
  std::string most_events;
  std::string most_bytes;
  std::size_t events = 0;
  std::uint64_t bytes = 0;
  for (const std::string& name : names) {
    const trace::Trace& t = load(name);
    if (t.events.size() > events) {
      events = t.events.size();
      most_events = name;
    }
    if (t.peak_live() > bytes) {
      bytes = t.peak_live();
      most_bytes = name;
    }
  }
  std::vector<std::string> picked;
  if (!most_events.empty()) picked.push_back(most_events);
  if (!most_bytes.empty() && most_bytes != most_events) picked.push_back(most_bytes);
  return picked;
}

void register_benchmarks() {
  std::vector<std::string> names = shared_trace_names();
  const std::vector<std::string> big = largest(names);
  names.insert(names.begin(), "synthetic");
  for (const std::string& name : names) {
    for (const char* policy : kPolicies) {
      const std::string full = "replay/" + name + "/" + policy;
      benchmark::RegisterBenchmark(full.c_str(), [name, policy](benchmark::State& s) {
        bench_replay(s, name, policy);
      })->Unit(benchmark::kMillisecond);
    }
  }
  for (const std::string& name : big) {
    for (const char* policy : {"cistern", "torch"}) {
      const std::string full = "min_capacity/" + name + "/" + policy;
      benchmark::RegisterBenchmark(full.c_str(), [name, policy](benchmark::State& s) {
        bench_min_capacity(s, name, policy);
      })->Unit(benchmark::kMillisecond);
    }
  }
}

void add_context() {
  benchmark::AddCustomContext("traces", traces_dir());
  benchmark::AddCustomContext("device", "SimDevice, 80 GiB, cold start, default cost model");
  benchmark::AddCustomContext("items_per_second", "trace events per second of replay::run");
}

// --- command line --------------------------------------------------------------------------------

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
  for (const std::string& arg : args) {
    if (arg.rfind(flag, 0) == 0) return true;
  }
  return false;
}

int run_benchmarks(std::vector<std::string> args, bool smoke) {
  if (smoke && !has_flag(args, "--benchmark_min_time")) {
    args.emplace_back("--benchmark_min_time=0.002");
  }
  if (smoke && !has_flag(args, "--benchmark_filter")) {
    args.emplace_back("--benchmark_filter=^replay/(synthetic|somas/tiny_bert.csv)/|^min_capacity/");
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  int argc = static_cast<int>(argv.size());
  benchmark::Initialize(&argc, argv.data());
  if (benchmark::ReportUnrecognizedArguments(argc, argv.data())) return 1;
  register_benchmarks();
  add_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (const std::string& e : errors()) std::fprintf(stderr, "bench_replay: %s\n", e.c_str());
  return errors().empty() ? 0 : 1;
}

}  // namespace
}  // namespace cistern::bench

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args{argv[0]};
    bool smoke = false;
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "--smoke") {
        smoke = true;
      } else {
        args.emplace_back(argv[i]);
      }
    }
    return cistern::bench::run_benchmarks(std::move(args), smoke);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_replay: %s\n", e.what());
    return 2;
  }
}
