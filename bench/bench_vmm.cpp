// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// bench_vmm: the time of every virtual-memory call the page engine makes, on the real device.
//
//   bench_vmm --out DIR [--device N] [--repetitions N] [--smoke] [--self-test]
//
// Each call is timed alone (steady_clock around the one call), `--repetitions` times (default
// 200; 20 with --smoke), after an untimed warm-up round:
//   cuMemAddressReserve / cuMemAddressFree of 9/8 of the device's memory (as PyTorch reserves);
//   cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease of 2 MiB and 20 MiB handles
//     (PyTorch's two page sizes), 200 MiB and 2 GiB ones, in batches: create a batch, map each
//     at a fresh address, set its access, unmap each, release each - the order a growing and
//     shrinking pool makes;
//   one cuMemSetAccess and one cuMemUnmap over 1, 8, 64 and 512 adjacent mappings of 2 MiB
//     handles, and over one handle of 512 granules mapped whole (a quarter of the repetitions):
//     the cost per mapping covered (a least-squares slope, printed) and per MiB of a mapping;
//   cudaEventRecord, cudaEventQuery, cudaStreamSynchronize and cudaEventSynchronize on an idle
//     stream (the query then synchronise pair reclaim pays per stream), and cudaDeviceSynchronize;
//   cudaMalloc / cudaFree at 2, 20, 200 MiB and 2 GiB (the segment calls the model also prices);
//   sizes over a quarter of the GPU's memory are skipped;
//   the same VMM calls through CudaVmmDevice (the device contract: tracking and device guard
//     included; its map is cuMemMap + cuMemSetAccess).
// Writes DIR/bench_vmm.json (every call: median, p99, mean, min, max; and the cost model's
// fields, which `cistern replay --cost-model DIR/bench_vmm.json` reads) and DIR/bench_vmm.md.
// Without a usable GPU (or without virtual memory management) it prints one "bench_vmm: SKIPPED:
// ..." line and exits 0. --self-test checks the summaries, the cost-model derivation and the output
// on made-up samples, without a GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cistern/cuda_device.hpp"
#include "cistern/errors.hpp"
#include "cistern/types.hpp"
#include "cuda/cuda_api.hpp"
#include "replay/engine.hpp"
#include "vmm_costs.hpp"

namespace cistern::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

struct Args {
  std::string out = "results/gpu";
  int device = 0;
  int repetitions = 200;
  bool smoke = false;
  bool self_test = false;
};

Args parse_args(int argc, char** argv) {
  Args args;
  bool repetitions_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--smoke") {
      args.smoke = true;
    } else if (flag == "--self-test") {
      args.self_test = true;
    } else if (flag == "--out" && has_value) {
      args.out = argv[++i];
    } else if (flag == "--device" && has_value) {
      args.device = std::atoi(argv[++i]);
    } else if (flag == "--repetitions" && has_value) {
      args.repetitions = std::max(1, std::atoi(argv[++i]));
      repetitions_given = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_vmm --out DIR [--device N] [--repetitions N] [--smoke] "
                   "[--self-test]\n");
      std::exit(2);
    }
  }
  if (args.smoke && !repetitions_given) args.repetitions = 20;
  return args;
}

double ns_since(Clock::time_point began) {
  return std::chrono::duration<double, std::nano>(Clock::now() - began).count();
}

// --- the calls ---------------------------------------------------------------------------------------

/// The driver's virtual-memory functions and the device they run on; every failure throws.
class Driver {
 public:
  Driver(int ordinal, detail::CudaDriverApi api) : ordinal_(ordinal), api_(api) {}

  const detail::CudaDriverApi& api() const noexcept { return api_; }
  int ordinal() const noexcept { return ordinal_; }

