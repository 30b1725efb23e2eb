/* Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
 *
 * The C ABI of libcistern_plugin.so: cistern as a framework's CUDA allocator.
 *
 * PyTorch (CUDAPluggableAllocator) loads the library and calls `cistern_malloc` / `cistern_free`,
 * whose signatures are exactly the ones it casts to; the optional hooks it can be given
 * (`set_init_fn`, `set_reset_fn`, `set_memory_fraction_fn`, `set_record_stream_fn`,
 * `set_base_alloc_fn`) are the functions of the same C types below, and its CUDA graph hooks
 * (`set_begin_allocate_to_pool`, `set_end_allocate_to_pool_fn`, `set_release_pool`) the C++
 * functions at the end. CuPy calls `cistern_malloc`
 * and `cistern_free` through the `cistern.cupy` Python module. The Python package `cistern`
 * (python/) wraps all of it: `cistern.torch.enable()`.
 *
 * One caching allocator per device, created on first use and configured by the environment
 * variable CISTERN_ALLOC_CONF (the options of `cistern::Config`, PyTorch's syntax). The device
 * backend is chosen once, on first use, by CISTERN_BACKEND:
 *   "cuda" (the default when the library was built with the CUDA toolkit) - real GPUs;
 *   "sim"  - cistern's simulated device, with no GPU: for tests. Its capacity per device is
 *            CISTERN_SIM_CAPACITY (e.g. "8GiB"; default 80 GiB). Its addresses are not memory:
 *            never use it under a framework that touches the memory.
 *
 * Nothing throws across this ABI, with one exception made for PyTorch: `cistern_malloc_or_throw`
 * (see there). Out of memory makes `cistern_malloc` return NULL and records cistern's detailed
 * message; `cistern_try_malloc` returns the error code and that message to its caller, so that
 * framework glue can raise the framework's own out-of-memory error (cistern.torch, cistern.cupy).
 * A NULL handed to a framework that does not check it (PyTorch's CUDAPluggableAllocator under
 * `change_current_allocator`) crashes it later: use `cistern_malloc_or_throw` or glue there.
 * Misuse - freeing a pointer that is not allocated (unknown pointer, double free), a size or
 * device that does not match the allocation - leaves the allocator exactly as it was, is
 * recorded as the last error, counted, and printed to stderr the first time only. Configuration
 * and device failures are recorded the same way. Every function is thread-safe except
 * `cistern_shutdown`.
 *
 * This header is C (C99) and C++, and compiles under nvcc; it needs no CUDA header: a
 * `struct CUstream_st*` is a `cudaStream_t`. */
#ifndef CISTERN_PLUGIN_H
#define CISTERN_PLUGIN_H

#ifdef __cplusplus
#include <cstddef>
#include <cstdint>
#else
#include <stddef.h>
#include <stdint.h>
#endif

#if defined(_WIN32)
#define CISTERN_PLUGIN_API
#else
#define CISTERN_PLUGIN_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** A CUDA stream (`cudaStream_t`); NULL is the legacy default stream. */
typedef struct CUstream_st* cistern_stream_t;

/** Error codes of `cistern_last_error_code` and of the functions returning int. */
enum cistern_error {
  CISTERN_OK = 0,
  CISTERN_ERROR_OUT_OF_MEMORY = 1,    /**< the device could not provide the memory */
  CISTERN_ERROR_INVALID_POINTER = 2,  /**< free of a pointer not allocated (double free, unknown) */
  CISTERN_ERROR_SIZE_MISMATCH = 3,    /**< free with a size or device other than the allocation's */
  CISTERN_ERROR_INVALID_ARGUMENT = 4, /**< a bad device ordinal, fraction, path, ... */
  CISTERN_ERROR_CONFIG = 5,           /**< CISTERN_ALLOC_CONF or CISTERN_BACKEND is invalid */
  CISTERN_ERROR_DEVICE = 6,           /**< the backend failed (no GPU, driver error, ...) */
  CISTERN_ERROR_INTERNAL = 7          /**< anything else: a bug in cistern */
};

/** How the message of an out-of-memory error raised inside a framework begins: PyTorch's own
 *  words, so that code matching them (`"CUDA out of memory" in str(error)`) keeps working. The
 *  rest is cistern's message: what was requested, what the device has free, what cistern has
 *  allocated, reserved and cached, and its limit when one is set. */
#define CISTERN_FRAMEWORK_OOM_PREFIX "CUDA out of memory. "

/* --- PyTorch's CUDAPluggableAllocator signatures ---------------------------------------------- */

