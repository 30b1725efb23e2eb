// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CUDA graph capture and the device calls of the plug-in's allocators (see
// Note [Graph pools] in graph_pools.hpp).
//
// `CaptureState` says whether a stream of one device is being captured: cudaStreamIsCapturing on
// CUDA; on the simulated backend, the streams that cistern_sim_begin_capture marked.
//
// `CaptureGuardDevice` is the device each of the plug-in's allocators sees: a forwarding adaptor
// over the shared device that changes only the calls that obtain memory (allocate, reserve,
// create_physical, map, map_run), and only while a malloc of the plug-in is in flight on this
// thread (`MallocScope`), so that the hot path never asks CUDA anything:
//   - the general allocator's: refused (`Status::invalid_argument`) when that malloc's stream is
//     being captured - no pool was begun for it, and memory obtained there would be reused
//     outside the graph; `refused_for_capture()` then says so and `last_error()` says why;
//   - a graph pool's: run in cudaStreamCaptureModeRelaxed, as PyTorch's cudaMalloc during capture
//     does (the default global mode forbids cudaMalloc while any stream is captured); so do its
//     event queries (a pool's blocks freed with record_stream uses wait for events).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "cistern/device.hpp"
#include "cistern/types.hpp"

namespace cistern::plugin {

/// See the file comment.
class CaptureState {
 public:
  /// `simulated`: the marks of `mark` are the truth; otherwise CUDA is asked.
  explicit CaptureState(bool simulated) noexcept : simulated_(simulated) {}
  /// Whether `stream` is being captured (a CUDA error counts as not).
  bool is_capturing(Stream stream) const;
  /// Simulated backend: marks `stream` as captured (`capturing`) or no longer. Throws
  /// `InvalidArgument` on CUDA, where the driver knows.
  void mark(Stream stream, bool capturing);

 private:
  bool simulated_;
  mutable std::mutex mutex_;
  std::set<Stream> captured_;
};

/// Which allocator a `CaptureGuardDevice` serves.
enum class GuardRole : std::uint8_t { general, graph_pool };

/// Marks the malloc in flight on this thread (its stream) for the guards below; nests.
class MallocScope {
 public:
  explicit MallocScope(Stream stream) noexcept;
  ~MallocScope();
  MallocScope(const MallocScope&) = delete;
  MallocScope& operator=(const MallocScope&) = delete;

  /// Whether the general allocator's guard refused a device call during this scope.
  bool refused_for_capture() const noexcept { return refused_; }

  /// The innermost scope of this thread, or nullptr.
  static MallocScope* current() noexcept;
  Stream stream() const noexcept { return stream_; }
  void note_refusal() noexcept { refused_ = true; }

 private:
  Stream stream_;
  bool refused_ = false;
  MallocScope* outer_;
};

/// See the file comment.
class CaptureGuardDevice : public Device {
 public:
  CaptureGuardDevice(Device& upstream, const CaptureState& capture, GuardRole role) noexcept
      : upstream_(upstream), capture_(capture), role_(role) {}

  int index() const noexcept override { return upstream_.index(); }
  std::string name() const override { return upstream_.name(); }
  std::size_t granularity() const noexcept override { return upstream_.granularity(); }
  Status memory_info(MemoryInfo* info) noexcept override { return upstream_.memory_info(info); }
  std::string last_error() const override;
  Status allocate(std::size_t bytes, void** ptr) noexcept override;
  Status deallocate(void* ptr) noexcept override { return upstream_.deallocate(ptr); }
  bool supports_virtual_memory() const noexcept override {
    return upstream_.supports_virtual_memory();
  }
  Status reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept override;
  Status release_reservation(void* va, std::size_t bytes) noexcept override {
    return upstream_.release_reservation(va, bytes);
  }
  Status create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept override;
  Status release_physical(PhysicalHandle handle) noexcept override {
    return upstream_.release_physical(handle);
  }
  Status map(void* va, PhysicalHandle handle) noexcept override;
  Status map_run(void* va, const PhysicalHandle* handles, std::size_t count) noexcept override;
  Status unmap(void* va, std::size_t bytes) noexcept override { return upstream_.unmap(va, bytes); }
  Status create_event(Event* event) noexcept override { return upstream_.create_event(event); }
  Status destroy_event(Event event) noexcept override { return upstream_.destroy_event(event); }
  Status record_event(Event event, Stream stream) noexcept override {
    return upstream_.record_event(event, stream);
  }
  Status query_event(Event event) noexcept override;
  Status synchronize_event(Event event) noexcept override {
    return upstream_.synchronize_event(event);
  }
  Status stream_wait_event(Stream stream, Event event) noexcept override {
    return upstream_.stream_wait_event(stream, event);
  }
  Status synchronize_stream(Stream stream) noexcept override {
    return upstream_.synchronize_stream(stream);
  }
  Status synchronize_device() noexcept override { return upstream_.synchronize_device(); }

 private:
  /// Runs `call` (a device call that obtains memory) as the role requires.
  template <class Call>
  Status obtain(Call&& call) noexcept;
  /// Runs `call` in relaxed capture mode for a graph pool's malloc, as it is otherwise.
  template <class Call>
  Status relaxed_in_pool(Call&& call) noexcept;

  Device& upstream_;
  const CaptureState& capture_;
  GuardRole role_;
};

/// The message of a general-pool allocation refused during capture.
std::string capture_refusal_message(int device, Stream stream);

}  // namespace cistern::plugin
