// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "trace/address_lifetimes.hpp"

#include <algorithm>
#include <iterator>
#include <limits>
#include <numeric>
#include <vector>

namespace cistern::trace::detail {

// Provisional ids: allocation k (in event order) is k; live_before[j] (in discovery order) is
// j | live_before_flag. Final ids are only known once every live-before block has been found.

namespace {

/// The end of [addr, addr + size), saturated at the top of the address space.
std::uint64_t end_of(std::uint64_t addr, std::uint64_t size) {
  return size > std::numeric_limits<std::uint64_t>::max() - addr
             ? std::numeric_limits<std::uint64_t>::max()
             : addr + size;
}

}  // namespace

std::optional<std::pair<std::uint64_t, std::uint64_t>> AddressLifetimes::overlapping(
    std::uint64_t addr, std::uint64_t size) const {
  const std::uint64_t end = end_of(addr, size);
  auto next = spans_.upper_bound(addr);  // the first live span starting after addr
  if (next != spans_.end() && next->first < end) return *next;
  if (next != spans_.begin() && std::prev(next)->second > addr) return *std::prev(next);
  return std::nullopt;
}

std::optional<std::uint64_t> AddressLifetimes::live_at(std::uint64_t addr) const {
  const auto found = live_.find(addr);
  if (found == live_.end()) return std::nullopt;
  return found->second;
}

void AddressLifetimes::note_stack(std::vector<std::uint32_t>& stacks, std::uint64_t index,
                                  std::uint32_t stack) {
  if (stack == 0) return;
  any_stack_ = true;
  if (stacks.size() <= index) stacks.resize(index + 1);
  stacks[index] = stack;
}

void AddressLifetimes::alloc(std::uint64_t addr, std::uint64_t size, std::uint32_t stream,
                             std::int64_t time, std::uint32_t stack) {
  note_stack(alloc_stacks_, allocations_, stack);
  const std::uint64_t id = allocations_++;
  live_[addr] = id;
  spans_[addr] = end_of(addr, size);
  freed_.erase(addr);
  size_[id] = size;
  trace_.events.push_back(Event{Op::alloc, stream, id, size, addr, time});
}

AddressLifetimes::Freed AddressLifetimes::free(std::uint64_t addr, std::uint64_t size,
                                               std::uint32_t stream, std::int64_t time,
                                               std::uint32_t stack) {
  Freed freed;
  freed_.insert(addr);
  const auto found = live_.find(addr);
  if (found == live_.end()) {
    freed.id = trace_.live_before.size() | live_before_flag;
    freed.size = size;
    freed.before = true;
    note_stack(before_stacks_, trace_.live_before.size(), stack);
    trace_.live_before.push_back(LiveBlock{freed.id, size, addr, stream});
  } else {
    freed.id = found->second;
    const auto sized = size_.find(freed.id);
    freed.size = sized->second;
    size_.erase(sized);
    live_.erase(found);
    spans_.erase(addr);
  }
  trace_.events.push_back(Event{Op::free, stream, freed.id, freed.size, addr, time});
  return freed;
}

void AddressLifetimes::live_throughout(std::uint64_t addr, std::uint64_t size, std::uint32_t stream,
                                       std::uint32_t stack) {
  spans_[addr] = end_of(addr, size);
  note_stack(before_stacks_, trace_.live_before.size(), stack);
  trace_.live_before.push_back(
      LiveBlock{trace_.live_before.size() | live_before_flag, size, addr, stream});
}

void AddressLifetimes::finish() {
  std::vector<LiveBlock>& blocks = trace_.live_before;
  std::vector<std::uint64_t> order(blocks.size());
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
    return blocks[a].addr < blocks[b].addr;
  });
  std::vector<std::uint64_t> rank(blocks.size());
  for (std::size_t r = 0; r < order.size(); ++r) rank[order[r]] = r;

  const std::uint64_t count = blocks.size();
  const auto final_id = [&](std::uint64_t id) {
    return (id & live_before_flag) != 0 ? rank[id & ~live_before_flag] : count + id;
  };
  std::vector<LiveBlock> sorted;
  sorted.reserve(blocks.size());
  for (const std::uint64_t j : order) {
    sorted.push_back(blocks[j]);
    sorted.back().id = final_id(blocks[j].id);
  }
  blocks = std::move(sorted);
  for (Event& event : trace_.events) {
    if (event.op == Op::alloc || event.op == Op::free) event.id = final_id(event.id);
  }
  for (RecordedFreeCompletion& completion : trace_.recorded.deferred_frees) {
    completion.id = final_id(completion.id);
  }
  finish_stacks(count, rank);
}

void AddressLifetimes::finish_stacks(std::uint64_t live_before_count,
                                     const std::vector<std::uint64_t>& rank) {
  if (!any_stack_) return;
  std::vector<std::uint32_t>& stacks = trace_.alloc_stacks;
  stacks.assign(live_before_count + allocations_, 0);
  for (std::size_t j = 0; j < before_stacks_.size() && j < rank.size(); ++j) {
    stacks[rank[j]] = before_stacks_[j];
  }
  for (std::size_t k = 0; k < alloc_stacks_.size(); ++k) {
    stacks[live_before_count + k] = alloc_stacks_[k];
  }
  alloc_stacks_ = {};
  before_stacks_ = {};
}

}  // namespace cistern::trace::detail
