// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "replay/advise.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "cistern/errors.hpp"
#include "replay/warm_start.hpp"

namespace cistern::replay {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
/// The large segment size: max_split_size_mb may not be below it.
constexpr std::uint64_t kMinSplitMiB = 20;
/// The largest key of a roundup_power2_divisions list (MB): the last interval starts there.
constexpr std::uint64_t kLastIntervalMiB = 32768;
constexpr unsigned kSingleDivisions[] = {2, 4, 8, 16};
constexpr const char* kGarbageCollection[] = {
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.99",
    "garbage_collection_threshold:0.8,per_process_memory_fraction:0.99"};

constexpr const char* kExpandable = "expandable_segments:True";

/// Options joined in PYTORCH_ALLOC_CONF syntax, unset ("") ones left out.
std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& part : parts) {
    if (part.empty()) continue;
    out += (out.empty() ? "" : ",") + part;
  }
  return out;
}

/// Every request size of the trace, the blocks live before the window included.
std::vector<std::uint64_t> request_sizes(const trace::Trace& trace) {
  std::vector<std::uint64_t> sizes;
  sizes.reserve(trace.live_before.size() + trace.events.size() / 2);
  for (const trace::LiveBlock& block : trace.live_before) sizes.push_back(block.size);
  for (const trace::Event& e : trace.events) {
    if (e.op == trace::Op::alloc) sizes.push_back(e.size);
  }
  return sizes;
}

/// Best first: smallest min_capacity, then least device time, then the shortest string.
bool better(const AdviceCandidate& a, const AdviceCandidate& b) {
  if (a.min_capacity != b.min_capacity) return a.min_capacity < b.min_capacity;
  if (a.device_ms != b.device_ms) return a.device_ms < b.device_ms;
  if (a.config.size() != b.config.size()) return a.config.size() < b.config.size();
  return a.config < b.config;
}

/// Whether `a` and `b` have the same figures: they share a rank.
bool same_figures(const AdviceCandidate& a, const AdviceCandidate& b) {
  return a.min_capacity == b.min_capacity && a.device_allocs == b.device_allocs &&
         a.device_maps == b.device_maps && a.device_ms == b.device_ms;
}

/// The configurations tried so far and the replays that try new ones. Progress counts replays
/// against a total fixed before the first (`most_replays`).
class Search {
 public:
  Search(const trace::Trace& trace, const AdviseOptions& options,
         const std::function<void(std::size_t, std::size_t)>& progress, std::size_t total)
      : trace_(trace), options_(options), progress_(progress), total_(total) {}

  /// Replays, in parallel, every configuration of `configs` not tried yet, for `label`'s
  /// allocator ("torch" or "cistern"): at most `most` of them, the share of the total this
  /// stage was given; what it leaves unused counts as done when it ends.
  void evaluate(const std::vector<std::string>& configs, std::size_t most,
                const std::string& label = "torch") {
    std::vector<Policy> policies;
    std::vector<std::string> names;
    for (const std::string& config : configs) {
      const std::string name = key(label, config);
      if (tried_.count(name) != 0 || std::find(names.begin(), names.end(), name) != names.end())
        continue;
      AdviceCandidate& candidate = tried_[name];
      candidate.config = config;
      try {
        std::string text = label;
        if (!config.empty()) text.append(":").append(config);
        policies.push_back(Policy::parse(text));
        policies.back().take_recorded = false;  // a key left out is PyTorch's default
        names.push_back(name);
      } catch (const Error& e) {
        candidate.error = e.what();
      }
    }
    // Never more than the stage's share (most_replays is a bound); if it were, the total
    // would grow rather than the bar pass 100%.
    total_ += policies.size() - std::min(policies.size(), most);
    if (!policies.empty()) replay_all(policies, names);
    done_ += std::max(most, policies.size());
    if (progress_) progress_(done_, total_);
  }

  /// A configuration tried before (an error row if it was never tried).
  AdviceCandidate get(const std::string& config, const std::string& label = "torch") const {
    const auto found = tried_.find(key(label, config));
    if (found != tried_.end()) return found->second;
    AdviceCandidate missing;
    missing.config = config;
    missing.error = "not tried";
    return missing;
  }

  /// The `keep` best of `configs` (each tried), best first.
  std::vector<std::string> best_of(const std::vector<std::string>& configs,
                                   std::size_t keep) const {
    std::vector<AdviceCandidate> ranked;
    for (const std::string& config : configs) {
      const AdviceCandidate candidate = get(config);
      if (candidate.error.empty()) ranked.push_back(candidate);
    }
    std::stable_sort(ranked.begin(), ranked.end(), better);
    std::vector<std::string> out;
    for (std::size_t i = 0; i < ranked.size() && i < keep; ++i) out.push_back(ranked[i].config);
    return out;
  }

