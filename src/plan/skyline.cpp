// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The search's segment tree over time sections (see skyline.hpp).
#include "plan/skyline.hpp"

#include <algorithm>
#include <limits>

namespace cistern::plan::detail {
namespace {

constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();

}  // namespace

Skyline::Skyline(const std::vector<std::int64_t>& remainder)
    : sections_(static_cast<std::uint32_t>(remainder.size())) {
  nodes_.resize(4 * std::max<std::size_t>(remainder.size(), 1));
  if (sections_ > 0) build(1, 0, sections_, remainder);
}

void Skyline::build(std::size_t node, std::uint32_t lo, std::uint32_t hi,
                    const std::vector<std::int64_t>& remainder) {
  if (hi - lo == 1) {
    nodes_[node].remainder = remainder[lo];
    nodes_[node].floor_plus_rem = remainder[lo];
    nodes_[node].low = remainder[lo] > 0 ? 0 : kNone;
    return;
  }
  const std::uint32_t mid = lo + (hi - lo) / 2;
  build(2 * node, lo, mid, remainder);
  build(2 * node + 1, mid, hi, remainder);
  nodes_[node].remainder = std::max(nodes_[2 * node].remainder, nodes_[2 * node + 1].remainder);
  nodes_[node].floor_plus_rem =
      std::max(nodes_[2 * node].floor_plus_rem, nodes_[2 * node + 1].floor_plus_rem);
  nodes_[node].low = std::min(nodes_[2 * node].low, nodes_[2 * node + 1].low);
}

void Skyline::write(std::size_t node, const Node& value) {
  log_.emplace_back(node, nodes_[node]);
  nodes_[node] = value;
}

void Skyline::apply(std::size_t node, std::int64_t level, std::int64_t delta) {
  Node n = nodes_[node];
  n.floor = level;
  n.remainder += delta;
  n.floor_plus_rem = level + n.remainder;
  // Every floor below is now `level`; some section is active if the largest remainder is.
  n.low = n.remainder > 0 ? level : kNone;
  // Composes with an earlier pending update: the later level wins, the deltas add up.
  n.pending_level = level;
  n.pending_delta = (n.pending ? n.pending_delta : 0) + delta;
  n.pending = true;
  write(node, n);
}

void Skyline::push_down(std::size_t node) {
  const Node& n = nodes_[node];
  if (!n.pending) return;
  const std::int64_t level = n.pending_level;
  const std::int64_t delta = n.pending_delta;
  apply(2 * node, level, delta);
  apply(2 * node + 1, level, delta);
  Node cleared = nodes_[node];
  cleared.pending = false;
  cleared.pending_delta = 0;
  write(node, cleared);
}

std::int64_t Skyline::query(std::size_t node, std::uint32_t lo, std::uint32_t hi,
                            std::uint32_t first, std::uint32_t last) {
  if (first <= lo && hi <= last) return nodes_[node].floor;
  // A pending update covers the whole node: its level is every section's floor below.
  if (nodes_[node].pending) return nodes_[node].pending_level;
  const std::uint32_t mid = lo + (hi - lo) / 2;
  std::int64_t best = 0;
  if (first < mid) best = query(2 * node, lo, mid, first, last);
  if (last > mid) best = std::max(best, query(2 * node + 1, mid, hi, first, last));
  return best;
}

void Skyline::update(std::size_t node, std::uint32_t lo, std::uint32_t hi, std::uint32_t first,
                     std::uint32_t last, std::int64_t level, std::int64_t delta) {
  if (first <= lo && hi <= last) {
    apply(node, level, delta);
    return;
  }
  push_down(node);
  const std::uint32_t mid = lo + (hi - lo) / 2;
  if (first < mid) update(2 * node, lo, mid, first, last, level, delta);
  if (last > mid) update(2 * node + 1, mid, hi, first, last, level, delta);
  Node n = nodes_[node];
  const Node& l = nodes_[2 * node];
  const Node& r = nodes_[2 * node + 1];
  n.floor = std::max(l.floor, r.floor);
  n.remainder = std::max(l.remainder, r.remainder);
  n.floor_plus_rem = std::max(l.floor_plus_rem, r.floor_plus_rem);
  n.low = std::min(l.low, r.low);
  write(node, n);
}

std::int64_t Skyline::max_floor(std::uint32_t first, std::uint32_t last) {
  return query(1, 0, sections_, first, last);
}

void Skyline::place(std::uint32_t first, std::uint32_t last, std::int64_t level,
                    std::int64_t size) {
  update(1, 0, sections_, first, last, level, -size);
}

std::pair<std::uint32_t, std::int64_t> Skyline::lowest_active() {
  if (sections_ == 0 || nodes_[1].low == kNone) return {sections_, kNone};
  const std::int64_t low = nodes_[1].low;
  std::size_t node = 1;
  std::uint32_t lo = 0;
  std::uint32_t hi = sections_;
  while (hi - lo > 1) {
    push_down(node);
    const std::uint32_t mid = lo + (hi - lo) / 2;
    if (nodes_[2 * node].low == low) {
      node = 2 * node;
      hi = mid;
    } else {
      node = 2 * node + 1;
      lo = mid;
    }
  }
  return {lo, low};
}

std::int64_t Skyline::above(std::size_t node, std::int64_t level) {
  const Node& n = nodes_[node];
  if (n.low == kNone || n.floor <= level) return kNone;  // nothing active above `level` here
  if (n.low > level) return n.low;
  push_down(node);
  return std::min(above(2 * node, level), above(2 * node + 1, level));
}

std::int64_t Skyline::lowest_active_above(std::int64_t level) {
  return sections_ == 0 ? kNone : above(1, level);
}

std::int64_t Skyline::bound(std::int64_t offset_level) const {
  if (sections_ == 0) return 0;
  const Node& root = nodes_[1];
  return std::max(root.floor_plus_rem, offset_level + root.remainder);
}

void Skyline::undo_to(std::size_t mark) {
  while (log_.size() > mark) {
    nodes_[log_.back().first] = log_.back().second;
    log_.pop_back();
  }
}

}  // namespace cistern::plan::detail
