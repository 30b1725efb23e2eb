// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The "recorded" row: what the recording allocator (PyTorch) itself did on the same work, from
// the segment events and counters the trace kept. No replay is involved.
#include <algorithm>

#include "replay/engine_detail.hpp"

namespace cistern::replay {
namespace detail {
namespace {

using Kind = trace::RecordedSegmentEvent::Kind;

/// Reserved bytes after each event. From the format's own samples where it kept them (Kineto),
/// else rebuilt from the segment events, each of which happens just before its `before_event`.
std::vector<std::uint64_t> recorded_reserved(const trace::Trace& trace) {
  const trace::Recorded& rec = trace.recorded;
  std::vector<std::uint64_t> after(trace.events.size());
  std::int64_t reserved = static_cast<std::int64_t>(rec.initial_reserved.value_or(0));
  if (!rec.reserved_samples.empty()) {
    std::size_t next = 0;
    for (std::size_t i = 0; i < after.size(); ++i) {
      while (next < rec.reserved_samples.size() && rec.reserved_samples[next].first <= i) {
        reserved = static_cast<std::int64_t>(rec.reserved_samples[next++].second);
      }
      after[i] = static_cast<std::uint64_t>(reserved);
    }
    return after;
  }
  std::size_t next = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    for (; next < rec.segment_events.size() && rec.segment_events[next].before_event <= i; ++next) {
      const trace::RecordedSegmentEvent& s = rec.segment_events[next];
      const auto size = static_cast<std::int64_t>(s.size);
      reserved += s.kind == Kind::alloc || s.kind == Kind::map ? size : -size;
    }
    after[i] = static_cast<std::uint64_t>(std::max<std::int64_t>(reserved, 0));
  }
  return after;
}

/// The physical handles PyTorch creates for a segment_map or segment_unmap of `bytes`: 20 MiB
/// pages in the large pool, 2 MiB in the small one (a range that is not a multiple of 20 MiB
/// can only be the small pool's).
double pytorch_handles(std::size_t bytes) noexcept {
  constexpr std::size_t kLarge = 20 * MiB;
  constexpr std::size_t kSmall = 2 * MiB;
  const std::size_t n = bytes % kLarge == 0 ? bytes / kLarge : (bytes + kSmall - 1) / kSmall;
  return static_cast<double>(std::max<std::size_t>(n, 1));
}

/// Counts and prices the recorded segment events as the engine prices a policy's device calls.
/// An expandable segment's segment_map is priced as PyTorch makes it - per handle a creation, a
/// cuMemMap and the access grant's share (one cuMemSetAccess over the range costs per mapping it
/// covers) - and its segment_unmap as per handle an unmap and a release. The handles of a range
/// are of one size, so their parts per MiB add up to the range's.
void count_device_calls(const trace::Trace& trace, const CostModel& costs, Result& r) {
  double ns = 0;
  for (const trace::RecordedSegmentEvent& s : trace.recorded.segment_events) {
    const double mib = static_cast<double>(s.size) / static_cast<double>(MiB);
    switch (s.kind) {
      case Kind::alloc:
        ++r.device_allocs;
        ns += costs.alloc_price(s.size);
        break;
      case Kind::free:
        ++r.device_frees;
        ns += costs.free_price(s.size);
        break;
      case Kind::map:
        ++r.device_maps;
        ns += pytorch_handles(s.size) * (costs.create_ns + costs.map_ns + costs.access_ns) +
              (costs.create_ns_per_mib + costs.access_ns_per_mib) * mib;
        break;
      case Kind::unmap:
        ++r.device_unmaps;
        ns += pytorch_handles(s.size) * (costs.unmap_ns + costs.release_ns) +
              (costs.unmap_ns_per_mib + costs.release_ns_per_mib) * mib;
        break;
    }
  }
  r.device_ms = ns / 1e6;
}

/// The first event after which the series holds its maximum (kAtStart if it never rises).
std::size_t first_peak(const std::vector<std::uint64_t>& series, std::uint64_t at_start) {
  std::size_t peak = kAtStart;
  std::uint64_t best = at_start;
  for (std::size_t i = 0; i < series.size(); ++i) {
    if (series[i] > best) {
      best = series[i];
      peak = i;
    }
  }
  return peak;
}

}  // namespace

std::optional<Result> recorded_plan(const trace::Trace& trace, const Plan& plan,
                                    const Options& options) {
  const trace::Recorded& rec = trace.recorded;
  if (!rec.peak_reserved.has_value()) return std::nullopt;
  Result r = result_header(trace, plan, "recorded", to_string(Start::warm));
  r.peak_reserved = *rec.peak_reserved;
  if (r.peak_live > 0) {
    r.overhead = static_cast<double>(*rec.peak_reserved) / static_cast<double>(r.peak_live) - 1.0;
  }
  count_device_calls(trace, options.costs, r);
  if (options.timeline_points > 0 && plan.error.empty()) {
    const std::vector<std::uint64_t> reserved = recorded_reserved(trace);
    const std::size_t peak = first_peak(reserved, rec.initial_reserved.value_or(0));
    r.timeline = sample_timeline(trace, plan, reserved, options.timeline_points, peak);
  }
  return r;
}

}  // namespace detail

std::optional<Result> recorded(const trace::Trace& trace, const Options& options) {
  if (!trace.recorded.peak_reserved.has_value()) return std::nullopt;
  return detail::recorded_plan(trace, detail::compile(trace), options);
}

}  // namespace cistern::replay
