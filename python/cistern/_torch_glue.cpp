// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// cistern's glue to PyTorch: compiled at first use by cistern.torch against the installed PyTorch
// (torch.utils.cpp_extension.load; cached), so that an allocation cistern cannot serve reaches
// the program as `torch.OutOfMemoryError` carrying cistern's message, never as a NULL that
// PyTorch's CUDAPluggableAllocator would store and hand on.
//
// It does not link the plug-in: `cistern_torch_bind` receives the plug-in's functions from the
// library Python already loaded, so both routes use one and the same allocator state.
//
//   cistern_torch_malloc       enable(): the allocation, or c10::OutOfMemoryError (Python:
//                              torch.OutOfMemoryError) on out of memory, c10::Error (Python:
//                              RuntimeError) on any other failure. PyTorch's pluggable allocator
//                              records nothing before the allocation function returns, so a throw
//                              leaves it as it was.
//   cistern_torch_pool_malloc  MemPool: PyTorch's own caching allocator sits above cistern there,
//                              checks for NULL, gives its cached blocks back and retries before it
//                              raises torch.OutOfMemoryError itself; so out of memory returns NULL
//                              (remembered for this thread), and the out-of-memory observer below
//                              replaces PyTorch's message by cistern's when PyTorch gives up.
//   cistern_torch_free         the plug-in's free.
//
// Built without CISTERN_TORCH_POOL_OBSERVER (the fallback build, which needs no CUDA headers), the
// MemPool route keeps PyTorch's message.
#include <c10/util/Exception.h>
#ifdef CISTERN_TORCH_POOL_OBSERVER
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cstddef>
#include <cstdint>
#include <string>

namespace {

// The plug-in's C entry points (include/cistern/plugin.h); a stream is a cudaStream_t.
using TryMalloc = int (*)(std::size_t, int, void*, void**, char*, std::size_t);
using Free = void (*)(void*, std::size_t, int, void*);

constexpr int kOk = 0;                                 // CISTERN_OK
constexpr int kOutOfMemory = 1;                        // CISTERN_ERROR_OUT_OF_MEMORY
constexpr char kOomPrefix[] = "CUDA out of memory. ";  // CISTERN_FRAMEWORK_OOM_PREFIX
constexpr std::size_t kMessageCapacity = 4096;

TryMalloc g_try_malloc = nullptr;
Free g_free = nullptr;

/// An out-of-memory that the MemPool route returned as NULL on this thread, for the observer.
struct PendingOom {
  bool set = false;
  int device = 0;
  std::string message;
};
thread_local PendingOom t_pending;

/// One allocation through the plug-in: its code, the pointer, and the failure's message.
int attempt(std::size_t size, int device, void* stream, void** ptr, std::string* message) {
  TORCH_CHECK(g_try_malloc != nullptr,
              "cistern: the PyTorch glue is not bound to the plug-in (cistern_torch_bind was not "
              "called); use cistern.torch.enable()");
  char text[kMessageCapacity] = {};
  *ptr = nullptr;
  const int code = g_try_malloc(size, device, stream, ptr, text, sizeof text);
  *message = text;
  return code;
}

}  // namespace

// Exported whatever visibility the build defaults to: Python finds these by name.
#define CISTERN_GLUE_API __attribute__((visibility("default")))

extern "C" {

/// Binds the plug-in's `cistern_try_malloc` and `cistern_free`. Returns 0, or 1 for a NULL.
CISTERN_GLUE_API int cistern_torch_bind(void* try_malloc, void* free_fn) {
  if (try_malloc == nullptr || free_fn == nullptr) return 1;
  g_try_malloc = reinterpret_cast<TryMalloc>(try_malloc);
  g_free = reinterpret_cast<Free>(free_fn);
  return 0;
}

/// PyTorch's allocation function under enable(): never returns NULL for a size > 0.
CISTERN_GLUE_API void* cistern_torch_malloc(std::size_t size, int device, void* stream) {
  void* ptr = nullptr;
  std::string message;
  const int code = attempt(size, device, stream, &ptr, &message);
  TORCH_CHECK_WITH(OutOfMemoryError, code != kOutOfMemory, kOomPrefix + message);
  TORCH_CHECK(code == kOk, message);
  return ptr;
}

/// PyTorch's allocation function for a MemPool: NULL on out of memory (PyTorch retries and then
/// raises), a throw for any other failure (retrying would not help).
CISTERN_GLUE_API void* cistern_torch_pool_malloc(std::size_t size, int device, void* stream) {
  void* ptr = nullptr;
  std::string message;
  const int code = attempt(size, device, stream, &ptr, &message);
  t_pending.set = code == kOutOfMemory;
  if (code == kOutOfMemory) {
    t_pending.device = device;
    t_pending.message = std::move(message);
    return nullptr;
  }
  TORCH_CHECK(code == kOk, message);
  return ptr;
}

/// PyTorch's free function: the plug-in's free (which never throws).
CISTERN_GLUE_API void cistern_torch_free(void* ptr, std::size_t size, int device, void* stream) {
  if (g_free != nullptr) g_free(ptr, size, device, stream);
}

/// Whether this build replaces PyTorch's out-of-memory message in the MemPool route.
CISTERN_GLUE_API int cistern_torch_has_pool_observer(void) {
#ifdef CISTERN_TORCH_POOL_OBSERVER
  return 1;
#else
  return 0;
#endif
}

/// Attaches the out-of-memory observer to PyTorch's current (native) caching allocator: when it
/// gives up on an allocation that cistern refused in the MemPool route on this thread, the
/// observer throws c10::OutOfMemoryError with cistern's message in place of PyTorch's (observers
/// run after PyTorch has released its lock and updated its statistics, right before it throws its
/// own). Returns 0, or 1 when PyTorch refuses (a pluggable allocator is current) or the build has
/// no observer. Never throws (it is called through ctypes).
CISTERN_GLUE_API int cistern_torch_attach_pool_observer(void) {
#ifdef CISTERN_TORCH_POOL_OBSERVER
  try {
    c10::cuda::CUDACachingAllocator::attachOutOfMemoryObserver(
        [](int64_t device, std::size_t /*alloc_size*/, std::size_t /*total*/,
           std::size_t /*free*/) {
          if (!t_pending.set || t_pending.device != static_cast<int>(device)) return;
          std::string message = kOomPrefix + t_pending.message +
                                " (PyTorch's MemPool gave its cached blocks back and retried)";
          t_pending = PendingOom{};
          TORCH_CHECK_WITH(OutOfMemoryError, false, message);
        });
    return 0;
  } catch (...) {
    return 1;
  }
#else
  return 1;
#endif
}

}  // extern "C"
