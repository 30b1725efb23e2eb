// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The exceptions cistern throws. Every one derives from `cistern::Error` (a `std::runtime_error`)
// and carries a message that names the problem and what to do about it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace cistern {

/// Base class of every cistern exception.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A bad argument: an impossible size, an unknown option, a malformed value.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A configuration string or table entry that cannot be accepted. `key()` names the option.
class ConfigError : public InvalidArgument {
 public:
  ConfigError(std::string key, const std::string& message)
      : InvalidArgument(message), key_(std::move(key)) {}
  /// The option the error is about.
  const std::string& key() const noexcept { return key_; }

 private:
  std::string key_;
};

/// Misuse of an allocation: a pointer this allocator never returned, a double free, a size
/// that does not match. The allocator's state is left exactly as it was before the call.
class InvalidPointer : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

/// A device call failed for a reason other than running out of memory. `operation()` names the
/// call (for example "allocate" or "record_event"); the allocator's state is left consistent.
class DeviceError : public Error {
 public:
  DeviceError(std::string operation, const std::string& message)
      : Error(message), operation_(std::move(operation)) {}
  /// The device operation that failed.
  const std::string& operation() const noexcept { return operation_; }

 private:
  std::string operation_;
};

/// The figures an out-of-memory error reports, in bytes.
struct OutOfMemoryInfo {
  int device = 0;                  ///< device index
  std::uint64_t requested = 0;     ///< the caller's size
  std::uint64_t rounded = 0;       ///< the rounded block size
  std::uint64_t segment = 0;       ///< the segment the allocator tried to obtain (0: none)
  std::uint64_t allocated = 0;     ///< allocated_bytes.all.current
  std::uint64_t reserved = 0;      ///< reserved_bytes.all.current
  std::uint64_t cached = 0;        ///< reserved but not allocated (free or pending blocks)
  std::uint64_t largest_free = 0;  ///< the largest cached free block at the time of failure
  std::uint64_t device_total = 0;  ///< the device's capacity
  std::uint64_t device_free = 0;   ///< what the device reported as free
  std::uint64_t limit = 0;         ///< the configured reserved-memory limit (0: none)
};

/// The allocator could not satisfy a request even after freeing its cache and retrying.
/// The allocator remains fully usable; nothing has leaked.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const OutOfMemoryInfo& info, const std::string& message)
      : Error(message), info_(info) {}
  /// The figures behind the message.
  const OutOfMemoryInfo& info() const noexcept { return info_; }

 private:
  OutOfMemoryInfo info_;
};

/// `check()` found a broken invariant: a bug in cistern, never a user error.
class InvariantViolation : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace cistern
