// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Call stacks of allocations, as PyTorch's memory snapshots carry them (each event's `frames`: a
// list of {filename, line, name}, innermost first). Many events share one stack - a training
// step allocates from the same few lines over and over - so stacks are interned: a table holds
// each distinct frame and each distinct stack once, and an event names its stack by a 32-bit id
// (`HistoryEntry::stack`, `trace::Trace::alloc_stacks`). Id 0 is the empty stack: no frames
// recorded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cistern {

/// One frame of a call stack: PyTorch's {filename, line, name}.
struct StackFrame {
  std::string filename;
  std::int64_t line = 0;
  std::string name;
};

/// Interned call stacks (see the file comment). Ids are dense: 0 (empty) to `size() - 1`.
class StackTable {
 public:
  StackTable();

  /// The id of the frame {filename, line, name}, adding it if new.
  std::uint32_t frame_id(std::string_view filename, std::int64_t line, std::string_view name);
  /// The id of the stack made of these frame ids (innermost first), adding it if new; 0 for none.
  /// Throws `InvalidArgument` if a frame id is unknown.
  std::uint32_t stack_id(const std::vector<std::uint32_t>& frames);

  /// The frame ids of stack `id` (empty for 0). Throws `InvalidArgument` for an unknown id.
  const std::vector<std::uint32_t>& stack(std::uint32_t id) const;
  /// Frame `id`. Throws `InvalidArgument` for an unknown id.
  const StackFrame& frame(std::uint32_t id) const;
  /// The number of stacks, the empty one included (so at least 1).
  std::size_t size() const noexcept { return stacks_.size(); }
  /// The number of distinct frames.
  std::size_t frame_count() const noexcept { return frames_.size(); }

 private:
  std::vector<StackFrame> frames_;
  std::vector<std::vector<std::uint32_t>> stacks_;
  std::unordered_map<std::string, std::uint32_t> frame_ids_;  ///< frame's key -> id
  std::unordered_map<std::string, std::uint32_t> stack_ids_;  ///< frame ids' bytes -> id
};

}  // namespace cistern