/** Allocates `size` bytes on `device` for use on `stream`. NULL for size 0 and on any failure
 *  (the last error says why: out of memory, configuration, device). Stream handles: on the
 *  simulated backend a handle that is neither 0 nor from `cistern_sim_create_stream` is misuse
 *  (CISTERN_ERROR_INVALID_ARGUMENT, counted, nothing done) here, in `cistern_free` and in
 *  `cistern_record_stream` alike; on CUDA the handle is taken as the cudaStream_t it is. */
CISTERN_PLUGIN_API void* cistern_malloc(size_t size, int device, cistern_stream_t stream);
/** `cistern_malloc` that says how it went: returns CISTERN_OK with the memory in `*ptr` (NULL for
 *  size 0), or the error code with `*ptr` = NULL and this failure's message copied into `message`
 *  like `cistern_memory_stats_json` does (`message` may be NULL). The message is this call's own,
 *  whatever other threads do meanwhile; it is also recorded as the last error. `ptr` NULL:
 *  CISTERN_ERROR_INVALID_ARGUMENT, nothing allocated. For framework glue that raises the
 *  framework's error (cistern.cupy; cistern.torch's extension). */
CISTERN_PLUGIN_API int cistern_try_malloc(size_t size, int device, cistern_stream_t stream,
                                          void** ptr, char* message, size_t capacity);
/** C++ only, for PyTorch's CUDAPluggableAllocator: `cistern_malloc`, except that a failure throws
 *  instead of returning NULL (PyTorch does not check the pointer). Out of memory throws
 *  `std::runtime_error` whose message is CISTERN_FRAMEWORK_OOM_PREFIX followed by cistern's
 *  message; any other failure throws `std::runtime_error` with cistern's message. PyTorch turns
 *  both into a Python `RuntimeError` (not `torch.OutOfMemoryError`: that needs PyTorch's own C++
 *  type, which cistern.torch's extension throws; this is its fallback). The allocator is left as
 *  it was. Size 0 returns NULL without throwing. Never call it from C. */
CISTERN_PLUGIN_API void* cistern_malloc_or_throw(size_t size, int device, cistern_stream_t stream);
/** Frees `ptr`, ordered on `stream`. `size` and `device` must be those of the allocation (as
 *  PyTorch passes them); otherwise nothing is freed and the misuse is recorded. NULL: no-op. */
CISTERN_PLUGIN_API void cistern_free(void* ptr, size_t size, int device, cistern_stream_t stream);

/* --- optional hooks (PyTorch: set_init_fn, set_reset_fn, ...) -------------------------------------- */

/** `set_init_fn`: the framework's device count. Reads the environment and checks it (errors are
 *  recorded); allocators are still created lazily. */
CISTERN_PLUGIN_API void cistern_init(int device_count);
/** `set_reset_fn` (`torch.cuda.empty_cache()`): every device returns its unused cached memory. */
CISTERN_PLUGIN_API void cistern_empty_cache(void);
/** `set_memory_fraction_fn`: limits `device` to `fraction` (0, 1] of its memory. */
CISTERN_PLUGIN_API void cistern_set_memory_fraction(double fraction, int device);
/** `set_record_stream_fn` (`Tensor.record_stream`): `stream` also uses `ptr`. */
CISTERN_PLUGIN_API void cistern_record_stream(void* ptr, cistern_stream_t stream);
/** `set_base_alloc_fn`: the start of the device segment holding `ptr`, its size in `*size`
 *  (for CUDA IPC). For a pointer cistern does not hold: `ptr` itself, `*size` untouched. */
CISTERN_PLUGIN_API void* cistern_base_allocation(void* ptr, size_t* size);

/* --- CUDA graph pools (PyTorch: set_begin_allocate_to_pool, set_end_allocate_to_pool_fn,
 *     set_release_pool) ------------------------------------------------------------------------ */

/** Whether an allocation on `stream` goes to the pool being begun: non-zero for yes. */
typedef int (*cistern_stream_filter)(void* context, cistern_stream_t stream);

/** Begins routing allocations of `device` to the graph pool (`pool_first`, `pool_second`) -
 *  PyTorch's MempoolId_t; (0, 0) is refused - for every stream `filter(context, stream)` accepts
 *  (every stream when `filter` is NULL), until `cistern_end_allocate_to_pool`. The pool is made
 *  on its first begin; each begin is one use of it. `filter` and `context` must stay valid until
 *  the end. Blocks allocated in a pool are never reused outside it: freed, they stay cached in
 *  the pool for its next allocations. When begins overlap, the newest whose filter accepts the
 *  stream serves. Statistics, `cistern_empty_cache` and snapshots include the pools. While a
 *  stream is captured into a CUDA graph and no pool accepts it, an allocation that would need new
 *  device memory fails (CISTERN_ERROR_INVALID_ARGUMENT, saying so) instead of obtaining memory
 *  that would later be reused outside the graph. Returns an error code. */
