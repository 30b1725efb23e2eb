// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// A trace compiled for replay: what the engine's event loop reads instead of the trace itself.
//
// Compiling checks everything the loop relies on (a free names a live allocation, stream indices
// are in range), so that the loop needs no checks of its own, and names every allocation by a
// dense slot, so that the id -> pointer map is a plain vector. It also computes the live bytes
// after every event, which are the same for every policy. A plan is immutable once made and is
// shared by every replay of its trace (the probes of a capacity search, the policies of run_all).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trace/trace.hpp"

namespace cistern::replay::detail {

/// "No event": a peak reached before the first event (by the blocks live before the window).
inline constexpr std::size_t kAtStart = static_cast<std::size_t>(-1);

/// One event, as the loop needs it (16 bytes, so that a plan of a million events is 16 MB).
struct Step {
  std::uint64_t size = 0;    ///< requested bytes (alloc); 0 otherwise
  std::uint32_t slot = 0;    ///< the allocation's slot (alloc, free)
  std::uint16_t stream = 0;  ///< index into Trace::streams
  trace::Op op = trace::Op::alloc;
};

/// A compiled trace. See the file comment.
struct Plan {
  std::vector<Step> start;                ///< cold start: live_before allocations, in address order
  std::vector<Step> steps;                ///< one per event of the window
  std::vector<std::uint64_t> live_after;  ///< live requested bytes after each event
  std::uint64_t live_at_start = 0;        ///< bytes of the blocks live before the window
  std::uint64_t peak_live = 0;  ///< max of live_at_start and live_after (= Trace::peak_live)
  std::size_t peak_live_event = kAtStart;  ///< the first event after which peak_live holds
  std::size_t slots = 0;                   ///< distinct allocations (live_before and window)
  std::vector<std::uint32_t> slot_of_live_before;  ///< slot of each trace.live_before[i]
  std::string error;  ///< why the trace cannot be replayed ("" if it can); then the rest is empty
};

/// Compiles `trace`. Never throws for bad input: a trace that cannot be replayed gives a plan
/// whose `error` names the first offending event.
Plan compile(const trace::Trace& trace);

}  // namespace cistern::replay::detail