  /// Every torch configuration replayed without error, best first, ranked.
  std::vector<AdviceCandidate> ranking() const {
    std::vector<AdviceCandidate> out;
    for (const auto& [name, candidate] : tried_) {
      if (name.rfind("torch|", 0) == 0 && candidate.error.empty()) out.push_back(candidate);
    }
    std::sort(out.begin(), out.end(), better);
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i].rank = i > 0 && same_figures(out[i - 1], out[i]) ? out[i - 1].rank : i + 1;
    return out;
  }

 private:
  /// Replays `policies` (named `names` in `tried_`) and records their figures.
  void replay_all(const std::vector<Policy>& policies, const std::vector<std::string>& names) {
    // run_all counts the trace's recorded row as a job too: progress counts the policies only.
    const std::vector<Result> rows =
        run_all({&trace_}, policies, options_.replay, true, options_.threads,
                [&](std::size_t done, std::size_t) {
                  if (progress_) progress_(done_ + std::min(done, policies.size()), total_);
                });
    std::size_t next = 0;
    for (const Result& row : rows) {
      if (row.policy == "recorded") continue;
      AdviceCandidate& candidate = tried_[names.at(next++)];
      candidate.min_capacity = row.min_capacity.value_or(0);
      candidate.device_allocs = row.device_allocs;
      candidate.device_maps = row.device_maps;
      candidate.device_ms = row.device_ms.value_or(0);
      candidate.error = row.error;
      if (candidate.error.empty() && !row.min_capacity) candidate.error = "no min_capacity found";
    }
  }

  static std::string key(const std::string& label, const std::string& config) {
    return label + "|" + config;
  }

  const trace::Trace& trace_;
  const AdviseOptions& options_;
  const std::function<void(std::size_t, std::size_t)>& progress_;
  std::map<std::string, AdviceCandidate> tried_;  ///< by "label|config"
  std::size_t done_ = 0;   ///< replays run, and the unused shares of stages that ended
  std::size_t total_ = 0;  ///< replays planned
};

/// Stage 1 (see advise.hpp) for one option: its values as configuration strings.
std::vector<std::string> split_configs(const trace::Trace& trace, std::size_t limit) {
  std::vector<std::string> out;
  for (const std::uint64_t mib : max_split_values(trace, limit))
    out.push_back(fmt::format("max_split_size_mb:{}", mib));
  return out;
}

std::vector<std::string> single_division_configs() {
  std::vector<std::string> out;
  for (const unsigned d : kSingleDivisions)
    out.push_back(fmt::format("roundup_power2_divisions:{}", d));
  return out;
}

std::vector<std::string> gc_configs() {
  return {std::begin(kGarbageCollection), std::end(kGarbageCollection)};
}

/// The single division value among `singles` that did best (4 when none could be replayed).
unsigned best_single_division(const Search& search, const std::vector<std::string>& singles) {
  const std::vector<std::string> best = search.best_of(singles, 1);
  if (best.empty()) return 4;
  return static_cast<unsigned>(std::stoul(best.front().substr(best.front().find(':') + 1)));
}

/// `values` with "" (the option unset) added: each option's "best values" may be to leave it.
std::vector<std::string> with_unset(std::vector<std::string> values) {
  values.insert(values.begin(), "");
  return values;
}

/// `values` without repeats, in their first order.
std::vector<std::string> distinct(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& value : values)
    if (std::find(out.begin(), out.end(), value) == out.end()) out.push_back(value);
  return out;
}

/// The most configurations of stage 3 that no earlier stage tried, for `splits`, `roundings`
/// and `gcs` values tried alone: the combinations of the 3 best splits, the 3 best roundings and
/// the best gc setting, each or unset, less those with at most one option set (tried alone),
/// and every rounding with expandable segments (alone, tried in stage 1).
std::size_t most_new_combinations(std::size_t splits, std::size_t roundings, std::size_t gcs) {
  const std::size_t s = std::min<std::size_t>(splits, 3), r = std::min<std::size_t>(roundings, 3),
                    g = std::min<std::size_t>(gcs, 1);
  return (s + 1) * (r + 1) * (g + 1) - (1 + s + r + g) + roundings;
}

}  // namespace

std::size_t most_replays(std::size_t stage1, std::size_t splits, std::size_t singles,
                         std::size_t gcs, std::size_t lists) {
  return stage1 + lists + most_new_combinations(splits, singles + lists, gcs) + 1;
}

