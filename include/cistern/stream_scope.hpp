// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Scoped defaults for the RAII API: the current stream of the calling thread and the
// process-wide default allocator.
//
//   cistern::StreamScope on(my_stream);          // this thread works on my_stream until scope end
//   cistern::DeviceBuffer buf(1 << 20);          // allocated on my_stream by the default allocator
#pragma once

#include "cistern/types.hpp"

namespace cistern {

class Allocator;

/// The calling thread's current stream (the default stream unless a StreamScope is active).
Stream current_stream() noexcept;

/// Makes `stream` the calling thread's current stream for the lifetime of the scope; scopes nest.
class StreamScope {
 public:
  explicit StreamScope(Stream stream) noexcept;
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  Stream previous_;
};

/// The process-wide default allocator, or nullptr if none was set.
Allocator* default_allocator() noexcept;

/// Sets the default allocator (nullptr to clear); returns the previous one. The allocator must
/// outlive its use as the default.
Allocator* set_default_allocator(Allocator* allocator) noexcept;

/// Makes `allocator` the default for the lifetime of the scope, then restores the previous one.
class AllocatorScope {
 public:
  explicit AllocatorScope(Allocator& allocator) noexcept
      : previous_(set_default_allocator(&allocator)) {}
  ~AllocatorScope() { set_default_allocator(previous_); }
  AllocatorScope(const AllocatorScope&) = delete;
  AllocatorScope& operator=(const AllocatorScope&) = delete;

 private:
  Allocator* previous_;
};

}  // namespace cistern
