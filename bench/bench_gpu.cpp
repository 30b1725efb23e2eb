// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// bench_gpu: cistern against the allocators CUDA programs otherwise use, on a real GPU, in one
// process and one run (gpu_allocators.hpp): cistern with its page engine (`vmm:true`, on a
// CudaVmmDevice) and without it (`vmm:false`), cudaMalloc, cudaMallocAsync (pool, release
// threshold unlimited), CUB's CachingDeviceAllocator and PyTorch's caching allocator.
//
//   bench_gpu --out DIR [--trace FILE]... [--trace-if-present FILE]... [--torch-shim LIB]
//             [--device N] [--smoke] [--budget-s S] [--self-test]
//
// Two workloads per allocator, all on the device's default stream:
//   cache_hit     allocate + free of one size, again and again after a warm-up: the hot path
//                 (ns per pair, the median of several runs of about 0.3 s each);
//   trace_replay  the allocations and frees of a recorded trace (a PyTorch snapshot), as fast as
//                 the allocator serves them (host ns per operation, peak reserved where the
//                 allocator reports it, OOMs); a replay that exceeds --budget-s stops there and
//                 is marked partial (raw cudaMalloc on a long trace).
// Writes DIR/bench_gpu.json and DIR/bench_gpu.md. Exits 77 (skipped) when no GPU can be used.
// --self-test runs the whole program without a GPU, host malloc standing in for the allocators
// (a CTest check of the harness, the JSON and the markdown). --trace-if-present names a trace
// that is replayed when the file exists and otherwise left out with a line saying so (the
// shared traces, on a clone without ../shared).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cistern/types.hpp"
#include "gpu_allocators.hpp"
#include "trace/readers.hpp"
#include "trace/trace.hpp"

namespace cistern::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr int kSkipped = 77;

struct Args {
  std::string out = "results/gpu";
  std::vector<std::string> traces;
  std::string torch_shim;
  int device = 0;
  bool smoke = false;
  /// No GPU: host malloc stands in for every allocator, to check this program's own logic.
  bool self_test = false;
  double budget_s = 30;
};

double ns_since(Clock::time_point began) {
  return std::chrono::duration<double, std::nano>(Clock::now() - began).count();
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--smoke") {
      args.smoke = true;
    } else if (flag == "--self-test") {
      args.self_test = true;
      args.smoke = true;
    } else if (flag == "--out" && has_value) {
      args.out = argv[++i];
    } else if (flag == "--trace" && has_value) {
      args.traces.emplace_back(argv[++i]);
    } else if (flag == "--trace-if-present" && has_value) {
      const std::string path = argv[++i];
      if (std::filesystem::exists(path)) {
        args.traces.push_back(path);
      } else {
        std::printf("bench_gpu: no trace at %s (../shared is not beside this clone?): left out\n",
                    path.c_str());
      }
    } else if (flag == "--torch-shim" && has_value) {
      args.torch_shim = argv[++i];
    } else if (flag == "--device" && has_value) {
      args.device = std::atoi(argv[++i]);
    } else if (flag == "--budget-s" && has_value) {
      args.budget_s = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: bench_gpu --out DIR [--trace FILE]... [--trace-if-present FILE]... "
                   "[--torch-shim LIB] [--device N] [--smoke] [--budget-s S] [--self-test]\n");
      std::exit(2);
    }
  }
  return args;
}

// --- cache hits ------------------------------------------------------------------------------------

/// `pairs` allocate + free pairs of `bytes`; the ns of one pair.
double time_pairs(GpuAllocator& a, std::size_t bytes, int pairs) {
  const Clock::time_point began = Clock::now();
  for (int i = 0; i < pairs; ++i) {
    void* p = a.allocate(bytes, nullptr);
    if (p == nullptr) throw std::runtime_error("out of memory");
    a.deallocate(p, bytes, nullptr);
  }
  return ns_since(began) / pairs;
}

