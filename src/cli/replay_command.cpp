// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern replay TRACE...`: reads the traces, runs every (trace, policy) pair through the
// replay engine in parallel, adds PyTorch's recorded figures for snapshots, and reports them as
// a table, JSON and/or HTML. Exits 4 if any replay ran out of memory at --capacity.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/pytorch_snapshot.hpp"
#include "cistern/types.hpp"
#include "cli/cli.hpp"
#include "cli/device_replay.hpp"
#include "cli/progress.hpp"
#include "cli/report.hpp"
#include "cli/trace_args.hpp"
#include "replay/engine.hpp"
#include "replay/snapshot_run.hpp"
#include "trace/readers.hpp"

#ifndef CISTERN_VERSION
#define CISTERN_VERSION "unknown"
#endif

namespace cistern::cli {
namespace {

constexpr const char* kReplayExamples =
    "Examples:\n"
    "  cistern replay memory.pickle.gz\n"
    "  cistern replay --min-capacity --html report.html traces/*.pickle.gz\n"
    "  cistern replay -p torch,cistern:expandable_segments=true --capacity 24GiB trace.csv\n"
    "  cistern replay --json - trace.json.gz | jq '.results[] | {policy, overhead}'\n\n";

struct ReplayArgs {
  std::vector<std::string> traces;
  std::string policies = "cistern,torch,nocache";
  std::string capacity = "80GiB";
  bool min_capacity = false;
  std::string start = "cold";
  std::string json;
  std::string html;
  std::string snapshot;
  TraceArgs input;
  unsigned threads = 0;
  std::size_t timeline_points = 2000;
  bool check = false;
  bool quiet = false;
  std::string backend = "sim";
  int gpu = 0;
  bool touch = false;
  std::size_t repeat = 1;
  std::string cost_model = "h200";
  std::string command_line;
};

/// What the command line asks for, validated before any trace is read.
struct ReplayPlan {
  std::vector<replay::Policy> policies;
  replay::Options options;
  trace::ReadOptions read;
};

/// The policies a warm start needs to accept, named in the error if one does not.
void require_warm_policies(const std::vector<replay::Policy>& policies) {
  for (const replay::Policy& policy : policies) {
    if (policy.supports_warm_start()) continue;
    std::string able;
    for (const char* name : {"cistern", "torch", "nocache"})
      if (replay::Policy::parse(name).supports_warm_start())
        able += (able.empty() ? "" : ", ") + std::string(name);
    throw UsageError(fmt::format(
        "--start warm: policy '{}' cannot start from PyTorch's recorded cache (policies that "
        "can: {}); use --start cold to compare policies",
        policy.label, able.empty() ? "none" : able));
  }
}

/// `--cost-model`: a model by name, or a JSON file of the model's fields in ns over the H200
/// model - a flat object, or bench_vmm.json, whose `cost_model.fields` it takes. A null field
/// (bench_vmm's "not measured") keeps the H200 figure; an unknown field is an error naming it.
replay::CostModel load_cost_model(const std::string& spec) {
  if (spec == "h200" || spec == "a100") return replay::CostModel::named(spec);
  std::error_code error;
  if (!std::filesystem::is_regular_file(spec, error)) {
    throw UsageError(fmt::format(
        "--cost-model: '{}' is neither a model (h200, a100) nor a readable file", spec));
  }
  std::ifstream in(spec, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) throw UsageError(fmt::format("--cost-model: cannot read '{}'", spec));
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, false);
  if (doc.is_discarded()) throw UsageError(fmt::format("--cost-model {}: not valid JSON", spec));
  const nlohmann::json* fields = &doc;
  if (doc.is_object() && doc.contains("cost_model")) {  // bench_vmm.json, or a replay's JSON
    const nlohmann::json& model = doc.at("cost_model");
    fields = model.is_object() && model.contains("fields") ? &model.at("fields") : nullptr;
  }
  if (fields == nullptr || !fields->is_object()) {
    throw UsageError(fmt::format(
        "--cost-model {}: needs a JSON object of the model's fields in ns (or bench_vmm.json)",
        spec));
  }
  replay::CostModel model = replay::CostModel::h200();
  model.name = spec;
  try {
    for (const auto& [field, value] : fields->items()) {
      if (value.is_null()) {
        model.set(field, model.get(field));  // not measured: the H200 figure stays
      } else if (value.is_number()) {
        model.set(field, value.get<double>());
      } else {
        throw InvalidArgument("cost model field '" + field + "' needs a number of ns, not " +
                              value.dump());
      }
    }
  } catch (const InvalidArgument& e) {
    throw UsageError(fmt::format("--cost-model {}: {}", spec, e.what()));
  }
  return model;
}

ReplayPlan make_plan(const ReplayArgs& args) {
  ReplayPlan plan;
  try {
    plan.policies = replay::Policy::parse_list(args.policies);
  } catch (const InvalidArgument& e) {
    throw UsageError(std::string("--policy: ") + e.what());
  }
  if (plan.policies.empty()) throw UsageError("--policy: no policy given");
  try {
    plan.options.capacity = parse_bytes(args.capacity);
  } catch (const InvalidArgument& e) {
    throw UsageError(std::string("--capacity: ") + e.what());
  }
  if (plan.options.capacity == 0) throw UsageError("--capacity: must be more than 0 bytes");
  plan.options.start = args.start == "warm" ? replay::Start::warm : replay::Start::cold;
  if (plan.options.start == replay::Start::warm) require_warm_policies(plan.policies);
  plan.options.check_invariants = args.check;
  if (args.repeat == 0) throw UsageError("--repeat: needs at least 1 pass");
  if (args.repeat > 1 && args.backend != "sim") {
    throw UsageError("--repeat: only the simulated backend replays several passes");
  }
  plan.options.repeat = args.repeat;
  plan.options.costs = load_cost_model(args.cost_model);
  if (!args.html.empty()) {
    plan.options.timeline_points = args.timeline_points;
    plan.options.segment_map_at_peak = true;
  }
  plan.read = read_options(args.input);
  if (args.json == "-" && args.html == "-")
    throw UsageError("--json - and --html - cannot both write to stdout");
  if (args.snapshot == "-") throw UsageError("--snapshot: needs a file name, not '-'");
  check_output_path(args.json, "--json");
  check_output_path(args.html, "--html");
  check_output_path(args.snapshot, "--snapshot");
  return plan;
}

/// Reads every trace, a few at a time in parallel (each may take much memory while it is
/// parsed), each device of a file as its own trace unless --device chooses one; rethrows the
/// first reader error in command-line order.
std::vector<trace::Trace> read_traces(const std::vector<std::string>& paths,
                                      const trace::ReadOptions& options, unsigned threads) {
  const std::size_t batch =
      threads != 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  std::vector<trace::Trace> traces;
  traces.reserve(paths.size());
  for (std::size_t first = 0; first < paths.size(); first += batch) {
    std::vector<std::future<std::vector<trace::Trace>>> pending;
    for (std::size_t i = first; i < std::min(paths.size(), first + batch); ++i)
      pending.push_back(std::async(std::launch::async, [&path = paths[i], &options] {
        return trace::read_trace_devices(path, options);
      }));
    for (auto& future : pending) {
      for (trace::Trace& t : future.get()) traces.push_back(std::move(t));
    }
  }
  return traces;
}

void require_warm_startable(const std::vector<trace::Trace>& traces) {
  for (const trace::Trace& t : traces) {
    if (t.format != "pytorch")
      throw UsageError(fmt::format("--start warm needs PyTorch snapshots; {} is a {} trace",
                                   t.source, t.format));
  }
}

/// What the replays of these traces cannot reproduce exactly (`Recorded::notes`), on stderr.
void print_notes(const std::vector<trace::Trace>& traces) {
  for (const trace::Trace& t : traces) {
    for (const std::string& note : t.recorded.notes) {
      std::cerr << fmt::format("note: {} (device {}): {}\n", t.source, t.device, note);
    }
  }
}

std::uint64_t bytes_live_before(const trace::Trace& t) {
  std::uint64_t total = 0;
  for (const trace::LiveBlock& block : t.live_before) total += block.size;
  return total;
}

std::vector<const trace::Trace*> pointers_to(const std::vector<trace::Trace>& traces) {
  std::vector<const trace::Trace*> pointers;
  pointers.reserve(traces.size());
  for (const trace::Trace& t : traces) pointers.push_back(&t);
  return pointers;
}

std::vector<replay::Result> replay_all(const std::vector<const trace::Trace*>& pointers,
                                       const ReplayPlan& plan, const ReplayArgs& args) {
  Progress progress("replay", !args.quiet);
  std::vector<replay::Result> results = replay::run_all(
      pointers, plan.policies, plan.options, args.min_capacity, args.threads,
      [&progress](std::size_t done, std::size_t total) { progress.update(done, total); });
  progress.finish();
  const bool has_recorded =
      std::any_of(results.begin(), results.end(),
                  [](const replay::Result& r) { return r.policy == "recorded"; });
  if (!has_recorded) {
    for (const trace::Trace* t : pointers)
      if (std::optional<replay::Result> r = replay::recorded(*t, plan.options))
        results.push_back(std::move(*r));
  }
  return results;
}

bool any_oom(const std::vector<TraceResults>& groups) {
  for (const TraceResults& t : groups)
    for (const replay::Result& r : t.results)
      if (r.policy != "recorded" && r.ooms > 0) return true;
  return false;
}

/// Tells what went wrong on stderr and chooses the exit status: 3 if a trace could not be
/// replayed under some policy (the table and the JSON say which), else 4 if a replay ran out of
/// memory, else 0. Notes (caveats about a figure) are printed but do not fail the run.
int exit_status(const std::vector<TraceResults>& groups, const ReplayArgs& args) {
  bool failed = false;
  for (const TraceResults& t : groups) {
    for (const replay::Result& r : t.results) {
      if (!r.note.empty())
        std::cerr << "cistern: note: " << t.trace << ": " << r.policy << ": " << r.note << "\n";
      if (!r.error.empty()) {
        std::cerr << "cistern: " << t.trace << ": " << r.policy << ": " << r.error << "\n";
        failed = true;
      }
    }
  }
  if (failed) return kExitBadInput;
  if (any_oom(groups)) {
    std::cerr << "cistern: out of memory: some replays failed allocations at --capacity "
              << args.capacity << " (the ooms column); try a larger --capacity\n";
    return kExitOutOfMemory;
  }
  return kExitOk;
}

/// --backend cuda: the flags that only the simulated device understands are refused.
void require_device_flags(const ReplayArgs& args, const ReplayPlan& plan) {
  if (args.min_capacity) throw UsageError("--min-capacity needs --backend sim");
  if (!args.html.empty()) throw UsageError("--html needs --backend sim");
  if (plan.options.start == replay::Start::warm) {
    throw UsageError(
        "--start warm needs --backend sim (a GPU cannot place blocks at the "
        "recorded addresses)");
  }
}

int run_replay_on_cuda(const ReplayArgs& args, const ReplayPlan& plan,
                       const std::vector<const trace::Trace*>& pointers) {
  DeviceReplayRequest request;
  request.traces = pointers;
  request.policies = plan.policies;
  request.options = plan.options;
  request.device = args.gpu;
  request.touch = args.touch;
  request.json = args.json;
  request.quiet = args.quiet;
  return run_device_replay(request);
}

/// `--snapshot FILE`: one PyTorch memory snapshot per (trace, policy), from a recorded cold replay
/// (replay/snapshot_run.hpp names the files when there are several).
void write_snapshots(const std::vector<trace::Trace>& traces, const ReplayPlan& plan,
                     const std::string& path) {
  for (std::size_t t = 0; t < traces.size(); ++t) {
    for (const replay::Policy& policy : plan.policies) {
      const std::string file =
          replay::snapshot_path(path, policy.label, t, plan.policies.size() > 1, traces.size() > 1);
      const replay::RecordedRun run = replay::record_run(traces[t], policy, plan.options);
      write_pytorch_snapshot(file, {run.record}, run.config);
    }
  }
}

int run_replay(const ReplayArgs& args) {
  const ReplayPlan plan = make_plan(args);
  const bool on_cuda = args.backend == "cuda";
  if (on_cuda) require_device_flags(args, plan);
  if (args.touch && !on_cuda) throw UsageError("--touch needs --backend cuda");
  const std::vector<trace::Trace> traces = read_traces(args.traces, plan.read, args.threads);
  for (const trace::Trace& t : traces) trace::require_history(t);
  if (plan.options.start == replay::Start::warm) require_warm_startable(traces);
  if (!args.quiet) print_notes(traces);
  const std::vector<const trace::Trace*> pointers = pointers_to(traces);
  if (on_cuda) return run_replay_on_cuda(args, plan, pointers);
  const std::vector<TraceResults> groups =
      group_results(pointers, replay_all(pointers, plan, args), args.start);

  const bool stdout_taken = args.json == "-" || args.html == "-";
  if (!stdout_taken && !args.quiet) std::cout << format_table(groups, plan.options.capacity);
  if (!args.json.empty())
    write_output(args.json, format_json(groups, plan.options.costs), "--json");
  if (!args.html.empty()) {
    const ReportInfo info{CISTERN_VERSION, now_iso8601(), args.command_line, plan.options.capacity};
    write_output(args.html, format_html(groups, info), "--html");
  }
  if (!args.snapshot.empty()) write_snapshots(traces, plan, args.snapshot);
  return exit_status(groups, args);
}

}  // namespace

