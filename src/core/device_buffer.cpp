// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The out-of-line parts of the RAII API: the current stream, the default allocator, and frees
// from destructors.
#include "cistern/device_buffer.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>

#include "cistern/errors.hpp"
#include "cistern/stream_scope.hpp"

namespace cistern {
namespace {

thread_local Stream current_stream_of_thread;
thread_local int current_device_of_thread = 0;
std::atomic<Allocator*> default_allocator_{nullptr};
std::atomic<Allocator*> per_device_allocators_[kMaxDefaultDevices] = {};

}  // namespace

Stream current_stream() noexcept { return current_stream_of_thread; }

StreamScope::StreamScope(Stream stream) noexcept : previous_(current_stream_of_thread) {
  current_stream_of_thread = stream;
}

StreamScope::~StreamScope() { current_stream_of_thread = previous_; }

int current_device() noexcept { return current_device_of_thread; }

DeviceScope::DeviceScope(int device) noexcept : previous_(current_device_of_thread) {
  current_device_of_thread = device;
}

DeviceScope::~DeviceScope() { current_device_of_thread = previous_; }

Allocator* per_device_allocator(int device) noexcept {
  if (device < 0 || device >= kMaxDefaultDevices) return nullptr;
  return per_device_allocators_[device].load();
}

Allocator* set_per_device_allocator(int device, Allocator* allocator) {
  if (device < 0 || device >= kMaxDefaultDevices) {
    throw InvalidArgument(
        fmt::format("cistern: set_per_device_allocator({}): the device ordinal must be in [0, {})",
                    device, kMaxDefaultDevices));
  }
  return per_device_allocators_[device].exchange(allocator);
}

Allocator* default_allocator() noexcept {
  if (Allocator* scoped = default_allocator_.load()) return scoped;
  return per_device_allocator(current_device());
}

Allocator* set_default_allocator(Allocator* allocator) noexcept {
  return default_allocator_.exchange(allocator);
}

namespace detail {

Allocator& allocator_or_default(Allocator* allocator) {
  if (allocator == nullptr) allocator = default_allocator();
  if (allocator == nullptr) {
    throw InvalidArgument(
        fmt::format("cistern: no allocator given and no default allocator set for device {}; "
                    "pass one, or set one with cistern::set_per_device_allocator(), "
                    "cistern::set_default_allocator() or cistern::AllocatorScope",
                    current_device()));
  }
  return *allocator;
}

void free_noexcept(Allocator* allocator, void* ptr, Stream stream) noexcept {
  if (ptr == nullptr || allocator == nullptr) return;
  try {
    allocator->deallocate(ptr, stream);
  } catch (const std::exception& e) {
    // A destructor cannot throw; the memory stays with the allocator, which stays consistent.
    std::fprintf(stderr, "cistern: freeing %p from a destructor failed: %s\n", ptr, e.what());
  }
}

void throw_array_too_large(std::size_t count, std::size_t element_size) {
  throw InvalidArgument(
      fmt::format("cistern: make_device_unique: {} elements of {} bytes do not fit in size_t",
                  count, element_size));
}

}  // namespace detail
}  // namespace cistern