  void check(CUresult result, const char* call) const {
    if (result == CUDA_SUCCESS) return;
    const char* name = nullptr;
    if (api_.get_error_name(result, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown";
    throw std::runtime_error(std::string(call) + " failed: " + name);
  }

  /// Pinned device memory of this GPU, as CudaVmmDevice creates it.
  CUmemAllocationProp properties() const {
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = ordinal_;
    return p;
  }

  /// Read-write access for this GPU.
  CUmemAccessDesc access() const {
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = ordinal_;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return a;
  }

 private:
  int ordinal_;
  detail::CudaDriverApi api_;
};

void check_cuda(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return;
  (void)cudaGetLastError();
  throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(error));
}

/// The series being measured, by name, in the order first used.
class Recorder {
 public:
  /// Times `call` (which returns a CUresult or cudaError_t) into series `name`; throws on failure.
  template <class Call, class Check>
  void time(const std::string& name, const char* api_call, std::size_t bytes, Call&& call,
            Check&& check) {
    const Clock::time_point began = Clock::now();
    const auto result = call();
    const double ns = ns_since(began);
    check(result, api_call);
    if (timing_) series(name, api_call, bytes).ns.push_back(ns);
  }

  /// Adds one sample measured by the caller.
  void add(const std::string& name, const char* api_call, std::size_t bytes, double ns) {
    if (timing_) series(name, api_call, bytes).ns.push_back(ns);
  }

  /// While false (the warm-up round), calls run but are not recorded.
  void set_timing(bool on) noexcept { timing_ = on; }
  const std::vector<CallSeries>& all() const noexcept { return series_; }

 private:
  CallSeries& series(const std::string& name, const char* api_call, std::size_t bytes) {
    for (CallSeries& s : series_) {
      if (s.name == name) return s;
    }
    series_.push_back(CallSeries{name, api_call, bytes, {}});
    return series_.back();
  }

  std::vector<CallSeries> series_;
  bool timing_ = true;
};

/// The measurements, one method per group of calls.
class VmmBench {
 public:
  VmmBench(const Driver& driver, std::size_t granularity, std::size_t total_memory)
      : driver_(driver), granularity_(granularity), total_memory_(total_memory) {}

  Recorder& recorder() noexcept { return recorder_; }

  /// Reserving and freeing the address space one pool of PyTorch's takes.
  void reserve(int repetitions) {
    const std::size_t bytes = round_up(total_memory_ / 8 * 9);
    for (int i = 0; i < repetitions; ++i) {
      CUdeviceptr va = 0;
      driver_time("reserve", "cuMemAddressReserve", bytes,
                  [&] { return driver_.api().mem_address_reserve(&va, bytes, 0, 0, 0); });
      driver_time("address_free", "cuMemAddressFree", bytes,
                  [&] { return driver_.api().mem_address_free(va, bytes); });
    }
  }

  /// Create, map, set access, unmap and release of `count` handles of `bytes`, in batches.
  void handles(std::size_t bytes, const std::string& suffix, std::size_t count, std::size_t batch) {
    if (!fits(batch * bytes)) return;
    for (std::size_t done = 0; done < count; done += batch) {
      handle_batch(bytes, suffix, std::min(batch, count - done));
    }
  }

  /// One cuMemSetAccess, then one cuMemUnmap, over `n` adjacent mappings of 2 MiB handles for
  /// each n of kSpanMappings, and over one handle of 512 granules mapped whole, `repetitions`
  /// times each: the series "set_access_<n>x2mib", "unmap_<n>x2mib", "set_access_1x1024mib" and
  /// "unmap_1x1024mib" of vmm_costs.hpp.
  void spans(int repetitions) {
    const std::size_t piece = round_up(2 * MiB);
    for (const std::size_t n : kSpanMappings) {
      if (!fits(n * piece)) continue;
      for (int r = 0; r < repetitions; ++r) span(n, piece, std::to_string(n) + "x2mib");
    }
    const std::size_t whole = round_up(kWholeHandleMiB * MiB);
    if (!fits(whole)) return;
    for (int r = 0; r < repetitions; ++r) {
      span(1, whole, "1x" + std::to_string(kWholeHandleMiB) + "mib");
    }
  }

