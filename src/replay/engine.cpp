// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The replay engine: one replay of a trace under a policy, and what it reports.
#include "replay/engine.hpp"

#include <fmt/format.h>

#include <exception>

#include "cistern/errors.hpp"
#include "replay/engine_detail.hpp"
#include "replay/replayer.hpp"

namespace cistern::replay {

const char* to_string(Start start) noexcept {
  switch (start) {
    case Start::cold: return "cold";
    case Start::warm: return "warm";
  }
  return "?";
}

namespace detail {
namespace {

std::optional<double> overhead(std::uint64_t reserved, std::uint64_t live) {
  if (live == 0) return std::nullopt;
  return static_cast<double>(reserved) / static_cast<double>(live) - 1.0;
}

/// Copies what a finished replay measured into its row.
void fill(Result& r, const Replayer& replayer) {
  const Measures& m = replayer.measures();
  const DeviceCalls& calls = replayer.device_calls();
  r.peak_reserved = m.peak_reserved;
  r.overhead = overhead(m.peak_reserved, r.peak_live);
  r.ooms = m.ooms;
  r.note = replayer.start_note();
  set_device_calls(r, calls);
  if (m.allocator_calls > 0) r.ns_per_op = m.loop_ns / static_cast<double>(m.allocator_calls);
}

/// The allocator's segments when its reserved bytes first reach their peak: a second replay that
/// stops at that event (replays are deterministic).
/// With several passes, the first pass's peak.
Snapshot snapshot_at_peak(const trace::Trace& trace, const Plan& plan, const Policy& policy,
                          const Options& options, const Measures& first, std::uint64_t peak,
                          std::string& note) {
  Replayer again(trace, plan, policy, options, options.capacity);
  again.start(false);
  if (first.peak_reserved_event != kAtStart) {
    again.replay(first.peak_reserved_event + 1, false, nullptr);
  }
  if (again.allocator().reserved_bytes() != peak) {
    note += fmt::format(
        "{}the segment map holds {} reserved bytes, not the peak's {}: the replay "
        "was not deterministic",
        note.empty() ? "" : "; ", again.allocator().reserved_bytes(), peak);
  }
  return again.allocator().snapshot();
}

std::uint64_t all_calls(const DeviceCalls& c) {
  return c.allocs + c.frees + c.reserves + c.unreserves + c.creates + c.releases + c.maps +
         c.unmaps + c.events + c.syncs;
}

/// What the pass that just ended did: the calls since `before`, and with the planned policy its
/// requests since the step began (`plan_before`) up to `plan_now`.
PassResult pass_result(const Replayer& replayer, const DeviceCalls& before, std::uint64_t peak,
                       const plan::PlannedCounters& plan_before,
                       const plan::PlannedCounters& plan_now) {
  const DeviceCalls& now = replayer.device_calls();
  PassResult pass;
  pass.peak_reserved = peak;
  pass.device_allocs = now.allocs - before.allocs;
  pass.device_frees = now.frees - before.frees;
  pass.maps = now.maps - before.maps;
  pass.unmaps = now.unmaps - before.unmaps;
  pass.device_calls = all_calls(now) - all_calls(before);
  pass.device_ms = (now.ns - before.ns) / 1e6;
  if (replayer.learning() != nullptr) {
    pass.planned = true;
    pass.recorded = plan_now.recorded - plan_before.recorded;
    pass.plan_hits = plan_now.hits - plan_before.hits;
    pass.idle_fits = plan_now.idle_fits - plan_before.idle_fits;
    pass.fallbacks = plan_now.fallbacks - plan_before.fallbacks;
  }
  return pass;
}

/// The planned policy's counters now (zero for other policies).
plan::PlannedCounters plan_counters(const Replayer& replayer) {
  return replayer.learning() != nullptr ? replayer.learning()->counters() : plan::PlannedCounters{};
}

/// The replay proper; throws on a trace the allocator rejects.
void replay_into(Result& r, const trace::Trace& trace, const Plan& plan, const Policy& policy,
                 const Options& options) {
  Replayer replayer(trace, plan, policy, options, options.capacity);
  DeviceCalls before;  // the first pass includes the start
  replayer.start(false);
  std::vector<std::uint64_t> reserved_after;
  if (options.timeline_points > 0) reserved_after.resize(plan.steps.size());
  replayer.replay(plan.steps.size(), false,
                  options.timeline_points > 0 ? &reserved_after : nullptr);
  plan::PlannedCounters plan_before;  // the planned policy's, when the pass's step began
  for (std::size_t pass = 1; pass < options.repeat; ++pass) {
    // A pass's own clean-up (the frees and re-allocations of end_pass) belongs to it; with the
    // planned policy, the re-allocations are the next step's first requests.
    const std::uint64_t peak = replayer.measures().pass_peak_reserved;
    replayer.end_pass(false);
    r.passes.push_back(
        pass_result(replayer, before, peak, plan_before, replayer.plan_counters_at_pass_start()));
    plan_before = replayer.plan_counters_at_pass_start();
    before = replayer.device_calls();
    replayer.replay(plan.steps.size(), false, nullptr);
  }
  if (options.repeat > 1) {
    r.passes.push_back(pass_result(replayer, before, replayer.measures().pass_peak_reserved,
                                   plan_before, plan_counters(replayer)));
  }
  fill(r, replayer);
  const Measures& m = replayer.measures();
  if (options.timeline_points > 0) {
    r.timeline = sample_timeline(trace, plan, reserved_after, options.timeline_points,
                                 m.peak_reserved_event);
  }
  if (options.segment_map_at_peak) {
    const std::uint64_t peak = r.passes.empty() ? m.peak_reserved : r.passes[0].peak_reserved;
    r.segment_map = snapshot_at_peak(trace, plan, policy, options, m, peak, r.note);
  }
}

}  // namespace

void set_device_calls(Result& row, const DeviceCalls& calls) {
  row.device_allocs = calls.allocs;
  row.device_frees = calls.frees;
  row.device_maps = calls.maps;
  row.device_unmaps = calls.unmaps;
  row.handle_creates = calls.creates;
  row.handle_releases = calls.releases;
  row.syncs = calls.syncs;
  row.device_ms = calls.ns / 1e6;
}

Result result_header(const trace::Trace& trace, const Plan& plan, const std::string& policy,
                     const std::string& start) {
  Result r;
  r.trace = trace.source;
  r.device = trace.device;
  r.policy = policy;
  r.start = start;
  r.events = trace.events.size();
  // Trace::peak_live's figure, computed while compiling (where it costs nothing extra); a trace
  // that does not compile has none.
  r.peak_live = plan.peak_live;
  return r;
}

void require_start(const Policy& policy, Start start) {
  if (start != Start::warm || policy.supports_warm_start()) return;
  std::string able;
  for (const char* name : {"cistern", "torch", "nocache"}) {
    if (!Policy::parse(name).supports_warm_start()) continue;
    able += able.empty() ? name : std::string(", ") + name;
  }
  throw InvalidArgument(fmt::format(
      "replay: policy '{}' cannot start warm; policies that can: {} (use a cold start for '{}')",
      policy.label.empty() ? policy.name : policy.label, able, policy.name));
}

Result run_plan(const trace::Trace& trace, const Plan& plan, const Policy& policy,
                const Options& options) {
  require_start(policy, options.start);
  Result r = result_header(trace, plan, policy.label.empty() ? policy.name : policy.label,
                           to_string(options.start));
  r.capacity = options.capacity;
  if (!plan.error.empty()) {
    r.error = plan.error;
    return r;
  }
  try {
    r.settings = policy.settings_for(trace);
    replay_into(r, trace, plan, policy, options);
  } catch (const std::exception& e) {
    // Figures of a replay that did not finish would mislead: keep only the row's identity.
    Result failed = result_header(trace, plan, r.policy, r.start);
    failed.capacity = r.capacity;
    failed.settings = r.settings;
    failed.error = e.what();
    return failed;
  }
  return r;
}

}  // namespace detail

Result run(const trace::Trace& trace, const Policy& policy, const Options& options) {
  detail::require_start(policy, options.start);
  const detail::Plan plan = detail::compile(trace);
  return detail::run_plan(trace, plan, policy, options);
}

}  // namespace cistern::replay
