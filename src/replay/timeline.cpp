// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Downsampling a replay's memory timeline for the report.
#include <algorithm>

#include "replay/engine_detail.hpp"

namespace cistern::replay::detail {
namespace {

/// `points` indices spread evenly over [0, events), first and last included.
std::vector<std::size_t> even_indices(std::size_t events, std::size_t points) {
  std::vector<std::size_t> picked;
  if (events <= points) {
    for (std::size_t i = 0; i < events; ++i) picked.push_back(i);
    return picked;
  }
  if (points == 1) return {events - 1};
  picked.reserve(points + 2);
  const std::uint64_t span = events - 1;
  for (std::uint64_t k = 0; k < points; ++k) {
    picked.push_back(static_cast<std::size_t>(k * span / (points - 1)));
  }
  return picked;
}

}  // namespace

std::vector<TimelinePoint> sample_timeline(const trace::Trace& trace, const Plan& plan,
                                           const std::vector<std::uint64_t>& reserved_after,
                                           std::size_t points, std::size_t peak_reserved_event) {
  const std::size_t events = std::min(reserved_after.size(), plan.live_after.size());
  if (points == 0 || events == 0) return {};
  std::vector<std::size_t> picked = even_indices(events, points);
  // The peaks are what the report is read for: an even spacing alone would often step over them.
  for (std::size_t peak : {plan.peak_live_event, peak_reserved_event}) {
    if (peak != kAtStart && peak < events) picked.push_back(peak);
  }
  std::sort(picked.begin(), picked.end());
  picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
  std::vector<TimelinePoint> timeline;
  timeline.reserve(picked.size());
  for (std::size_t i : picked) {
    timeline.push_back({i, trace.events[i].time, plan.live_after[i], reserved_after[i]});
  }
  return timeline;
}

}  // namespace cistern::replay::detail
