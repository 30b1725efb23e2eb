// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Small value types shared by every layer: stream and event handles, byte-size helpers.
// C++17, no CUDA headers: this file compiles in host code and in .cu files alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

/// CUDA's stream type, declared here so that no CUDA header is needed: `cudaStream_t` and
/// `CUstream` are `CUstream_st*`.
struct CUstream_st;  // NOLINT(readability-identifier-naming): CUDA's name

namespace cistern {

/// An opaque stream handle. For the CUDA backends it holds a `cudaStream_t` value (0 is the
/// legacy default stream); for `SimDevice` it holds the id returned by `SimDevice::create_stream`.
/// Built only from a `cudaStream_t` (implicitly, so that CUDA streams can be passed directly), from
/// a device's own streams, or explicitly from a raw integer handle: no other pointer converts, so
/// `allocate(n, some_float_ptr)` does not compile.
struct Stream {
  std::uintptr_t handle = 0;

  constexpr Stream() noexcept = default;
  /// A stream from its raw integer handle.
  constexpr explicit Stream(std::uintptr_t raw) noexcept : handle(raw) {}
  /// A stream from a `cudaStream_t` (a template so that a literal 0 stays unambiguous).
  template <class T, std::enable_if_t<std::is_same_v<T, ::CUstream_st>, int> = 0>
  Stream(T* native) noexcept  // NOLINT(google-explicit-constructor): cudaStream_t converts freely
      : handle(reinterpret_cast<std::uintptr_t>(native)) {}

  /// The handle as a native pointer type, e.g. `s.native<CUstream_st>()` gives a `cudaStream_t`.
  template <class T>
  T* native() const noexcept {
    return reinterpret_cast<T*>(handle);
  }

  friend constexpr bool operator==(Stream a, Stream b) noexcept { return a.handle == b.handle; }
  friend constexpr bool operator!=(Stream a, Stream b) noexcept { return a.handle != b.handle; }
  friend constexpr bool operator<(Stream a, Stream b) noexcept { return a.handle < b.handle; }
};

/// The legacy default stream (handle 0).
inline constexpr Stream default_stream{};

/// An opaque event handle created and owned by a `Device`.
struct Event {
  std::uintptr_t handle = 0;
  friend constexpr bool operator==(Event a, Event b) noexcept { return a.handle == b.handle; }
  friend constexpr bool operator!=(Event a, Event b) noexcept { return a.handle != b.handle; }
};

/// Physical memory created by `Device::create_physical`: an opaque handle (a
/// `CUmemGenericAllocationHandle` on the VMM backend) and its size. The driver maps a handle only
/// whole, so the size travels with it: `Device::map` takes the handle and nothing else.
struct PhysicalHandle {
  std::uint64_t handle = 0;
  std::size_t bytes = 0;  ///< the size it was created with (a multiple of the granularity)
  friend constexpr bool operator==(PhysicalHandle a, PhysicalHandle b) noexcept {
    return a.handle == b.handle;
  }
};

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t GiB = std::size_t{1} << 30;

/// Formats a byte count the way PyTorch's messages do: "N bytes", "x.xx KiB", "x.xx MiB",
/// "x.xx GiB".
std::string format_bytes(std::uint64_t bytes);

/// Parses a byte count such as "512", "64KiB", "80GiB", "1.5GB", "20MiB" (binary and decimal
/// suffixes, case-insensitive). Throws `cistern::InvalidArgument` naming the text on bad input.
std::uint64_t parse_bytes(const std::string& text);

}  // namespace cistern