  /// Record, query and synchronise on an idle stream; the query + sync pair; a device sync.
  void events(int repetitions) {
    cudaStream_t stream = nullptr;
    cudaEvent_t event = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    for (int i = 0; i < repetitions; ++i) {
      runtime_time("event_record", "cudaEventRecord",
                   [&] { return cudaEventRecord(event, stream); });
      const Clock::time_point pair = Clock::now();
      runtime_time("event_query", "cudaEventQuery", [&] { return cudaEventQuery(event); });
      runtime_time("stream_sync", "cudaStreamSynchronize",
                   [&] { return cudaStreamSynchronize(stream); });
      recorder_.add("query_sync_pair", "cudaEventQuery + cudaStreamSynchronize", 0, ns_since(pair));
      check_cuda(cudaEventRecord(event, stream), "cudaEventRecord");
      runtime_time("event_sync", "cudaEventSynchronize",
                   [&] { return cudaEventSynchronize(event); });
      runtime_time("device_sync", "cudaDeviceSynchronize", [] { return cudaDeviceSynchronize(); });
    }
    (void)cudaEventDestroy(event);
    (void)cudaStreamDestroy(stream);
  }

  /// cudaMalloc and cudaFree of `bytes`.
  void segments(std::size_t bytes, const std::string& suffix, int repetitions) {
    if (!fits(bytes)) return;
    for (int i = 0; i < repetitions; ++i) {
      void* ptr = nullptr;
      runtime_time(
          "cuda_malloc_" + suffix, "cudaMalloc", [&] { return cudaMalloc(&ptr, bytes); }, bytes);
      runtime_time(
          "cuda_free_" + suffix, "cudaFree", [&] { return cudaFree(ptr); }, bytes);
    }
  }

  /// The same calls through CudaVmmDevice, the device contract the allocator calls.
  void contract(CudaVmmDevice& device, std::size_t bytes, const std::string& suffix,
                int repetitions) {
    void* va = nullptr;
    contract_check(device, device.reserve(round_up(bytes), 0, &va));
    for (int i = 0; i < repetitions; ++i) {
      PhysicalHandle handle;
      contract_time(device, "contract_create_" + suffix, "CudaVmmDevice::create_physical", bytes,
                    [&] { return device.create_physical(bytes, &handle); });
      contract_time(device, "contract_map_" + suffix, "CudaVmmDevice::map", bytes,
                    [&] { return device.map(va, handle); });
      contract_time(device, "contract_unmap_" + suffix, "CudaVmmDevice::unmap", bytes,
                    [&] { return device.unmap(va, bytes); });
      contract_time(device, "contract_release_" + suffix, "CudaVmmDevice::release_physical", bytes,
                    [&] { return device.release_physical(handle); });
    }
    contract_check(device, device.release_reservation(va, round_up(bytes)));
  }

 private:
  std::size_t round_up(std::size_t bytes) const {
    return (bytes + granularity_ - 1) / granularity_ * granularity_;
  }

  /// Whether `bytes` held at once is at most a quarter of the GPU's memory (a larger size is
  /// skipped: its series stays absent, its figures null).
  bool fits(std::size_t bytes) const { return bytes <= total_memory_ / 4; }

  /// `n` handles of `bytes` mapped side by side (untimed), then one cuMemSetAccess and one
  /// cuMemUnmap over all of them, timed as "set_access_<name>" and "unmap_<name>".
  void span(std::size_t n, std::size_t bytes, const std::string& name) {
    const CUdeviceptr va = reserve_untimed(n * bytes);
    std::vector<CUmemGenericAllocationHandle> handles(n);
    for (std::size_t i = 0; i < n; ++i) {
      handles[i] = create_untimed(bytes);
      check(driver_.api().mem_map(va + i * bytes, bytes, 0, handles[i], 0), "cuMemMap");
    }
    const CUmemAccessDesc access = driver_.access();
    driver_time("set_access_" + name, "cuMemSetAccess", n * bytes,
                [&] { return driver_.api().mem_set_access(va, n * bytes, &access, 1); });
    driver_time("unmap_" + name, "cuMemUnmap", n * bytes,
                [&] { return driver_.api().mem_unmap(va, n * bytes); });
    for (const CUmemGenericAllocationHandle handle : handles) {
      check(driver_.api().mem_release(handle), "cuMemRelease");
    }
    check(driver_.api().mem_address_free(va, n * bytes), "cuMemAddressFree");
  }

