// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern advise TRACE...`: which PYTORCH_ALLOC_CONF needs the smallest device for each trace,
// and what cistern needs beside it (replay/advise.hpp says how the search runs and is pruned).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/types.hpp"
#include "cli/cli.hpp"
#include "cli/progress.hpp"
#include "cli/report_advise.hpp"
#include "cli/trace_args.hpp"
#include "replay/advise.hpp"
#include "trace/readers.hpp"

namespace cistern::cli {
namespace {

struct AdviseArgs {
  std::vector<std::string> traces;
  std::string capacity = "80GiB";
  std::string json;
  std::string html;
  std::size_t rows = 10;
  unsigned threads = 0;
  bool quiet = false;
  TraceArgs input;
  std::string command_line;
};

constexpr const char* kAdviseExamples =
    "Examples:\n"
    "  cistern advise memory.pickle.gz\n"
    "  cistern advise --json advice.json --html advice.html run1.pickle run2.pickle\n\n";

replay::AdviseOptions advise_options(const AdviseArgs& args) {
  replay::AdviseOptions options;
  try {
    options.replay.capacity = parse_bytes(args.capacity);
  } catch (const InvalidArgument& e) {
    throw UsageError(std::string("--capacity: ") + e.what());
  }
  if (options.replay.capacity == 0) throw UsageError("--capacity: must be more than 0 bytes");
  options.threads = args.threads;
  return options;
}

int run_advise(const AdviseArgs& args) {
  const replay::AdviseOptions options = advise_options(args);
  const trace::ReadOptions read = read_options(args.input);
  if (args.json == "-" && args.html == "-")
    throw UsageError("--json - and --html - cannot both write to stdout");
  check_output_path(args.json, "--json");
  check_output_path(args.html, "--html");
  std::vector<replay::Advice> advice;
  for (const std::string& path : args.traces) {
    for (const trace::Trace& t : trace::read_trace_devices(path, read)) {
      trace::require_history(t);
      for (const std::string& note : t.recorded.notes)
        if (!args.quiet)
          std::cerr << fmt::format("note: {} (device {}): {}\n", path, t.device, note);
      Progress progress("advise", !args.quiet);
      advice.push_back(replay::advise(
          t, options, [&](std::size_t done, std::size_t total) { progress.update(done, total); }));
      progress.finish();
    }
  }
  const bool stdout_taken = args.json == "-" || args.html == "-";
  if (!stdout_taken && !args.quiet) std::cout << format_advice_table(advice, args.rows);
  if (!args.json.empty()) write_output(args.json, advice_json(advice).dump(2) + "\n", "--json");
  if (!args.html.empty()) {
    const ReportInfo info{CISTERN_VERSION, now_iso8601(), args.command_line,
                          options.replay.capacity};
    write_output(args.html, format_advice_html(advice, info), "--html");
  }
  return kExitOk;
}

}  // namespace

Command add_advise_command(CLI::App& parent) {
  auto args = std::make_shared<AdviseArgs>();
  CLI::App* app = parent.add_subcommand(
      "advise",
      "Search PyTorch's allocator options (max_split_size_mb, roundup_power2_divisions, "
      "garbage_collection_threshold, expandable_segments) on the torch emulation for the "
      "PYTORCH_ALLOC_CONF (PyTorch 2.9 and earlier: PYTORCH_CUDA_ALLOC_CONF) that needs the "
      "smallest device for each trace, and show cistern's own figure beside it");
  app->add_option("trace", args->traces, "Trace files (every format cistern replay reads)")
      ->required();
  app->add_option("--capacity,-c", args->capacity,
                  "Device capacity of the replays that count device calls, e.g. 80GiB")
      ->capture_default_str();
  app->add_option("--json", args->json, "Write the results as JSON to FILE ('-': stdout)")
      ->type_name("FILE");
  app->add_option("--html", args->html, "Write an HTML report to FILE ('-': stdout)")
      ->type_name("FILE");
  app->add_option("--rows", args->rows, "Configurations shown per trace, best first")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  add_trace_options(*app, args->input);
  app->add_option("--threads,-j", args->threads, "Replays to run at once (0: one per core)")
      ->capture_default_str();
  app->add_flag("--quiet,-q", args->quiet, "No table and no progress bar");
  app->footer(std::string(kAdviseExamples) + kExitCodesHelp);
  return {app, [args](const std::string& command_line) {
            args->command_line = command_line;
            return run_advise(*args);
          }};
}

}  // namespace cistern::cli
