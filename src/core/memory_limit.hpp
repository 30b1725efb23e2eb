// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The reserved-memory limit of `per_process_memory_fraction` and `memory_limit_mb`, as the
// caching and the pass-through allocator apply it (the torch emulation follows PyTorch's own
// rule, in src/replay/torch_allocator.cpp).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cistern/config.hpp"
#include "cistern/errors.hpp"

namespace cistern::detail {

/// The most bytes an allocator may reserve on a device of `device_total` bytes (0: unknown) under
/// `config`'s memory fraction and hard limit; SIZE_MAX when neither limits it.
inline std::size_t allowed_bytes(const Config& config, std::size_t device_total) noexcept {
  std::size_t allowed = SIZE_MAX;
  if (config.memory_fraction < 1.0 && device_total > 0) {
    allowed = static_cast<std::size_t>(static_cast<double>(device_total) * config.memory_fraction);
  }
  if (config.memory_limit > 0) allowed = std::min(allowed, config.memory_limit);
  return allowed;
}

/// Throws InvalidArgument unless `fraction`, the argument of set_memory_fraction, is in (0, 1].
inline void check_memory_fraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    throw InvalidArgument(
        fmt::format("cistern: set_memory_fraction({}): the fraction must be in (0, 1]", fraction));
  }
}

}  // namespace cistern::detail