  void check(CUresult result, const char* call) const { driver_.check(result, call); }

  template <class Call>
  void driver_time(const std::string& name, const char* call, std::size_t bytes, Call&& run) {
    recorder_.time(name, call, bytes, run,
                   [this](CUresult result, const char* what) { check(result, what); });
  }

  template <class Call>
  void runtime_time(const std::string& name, const char* call, Call&& run, std::size_t bytes = 0) {
    recorder_.time(name, call, bytes, run, check_cuda);
  }

  static void contract_check(const CudaVmmDevice& device, Status status) {
    if (status != Status::ok) throw std::runtime_error(device.last_error());
  }

  template <class Call>
  void contract_time(CudaVmmDevice& device, const std::string& name, const char* call,
                     std::size_t bytes, Call&& run) {
    recorder_.time(name, call, bytes, run,
                   [&device](Status status, const char*) { contract_check(device, status); });
  }

  CUdeviceptr reserve_untimed(std::size_t bytes) {
    CUdeviceptr va = 0;
    check(driver_.api().mem_address_reserve(&va, bytes, 0, 0, 0), "cuMemAddressReserve");
    return va;
  }

  CUmemGenericAllocationHandle create_untimed(std::size_t bytes) {
    const CUmemAllocationProp properties = driver_.properties();
    CUmemGenericAllocationHandle handle = 0;
    check(driver_.api().mem_create(&handle, bytes, &properties, 0), "cuMemCreate");
    return handle;
  }

  void handle_batch(std::size_t bytes, const std::string& suffix, std::size_t count) {
    const CUdeviceptr va = reserve_untimed(count * bytes);
    const CUmemAllocationProp properties = driver_.properties();
    const CUmemAccessDesc access = driver_.access();
    std::vector<CUmemGenericAllocationHandle> handles(count);
    for (std::size_t i = 0; i < count; ++i) {
      driver_time("create_" + suffix, "cuMemCreate", bytes,
                  [&] { return driver_.api().mem_create(&handles[i], bytes, &properties, 0); });
    }
    for (std::size_t i = 0; i < count; ++i) {
      const CUdeviceptr at = va + i * bytes;
      driver_time("map_" + suffix, "cuMemMap", bytes,
                  [&] { return driver_.api().mem_map(at, bytes, 0, handles[i], 0); });
      driver_time("set_access_" + suffix, "cuMemSetAccess", bytes,
                  [&] { return driver_.api().mem_set_access(at, bytes, &access, 1); });
    }
    for (std::size_t i = 0; i < count; ++i) {
      driver_time("unmap_" + suffix, "cuMemUnmap", bytes,
                  [&] { return driver_.api().mem_unmap(va + i * bytes, bytes); });
    }
    for (std::size_t i = 0; i < count; ++i) {
      driver_time("release_" + suffix, "cuMemRelease", bytes,
                  [&] { return driver_.api().mem_release(handles[i]); });
    }
    check(driver_.api().mem_address_free(va, count * bytes), "cuMemAddressFree");
  }