/// One size: a warm-up, a probe that sizes the runs (about `run_s` each, at most `max_pairs`
/// pairs: an allocator that does not cache this size pays cudaMalloc + cudaFree every time), and
/// the median of `repetitions` runs.
Json cache_hit_row(GpuAllocator& a, std::size_t bytes, const Args& args) {
  const double run_s = args.smoke ? 0.02 : 0.3;
  const int max_pairs = args.smoke ? 200 : 20000;
  const int repetitions = args.smoke ? 3 : 5;
  Json row;
  row["allocator"] = a.name();
  row["bytes"] = bytes;
  try {
    (void)time_pairs(a, bytes, 1);
    const double probe_ns = time_pairs(a, bytes, 10);
    const int pairs =
        std::clamp(static_cast<int>(run_s * 1e9 / std::max(probe_ns, 1.0)), 10, max_pairs);
    std::vector<double> runs;
    for (int r = 0; r < repetitions; ++r) runs.push_back(time_pairs(a, bytes, pairs));
    std::sort(runs.begin(), runs.end());
    row["pairs"] = pairs;
    row["repetitions"] = repetitions;
    row["ns_per_pair"] = runs[runs.size() / 2];
  } catch (const std::exception& e) {
    row["ns_per_pair"] = nullptr;
    row["error"] = e.what();
  }
  return row;
}

Json cache_hits(GpuAllocator& a, const Args& args) {
  Json rows = Json::array();
  for (std::size_t bytes : {std::size_t{512}, 64 * KiB, 1 * MiB, 16 * MiB}) {
    rows.push_back(cache_hit_row(a, bytes, args));
  }
  a.release_cache();
  return rows;
}

// --- trace replay ----------------------------------------------------------------------------------

/// What one replay measured.
struct ReplayFigures {
  std::size_t ops = 0;  ///< allocations and frees made in the timed loop
  std::size_t events_done = 0;
  std::uint64_t ooms = 0;
  double loop_ns = 0;
  bool partial = false;
};

/// The trace as the timed loop reads it: ids replaced by dense slots, so that the loop costs
/// the same small vector access for every allocator (no hashing in the measurement).
struct Step {
  trace::Op op = trace::Op::alloc;
  std::uint32_t slot = 0;
  std::uint64_t bytes = 0;
};

struct CompiledTrace {
  std::vector<Step> start;  ///< the blocks live before the window
  std::vector<Step> steps;  ///< the window's events
  std::size_t slots = 0;
};

CompiledTrace compile(const trace::Trace& t) {
  CompiledTrace c;
  std::unordered_map<std::uint64_t, std::uint32_t> slot_of;
  const auto slot = [&](std::uint64_t id) {
    const auto [it, added] = slot_of.emplace(id, static_cast<std::uint32_t>(slot_of.size()));
    return it->second;
  };
  for (const trace::LiveBlock& b : t.live_before) {
    c.start.push_back(Step{trace::Op::alloc, slot(b.id), b.size});
  }
  for (const trace::Event& e : t.events) {
    const bool has_id = e.op == trace::Op::alloc || e.op == trace::Op::free;
    c.steps.push_back(Step{e.op, has_id ? slot(e.id) : 0, e.size});
  }
  c.slots = slot_of.size();
  return c;
}

class TraceReplay {
 public:
  TraceReplay(GpuAllocator& a, const CompiledTrace& t, double budget_s, bool on_gpu)
      : a_(a), trace_(t), budget_ns_(budget_s * 1e9), on_gpu_(on_gpu), live_(t.slots) {}

  ReplayFigures run() {
    for (const Step& step : trace_.start) allocate(step);
    a_.reset_peak();
    const Clock::time_point began = Clock::now();
    for (const Step& step : trace_.steps) {
      play(step);
      ++figures_.events_done;
      if ((figures_.events_done & 63) == 0 && ns_since(began) > budget_ns_) {
        figures_.partial = figures_.events_done < trace_.steps.size();
        break;
      }
    }
    figures_.loop_ns = ns_since(began);
    synchronize();
    return figures_;
  }

  /// Frees what is still allocated and empties the cache (untimed).
  void release() {
    for (Block& block : live_) {
      if (block.ptr != nullptr) a_.deallocate(block.ptr, block.bytes, nullptr);
      block = Block{};
    }
    a_.release_cache();
  }

 private:
  struct Block {
    void* ptr = nullptr;
    std::size_t bytes = 0;
  };