CISTERN_PLUGIN_API int cistern_begin_allocate_to_pool(int device, uint64_t pool_first,
                                                      uint64_t pool_second,
                                                      cistern_stream_filter filter, void* context);
/** Ends the routing of the newest begin of the pool (not a use: see `cistern_release_pool`).
 *  Returns an error code (CISTERN_ERROR_INVALID_ARGUMENT when the pool is not begun). */
CISTERN_PLUGIN_API int cistern_end_allocate_to_pool(int device, uint64_t pool_first,
                                                    uint64_t pool_second);
/** Drops one use of the pool. When none is left, the pool gives its memory back to the device as
 *  soon as nothing allocated in it is live (at once when nothing is); until then its free blocks
 *  go back with `cistern_empty_cache`. Returns an error code. */
CISTERN_PLUGIN_API int cistern_release_pool(int device, uint64_t pool_first, uint64_t pool_second);

/* --- statistics and snapshots --------------------------------------------------------------------- */

/** Writes `device`'s statistics as a JSON object with PyTorch's key names
 *  ("allocated_bytes.all.current": 512, ...) into `buffer` (NUL-terminated, cut to `capacity`)
 *  and returns the full length without the NUL, as snprintf does; 0 on error. A device not yet
 *  used reports zeros. */
CISTERN_PLUGIN_API size_t cistern_memory_stats_json(int device, char* buffer, size_t capacity);
/** Sets every peak of `device` to its current value. Returns an error code. */
CISTERN_PLUGIN_API int cistern_reset_peak_stats(int device);
/** Zeroes `device`'s running sums and num_* counters. Returns an error code. */
CISTERN_PLUGIN_API int cistern_reset_accumulated_stats(int device);
/** Starts (non-zero) or stops recording the event history of every device, present and future,
 *  keeping up to `max_entries` events per device (0: one million). Returns an error code. */
CISTERN_PLUGIN_API int cistern_record_history(int enabled, size_t max_entries);
/** Runs the invariant checker of `device`'s allocator (every block, pool and counter). Returns
 *  CISTERN_OK (also for a device not yet used: nothing to check), CISTERN_ERROR_INVALID_ARGUMENT
 *  for an ordinal out of range, or CISTERN_ERROR_INTERNAL with the broken invariant as the last
 *  error (a bug in cistern). */
CISTERN_PLUGIN_API int cistern_check(int device);
/** Writes every device's segments, blocks and recorded history to `path` as a PyTorch memory
 *  snapshot pickle (what `torch.cuda.memory._dump_snapshot` writes). Returns an error code:
 *  CISTERN_ERROR_INVALID_ARGUMENT when the file cannot be written, the last error naming the
 *  path and the OS reason ("No such file or directory", "No space left on device"). */
CISTERN_PLUGIN_API int cistern_write_snapshot(const char* path);
/** Asked after every successful allocation for the id of the caller's call stack (from
 *  `cistern_add_stack`; 0: none). cistern.torch.record_history(stacks="python") sets one that
 *  walks the Python frames of the allocating thread. */
typedef uint32_t (*cistern_stack_hook)(void); /* NOLINT(modernize-redundant-void-arg): C */
/** Sets (NULL: clears) the stack hook; the plug-in keeps the stacks of each device's newest
 *  `max_entries` allocations (0: one million) and `cistern_write_snapshot` writes them as the
 *  events' and blocks' `frames`. The hook runs on the allocating thread, outside cistern's locks,
 *  and may call `cistern_add_stack`. Returns an error code. */
CISTERN_PLUGIN_API int cistern_set_stack_hook(cistern_stack_hook hook, size_t max_entries);
/** Starts (`enabled` non-zero) or stops taking each allocation's native (C/C++) frames, with or
 *  without a stack hook; keeps the stacks of each device's newest `max_entries` allocations (0:
 *  one million). The plug-in's own frames are left out; with a hook that answers a Python stack,
 *  the native frames from the first one in the Python interpreter on are replaced by that stack.
 *  Native frames are named from the dynamic symbol table: filename the shared object, line 0,
 *  name the demangled function. cistern.torch.record_history(stacks="all") sets this. Returns an
 *  error code. */
