// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The trace-reading flags every subcommand shares (--device, --format, --scale,
// --max-input-size) and their translation into trace::ReadOptions.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

#include "cistern/errors.hpp"
#include "cistern/types.hpp"
#include "cli/cli.hpp"
#include "trace/readers.hpp"

namespace cistern::cli {

/// How the user asked for traces to be read.
struct TraceArgs {
  int device = -1;                      ///< <0: the reader chooses (the only device with events)
  std::string format;                   ///< empty: recognised from the content
  double scale = 1;                     ///< lifetime lists: multiply sizes by this
  std::string max_input_size = "2GiB";  ///< the most bytes a trace may decompress to
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
  app.add_option("--max-input-size", args.max_input_size,
                 "The most bytes a trace file may hold once decompressed (KiB, MiB, GiB "
                 "suffixes); larger files, and gzip streams that would inflate past it, are "
                 "refused without using more memory")
      ->capture_default_str();
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
  // NaN and infinity pass CLI11's PositiveNumber check: refuse them here, as usage errors.
  if (!std::isfinite(args.scale) || !(args.scale > 0)) {
    throw UsageError("--scale: expected a finite number above 0, got " +
                     std::to_string(args.scale));
  }
  options.scale = args.scale;
  try {
    options.max_input_size = parse_bytes(args.max_input_size);
  } catch (const InvalidArgument& e) {
    throw UsageError(std::string("--max-input-size: ") + e.what());
  }
  if (options.max_input_size == 0) throw UsageError("--max-input-size: must be more than 0 bytes");
  return options;
}

}  // namespace cistern::cli
