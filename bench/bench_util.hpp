// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Pieces of the hot-path benchmark: the workloads (size sequences), the allocators under test
// behind one small interface, and the FIFO window that drives them.
//
// Every allocator sees exactly the same sequence of requests. Nothing ever touches the memory
// returned: cistern's addresses are simulated device addresses, and for the host allocators only
// their bookkeeping is compared.
#pragma once

#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"
#include "support/trace_sizes.hpp"

namespace cistern::bench {

// --- workloads -----------------------------------------------------------------------------------

/// A named request pattern. `window` == 0: each request is freed at once (an allocate+free
/// pair). `window` > 0: that many allocations stay live; each step frees the oldest and then
/// allocates the next size (FIFO), cycling through `sizes`.
struct Workload {
  std::string name;
  std::vector<std::size_t> sizes;
  std::size_t window = 0;
};

/// Live allocations of the trace mixes.
inline constexpr std::size_t kMixWindow = 64;
/// Largest size of the small-size mix (the allocator's small-pool limit).
inline constexpr std::size_t kSmallMixLimit = std::size_t{1} << 20;

/// The fixed-size workloads, in report order.
inline const std::vector<Workload>& fixed_workloads() {
  static const std::vector<Workload> fixed = {{"512B", {512}, 0},
                                              {"64KiB", {64 * KiB}, 0},
                                              {"2MiB", {2 * MiB}, 0},
                                              {"100MiB", {100 * MiB}, 0}};
  return fixed;
}

/// Every workload name, in report order: fixed sizes, then the trace mixes.
inline std::vector<std::string> workload_names() {
  std::vector<std::string> names;
  for (const Workload& w : fixed_workloads()) names.push_back(w.name);
  names.push_back("mix_small");
  names.push_back("mix_all");
  return names;
}

inline bool is_trace_mix(const std::string& name) {
  return name == "mix_small" || name == "mix_all";
}

/// The sizes of every real trace, in `load_trace_sizes` order; read once.
inline const std::vector<std::size_t>& all_trace_sizes() {
  static const std::vector<std::size_t> sizes =
      cistern::testing::load_trace_sizes(cistern::testing::shared_dir());
  return sizes;
}

/// The trace sizes up to `limit`, in trace order.
inline std::vector<std::size_t> trace_sizes_up_to(std::size_t limit) {
  std::vector<std::size_t> kept;
  for (std::size_t size : all_trace_sizes()) {
    if (size <= limit) kept.push_back(size);
  }
  return kept;
}

inline Workload make_trace_mix(const std::string& name) {
  std::vector<std::size_t> sizes =
      name == "mix_small" ? trace_sizes_up_to(kSmallMixLimit) : all_trace_sizes();
  // cistern turns a 0-byte request into nullptr; keep the sequences identical for everyone.
  sizes.erase(std::remove(sizes.begin(), sizes.end(), std::size_t{0}), sizes.end());
  if (sizes.empty()) throw InvalidArgument("bench: the traces hold no sizes for " + name);
  return Workload{name, std::move(sizes), kMixWindow};
}

/// The workload of a name (the trace mixes are built once, on first use); throws
/// `InvalidArgument` on an unknown name or when the traces cannot be read.
inline const Workload& workload(const std::string& name) {
  for (const Workload& w : fixed_workloads()) {
    if (w.name == name) return w;
  }
  if (!is_trace_mix(name)) throw InvalidArgument("bench: unknown workload '" + name + "'");
  static std::mutex mutex;
  static std::map<std::string, Workload> mixes;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = mixes.find(name);
  if (it == mixes.end()) it = mixes.emplace(name, make_trace_mix(name)).first;
  return it->second;
}

// --- allocators under test -----------------------------------------------------------------------

/// cistern on one stream.
class CisternHeap {
 public:
  CisternHeap(CachingAllocator& allocator, Stream stream)
      : CisternHeap(allocator, stream, stream) {}
  /// Allocates on `stream` and frees on `free_stream` (a cross-stream free when they differ).
  CisternHeap(CachingAllocator& allocator, Stream stream, Stream free_stream)
      : allocator_(&allocator), stream_(stream), free_stream_(free_stream) {}
  void* allocate(std::size_t bytes) { return allocator_->allocate(bytes, stream_); }
  void deallocate(void* ptr) { allocator_->deallocate(ptr, free_stream_); }

