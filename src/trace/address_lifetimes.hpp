// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Builds a trace's alloc and free events from a recording that names allocations only by
// address (PyTorch snapshots, Kineto traces, RMM logs): one id per address lifetime, from its
// allocation to its free. A free of an address that is not live is a block allocated before the
// recording began; it joins `live_before`. `finish` then numbers ids as every reader does:
// `live_before` 0..L-1 in address order, allocations L, L+1, ... in event order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "trace/trace.hpp"

namespace cistern::trace::detail {

/// Appends alloc and free events to a trace, tracking which addresses are live.
class AddressLifetimes {
 public:
  /// Fills `trace.events` and `trace.live_before`, which must be empty, until `finish`.
  explicit AddressLifetimes(Trace& trace) : trace_(trace) {}

  /// The provisional id of the allocation live at `addr`, if any.
  std::optional<std::uint64_t> live_at(std::uint64_t addr) const;
  /// True if the last event at `addr` was a free: another free there would be a double free,
  /// not a block from before the recording.
  bool freed_at(std::uint64_t addr) const { return freed_.count(addr) != 0; }

  /// Appends an alloc of `size` bytes at `addr`. The caller has checked that `addr` is not live.
  /// `stack` (an id into `trace.stacks`, 0: none) is where the program allocated it.
  void alloc(std::uint64_t addr, std::uint64_t size, std::uint32_t stream, std::int64_t time,
             std::uint32_t stack = 0);

  /// What a free found.
  struct Freed {
    std::uint64_t id = 0;    ///< provisional: `finish` renumbers it wherever the trace holds it
    std::uint64_t size = 0;  ///< the allocation's size
    bool before = false;     ///< the address was not live: a block live before the recording
  };
  /// Appends a free of the allocation at `addr`. If none is live there, a `live_before` block of
  /// `size` bytes is created first. The event carries the allocation's own size. The caller has
  /// checked `freed_at(addr)`. `stack` is the allocation's stack, used only for such a block.
  Freed free(std::uint64_t addr, std::uint64_t size, std::uint32_t stream, std::int64_t time,
             std::uint32_t stack = 0);

  /// The live allocation, as [begin, end), that shares a byte with [addr, addr + size), if any.
  /// Live allocations never overlap: a reader that finds one refuses the trace, naming both.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> overlapping(std::uint64_t addr,
                                                                     std::uint64_t size) const;

  /// Adds a block live from before the recording to its end (never freed in it).
  void live_throughout(std::uint64_t addr, std::uint64_t size, std::uint32_t stream,
                       std::uint32_t stack = 0);

  /// Sorts `live_before` by address and renumbers every id in the trace, including
  /// `recorded.deferred_frees`, and fills `trace.alloc_stacks` when a stack was given. Call once,
  /// last.
  void finish();

 private:
  static constexpr std::uint64_t live_before_flag = std::uint64_t{1} << 63;

  Trace& trace_;
  std::unordered_map<std::uint64_t, std::uint64_t> live_;  ///< address -> provisional id
  std::unordered_map<std::uint64_t, std::uint64_t> size_;  ///< provisional id -> size, while live
  std::map<std::uint64_t, std::uint64_t> spans_;           ///< live allocation's address -> its end
  std::unordered_set<std::uint64_t> freed_;  ///< addresses whose last event was a free
  std::uint64_t allocations_ = 0;
  // Stacks by provisional id, kept only once a nonzero stack was given (4 bytes per allocation).
  std::vector<std::uint32_t> alloc_stacks_;   ///< allocation k's
  std::vector<std::uint32_t> before_stacks_;  ///< live_before[j]'s, in discovery order
  bool any_stack_ = false;
  void note_stack(std::vector<std::uint32_t>& stacks, std::uint64_t index, std::uint32_t stack);
  void finish_stacks(std::uint64_t live_before_count,
                     const std::vector<std::uint64_t>& rank);  // rank of live_before[j]
};

}  // namespace cistern::trace::detail
