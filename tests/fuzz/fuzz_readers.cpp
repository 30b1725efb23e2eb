// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// libFuzzer harness for every trace reader and, for the traces that read, the replay engine.
// The first byte picks the format (0-4: pytorch, lifetimes, rmm, kineto, cistern; else: recognise
// by content); the rest is the file. Any input must either read or raise cistern::Error; a trace
// that reads must pass Trace::check() and replay under cistern and torch on a small simulated
// device without any exception but cistern::Error (torch refuses, with a clear error, a snapshot
// whose recorded allocator settings no configuration takes). Sanitizers catch everything else.
// Build with -DCISTERN_BUILD_FUZZERS=ON and clang (tests/fuzz/CMakeLists.txt); run with a corpus
// folder outside the repository, seeded with small traces:
//   build-fuzz/tests/fuzz/fuzz_readers -max_len=8192 -max_total_time=300 /tmp/readers_corpus
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cistern/errors.hpp"
#include "replay/engine.hpp"
#include "trace/readers.hpp"

namespace {

constexpr std::size_t kMaxReplayedEvents = 4096;  // keeps each input fast

void replay(const cistern::trace::Trace& trace) {
  if (trace.events.size() > kMaxReplayedEvents) return;
  cistern::replay::Options options;
  options.capacity = std::size_t{256} << 20;
  options.check_invariants = true;
  for (const char* name : {"cistern", "torch"}) {
    const cistern::replay::Policy policy = cistern::replay::Policy::parse(name);
    // A snapshot may record allocator settings no configuration takes (PyTorch would not have
    // started with them): torch then refuses the replay with a clear error naming the setting,
    // and the replay must say so rather than run.
    bool settings_refused = false;
    try {
      (void)policy.for_trace(trace);
    } catch (const cistern::ConfigError&) {
      settings_refused = true;
    }
    const cistern::replay::Result result = cistern::replay::run(trace, policy, options);
    if (result.error.empty() == settings_refused) {  // a trace that reads must replay
      std::fprintf(
          stderr, "%s: %s\n", name,
          settings_refused ? "replayed with refused recorded settings" : result.error.c_str());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  cistern::trace::ReadOptions options;
  if (data[0] < 5) options.format = static_cast<cistern::trace::Format>(data[0]);
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const cistern::trace::Trace trace =
        cistern::trace::read_trace_bytes(std::move(bytes), "fuzz", options);
    trace.check();
    (void)trace.peak_live();
    replay(trace);
  } catch (const cistern::Error&) {
    // A clear error: what bad input must give.
  }
  return 0;
}