 private:
  CachingAllocator* allocator_;
  Stream stream_;
  Stream free_stream_;
};

/// The process's `malloc`/`free`: glibc's, as long as nothing overrides them (`malloc_is_glibc`).
struct GlibcHeap {
  void* allocate(std::size_t bytes) {
    void* ptr = std::malloc(bytes);
    if (ptr == nullptr) throw std::bad_alloc();
    return ptr;
  }
  void deallocate(void* ptr) noexcept { std::free(ptr); }
};

/// mimalloc's entry points, looked up in a privately loaded copy of the library.
///
/// Why not link it: Debian's libmimalloc.so exports `malloc` and `free` as well as `mi_malloc`,
/// so linking it would silently replace glibc's malloc for the whole process, and the glibc
/// rows would measure mimalloc. Loaded with RTLD_LOCAL, its symbols serve only explicit lookups.
struct MimallocApi {
  void* (*malloc)(std::size_t) = nullptr;
  void (*free)(void*) = nullptr;
  int (*version)() = nullptr;
  std::string library;  ///< the file loaded
  std::string error;    ///< why it is unavailable ("" when available)
};

inline MimallocApi load_mimalloc() {
  MimallocApi api;
#ifdef CISTERN_BENCH_MIMALLOC_LIBRARY
  api.library = CISTERN_BENCH_MIMALLOC_LIBRARY;
  void* handle = dlopen(api.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    api.error = dlerror();
    return api;
  }
  api.malloc = reinterpret_cast<void* (*)(std::size_t)>(dlsym(handle, "mi_malloc"));
  api.free = reinterpret_cast<void (*)(void*)>(dlsym(handle, "mi_free"));
  api.version = reinterpret_cast<int (*)()>(dlsym(handle, "mi_version"));
  if (api.malloc == nullptr || api.free == nullptr) {
    api.error = api.library + " lacks mi_malloc or mi_free";
  }
#else
  api.error = "mimalloc was not found when the benchmark was configured (install libmimalloc-dev)";
#endif
  return api;
}

/// mimalloc, loaded once.
inline const MimallocApi& mimalloc() {
  static const MimallocApi api = load_mimalloc();
  return api;
}

/// The library and version loaded, or why mimalloc is unavailable.
inline std::string mimalloc_description() {
  const MimallocApi& mi = mimalloc();
  if (!mi.error.empty()) return "unavailable: " + mi.error;
  const int version = mi.version != nullptr ? mi.version() : 0;
  return mi.library + " version " + std::to_string(version);
}

/// `mi_malloc`/`mi_free`; only to be made when `mimalloc().error` is empty.
class MimallocHeap {
 public:
  MimallocHeap() : malloc_(mimalloc().malloc), free_(mimalloc().free) {}
  void* allocate(std::size_t bytes) {
    void* ptr = malloc_(bytes);
    if (ptr == nullptr) throw std::bad_alloc();
    return ptr;
  }
  void deallocate(void* ptr) noexcept { free_(ptr); }