  void synchronize() const {
    if (on_gpu_) check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  void allocate(const Step& step) {
    if (step.bytes == 0) return;
    void* p = a_.allocate(step.bytes, nullptr);
    if (p == nullptr) {
      ++figures_.ooms;
      return;
    }
    live_[step.slot] = Block{p, step.bytes};
  }

  void play(const Step& step) {
    switch (step.op) {
      case trace::Op::alloc:
        ++figures_.ops;
        allocate(step);
        return;
      case trace::Op::free: {
        Block& block = live_[step.slot];
        if (block.ptr == nullptr) return;  // its allocation failed (or had no bytes)
        ++figures_.ops;
        a_.deallocate(block.ptr, block.bytes, nullptr);
        block = Block{};
        return;
      }
      case trace::Op::synchronize: synchronize(); return;
      case trace::Op::empty_cache: a_.release_cache(); return;
    }
  }

  GpuAllocator& a_;
  const CompiledTrace& trace_;
  double budget_ns_;
  bool on_gpu_;
  ReplayFigures figures_;
  std::vector<Block> live_;  ///< by slot
};

Json replay_row(GpuAllocator& a, const trace::Trace& t, const Args& args) {
  Json row;
  row["allocator"] = a.name();
  row["trace"] = t.source;
  row["events"] = t.events.size();
  row["peak_live"] = t.peak_live();
  const CompiledTrace compiled = compile(t);
  TraceReplay replay(a, compiled, args.smoke ? std::min(args.budget_s, 2.0) : args.budget_s,
                     !args.self_test);
  try {
    const ReplayFigures f = replay.run();
    row["events_done"] = f.events_done;
    row["partial"] = f.partial;
    row["ops"] = f.ops;
    row["ooms"] = f.ooms;
    row["loop_ms"] = f.loop_ns / 1e6;
    row["ns_per_op"] = f.ops > 0 ? Json(f.loop_ns / static_cast<double>(f.ops)) : Json(nullptr);
    const std::optional<std::uint64_t> peak = a.peak_reserved();
    row["peak_reserved"] = peak ? Json(*peak) : Json(nullptr);
  } catch (const std::exception& e) {
    row["error"] = e.what();
  }
  try {
    replay.release();  // the next allocator starts on an empty device
  } catch (const std::exception& e) {
    if (!row.contains("error")) row["error"] = std::string("releasing: ") + e.what();
  }
  return row;
}

// --- the run ---------------------------------------------------------------------------------------

/// The allocators to compare, by name; one that cannot be made here is listed as skipped.
using Maker = std::pair<std::string, std::function<std::unique_ptr<GpuAllocator>()>>;

/// --self-test: host memory as "device" memory, no CUDA call at all.
class HostAllocator final : public GpuAllocator {
 public:
  std::string name() const override { return "host-malloc"; }
  void* allocate(std::size_t bytes, cudaStream_t) override { return std::malloc(bytes); }
  void deallocate(void* ptr, std::size_t, cudaStream_t) override { std::free(ptr); }
  void release_cache() override {}
};

std::vector<Maker> allocator_makers(const Args& args) {
  if (args.self_test) {
    return {{"host-malloc", [] { return std::make_unique<HostAllocator>(); }},
            {"missing", []() -> std::unique_ptr<GpuAllocator> {
               throw std::runtime_error("self-test: an allocator that cannot be made");
             }}};
  }
  const int d = args.device;
  std::vector<Maker> makers = {
      {"cistern vmm:true", [d] { return make_cistern_allocator(d, true); }},
      {"cistern vmm:false", [d] { return make_cistern_allocator(d, false); }},
      {"cudaMalloc", [] { return make_cuda_malloc_allocator(); }},
      {"cudaMallocAsync", [d] { return make_cuda_malloc_async_allocator(d); }},
      {"cub", [d] { return make_cub_allocator(d); }},
  };
  if (!args.torch_shim.empty()) {
    makers.emplace_back("torch",
                        [d, shim = args.torch_shim] { return make_torch_allocator(shim, d); });
  }
  return makers;
}

Json environment(int device) {
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  int runtime = 0;
  int driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);
  Json env;
  env["device"] = properties.name;
  env["memory"] = properties.totalGlobalMem;
  env["cuda_runtime"] = runtime;
  env["cuda_driver"] = driver;
  return env;
}

std::string cell(const Json& value, const char* format, double scale = 1) {
  if (value.is_null()) return "-";
  char text[64];
  std::snprintf(text, sizeof text, format, value.get<double>() / scale);
  return text;
}

