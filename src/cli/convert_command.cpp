// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern convert INPUT OUTPUT`: reads a trace in any format and writes it as a cistern trace
// (lossless: streams, program calls, recorded figures) or as a lifetime list (allocations and
// frees only, for static memory planners such as minimalloc).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "cistern/errors.hpp"
#include "cli/cli.hpp"
#include "cli/trace_args.hpp"
#include "trace/native.hpp"
#include "trace/readers.hpp"

namespace cistern::cli {
namespace {

struct ConvertArgs {
  std::string input;
  std::string output;
  std::string to = "cistern";
  TraceArgs read;
};

/// A lifetime list: `id,lower,upper,size`, lifetime [lower, upper) in steps. Blocks live before
/// the window start at step 0, event i happens at step i + 1, and an allocation never freed
/// lives to the step after the last event. Program calls and streams have no place in the
/// format and are counted in `dropped`.
std::string lifetimes_csv(const trace::Trace& t, std::size_t& dropped) {
  struct Lifetime {
    std::uint64_t lower = 0, upper = 0, size = 0;
  };
  std::vector<Lifetime> lifetimes;
  std::unordered_map<std::uint64_t, std::size_t> open;  // id -> index in lifetimes
  const std::uint64_t end = t.events.size() + 1;
  for (const trace::LiveBlock& b : t.live_before) {
    open[b.id] = lifetimes.size();
    lifetimes.push_back({0, end, b.size});
  }
  dropped = 0;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const trace::Event& e = t.events[i];
    if (e.op == trace::Op::alloc) {
      open[e.id] = lifetimes.size();
      lifetimes.push_back({i + 1, end, e.size});
    } else if (e.op == trace::Op::free) {
      const auto found = open.find(e.id);
      if (found == open.end()) continue;
      lifetimes[found->second].upper = i + 1;
      open.erase(found);
    } else {
      ++dropped;
    }
  }
  std::string out = "id,lower,upper,size\n";
  for (std::size_t i = 0; i < lifetimes.size(); ++i)
    out +=
        fmt::format("{},{},{},{}\n", i, lifetimes[i].lower, lifetimes[i].upper, lifetimes[i].size);
  return out;
}

/// Writes `t` as a cistern trace to `path` ('-': stdout; gzip-compressed for a name ending in
/// ".gz").
void write_native(const std::string& path, const trace::Trace& t) {
  if (path == "-") {  // through write_output, whose writes are checked
    std::ostringstream text;
    trace::write_native(text, t);
    write_output(path, text.str(), "convert");
    return;
  }
  trace::write_native_file(path, t);
}

int run_convert(const ConvertArgs& args) {
  check_output_path(args.output, "convert");
  const trace::Trace t = trace::read_trace(args.input, read_options(args.read));
  if (args.to == "lifetimes") {
    std::size_t dropped = 0;
    write_output(args.output, lifetimes_csv(t, dropped), "convert");
    if (dropped > 0 || t.streams.size() > 1) {
      std::cerr << fmt::format(
          "cistern: note: a lifetime list keeps allocations and frees only; {} program calls "
          "(synchronize, empty_cache) and {} stream(s) were merged away\n",
          dropped, t.streams.size());
    }
  } else {
    write_native(args.output, t);
  }
  return kExitOk;
}

}  // namespace

Command add_convert_command(CLI::App& parent) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* app = parent.add_subcommand(
      "convert",
      "Convert a trace (any readable format) to a cistern trace, or to a lifetime list for "
      "static memory planners");
  app->add_option("input", args->input, "The trace to read")->required();
  app->add_option("output", args->output,
                  "Where to write ('-': stdout; a name ending in .gz is gzip-compressed for "
                  "--to cistern)")
      ->required();
  app->add_option("--to", args->to,
                  "cistern: cistern's own trace format, lossless; lifetimes: id,lower,upper,size "
                  "CSV (allocations and frees only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cistern", "lifetimes"}));
  add_trace_options(*app, args->read);
  app->footer(kExitCodesHelp);
  return {app, [args](const std::string&) { return run_convert(*args); }};
}

}  // namespace cistern::cli
