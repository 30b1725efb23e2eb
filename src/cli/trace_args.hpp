// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The trace-reading flags every subcommand shares (--device, --format, --scale) and their
// translation into trace::ReadOptions.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli/cli.hpp"
#include "trace/readers.hpp"

namespace cistern::cli {

/// How the user asked for traces to be read.
struct TraceArgs {
  int device = -1;     ///< <0: the reader chooses (the only device with events)
  std::string format;  ///< empty: recognised from the content
  double scale = 1;    ///< lifetime lists: multiply sizes by this
};

/// Adds --device, --format and --scale to `app`.
inline void add_trace_options(CLI::App& app, TraceArgs& args) {
  app.add_option("--device", args.device,
                 "Device whose events to read (default: the only device with events)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--format", args.format,
                 "Read as this format instead of recognising it: pytorch, lifetimes, rmm, "
                 "kineto, cistern");
  app.add_option("--scale", args.scale,
                 "Lifetime lists: multiply every size by this (minimalloc's normalised sets)")
      ->check(CLI::PositiveNumber);
}

/// The reader options; throws UsageError for an unknown format name.
inline trace::ReadOptions read_options(const TraceArgs& args) {
  trace::ReadOptions options;
  if (args.device >= 0) options.device = args.device;
  if (!args.format.empty()) {
    options.format = trace::format_from_string(args.format);
    if (!options.format) {
      throw UsageError("unknown --format '" + args.format +
                       "'; expected pytorch, lifetimes, rmm, kineto or cistern");
    }
  }
  options.scale = args.scale;
  return options;
}

}  // namespace cistern::cli
