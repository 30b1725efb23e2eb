// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Internal assertions, as mimalloc's mi_assert_internal: cheap checks of the invariants one
// function relies on (a block's state before a transition, a counter that cannot go negative, a
// key that must be absent), compiled in only when the project is configured with
// -DCISTERN_DEBUG=ON (the ASan CI step does). A failure prints the condition and its place and
// aborts, so that a sanitizer or debugger stops at the first broken invariant rather than at a
// later symptom. The whole-allocator checker (`check()`) remains the tool for tests.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace cistern::detail {

/// Whether internal assertions are compiled in.
#if defined(CISTERN_DEBUG) && CISTERN_DEBUG
inline constexpr bool kDebugAssertions = true;
#else
inline constexpr bool kDebugAssertions = false;
#endif

/// Reports a failed internal assertion and aborts.
[[noreturn]] __attribute__((cold, noinline)) inline void assertion_failed(const char* condition,
                                                                          const char* file,
                                                                          int line) noexcept {
  std::fprintf(stderr, "cistern: internal assertion failed: %s (%s:%d)\n", condition, file, line);
  std::abort();
}

}  // namespace cistern::detail

/// Checks `condition` in CISTERN_DEBUG builds; compiles to nothing (and does not evaluate it)
/// otherwise.
#define CISTERN_ASSERT_INTERNAL(condition)                                                   \
  do {                                                                                       \
    if constexpr (::cistern::detail::kDebugAssertions) {                                     \
      if (!(condition)) ::cistern::detail::assertion_failed(#condition, __FILE__, __LINE__); \
    }                                                                                        \
  } while (false)
