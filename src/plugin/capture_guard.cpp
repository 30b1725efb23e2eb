// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CaptureState, MallocScope and CaptureGuardDevice (see capture_guard.hpp).
#include "plugin/capture_guard.hpp"

#include <cstdio>

#include "cistern/errors.hpp"
#ifdef CISTERN_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cistern::plugin {
namespace {

thread_local MallocScope* t_scope = nullptr;

/// Sets this thread's capture mode to relaxed for its lifetime (CUDA only), as PyTorch does
/// around a cudaMalloc that may run while a stream is captured.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() noexcept {
#ifdef CISTERN_HAS_CUDA
    mode_ = cudaStreamCaptureModeRelaxed;
    exchanged_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess;
#endif
  }
  ~RelaxedCaptureMode() {
#ifdef CISTERN_HAS_CUDA
    if (exchanged_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
#endif
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
#ifdef CISTERN_HAS_CUDA
  cudaStreamCaptureMode mode_{};
  bool exchanged_ = false;
#endif
};

std::string hex(Stream stream) {
  char text[32];
  std::snprintf(text, sizeof text, "%#zx", static_cast<std::size_t>(stream.handle));
  return text;
}

}  // namespace

// --- CaptureState ------------------------------------------------------------------------------

bool CaptureState::is_capturing(Stream stream) const {
  if (simulated_) {
    std::lock_guard<std::mutex> lock(mutex_);
    return captured_.count(stream) != 0;
  }
#ifdef CISTERN_HAS_CUDA
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream.native<CUstream_st>(), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
#else
  return false;
#endif
}

void CaptureState::mark(Stream stream, bool capturing) {
  if (!simulated_) {
    throw InvalidArgument("cistern: simulated capture needs CISTERN_BACKEND=sim");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (capturing) {
    captured_.insert(stream);
  } else {
    captured_.erase(stream);
  }
}

// --- MallocScope -------------------------------------------------------------------------------

MallocScope::MallocScope(Stream stream) noexcept : stream_(stream), outer_(t_scope) {
  t_scope = this;
}

MallocScope::~MallocScope() { t_scope = outer_; }

MallocScope* MallocScope::current() noexcept { return t_scope; }

std::string capture_refusal_message(int device, Stream stream) {
  return "cistern: malloc on device " + std::to_string(device) + ", stream " + hex(stream) +
         ": the stream is being captured into a CUDA graph, but no graph pool was begun for it "
         "(cistern_begin_allocate_to_pool; under PyTorch, cistern.torch.enable() sets the "
         "graph-pool hooks that torch.cuda.graph calls, where PyTorch's CUDAPluggableAllocator "
         "has set_begin_allocate_to_pool), so cistern would "
         "have to obtain device memory during the capture and could later reuse it outside the "
         "graph; nothing was allocated. Capture with torch.cuda.graph under "
         "cistern.torch.enable(), "
         "or allocate the memory before the capture begins";
}

// --- CaptureGuardDevice ------------------------------------------------------------------------

template <class Call>
Status CaptureGuardDevice::obtain(Call&& call) noexcept {
  MallocScope* scope = MallocScope::current();
  if (scope == nullptr) return call();
  if (role_ == GuardRole::graph_pool) {
    const RelaxedCaptureMode relaxed;
    return call();
  }
  bool capturing = false;
  try {
    capturing = capture_.is_capturing(scope->stream());
  } catch (...) {
    capturing = false;  // out of host memory for the lock: CUDA itself still refuses in global mode
  }
  if (!capturing) return call();
  scope->note_refusal();
  return Status::invalid_argument;
}

template <class Call>
Status CaptureGuardDevice::relaxed_in_pool(Call&& call) noexcept {
  if (role_ == GuardRole::general || MallocScope::current() == nullptr) return call();
  const RelaxedCaptureMode relaxed;
  return call();
}

std::string CaptureGuardDevice::last_error() const {
  const MallocScope* scope = MallocScope::current();
  if (scope != nullptr && scope->refused_for_capture()) {
    return capture_refusal_message(upstream_.index(), scope->stream());
  }
  return upstream_.last_error();
}

Status CaptureGuardDevice::allocate(std::size_t bytes, void** ptr) noexcept {
  return obtain([&] { return upstream_.allocate(bytes, ptr); });
}

// Address space is not memory: only a graph pool's relaxed mode applies.
Status CaptureGuardDevice::reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept {
  return relaxed_in_pool([&] { return upstream_.reserve(bytes, alignment, va); });
}

Status CaptureGuardDevice::create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept {
  return obtain([&] { return upstream_.create_physical(bytes, handle); });
}

// Maps put memory already created under addresses: only a graph pool's relaxed mode applies.
Status CaptureGuardDevice::map(void* va, PhysicalHandle handle) noexcept {
  return relaxed_in_pool([&] { return upstream_.map(va, handle); });
}

Status CaptureGuardDevice::query_event(Event event) noexcept {
  return relaxed_in_pool([&] { return upstream_.query_event(event); });
}

Status CaptureGuardDevice::map_run(void* va, const PhysicalHandle* handles,
                                   std::size_t count) noexcept {
  return relaxed_in_pool([&] { return upstream_.map_run(va, handles, count); });
}

}  // namespace cistern::plugin
