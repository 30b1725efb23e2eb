// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The search's state over time sections: for each section its floor (the top of the buffers
// placed there so far) and its remainder (the sizes of the buffers still to be placed there).
// Placing a buffer at the highest floor over its sections raises all of them to one level and
// takes its size from their remainders, so both are range updates on a segment tree. A section is
// active while some buffer still to be placed lives there; the tree also keeps the lowest floor
// of the active sections, which the search fills next. Every write
// goes through an undo log, which lets the depth-first search step back in O(log n) per level.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace cistern::plan::detail {

/// See the file comment. Values are signed so that remainders can be lowered by adding.
class Skyline {
 public:
  /// `remainder[s]`: the summed sizes of the buffers live in section s; every floor starts at 0.
  explicit Skyline(const std::vector<std::int64_t>& remainder);

  /// The highest floor over sections [first, last).
  std::int64_t max_floor(std::uint32_t first, std::uint32_t last);
  /// Sets the floor of sections [first, last) to `level` and lowers their remainders by `size`.
  void place(std::uint32_t first, std::uint32_t last, std::int64_t level, std::int64_t size);
  /// The leftmost active section whose floor is the lowest of the active ones, and that floor;
  /// (sections, max) when no section is active.
  std::pair<std::uint32_t, std::int64_t> lowest_active();
  /// The lowest floor above `level` of an active section (the maximum int64 if none).
  std::int64_t lowest_active_above(std::int64_t level);
  /// The highest per-section sum of floor and remainder: when every section's floor is a lower
  /// bound on the offsets of the buffers still to be placed there, no arena below this exists.
  std::int64_t section_bound() const { return sections_ == 0 ? 0 : nodes_[1].floor_plus_rem; }
  /// A lower bound on the final arena when no buffer still to be placed may start below
  /// `offset_level`: per section, max(floor, offset_level) + remainder.
  std::int64_t bound(std::int64_t offset_level) const;

  /// A point to come back to with `undo_to`.
  std::size_t mark() const { return log_.size(); }
  /// Restores the state as it was at `mark`.
  void undo_to(std::size_t mark);

 private:
  struct Node {
    std::int64_t floor = 0;           ///< max floor below
    std::int64_t remainder = 0;       ///< max remainder below
    std::int64_t floor_plus_rem = 0;  ///< max of floor + remainder below
    std::int64_t low = 0;             ///< min floor of the active sections below (max: none)
    std::int64_t pending_level = 0;   ///< lazy: children's floors become this ...
    std::int64_t pending_delta = 0;   ///< ... and their remainders change by this
    bool pending = false;
  };

  void build(std::size_t node, std::uint32_t lo, std::uint32_t hi,
             const std::vector<std::int64_t>& remainder);
  void write(std::size_t node, const Node& value);
  void apply(std::size_t node, std::int64_t level, std::int64_t delta);
  void push_down(std::size_t node);
  std::int64_t above(std::size_t node, std::int64_t level);
  std::int64_t query(std::size_t node, std::uint32_t lo, std::uint32_t hi, std::uint32_t first,
                     std::uint32_t last);
  void update(std::size_t node, std::uint32_t lo, std::uint32_t hi, std::uint32_t first,
              std::uint32_t last, std::int64_t level, std::int64_t delta);

  std::uint32_t sections_;
  std::vector<Node> nodes_;
  std::vector<std::pair<std::size_t, Node>> log_;  ///< (node, value before a write)
};

}  // namespace cistern::plan::detail
