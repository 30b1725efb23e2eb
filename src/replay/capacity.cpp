// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The capacity search: the smallest device, to 2 MiB, on which a trace runs with no
// out-of-memory.
//
// Bounds: nothing below the trace's peak_live can work, so the search starts there (rounded up
// to 2 MiB). One replay on an unlimited device gives an upper bound: the allocator's peak reserved
// bytes, or the device's peak use in whole granules if that is more. A device of that size lets
// every device call of the unlimited run succeed, so the same run happens; should it fail anyway
// (an allocator whose choices depend on the capacity itself), the bound doubles until a run
// fits. Then bisection, on multiples of 2 MiB. Each probe stops at its first out-of-memory: that
// alone decides it, and failing probes are the cheap half.
#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "cistern/errors.hpp"
#include "replay/engine_detail.hpp"
#include "replay/replayer.hpp"

namespace cistern::replay {
namespace detail {
namespace {

constexpr std::uint64_t kStep = 2 * MiB;
/// "Unlimited": the simulated device's whole address space (16 TiB).
constexpr std::uint64_t kUnlimited = std::uint64_t{1} << 44;

std::uint64_t round_up(std::uint64_t bytes) { return (bytes + kStep - 1) / kStep * kStep; }

/// Runs probes and remembers their outcomes.
class Prober {
 public:
  Prober(const trace::Trace& trace, const Plan& plan, const Policy& policy, const Options& options)
      : trace_(trace), plan_(plan), policy_(policy), options_(options) {}

  /// Whether the trace runs at `capacity` with no out-of-memory.
  bool fits(std::uint64_t capacity) {
    Replayer replayer(trace_, plan_, policy_, options_, capacity);
    const bool fit = run(replayer);
    outcomes_.emplace_back(capacity, fit);
    return fit;
  }

  /// The unlimited run; returns the upper bound it gives (see the file comment).
  std::uint64_t unlimited_bound() {
    Replayer replayer(trace_, plan_, policy_, options_, kUnlimited);
    if (!run(replayer)) {
      throw Error(fmt::format(
          "min_capacity: the trace runs out of memory under policy '{}' even "
          "on a {} device (a configured memory limit?)",
          policy_.label.empty() ? policy_.name : policy_.label, format_bytes(kUnlimited)));
    }
    return round_up(
        std::max<std::uint64_t>(replayer.measures().peak_reserved, replayer.device_peak_used()));
  }

  std::size_t probes() const noexcept { return outcomes_.size() + 1; }  // + the unlimited run

  /// A sentence if some capacity failed above one that fitted, else "".
  std::string contradiction() const {
    for (const auto& [failed, fit] : outcomes_) {
      if (fit) continue;
      for (const auto& [other, other_fit] : outcomes_) {
        if (other_fit && other < failed) {
          return fmt::format(
              "out of memory at {} bytes but none at {} bytes: more capacity made "
              "this policy fail here, so the search assumed wrongly that it never "
              "does; min_capacity is the bisection's answer",
              failed, other);
        }
      }
    }
    return "";
  }

 private:
  /// Every pass (Options::repeat), stopping at the first out-of-memory.
  bool run(Replayer& replayer) {
    replayer.start(true);
    for (std::size_t pass = 0; pass < options_.repeat && replayer.measures().ooms == 0; ++pass) {
      if (pass > 0) replayer.end_pass(true);
      if (replayer.measures().ooms == 0) replayer.replay(plan_.steps.size(), true, nullptr);
    }
    return replayer.measures().ooms == 0;
  }

  const trace::Trace& trace_;
  const Plan& plan_;
  const Policy& policy_;
  const Options& options_;
  std::vector<std::pair<std::uint64_t, bool>> outcomes_;
};

}  // namespace

CapacitySearch search_plan(const trace::Trace& trace, const Plan& plan, const Policy& policy,
                           const Options& options) {
  require_start(policy, options.start);
  if (!plan.error.empty()) throw Error("min_capacity: " + plan.error);
  Prober prober(trace, plan, policy, options);
  std::uint64_t low = std::max(round_up(plan.peak_live), kStep);
  std::uint64_t high = std::max(prober.unlimited_bound(), low);
  std::string note;
  if (!prober.fits(high)) {
    note = fmt::format(
        "a {}-byte device, enough for every device call of the unlimited run, ran "
        "out of memory: this policy's choices depend on the capacity itself; ",
        high);
    do {
      high *= 2;
      if (high > kUnlimited) throw Error("min_capacity: " + note + "no smaller device fits");
    } while (!prober.fits(high));
  }
  // Invariant: `high` fits; every capacity below `low` has failed or cannot work.
  while (low < high) {
    const std::uint64_t mid = low + (high - low) / kStep / 2 * kStep;
    if (prober.fits(mid)) {
      high = mid;
    } else {
      low = mid + kStep;
    }
  }
  note += prober.contradiction();
  return {high, prober.probes(), note};
}

}  // namespace detail

CapacitySearch search_min_capacity(const trace::Trace& trace, const Policy& policy,
                                   const Options& options) {
  detail::require_start(policy, options.start);
  const detail::Plan plan = detail::compile(trace);
  return detail::search_plan(trace, plan, policy, options);
}

std::uint64_t min_capacity(const trace::Trace& trace, const Policy& policy,
                           const Options& options) {
  return search_min_capacity(trace, policy, options).capacity;
}

}  // namespace cistern::replay
