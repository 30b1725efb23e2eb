// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Scoped defaults for the RAII API: the current stream and device of the calling thread, the
// per-device default allocators (as RMM's per_device_resource), and the process-wide scoped one.
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

/// The calling thread's current device ordinal (0 unless a DeviceScope is active).
int current_device() noexcept;

/// Makes `device` the calling thread's current device for the lifetime of the scope; scopes nest.
class DeviceScope {
 public:
  explicit DeviceScope(int device) noexcept;
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_;
};

/// Device ordinals the per-device table holds: 0 to kMaxDefaultDevices - 1.
inline constexpr int kMaxDefaultDevices = 64;

/// The default allocator of device `device` (nullptr if none was set or the ordinal is out of
/// range), as RMM's `get_per_device_resource`.
Allocator* per_device_allocator(int device) noexcept;

/// Sets the default allocator of `device` (nullptr to clear); returns the previous one. Throws
/// `InvalidArgument` for an ordinal outside [0, kMaxDefaultDevices). The allocator must outlive
/// its use as the default.
Allocator* set_per_device_allocator(int device, Allocator* allocator);

/// The default allocator: the process-wide one set by set_default_allocator or AllocatorScope,
/// or else the calling thread's current device's (per_device_allocator), or nullptr.
Allocator* default_allocator() noexcept;

/// Sets the process-wide default allocator, which takes precedence over the per-device ones
/// (nullptr to clear); returns the previous one. The allocator must outlive its use as the
/// default.
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