std::vector<std::uint64_t> max_split_values(const trace::Trace& trace, std::size_t limit) {
  std::vector<std::uint64_t> mib;
  for (const std::uint64_t size : request_sizes(trace)) {
    if (size >= kMinSplitMiB * kMiB) mib.push_back((size + kMiB - 1) / kMiB);
  }
  std::sort(mib.begin(), mib.end());
  mib.erase(std::unique(mib.begin(), mib.end()), mib.end());
  if (mib.size() <= limit || limit == 0) return limit == 0 ? std::vector<std::uint64_t>{} : mib;
  std::vector<std::uint64_t> spread;
  for (std::size_t i = 0; i < limit; ++i) {
    const std::size_t index = limit == 1 ? mib.size() - 1 : i * (mib.size() - 1) / (limit - 1);
    if (spread.empty() || spread.back() != mib[index]) spread.push_back(mib[index]);
  }
  return spread;
}

std::vector<std::string> combine_options(const std::vector<std::string>& splits,
                                         const std::vector<std::string>& roundings,
                                         const std::vector<std::string>& gcs,
                                         const std::vector<std::string>& expandable_roundings) {
  std::vector<std::string> out;
  const auto add = [&out](const std::string& config) {
    if (std::find(out.begin(), out.end(), config) == out.end()) out.push_back(config);
  };
  for (const std::string& split : with_unset(splits))
    for (const std::string& rounding : with_unset(roundings))
      for (const std::string& gc : with_unset(gcs)) add(joined({split, rounding, gc}));
  for (const std::string& rounding : with_unset(expandable_roundings))
    add(joined({rounding, kExpandable}));
  return out;
}

std::vector<std::string> division_lists(const trace::Trace& trace, unsigned divisions) {
  std::vector<std::uint64_t> sizes = request_sizes(trace);
  if (sizes.empty() || divisions <= 1) return {};
  std::sort(sizes.begin(), sizes.end());
  long double total = 0;
  for (const std::uint64_t size : sizes) total += static_cast<long double>(size);
  long double seen = 0;
  std::uint64_t median = sizes.back();
  for (const std::uint64_t size : sizes) {
    seen += static_cast<long double>(size);
    if (seen * 2 >= total) {
      median = size;
      break;
    }
  }
  std::uint64_t key = 1;
  while (key * 2 * kMiB <= median && key * 2 <= kLastIntervalMiB) key *= 2;
  std::vector<std::string> out;
  for (const std::uint64_t k : {key, key * 2}) {
    if (k > kLastIntervalMiB) continue;
    out.push_back(fmt::format("roundup_power2_divisions:[{}:1,>:{}]", k, divisions));
    out.push_back(fmt::format("roundup_power2_divisions:[{}:{},>:1]", k, divisions));
  }
  return out;
}

Advice advise(const trace::Trace& trace, const AdviseOptions& options,
              const std::function<void(std::size_t, std::size_t)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  const std::string baseline = recorded_config(trace).to_string();

  // Stage 1: each option alone, the defaults and the trace's own settings.
  const std::vector<std::string> splits = split_configs(trace, options.split_values);
  const std::vector<std::string> singles = single_division_configs();
  const std::vector<std::string> gcs = gc_configs();
  const std::vector<std::string> expandables{kExpandable};
  std::vector<std::string> stage1{"", baseline};
  for (const auto* group : {&splits, &singles, &gcs, &expandables})
    stage1.insert(stage1.end(), group->begin(), group->end());
  stage1 = distinct(stage1);
  // Stage 2 tries as many lists whatever the best single value (above 1) turns out to be.
  const std::size_t list_count = division_lists(trace, kSingleDivisions[0]).size();
  Search search(trace, options, progress,
                most_replays(stage1.size(), splits.size(), singles.size(), gcs.size(), list_count));
  search.evaluate(stage1, stage1.size());
  if (!search.get("").error.empty()) {
    throw Error(fmt::format("advise: {} cannot be replayed on the torch emulation: {}",
                            trace.source, search.get("").error));
  }

  // Stage 2: per-size lists around the byte-weighted median, with the best single value.
  const std::vector<std::string> lists =
      division_lists(trace, best_single_division(search, singles));
  search.evaluate(lists, list_count);

  // Stage 3: combinations of each option's best values, and expandable segments with every
  // rounding (their blocks are cut to the rounded sizes, so the best rounding may differ).
  std::vector<std::string> roundings = singles;
  roundings.insert(roundings.end(), lists.begin(), lists.end());
  search.evaluate(combine_options(search.best_of(splits, 3), search.best_of(roundings, 3),
                                  search.best_of(gcs, 1), roundings),
                  most_new_combinations(splits.size(), roundings.size(), gcs.size()));
  search.evaluate({""}, 1, "cistern");

  Advice advice;
  advice.trace = trace.source;
  advice.device = trace.device;
  advice.baseline = search.get(baseline);
  advice.defaults = search.get("");
  advice.candidates = search.ranking();
  advice.cistern = search.get("", "cistern");
  advice.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return advice;
}

}  // namespace cistern::replay
