// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// A test-only stand-in for the one call of PyTorch's <c10/cuda/CUDACachingAllocator.h> that
// cistern's PyTorch glue makes: `attachOutOfMemoryObserver`. PyTorch's caching allocator calls
// each observer with (device, allocation size, total or allowed bytes, free bytes) when it is
// about to raise out of memory; here the observers are kept so that a test can call them as
// PyTorch would (`stand_in_observers()`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace c10::cuda::CUDACachingAllocator {

using OutOfMemoryObserver = std::function<void(std::int64_t device, std::size_t allocated,
                                               std::size_t device_total, std::size_t device_free)>;

/// The observers attached so far (the stand-in's own; PyTorch keeps them per device).
inline std::vector<OutOfMemoryObserver>& stand_in_observers() {
  static std::vector<OutOfMemoryObserver> observers;
  return observers;
}

inline void attachOutOfMemoryObserver(OutOfMemoryObserver observer) {
  stand_in_observers().push_back(std::move(observer));
}

}  // namespace c10::cuda::CUDACachingAllocator
