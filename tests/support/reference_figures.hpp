// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The reference figures of every trace in ../shared/traces, from its README ("Reference
// figures"), computed there independently of cistern. Tests compare readers and replays with them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace cistern::testing {

/// One row of the README's reference table.
struct ReferenceFigures {
  const char* path;  ///< below <shared>/traces
  int device;
  std::size_t allocations;
  std::uint64_t live_before;
  std::uint64_t peak_live;
  std::optional<std::uint64_t> peak_reserved;  ///< PyTorch's own, where recorded
  const char* format;
};

/// Every shared trace, in the README's order.
const std::vector<ReferenceFigures>& reference_figures();

/// Names the trace in GoogleTest's failure messages (instead of its bytes).
inline void PrintTo(const ReferenceFigures& figures, std::ostream* os) { *os << figures.path; }

/// `text` with every character that is not a letter or digit replaced by '_' (a test name).
std::string identifier(const std::string& text);

}  // namespace cistern::testing
