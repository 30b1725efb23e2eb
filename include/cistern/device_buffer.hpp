// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Owning handles to device memory.
//
//   cistern::DeviceBuffer buf(bytes, stream, allocator);  // freed on `stream` when destroyed
//   auto x = cistern::make_device_unique<float[]>(n, allocator, stream);  // typed, unique
//
// Memory is uninitialised device memory: no constructor or destructor ever runs on it, which is
// why the typed handles accept only trivially destructible types. Destruction frees on the
// handle's stream, so work already submitted to that stream may still use the memory; work on
// other streams must be ordered first, or declared with `Allocator::record_stream`.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>

#include "cistern/allocator.hpp"
#include "cistern/stream_scope.hpp"
#include "cistern/types.hpp"

namespace cistern {

namespace detail {
/// The allocator to use when none is given: the default one, or throws InvalidArgument.
Allocator& allocator_or_default(Allocator* allocator);
/// Frees from a destructor: never throws; a failure is reported on stderr.
void free_noexcept(Allocator* allocator, void* ptr, Stream stream) noexcept;
/// Throws InvalidArgument for an array whose byte size does not fit in size_t.
[[noreturn]] void throw_array_too_large(std::size_t count, std::size_t element_size);
}  // namespace detail

/// An owning, movable, non-copyable buffer of device memory, freed on its stream.
class DeviceBuffer {
 public:
  /// An empty buffer (no memory).
  DeviceBuffer() noexcept = default;
  /// `bytes` of device memory for use on `stream`, from `allocator`.
  DeviceBuffer(std::size_t bytes, Stream stream, Allocator& allocator)
      : allocator_(&allocator), stream_(stream), size_(bytes) {
    data_ = allocator.allocate(bytes, stream);
  }
  /// `bytes` on the current stream from the default allocator (see stream_scope.hpp).
  explicit DeviceBuffer(std::size_t bytes)
      : DeviceBuffer(bytes, current_stream(), detail::allocator_or_default(nullptr)) {}
  ~DeviceBuffer() { reset(); }

  DeviceBuffer(DeviceBuffer&& other) noexcept
      : allocator_(other.allocator_),
        stream_(other.stream_),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      allocator_ = other.allocator_;
      stream_ = other.stream_;
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// The device pointer (nullptr when empty).
  void* data() noexcept { return data_; }
  const void* data() const noexcept { return data_; }
  /// The device pointer as `T*`.
  template <class T>
  T* data_as() noexcept {
    return static_cast<T*>(data_);
  }
  /// The size requested, in bytes.
  std::size_t size() const noexcept { return size_; }
  /// Whether the buffer holds no memory.
  bool empty() const noexcept { return data_ == nullptr; }
  /// The stream the memory is freed on.
  Stream stream() const noexcept { return stream_; }
  /// Frees on `stream` from now on. The allocator orders the free after `stream`'s work.
  void set_stream(Stream stream) noexcept { stream_ = stream; }
  /// The allocator that owns the memory (nullptr when default-constructed).
  Allocator* allocator() const noexcept { return allocator_; }

  /// Frees the memory now (on the buffer's stream); the buffer becomes empty.
  void reset() noexcept {
    if (data_ != nullptr) detail::free_noexcept(allocator_, data_, stream_);
    data_ = nullptr;
    size_ = 0;
  }
  /// Gives up ownership: the caller must free the returned pointer with the allocator.
  void* release() noexcept {
    size_ = 0;
    return std::exchange(data_, nullptr);
  }

 private:
  Allocator* allocator_ = nullptr;
  Stream stream_;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Frees device memory on a stream; the deleter of `device_unique_ptr`.
template <class T>
struct StreamDeleter {
  Allocator* allocator = nullptr;
  Stream stream;
  void operator()(T* ptr) const noexcept { detail::free_noexcept(allocator, ptr, stream); }
};

/// A unique pointer to device memory holding a `T` or (with `T[]`) an array of `T`.
template <class T>
using device_unique_ptr = std::unique_ptr<T, StreamDeleter<std::remove_extent_t<T>>>;

/// Allocates one uninitialised `T` on `stream`.
template <class T, std::enable_if_t<!std::is_array_v<T>, int> = 0>
device_unique_ptr<T> make_device_unique(Allocator& allocator, Stream stream = current_stream()) {
  static_assert(std::is_trivially_destructible_v<T>,
                "device memory is never destroyed on the host: T must be trivially destructible");
  void* p = allocator.allocate(sizeof(T), stream);
  return device_unique_ptr<T>(static_cast<T*>(p), StreamDeleter<T>{&allocator, stream});
}

/// Allocates an uninitialised array of `count` elements on `stream`.
template <class T, std::enable_if_t<std::is_array_v<T> && std::extent_v<T> == 0, int> = 0>
device_unique_ptr<T> make_device_unique(std::size_t count, Allocator& allocator,
                                        Stream stream = current_stream()) {
  using E = std::remove_extent_t<T>;
  static_assert(std::is_trivially_destructible_v<E>,
                "device memory is never destroyed on the host: T must be trivially destructible");
  if (count > SIZE_MAX / sizeof(E)) detail::throw_array_too_large(count, sizeof(E));
  void* p = allocator.allocate(count * sizeof(E), stream);
  return device_unique_ptr<T>(static_cast<E*>(p), StreamDeleter<E>{&allocator, stream});
}

}  // namespace cistern