std::string now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", &utc);
  return text;
}

std::vector<TraceResults> group_results(const std::vector<const trace::Trace*>& traces,
                                        std::vector<replay::Result> results,
                                        const std::string& start) {
  std::vector<TraceResults> groups;
  for (const trace::Trace* t : traces) {
    TraceResults g;
    g.trace = t->source;
    g.format = t->format;
    g.device = t->device;
    g.start = start;
    g.peak_live = t->peak_live();
    g.allocations = t->allocations();
    g.events = t->events.size();
    g.live_before = bytes_live_before(*t);
    g.source = t;
    groups.push_back(std::move(g));
  }
  for (replay::Result& r : results) {
    auto group = std::find_if(groups.begin(), groups.end(), [&r](const TraceResults& g) {
      return g.trace == r.trace && g.device == r.device;
    });
    if (group == groups.end()) {  // not from a listed trace: report it on its own
      TraceResults g;
      g.trace = r.trace;
      g.device = r.device;
      g.start = start;
      g.peak_live = r.peak_live;
      groups.push_back(std::move(g));
      group = groups.end() - 1;
    }
    group->results.push_back(std::move(r));
  }
  for (TraceResults& g : groups) {
    std::stable_partition(g.results.begin(), g.results.end(),
                          [](const replay::Result& r) { return r.policy == "recorded"; });
  }
  return groups;
}