std::string markdown(const Json& doc) {
  std::string md = "## GPU allocator benchmark (bench_gpu)\n\n";
  md += "Device: " + doc["environment"]["device"].get<std::string>() + ", CUDA runtime " +
        std::to_string(doc["environment"]["cuda_runtime"].get<int>()) + ", driver " +
        std::to_string(doc["environment"]["cuda_driver"].get<int>()) + ".\n\n";
  md +=
      "### Cache-hit allocate + free (ns per pair, median)\n\n| allocator | 512 B | 64 KiB | "
      "1 MiB | 16 MiB |\n|---|---:|---:|---:|---:|\n";
  std::string current;
  for (const Json& row : doc["cache_hit"]) {
    const std::string name = row["allocator"];
    if (name != current) {
      if (!current.empty()) md += "\n";
      md += "| " + name + " |";
      current = name;
    }
    md += " " + cell(row["ns_per_pair"], "%.0f") + " |";
  }
  md +=
      "\n\n### Trace replay (host ns per allocation or free)\n\n| trace | allocator | ns/op | "
      "peak reserved (GiB) | OOMs | events done |\n|---|---|---:|---:|---:|---:|\n";
  for (const Json& row : doc["trace_replay"]) {
    const std::string trace =
        std::filesystem::path(row["trace"].get<std::string>()).parent_path().filename().string() +
        "/" + std::filesystem::path(row["trace"].get<std::string>()).filename().string();
    if (row.contains("error")) {
      md += "| " + trace + " | " + row["allocator"].get<std::string>() +
            " | error: " + row["error"].get<std::string>() + " | | | |\n";
      continue;
    }
    md += "| " + trace + " | " + row["allocator"].get<std::string>() + " | " +
          cell(row["ns_per_op"], "%.0f") + " | " +
          cell(row["peak_reserved"], "%.2f", static_cast<double>(GiB)) + " | " +
          std::to_string(row["ooms"].get<std::uint64_t>()) + " | " +
          std::to_string(row["events_done"].get<std::size_t>()) + "/" +
          std::to_string(row["events"].get<std::size_t>()) +
          (row["partial"].get<bool>() ? " (budget)" : "") + " |\n";
  }
  for (const Json& skip : doc["skipped"]) {
    md += "\nSkipped: " + skip["allocator"].get<std::string>() + ": " +
          skip["why"].get<std::string>() + "\n";
  }
  return md;
}

Json self_test_environment() {
  Json env;
  env["device"] = "host (bench_gpu --self-test)";
  env["memory"] = 0;
  env["cuda_runtime"] = 0;
  env["cuda_driver"] = 0;
  return env;
}

int run(const Args& args) {
  int count = 0;
  const cudaError_t probe = args.self_test ? cudaSuccess : cudaGetDeviceCount(&count);
  if (!args.self_test && (probe != cudaSuccess || count <= args.device)) {
    std::printf("bench_gpu: skipped: no usable CUDA device %d (%s)\n", args.device,
                probe != cudaSuccess ? cudaGetErrorName(probe) : "not present");
    return kSkipped;
  }
  if (!args.self_test) check_cuda(cudaSetDevice(args.device), "cudaSetDevice");
  std::vector<trace::Trace> traces;
  for (const std::string& path : args.traces) traces.push_back(trace::read_trace(path, {}));

  Json doc;
  doc["environment"] = args.self_test ? self_test_environment() : environment(args.device);
  doc["smoke"] = args.smoke;
  doc["cache_hit"] = Json::array();
  doc["trace_replay"] = Json::array();
  doc["skipped"] = Json::array();
  for (const auto& [name, make] : allocator_makers(args)) {
    std::unique_ptr<GpuAllocator> a;
    try {
      a = make();
    } catch (const std::exception& e) {
      std::printf("bench_gpu: skipped %s: %s\n", name.c_str(), e.what());
      doc["skipped"].push_back(Json{{"allocator", name}, {"why", e.what()}});
      continue;
    }
    std::printf("bench_gpu: %s\n", a->name().c_str());
    std::fflush(stdout);
    for (const Json& row : cache_hits(*a, args)) doc["cache_hit"].push_back(row);
    for (const trace::Trace& t : traces) doc["trace_replay"].push_back(replay_row(*a, t, args));
  }
  std::filesystem::create_directories(args.out);
  std::ofstream(std::filesystem::path(args.out) / "bench_gpu.json") << doc.dump(2) << "\n";
  std::ofstream(std::filesystem::path(args.out) / "bench_gpu.md") << markdown(doc);
  std::printf("bench_gpu: wrote %s/bench_gpu.json and bench_gpu.md\n", args.out.c_str());
  return 0;
}

}  // namespace
}  // namespace cistern::bench

int main(int argc, char** argv) {
  try {
    return cistern::bench::run(cistern::bench::parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
}
