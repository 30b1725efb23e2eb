// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Normalising a planning problem (see problem.hpp).
#include "plan/problem.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "cistern/errors.hpp"

namespace cistern::plan::detail {
namespace {

/// Sizes stay below 2^62 each and their sum below 2^63, so arenas and bounds never overflow.
constexpr std::uint64_t kMaxTotal = std::uint64_t{1} << 62;

void validate(const std::vector<Buffer>& buffers, std::uint64_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw InvalidArgument(fmt::format("plan: alignment {} is not a power of two", alignment));
  }
  if (buffers.size() >= std::numeric_limits<std::uint32_t>::max() / 2) {
    throw InvalidArgument(fmt::format("plan: {} buffers are too many", buffers.size()));
  }
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    if (b.upper <= b.lower) {
      throw InvalidArgument(
          fmt::format("plan: buffer {}: lifetime [{}, {}) is empty (upper must be after lower)", i,
                      b.lower, b.upper));
    }
    if (b.size == 0) throw InvalidArgument(fmt::format("plan: buffer {}: size 0", i));
    if (b.size > kMaxTotal - total) {
      throw InvalidArgument(
          fmt::format("plan: buffer {}: the sizes add up to more than 2^62 bytes", i));
    }
    total += b.size;
  }
}

std::uint64_t aligned(std::uint64_t size, std::uint64_t alignment) {
  return (size + alignment - 1) & ~(alignment - 1);
}

}  // namespace

Problem normalise(const std::vector<Buffer>& buffers, std::uint64_t alignment) {
  validate(buffers, alignment);
  std::vector<std::uint64_t> points;
  points.reserve(2 * buffers.size());
  for (const Buffer& b : buffers) {
    points.push_back(b.lower);
    points.push_back(b.upper);
  }
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  const auto rank = [&](std::uint64_t t) {
    return static_cast<std::uint32_t>(std::lower_bound(points.begin(), points.end(), t) -
                                      points.begin());
  };
  Problem problem;
  problem.sections = points.empty() ? 0 : static_cast<std::uint32_t>(points.size() - 1);
  problem.items.reserve(buffers.size());
  for (const Buffer& b : buffers) {
    problem.items.push_back(Item{rank(b.lower), rank(b.upper), aligned(b.size, alignment)});
  }
  return problem;
}

std::vector<std::int64_t> section_sums(const Problem& problem) {
  // Difference array over sections: +size where an item starts, -size where it ends.
  std::vector<std::int64_t> delta(std::size_t{problem.sections} + 1, 0);
  for (const Item& item : problem.items) {
    delta[item.first] += static_cast<std::int64_t>(item.size);
    delta[item.last] -= static_cast<std::int64_t>(item.size);
  }
  std::vector<std::int64_t> sums(problem.sections, 0);
  std::int64_t live = 0;
  for (std::uint32_t s = 0; s < problem.sections; ++s) {
    live += delta[s];
    sums[s] = live;
  }
  return sums;
}

std::uint64_t peak_live(const Problem& problem) {
  const std::vector<std::int64_t> sums = section_sums(problem);
  const auto peak = std::max_element(sums.begin(), sums.end());
  return peak == sums.end() ? 0 : static_cast<std::uint64_t>(*peak);
}

std::uint64_t arena_of(const Problem& problem, const std::vector<std::uint64_t>& offsets) {
  std::uint64_t arena = 0;
  for (std::size_t i = 0; i < problem.items.size(); ++i) {
    arena = std::max(arena, offsets[i] + problem.items[i].size);
  }
  return arena;
}

}  // namespace cistern::plan::detail