CISTERN_PLUGIN_API int cistern_set_native_stacks(int enabled, size_t max_entries);
/** Adds the stack of `count` frames, innermost first (`filenames[i]`, `lines[i]`, `names[i]`:
 *  PyTorch's frame), if new, and stores its id in `*id`. Returns an error code. */
CISTERN_PLUGIN_API int cistern_add_stack(size_t count, const char* const* filenames,
                                         const int64_t* lines, const char* const* names,
                                         uint32_t* id);

/* --- errors ------------------------------------------------------------------------------------------ */

/** The code of the last error recorded (any thread), CISTERN_OK if none. */
CISTERN_PLUGIN_API int cistern_last_error_code(void);
/** Copies the last error's message like `cistern_memory_stats_json`; returns its length. */
CISTERN_PLUGIN_API size_t cistern_last_error(char* buffer, size_t capacity);
/** Misuses recorded so far (invalid pointer, size mismatch, invalid argument). */
CISTERN_PLUGIN_API uint64_t cistern_misuse_count(void);
/** Forgets the last error (the counters stay). */
CISTERN_PLUGIN_API void cistern_clear_error(void);

/* --- the process --------------------------------------------------------------------------------- */

/** The backend in use or that will be used: "cuda", "sim", or "" when CISTERN_BACKEND names none.
 */
CISTERN_PLUGIN_API const char* cistern_backend(void);
/** The library version, e.g. "0.1.0". */
CISTERN_PLUGIN_API const char* cistern_version(void);
/** Destroys every allocator (cached memory goes back to the device; live allocations are
 *  abandoned), forgets errors and counters; the next call starts afresh and re-reads the
 *  environment. For tests and teardown: must not run concurrently with any other call. */
CISTERN_PLUGIN_API void cistern_shutdown(void);

/* --- the simulated backend (CISTERN_BACKEND=sim), for tests --------------------------------------- */

/** A new simulated stream on `device`; NULL (and an error) on another backend. */
CISTERN_PLUGIN_API cistern_stream_t cistern_sim_create_stream(int device);
/** Submits `ns` simulated nanoseconds of work to `stream` of `device`: memory freed on it, or
 *  recorded for it, waits until that work completes. Returns an error code. */
CISTERN_PLUGIN_API int cistern_sim_launch(int device, cistern_stream_t stream, uint64_t ns);
/** Marks `stream` of the simulated `device` as captured into a CUDA graph (`capturing` non-zero)
 *  or no longer: what cudaStreamIsCapturing tells the CUDA backend. Returns an error code. */
CISTERN_PLUGIN_API int cistern_sim_set_capturing(int device, cistern_stream_t stream,
                                                 int capturing);
/** Completes all simulated work on `device`. Returns an error code. */
CISTERN_PLUGIN_API int cistern_sim_synchronize(int device);
/** Makes the simulated `device` refuse its next map of physical memory as a GPU under MIG or
 *  vGPU does (CUDA_ERROR_NOT_SUPPORTED): before the first allocation, cistern's engine then falls
 *  back to classic segments and says so once on stderr. Returns an error code. */
CISTERN_PLUGIN_API int cistern_sim_refuse_next_map(int device);

#ifdef __cplusplus
}

/* --- C++ only: PyTorch's graph-pool hooks, with the exact C++ types its CUDAPluggableAllocator
 *     casts the function pointers to (torch/csrc/cuda/Module.cpp: void(int, MempoolId_t,
 *     std::function<bool(cudaStream_t)>) and void(int, MempoolId_t); MempoolId_t is
 *     std::pair<unsigned long long, unsigned long long>). Never call them from C. -------------- */
#include <functional>
#include <utility>

extern "C" {
/** `set_begin_allocate_to_pool`: `cistern_begin_allocate_to_pool` with PyTorch's stream filter
 *  (kept until the end). Throws `std::runtime_error` with cistern's message on failure, which
 *  PyTorch raises as RuntimeError from the capture's begin. */
CISTERN_PLUGIN_API void cistern_torch_begin_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool,
    std::function<bool(cistern_stream_t)> filter);
/** `set_end_allocate_to_pool_fn`: `cistern_end_allocate_to_pool`; never throws (errors are
 *  recorded). */
CISTERN_PLUGIN_API void cistern_torch_end_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool);
/** `set_release_pool` (a graph's reset or destructor): `cistern_release_pool`; never throws. */
CISTERN_PLUGIN_API void cistern_torch_release_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool);
}
#endif

#endif /* CISTERN_PLUGIN_H */