  const Driver& driver_;
  std::size_t granularity_;
  std::size_t total_memory_;
  Recorder recorder_;
};

/// Every measurement, `repetitions` times each (handles in batches of at most 50 2 MiB, 20
/// 20 MiB, 5 200 MiB or one 2 GiB: at most 2 GiB held at once), the spans a quarter as often.
void measure_all(VmmBench& bench, CudaVmmDevice& device, int repetitions) {
  const auto count = static_cast<std::size_t>(repetitions);
  bench.reserve(repetitions);
  bench.handles(2 * MiB, "2mib", count, 50);
  bench.handles(20 * MiB, "20mib", count, 20);
  bench.handles(200 * MiB, "200mib", count, 5);
  bench.handles(2048 * MiB, "2048mib", count, 1);
  bench.spans(std::max(1, repetitions / 4));
  bench.events(repetitions);
  bench.segments(2 * MiB, "2mib", repetitions);
  bench.segments(20 * MiB, "20mib", repetitions);
  bench.segments(200 * MiB, "200mib", repetitions);
  bench.segments(2048 * MiB, "2048mib", repetitions);
  bench.contract(device, 2 * MiB, "2mib", repetitions);
  bench.contract(device, 20 * MiB, "20mib", repetitions);
}

// --- the run -----------------------------------------------------------------------------------------

/// Why this machine cannot run the benchmark, or nothing.
std::optional<std::string> unusable(const Args& args) {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  if (probe != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no usable CUDA device (") + cudaGetErrorName(probe) + ")";
  }
  if (count <= args.device) return "no CUDA device " + std::to_string(args.device);
  return std::nullopt;
}

Json environment(int device, std::size_t granularity) {
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  int runtime = 0;
  int driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);
  Json env;
  env["device"] = properties.name;
  env["memory"] = properties.totalGlobalMem;
  env["granularity"] = granularity;
  env["cuda_runtime"] = runtime;
  env["cuda_driver"] = driver;
  return env;
}

void write_results(const Args& args, const Json& results) {
  std::filesystem::create_directories(args.out);
  std::ofstream(std::filesystem::path(args.out) / "bench_vmm.json") << results.dump(2) << "\n";
  std::ofstream(std::filesystem::path(args.out) / "bench_vmm.md") << results_markdown(results);
  std::printf("bench_vmm: wrote %s/bench_vmm.json and bench_vmm.md\n", args.out.c_str());
}

int run_on_gpu(const Args& args) {
  if (const auto why = unusable(args)) {
    std::printf("bench_vmm: SKIPPED: %s\n", why->c_str());
    return 0;
  }
  CudaDeviceOptions options;
  options.device = args.device;
  std::unique_ptr<CudaVmmDevice> device;
  try {
    device = std::make_unique<CudaVmmDevice>(options);
  } catch (const DeviceError& e) {
    std::printf("bench_vmm: SKIPPED: %s\n", e.what());
    return 0;
  }
  check_cuda(cudaSetDevice(args.device), "cudaSetDevice");
  check_cuda(cudaFree(nullptr), "cudaFree(nullptr) (context creation)");
  const Driver driver(args.device, detail::load_cuda_driver_api(detail::cuda_runtime_api()));
  const Json env = environment(args.device, device->granularity());
  VmmBench bench(driver, device->granularity(), env["memory"].get<std::size_t>());
  std::printf("bench_vmm: %s, %d repetitions per call\n", env["device"].get<std::string>().c_str(),
              args.repetitions);
  std::fflush(stdout);
  bench.recorder().set_timing(false);  // first calls pay for lazy initialisation
  measure_all(bench, *device, 2);
  bench.recorder().set_timing(true);
  measure_all(bench, *device, args.repetitions);
  const Json results = results_json(env, bench.recorder().all(), args.repetitions);
  std::fputs(fits_text(results).c_str(), stdout);
  write_results(args, results);
  return 0;
}

// --- self-test ---------------------------------------------------------------------------------------

/// Counts and prints the self-test's failed expectations.
struct Expectations {
  int failures = 0;
  void near(double actual, double expected, const char* what) {
    if (std::abs(actual - expected) <= 1e-6 * std::max(1.0, std::abs(expected))) return;
    std::printf("bench_vmm: self-test: %s is %g, expected %g\n", what, actual, expected);
    ++failures;
  }
};

