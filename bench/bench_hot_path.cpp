// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The allocator's hot path: cache-hit allocate+free pairs through cistern, with mimalloc and
// glibc malloc on the very same size sequences as reference rows.
//
// Benchmarks are named pair/<workload>/<allocator>[/threads:N]:
//   workloads   512B, 64KiB, 2MiB, 100MiB   allocate then free one size
//               mix_small                   the real traces' sizes <= 1 MiB, in trace order
//               mix_all                     every real trace size
//               (the mixes keep 64 allocations live: each pair frees the oldest, then allocates
//               the next size, FIFO, cycling through the sizes)
//   allocators  cistern (one CachingAllocator over a 1 TiB SimDevice, one stream per thread),
//               mimalloc (mi_malloc/mi_free), glibc (malloc/free); for 512B and mix_small also
//               cistern:vmm=false (classic segments, one thread: the engine's hit-path cost)
//   threads     1, 2, 4; every thread runs the whole workload on its own stream (its own heap).
// Two more families, cistern only, show the paths that leave the stream's own pool:
//   shared_stream/<workload>/cistern/threads:N   2 and 4 threads allocate and free on one stream
//                                                (one pool and one pool lock for all)
//   cross_stream/<workload>/cistern[/threads:N]  every thread allocates on its own stream and
//                                                frees on a second stream of its own (the free
//                                                records an event; the block is reused once the
//                                                allocating stream sees it completed)
// Every run warms up first (two passes over the sizes), so that cistern serves the measured
// requests from its cache. The cistern rows count what still left the hit path during the
// measurement: device_allocs (segments from the device) and takeovers (cached segments taken
// from another stream's pool).
//
// Figures (all wall-clock): ns_per_pair is the time of one pair in one thread (averaged over the
// threads); items_per_second counts the pairs of all threads together per second (the scaling
// figure); Google Benchmark's own time column is wall time / all threads' pairs. UseRealTime is
// not used because it would put "/real_time" into every name.
//
// Modes:
//   bench_hot_path [Google Benchmark flags]      e.g. --benchmark_out=r.json
//                                                     --benchmark_out_format=json
//   bench_hot_path --smoke                       a quick run for CTest: fails if a pair/ row
//                                                (each thread on its own stream, a steady state)
//                                                took a segment over from another stream
//   bench_hot_path --callgrind-pairs=N --allocator=cistern|mimalloc|glibc --workload=NAME
//                  [--cross-stream]              warm up, then exactly N pairs between callgrind's
//                                                START/STOP_INSTRUMENTATION (run it under
//                                                valgrind --tool=callgrind --instr-atstart=no);
//                                                --cross-stream: cistern frees on a second stream
#include <benchmark/benchmark.h>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define CISTERN_BENCH_HAVE_CALLGRIND 1
#else
#define CISTERN_BENCH_HAVE_CALLGRIND 0
#endif

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace cistern::bench {
namespace {

// --- one benchmark run ---------------------------------------------------------------------------

/// What the threads of one run share: the device, two streams per thread (created up front: the
/// first allocates, the second frees in the cross_stream rows), one allocator, and a barrier.
struct Run {
  Run(int threads, const Config& config)
      : streams(make_streams(device, 2 * threads)), allocator(device, config), barrier(threads) {}

  static std::vector<Stream> make_streams(SimDevice& device, int threads) {
    std::vector<Stream> made;
    for (int i = 0; i < threads; ++i) made.push_back(device.create_stream());
    return made;
  }

  SimDevice device{large_device_options()};
  std::vector<Stream> streams;
  CachingAllocator allocator;
  ThreadBarrier barrier;
  SlowPaths slow_paths_before;
};

// Google Benchmark runs one benchmark at a time and calls these once per run, before the threads
// start and after they have ended.
std::unique_ptr<Run> g_run;
void start_run(const benchmark::State& state) {
  g_run = std::make_unique<Run>(state.threads(), Config::from_env());
}
// The cistern:vmm=false rows: classic segments, to compare the engine's hit path with.
void start_classic_run(const benchmark::State& state) {
  Config config = Config::from_env();
  config.vmm = Config::Vmm::off;
  g_run = std::make_unique<Run>(state.threads(), config);
}
void end_run(const benchmark::State&) { g_run.reset(); }

using WallClock = std::chrono::steady_clock;

/// items_per_second: the pairs of all threads per second of wall time (each thread adds its own
/// rate). ns_per_pair: wall-clock nanoseconds per pair in one thread, averaged over threads.
/// Both use wall time, not Google Benchmark's CPU time, so that waiting for a lock counts.
void set_pair_counters(benchmark::State& state, WallClock::duration wall) {
  const double pairs = static_cast<double>(state.iterations());
  const double ns = std::chrono::duration<double, std::nano>(wall).count();
  if (pairs == 0 || ns == 0) return;
  state.counters["items_per_second"] = benchmark::Counter(pairs * 1e9 / ns);
  state.counters["ns_per_pair"] = benchmark::Counter(ns / pairs, benchmark::Counter::kAvgThreads);
}

/// One thread's part of a run: warm up, wait for the others, measure. `cistern`: report how often
/// the measured pairs left cistern's cache-hit path (counters device_allocs and takeovers).
template <class Heap>
void measure(benchmark::State& state, Heap heap, const Workload& workload, bool cistern) {
  Run& run = *g_run;
  FifoWindow<Heap> window(heap, workload);
  window.warm_up();
  run.barrier.wait();  // every thread warmed up
  const bool report = cistern && state.thread_index() == 0;
  if (report) run.slow_paths_before = SlowPaths::of(run.allocator);
  run.barrier.wait();
  const WallClock::time_point start = WallClock::now();
  for (auto _ : state) window.step();
  // The loop ends with a barrier of its own: every thread has finished measuring here.
  const WallClock::duration wall = WallClock::now() - start;
  if (report) {
    const SlowPaths slow = SlowPaths::of(run.allocator) - run.slow_paths_before;
    state.counters["device_allocs"] = static_cast<double>(slow.device_allocs);
    state.counters["takeovers"] = static_cast<double>(slow.takeovers);
  }
  set_pair_counters(state, wall);
}

/// Which streams the threads of a cistern row use.
enum class StreamUse {
  own,     // pair/...: each thread allocates and frees on its own stream
  shared,  // shared_stream/...: every thread allocates and frees on the first stream
  cross,   // cross_stream/...: each thread allocates on its own stream and frees on another
};

/// The cistern heap of the calling thread in a row of the given stream use.
CisternHeap cistern_heap(const benchmark::State& state, StreamUse use) {
  const auto t = static_cast<std::size_t>(state.thread_index());
  const std::vector<Stream>& streams = g_run->streams;
  switch (use) {
    case StreamUse::shared: return CisternHeap(g_run->allocator, streams[0]);
    case StreamUse::cross: return CisternHeap(g_run->allocator, streams[2 * t], streams[2 * t + 1]);
    case StreamUse::own: break;
  }
  return CisternHeap(g_run->allocator, streams[2 * t]);
}

void bench_pairs(benchmark::State& state, const std::string& workload_name, AllocatorKind kind,
                 const std::string& unavailable, StreamUse use) {
  if (!unavailable.empty()) {
    state.SkipWithError(unavailable.c_str());
    return;
  }
  const Workload& w = workload(workload_name);
  switch (kind) {
    case AllocatorKind::cistern: measure(state, cistern_heap(state, use), w, true); break;
    case AllocatorKind::mimalloc: measure(state, MimallocHeap(), w, false); break;
    case AllocatorKind::glibc: measure(state, GlibcHeap(), w, false); break;
  }
}

/// Why a benchmark cannot run here ("" if it can).
std::string unavailable_reason(const std::string& workload_name, AllocatorKind kind) {
  const std::string shared = cistern::testing::shared_dir();
  if (is_trace_mix(workload_name) && !cistern::testing::traces_available(shared)) {
    return "no traces in " + shared + "/traces (set CISTERN_SHARED_DIR)";
  }
  return unavailable_reason(kind);
}

/// Registers `name` with 2 and 4 threads, and before that with one thread if `single`.
template <class Body>
void register_rows(const std::string& name, Body body, bool single) {
  if (single) benchmark::RegisterBenchmark(name.c_str(), body)->Setup(start_run)->Teardown(end_run);
  benchmark::RegisterBenchmark(name.c_str(), body)
      ->Threads(2)
      ->Threads(4)
      ->Setup(start_run)
      ->Teardown(end_run);
}

void register_benchmarks() {
  constexpr AllocatorKind kinds[] = {AllocatorKind::cistern, AllocatorKind::mimalloc,
                                     AllocatorKind::glibc};
  for (const std::string& name : workload_names()) {
    for (AllocatorKind kind : kinds) {
      const std::string full = "pair/" + name + "/" + to_string(kind);
      const std::string why = unavailable_reason(name, kind);
      auto body = [name, kind, why](benchmark::State& state) {
        bench_pairs(state, name, kind, why, StreamUse::own);
      };
      // Single-threaded under the plain name, then /threads:2 and /threads:4.
      register_rows(full, body, true);
    }
    const std::string why = unavailable_reason(name, AllocatorKind::cistern);
    register_rows(
        "shared_stream/" + name + "/cistern",
        [name, why](benchmark::State& state) {
          bench_pairs(state, name, AllocatorKind::cistern, why, StreamUse::shared);
        },
        false);
    register_rows(
        "cross_stream/" + name + "/cistern",
        [name, why](benchmark::State& state) {
          bench_pairs(state, name, AllocatorKind::cistern, why, StreamUse::cross);
        },
        true);
  }
  for (const std::string name : {"512B", "mix_small"}) {
    const std::string why = unavailable_reason(name, AllocatorKind::cistern);
    benchmark::RegisterBenchmark(("pair/" + name + "/cistern:vmm=false").c_str(),
                                 [name, why](benchmark::State& state) {
                                   bench_pairs(state, name, AllocatorKind::cistern, why,
                                               StreamUse::own);
                                 })
        ->Setup(start_classic_run)
        ->Teardown(end_run);
  }
}

void add_context() {
  const std::string config = Config::from_env().to_string();
  benchmark::AddCustomContext("cistern_config", config.empty() ? "defaults" : config);
  benchmark::AddCustomContext("cistern_device", "SimDevice, 1 TiB, one stream per thread");
  benchmark::AddCustomContext("malloc_library", malloc_library());
  benchmark::AddCustomContext("mimalloc", mimalloc_description());
  benchmark::AddCustomContext("traces", cistern::testing::shared_dir() + "/traces");
  benchmark::AddCustomContext("mix_window", std::to_string(kMixWindow));
  benchmark::AddCustomContext("ns_per_pair", "wall-clock ns per pair in one thread");
  benchmark::AddCustomContext("items_per_second", "pairs of all threads per wall-clock second");
}

// --- counting mode (callgrind) -------------------------------------------------------------------

struct CountRequest {
  std::uint64_t pairs = 0;
  AllocatorKind kind = AllocatorKind::cistern;
  std::string workload = "mix_small";
  bool cross_stream = false;  // cistern frees on another stream than it allocates on
};

/// Warms up, then runs exactly `pairs` pairs inside callgrind's instrumentation window; returns
/// how often those pairs left cistern's cache-hit path.
template <class Heap>
SlowPaths counted_pairs(Heap heap, const Workload& workload, std::uint64_t pairs,
                        const CachingAllocator& allocator) {
  FifoWindow<Heap> window(heap, workload);
  window.warm_up();
  const SlowPaths before = SlowPaths::of(allocator);
#if CISTERN_BENCH_HAVE_CALLGRIND
  CALLGRIND_START_INSTRUMENTATION;
#endif
  for (std::uint64_t i = 0; i < pairs; ++i) window.step();
#if CISTERN_BENCH_HAVE_CALLGRIND
  CALLGRIND_STOP_INSTRUMENTATION;
#endif
  return SlowPaths::of(allocator) - before;
}

/// The counting mode; returns the exit status.
int count_pairs(const CountRequest& request) {
  if (!CISTERN_BENCH_HAVE_CALLGRIND) {
    std::fprintf(stderr,
                 "bench_hot_path: built without <valgrind/callgrind.h> (Debian: valgrind); "
                 "the counting mode would count the whole process\n");
    return 2;
  }
  if (const std::string why = unavailable_reason(request.workload, request.kind); !why.empty()) {
    std::fprintf(stderr, "bench_hot_path: %s\n", why.c_str());
    return 2;
  }
  const Workload& w = workload(request.workload);
  SimDevice device(large_device_options());
  CachingAllocator allocator(device, Config::from_env());
  const Stream stream = device.create_stream();
  const Stream free_stream = request.cross_stream ? device.create_stream() : stream;
  SlowPaths slow;
  switch (request.kind) {
    case AllocatorKind::cistern:
      slow =
          counted_pairs(CisternHeap(allocator, stream, free_stream), w, request.pairs, allocator);
      break;
    case AllocatorKind::mimalloc:
      slow = counted_pairs(MimallocHeap(), w, request.pairs, allocator);
      break;
    case AllocatorKind::glibc:
      slow = counted_pairs(GlibcHeap(), w, request.pairs, allocator);
      break;
  }
  std::printf(
      "{\"allocator\": \"%s\", \"workload\": \"%s\", \"pairs\": %llu, "
      "\"device_allocs\": %lld, \"takeovers\": %lld}\n",
      to_string(request.kind), request.workload.c_str(),
      static_cast<unsigned long long>(request.pairs), static_cast<long long>(slow.device_allocs),
      static_cast<long long>(slow.takeovers));
  return 0;
}

// --- command line --------------------------------------------------------------------------------

struct Options {
  bool smoke = false;
  bool counting = false;
  CountRequest count;
  std::vector<std::string> benchmark_args;  // argv[0] and everything for Google Benchmark
};

bool take_value(const std::string& arg, const std::string& flag, std::string* value) {
  if (arg.rfind(flag + "=", 0) != 0) return false;
  *value = arg.substr(flag.size() + 1);
  return true;
}

Options parse_options(int argc, char** argv) {
  Options options;
  options.benchmark_args.emplace_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    if (arg == "--smoke") {
      options.smoke = true;
    } else if (take_value(arg, "--callgrind-pairs", &value)) {
      options.counting = true;
      options.count.pairs = std::stoull(value);
    } else if (take_value(arg, "--allocator", &value)) {
      options.count.kind = parse_allocator(value);
    } else if (take_value(arg, "--workload", &value)) {
      options.count.workload = value;
    } else if (arg == "--cross-stream") {
      options.count.cross_stream = true;
    } else {
      options.benchmark_args.push_back(arg);
    }
  }
  return options;
}

bool has_flag(const std::vector<std::string>& args, const std::string& flag) {
  for (const std::string& arg : args) {
    if (arg.rfind(flag, 0) == 0) return true;
  }
  return false;
}

/// --smoke: a tiny minimum time and, unless a filter is given, a few representative rows, the
/// threaded rows of every mix among them (where streams used to take each other's memory).
void add_smoke_flags(std::vector<std::string>& args) {
  if (!has_flag(args, "--benchmark_min_time")) args.emplace_back("--benchmark_min_time=0.002");
  if (!has_flag(args, "--benchmark_filter")) {
    args.emplace_back("--benchmark_filter=^pair/(512B|mix_small|mix_all)/(cistern|mimalloc)");
  }
}

/// The console output, and what the rows say of the steady state: in a pair/ row every thread
/// repeats its own work on its own stream with a warm cache, so a take-over of another stream's
/// segment (which orders one stream after the other's work) is a defect of the allocator, not of
/// the workload.
class SteadyStateReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      const std::string name = run.benchmark_name();
      const auto takeovers = run.counters.find("takeovers");
      if (name.rfind("pair/", 0) != 0 || takeovers == run.counters.end()) continue;
      if (takeovers->second.value > 0) {
        failures_.push_back(name + ": " +
                            std::to_string(static_cast<long long>(takeovers->second.value)) +
                            " take-overs while measuring");
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  const std::vector<std::string>& failures() const noexcept { return failures_; }

 private:
  std::vector<std::string> failures_;
};

/// The smoke run's extra check: after the warm-up, a pass over the small mix is all cache hits
/// for cistern (if not, the benchmark no longer measures the hit path).
int smoke_check() {
  if (!unavailable_reason("mix_small", AllocatorKind::cistern).empty()) return 0;
  const Workload& w = workload("mix_small");
  SimDevice device(large_device_options());
  CachingAllocator allocator(device, Config::from_env());
  const SlowPaths slow =
      counted_pairs(CisternHeap(allocator, device.create_stream()), w, w.sizes.size(), allocator);
  if (!slow.any()) return 0;
  std::fprintf(stderr,
               "bench_hot_path: after the warm-up, a pass over mix_small made %lld device "
               "allocations and %lld segment takeovers: the warm-up no longer reaches the "
               "cache-hit steady state\n",
               static_cast<long long>(slow.device_allocs), static_cast<long long>(slow.takeovers));
  return 1;
}

int run_benchmarks(Options& options) {
  if (options.smoke) add_smoke_flags(options.benchmark_args);
  std::vector<char*> argv;
  for (std::string& arg : options.benchmark_args) argv.push_back(arg.data());
  int argc = static_cast<int>(argv.size());
  benchmark::Initialize(&argc, argv.data());
  if (benchmark::ReportUnrecognizedArguments(argc, argv.data())) return 1;
  register_benchmarks();
  add_context();
  SteadyStateReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  for (const std::string& failure : reporter.failures()) {
    std::fprintf(stderr, "bench_hot_path: steady state broken: %s\n", failure.c_str());
  }
  if (!options.smoke) return 0;
  return reporter.failures().empty() ? smoke_check() : 1;
}

}  // namespace
}  // namespace cistern::bench

int main(int argc, char** argv) {
  using namespace cistern::bench;
  try {
    Options options = parse_options(argc, argv);
    if (options.counting) return count_pairs(options.count);
    return run_benchmarks(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_hot_path: %s\n", e.what());
    return 2;
  }
}
