// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The interface every stream-ordered device allocator in cistern offers: the caching allocator,
// the baselines of the replay engine, and the adaptors of the framework plug-ins.
#pragma once

#include <cstddef>
#include <string>

#include "cistern/stats.hpp"
#include "cistern/types.hpp"

namespace cistern {

/// A stream-ordered device memory allocator.
///
/// `allocate(bytes, stream)` returns memory usable by work on `stream`, aligned to at least 512
/// bytes (nullptr for 0 bytes). `deallocate(ptr, stream)` gives it back: work on the same stream
/// may reuse it at once, other streams only after the work submitted to `stream` so far is known
/// to be complete. `record_stream(ptr, stream)` declares that `stream` also uses the memory, so
/// that it is not reused before that stream's work submitted before the free is complete.
class Allocator {
 public:
  virtual ~Allocator() = default;
  Allocator() = default;
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  /// Allocates `bytes` for use on `stream`. Throws `OutOfMemory` when the device cannot provide
  /// them even after the cache has been released.
  virtual void* allocate(std::size_t bytes, Stream stream) = 0;
  /// Frees memory from `allocate`, ordered on `stream`. Throws `InvalidPointer` for a pointer
  /// that is not currently allocated (double free, foreign pointer); state is unchanged then.
  virtual void deallocate(void* ptr, Stream stream) = 0;
  /// Marks `ptr` as used by `stream` as well.
  virtual void record_stream(void* ptr, Stream stream) = 0;
  /// Returns every cached segment that holds no allocation to the device.
  virtual void empty_cache() = 0;
  /// Current statistics.
  virtual Stats stats() const = 0;
  /// Bytes currently held from the device (cheap: for sampling after every operation).
  virtual std::size_t reserved_bytes() const noexcept = 0;
  /// Sets every peak to its current value.
  virtual void reset_peak_stats() = 0;
  /// Segments and blocks, sorted by address.
  virtual Snapshot snapshot() const = 0;
  /// The device ordinal this allocator serves.
  virtual int device_index() const noexcept = 0;
  /// A short name, e.g. "cistern" or "torch".
  virtual std::string name() const = 0;

  /// Verifies the allocator's invariants; throws `InvariantViolation` describing the first one
  /// broken. This version checks what the interface shows: segments sorted and disjoint, blocks
  /// tiling their segments, and the snapshot agreeing with `stats()` and `reserved_bytes()`.
  /// Allocators override it to walk their internal structures as well.
  virtual void check() const;
};

}  // namespace cistern