/// Series with known order statistics and costs that lie on known lines.
std::vector<CallSeries> made_up_series() {
  std::vector<CallSeries> series;
  const auto constant = [&](const std::string& name, const char* call, std::size_t bytes,
                            double ns) {
    series.push_back(CallSeries{name, call, bytes, std::vector<double>(5, ns)});
  };
  CallSeries ramp{"create_2mib", "cuMemCreate", 2 * MiB, {}};
  for (int i = 100; i >= 1; --i) ramp.ns.push_back(i * 1000.0);  // 1..100 us, reversed
  series.push_back(ramp);
  // With 2 MiB's median (50.5 us) and 2 GiB's: 48.5 us + 1 us/MiB; 20 MiB off the line (the
  // line goes through the smallest and the largest size).
  constant("create_20mib", "cuMemCreate", 20 * MiB, 99'000);
  constant("create_2048mib", "cuMemCreate", 2048 * MiB, 48'500 + 2048 * 1'000.0);
  constant("map_2mib", "cuMemMap", 2 * MiB, 1'500);
  constant("set_access_2mib", "cuMemSetAccess", 2 * MiB, 30'000);
  constant("unmap_2mib", "cuMemUnmap", 2 * MiB, 20'000);
  constant("release_2mib", "cuMemRelease", 2 * MiB, 5'000);
  // Spans: cuMemSetAccess 30 us per 2 MiB mapping and nothing per call; cuMemUnmap 20 us per
  // mapping and 0.5 us per call. One 1 GiB handle: 30 + 1022 x 0.05 us and 20 + 1022 x 0.01 us,
  // so 50 and 10 ns per MiB.
  for (const std::size_t n : kSpanMappings) {
    const std::string name = std::to_string(n) + "x2mib";
    const auto mappings = static_cast<double>(n);
    constant("set_access_" + name, "cuMemSetAccess", n * 2 * MiB, 30'000 * mappings);
    constant("unmap_" + name, "cuMemUnmap", n * 2 * MiB, 500 + 20'000 * mappings);
  }
  constant("set_access_1x1024mib", "cuMemSetAccess", GiB, 30'000 + 1022 * 50.0);
  constant("unmap_1x1024mib", "cuMemUnmap", GiB, 20'000 + 1022 * 10.0);
  constant("reserve", "cuMemAddressReserve", 8 * GiB, 6'000);
  constant("address_free", "cuMemAddressFree", 8 * GiB, 7'000);
  constant("event_record", "cudaEventRecord", 0, 1'000);
  constant("event_query", "cudaEventQuery", 0, 2'000);
  constant("stream_sync", "cudaStreamSynchronize", 0, 3'000);
  constant("event_sync", "cudaEventSynchronize", 0, 4'000);
  constant("device_sync", "cudaDeviceSynchronize", 0, 5'000);
  // cudaMalloc: 40 us + 1 us per MiB exactly.
  for (const std::size_t mib : {2, 20, 200}) {
    series.push_back(CallSeries{"cuda_malloc_" + std::to_string(mib) + "mib",
                                "cudaMalloc",
                                mib * MiB,
                                {40'000.0 + 1'000.0 * static_cast<double>(mib)}});
  }
  return series;
}

int self_test(const Args& args) {
  Expectations expect;
  const CallSummary s = summarize(made_up_series()[0].ns);
  expect.near(static_cast<double>(s.samples), 100, "samples");
  expect.near(s.median, 50'500, "median of 1..100 us");
  expect.near(s.p99, 99'000, "p99 of 1..100 us");
  expect.near(s.min, 1'000, "min");
  expect.near(s.max, 100'000, "max");
  expect.near(summarize({3, 1, 2}).median, 2, "median of an odd count");
  const SlopeFit exact = fit_relative({{1, 3}, {8, 17}, {64, 129}});  // 1 + 2 n
  expect.near(exact.intercept_ns, 1, "intercept of 1 + 2 n");
  expect.near(exact.slope_ns, 2, "slope of 1 + 2 n");
  // Weights 1/ns^2: the line that least squares of the relative errors gives (worked out in
  // fractions: -400/729 + 7660/729 n; plain least squares would give -5.6 + 11.05 n).
  const SlopeFit relative = fit_relative({{1, 10}, {10, 100}, {100, 1100}});
  expect.near(relative.intercept_ns, -400.0 / 729, "relative fit's intercept");
  expect.near(relative.slope_ns, 7660.0 / 729, "relative fit's slope");
  const Json env = {{"device", "made up (bench_vmm --self-test)"},
                    {"memory", 0},
                    {"granularity", 2 * MiB},
                    {"cuda_runtime", 0},
                    {"cuda_driver", 0}};
  const Json results = results_json(env, made_up_series(), 100);
  const Json& fields = results["cost_model"]["fields"];
  // Every field of the replay's cost model, in its order, and no other: `cistern replay
  // --cost-model bench_vmm.json` takes them as they are.
  std::vector<std::string> names;
  for (const auto& [key, value] : fields.items()) names.push_back(key);
  std::vector<std::string> model;
  for (const replay::CostModel::Field& f : replay::CostModel::fields()) model.emplace_back(f.name);
  if (names != model) {
    std::printf("bench_vmm: self-test: the fields are not replay::CostModel's\n");
    ++expect.failures;
  }
  const auto field = [&fields](const char* name) {
    return fields[name].is_null() ? -1.0 : fields[name].get<double>();
  };
  expect.near(field("alloc_ns"), 40'000, "alloc_ns");
  expect.near(field("alloc_ns_per_mib"), 1'000, "alloc_ns_per_mib");
  expect.near(field("create_ns"), 48'500, "create_ns");
  expect.near(field("create_ns_per_mib"), 1'000, "create_ns_per_mib");
  expect.near(field("reserve_ns"), 6'000, "reserve_ns");
  expect.near(field("release_reservation_ns"), 7'000, "release_reservation_ns");
  expect.near(field("map_ns"), 1'500, "map_ns");
  expect.near(field("access_ns"), 30'000 - 2 * 50, "access_ns");
  expect.near(field("access_ns_per_mib"), 50, "access_ns_per_mib");
  expect.near(field("unmap_ns"), 20'000 - 2 * 10, "unmap_ns");
  expect.near(field("unmap_ns_per_mib"), 10, "unmap_ns_per_mib");
  expect.near(field("event_record_ns"), 1'000, "event_record_ns");
  expect.near(field("event_query_ns"), 2'000, "event_query_ns");
  expect.near(field("sync_stream_ns"), 3'000, "sync_stream_ns");
  expect.near(field("sync_event_ns"), 4'000, "sync_event_ns");
  expect.near(field("sync_device_ns"), 5'000, "sync_device_ns");
  const Json& unmap_fit = results["cost_model"]["fits"]["unmap_per_mapping"];
  expect.near(unmap_fit["slope_ns"].get<double>(), 20'000, "unmap slope");
  expect.near(unmap_fit["intercept_ns"].get<double>(), 500, "unmap intercept");
  expect.near(static_cast<double>(unmap_fit["points"].size()), 4, "unmap points");
  if (!fields["free_ns"].is_null() || !fields["release_ns"].is_null() ||
      !results["cost_model"]["calls"]["query_sync_pair_ns"].is_null()) {
    std::printf("bench_vmm: self-test: unmeasured figures must be null\n");
    ++expect.failures;
  }
  // The fields as the replay reads them: a model whose prices are the made-up calls'.
  replay::CostModel read = replay::CostModel::h200();
  for (const auto& [key, value] : fields.items()) {
    if (!value.is_null()) read.set(key, value.get<double>());
  }
  expect.near(read.access_price(2 * MiB), 30'000, "the model's 2 MiB access grant");
  expect.near(read.unmap_price(GiB), 30'220, "the model's unmap of 1 GiB handle");
  expect.near(read.create_price(2048 * MiB), 48'500 + 2048 * 1'000.0, "the model's 2 GiB create");
  std::fputs(fits_text(results).c_str(), stdout);
  write_results(args, results);
  return expect.failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace cistern::bench

int main(int argc, char** argv) {
  try {
    const cistern::bench::Args args = cistern::bench::parse_args(argc, argv);
    return args.self_test ? cistern::bench::self_test(args) : cistern::bench::run_on_gpu(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vmm: %s\n", e.what());
    return 1;
  }
}