 private:
  void* (*malloc_)(std::size_t);
  void (*free_)(void*);
};

/// The file of the shared object that defines the process's `malloc`.
inline std::string malloc_library() {
  // The first definition in the global scope is the one every call of malloc reaches.
  void* process_malloc = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info info{};
  if (process_malloc == nullptr || dladdr(process_malloc, &info) == 0 ||
      info.dli_fname == nullptr) {
    return "unknown";
  }
  return info.dli_fname;
}

/// Whether `malloc` is glibc's (libc.so), not an override.
inline bool malloc_is_glibc() { return malloc_library().find("libc.so") != std::string::npos; }

/// The allocators, as named in benchmark names and on the command line.
enum class AllocatorKind { cistern, mimalloc, glibc };

inline const char* to_string(AllocatorKind kind) noexcept {
  switch (kind) {
    case AllocatorKind::cistern: return "cistern";
    case AllocatorKind::mimalloc: return "mimalloc";
    case AllocatorKind::glibc: return "glibc";
  }
  return "?";
}

inline AllocatorKind parse_allocator(const std::string& text) {
  for (AllocatorKind kind :
       {AllocatorKind::cistern, AllocatorKind::mimalloc, AllocatorKind::glibc}) {
    if (text == to_string(kind)) return kind;
  }
  throw InvalidArgument("bench: unknown allocator '" + text + "' (cistern, mimalloc or glibc)");
}

/// Why an allocator cannot be measured in this process ("" if it can).
inline std::string unavailable_reason(AllocatorKind kind) {
  if (kind == AllocatorKind::mimalloc) return mimalloc().error;
  if (kind == AllocatorKind::glibc && !malloc_is_glibc()) {
    return "malloc is not glibc's but comes from " + malloc_library();
  }
  return "";
}

// --- the simulated device ------------------------------------------------------------------------

/// The device of the benchmarks: 1 TiB, so that no workload (four threads of 64 live trace
/// allocations, or of 100 MiB pairs) ever runs out of memory.
inline SimDeviceOptions large_device_options() {
  SimDeviceOptions options;
  options.capacity = std::size_t{1} << 40;
  return options;
}

/// How often cistern left its cache-hit path: segments obtained from the device, and cached
/// segments taken over from another stream's pool. Zero of both during a measurement means that
/// every request was a cache hit in the requesting stream's own pool.
struct SlowPaths {
  std::int64_t device_allocs = 0;
  std::int64_t takeovers = 0;

  static SlowPaths of(const CachingAllocator& allocator) {
    const Stats stats = allocator.stats();
    return {stats.num_device_alloc, stats.num_cross_stream_reuse};
  }
  friend SlowPaths operator-(SlowPaths a, SlowPaths b) {
    return {a.device_allocs - b.device_allocs, a.takeovers - b.takeovers};
  }
  bool any() const noexcept { return device_allocs != 0 || takeovers != 0; }
};

// --- the driver ----------------------------------------------------------------------------------

/// Drives one allocator through a workload (see `Workload`). One per thread.
template <class Heap>
class FifoWindow {
 public:
  FifoWindow(Heap heap, const Workload& workload)
      : heap_(heap), sizes_(workload.sizes), live_(workload.window, nullptr) {}
  FifoWindow(const FifoWindow&) = delete;
  FifoWindow& operator=(const FifoWindow&) = delete;
  ~FifoWindow() { drain(); }

  /// Fills the window, then makes two passes over the sizes, so that every later step of a
  /// caching allocator is served from its cache.
  void warm_up() {
    for (void*& slot : live_) slot = heap_.allocate(next_size());
    const std::size_t steps = 2 * sizes_.size() + 2 * live_.size() + 16;
    for (std::size_t i = 0; i < steps; ++i) step();
  }

  /// One pair. Window 0: allocates the next size and frees it. Otherwise: frees the oldest live
  /// allocation, then allocates the next size in its place.
  void step() {
    if (live_.empty()) {
      void* fresh = heap_.allocate(next_size());
      benchmark::DoNotOptimize(fresh);
      heap_.deallocate(fresh);
      return;
    }
    void*& oldest = live_[oldest_];
    heap_.deallocate(oldest);
    oldest = heap_.allocate(next_size());
    benchmark::DoNotOptimize(oldest);
    oldest_ = oldest_ + 1 == live_.size() ? 0 : oldest_ + 1;
  }

  /// Frees every live allocation.
  void drain() noexcept {
    for (void*& slot : live_) {
      if (slot != nullptr) heap_.deallocate(slot);
      slot = nullptr;
    }
  }

 private:
  std::size_t next_size() {
    const std::size_t size = sizes_[next_];
    next_ = next_ + 1 == sizes_.size() ? 0 : next_ + 1;
    return size;
  }

  Heap heap_;
  const std::vector<std::size_t>& sizes_;
  std::vector<void*> live_;
  std::size_t next_ = 0;    // index of the next size
  std::size_t oldest_ = 0;  // slot of the oldest live allocation
};

// --- threads -------------------------------------------------------------------------------------

/// A reusable barrier for a fixed number of threads (std::barrier is C++20).
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int threads) : threads_(threads) {}

  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t generation = generation_;
    if (++waiting_ == threads_) {
      waiting_ = 0;
      ++generation_;
      all_arrived_.notify_all();
      return;
    }
    all_arrived_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  const int threads_;
  int waiting_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace cistern::bench