Command add_replay_command(CLI::App& parent) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* app = parent.add_subcommand(
      "replay",
      "Replay allocation traces under allocator policies on a simulated device and report "
      "peak_live, peak reserved, overhead, min capacity, OOMs, device calls and speed");
  app->add_option("trace", args->traces,
                  "Trace files: PyTorch snapshots (.pickle[.gz]), lifetime lists (.csv), RMM "
                  "logs, Kineto traces (.json[.gz]), cistern traces")
      ->required();
  app->add_option("--policy,-p", args->policies,
                  "Comma-separated policies: cistern, torch (PyTorch emulation), nocache; "
                  "options after a colon, e.g. cistern:max_split_size_mb=256,torch")
      ->capture_default_str();
  app->add_option("--capacity,-c", args->capacity, "Simulated device capacity, e.g. 80GiB, 24GB")
      ->capture_default_str();
  app->add_flag("--min-capacity", args->min_capacity,
                "Also find the smallest capacity (to 2 MiB) with no out-of-memory (bisection)");
  app->add_option("--start", args->start,
                  "cold: blocks live before the window are allocated on an empty device; warm: "
                  "start from PyTorch's recorded cache (PyTorch snapshots only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cold", "warm"}));
  app->add_option("--json", args->json,
                  "Write the results as JSON to FILE ('-': stdout, instead of the table)")
      ->type_name("FILE");
  app->add_option("--html", args->html,
                  "Write a self-contained HTML report (timelines, segment maps) to FILE "
                  "('-': stdout)")
      ->type_name("FILE");
  app->add_option("--snapshot", args->snapshot,
                  "Write each policy's replay (cold start) as a PyTorch memory snapshot pickle for "
                  "pytorch.org/memory_viz; with several policies or traces the policy label and "
                  "the trace's index are inserted before the extension: FILE.torch.pickle, "
                  "FILE.cistern.1.pickle")
      ->type_name("FILE");
  add_trace_options(*app, args->input);
  app->add_option("--threads,-j", args->threads, "Replays to run at once (0: one per core)")
      ->capture_default_str();
  app->add_option("--timeline-points", args->timeline_points,
                  "Samples per timeline in the HTML report")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000000));
  app->add_option("--repeat", args->repeat,
                  "Replay the window this many times in a row (each pass frees what it "
                  "allocated); the report shows device calls in the first and later passes")
      ->capture_default_str();
  app->add_option("--cost-model", args->cost_model,
                  "The prices of device calls (device_ms): h200 (measured on an NVIDIA H200), "
                  "a100 (published A100 figures of 2 MiB pages, the rest the H200's), or a JSON "
                  "file of the model's fields in ns over h200, e.g. {\"create_ns\": 20000}, or "
                  "bench_vmm.json (docs/cost-model.md)")
      ->capture_default_str()
      ->type_name("MODEL|FILE");
  app->add_flag("--check", args->check,
                "Check the allocator's invariants after every event (slow)");
  app->add_flag("--quiet,-q", args->quiet, "No table and no progress bar");
  app->add_option("--backend", args->backend,
                  "sim: the simulated device of --capacity; cuda: a real GPU (CudaDevice), one "
                  "replay at a time, with the real time of the device calls beside the "
                  "simulated one (no --min-capacity, --html or --start warm)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sim", "cuda"}));
  app->add_option("--gpu", args->gpu, "--backend cuda: the CUDA device ordinal to replay on")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--touch", args->touch,
                "--backend cuda: write every allocation (cudaMemsetAsync) so that a bad "
                "pointer faults instead of passing unnoticed");
  app->footer(std::string(kReplayExamples) + kExitCodesHelp);
  return {app, [args](const std::string& command_line) {
            args->command_line = command_line;
            return run_replay(*args);
          }};
}

}  // namespace cistern::cli
