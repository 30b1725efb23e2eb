// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// CISTERN_HOT marks the small functions of the cache-hit path that must be inlined into
// allocate and deallocate: there a call, with its register saves, costs as much as the work.
#pragma once

#if defined(__GNUC__)
#define CISTERN_HOT inline __attribute__((always_inline))
#else
#define CISTERN_HOT inline
#endif
