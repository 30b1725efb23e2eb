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

/// The configurations tried so far and the replays that try new ones.
class Search {
 public:
  Search(const trace::Trace& trace, const AdviseOptions& options,
         const std::function<void(std::size_t, std::size_t)>& progress)
      : trace_(trace), options_(options), progress_(progress) {}

  /// Replays, in parallel, every configuration of `configs` not tried yet, for `label`'s
  /// allocator ("torch" or "cistern").
  void evaluate(const std::vector<std::string>& configs, const std::string& label = "torch") {
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
    if (policies.empty()) return;
    const std::size_t before = done_;
    const std::vector<Result> rows =
        run_all({&trace_}, policies, options_.replay, true, options_.threads,
                [&](std::size_t done, std::size_t total) {
                  if (progress_) progress_(before + done, before + total);
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
    done_ += policies.size();
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

  /// Every torch configuration replayed without error, best first.
  std::vector<AdviceCandidate> ranking() const {
    std::vector<AdviceCandidate> out;
    for (const auto& [name, candidate] : tried_) {
      if (name.rfind("torch|", 0) == 0 && candidate.error.empty()) out.push_back(candidate);
    }
    std::sort(out.begin(), out.end(), better);
    return out;
  }

 private:
  static std::string key(const std::string& label, const std::string& config) {
    return label + "|" + config;
  }

  const trace::Trace& trace_;
  const AdviseOptions& options_;
  const std::function<void(std::size_t, std::size_t)>& progress_;
  std::map<std::string, AdviceCandidate> tried_;  ///< by "label|config"
  std::size_t done_ = 0;
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

}  // namespace

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
  Search search(trace, options, progress);
  const std::string baseline = recorded_config(trace).to_string();

  // Stage 1: each option alone, the defaults and the trace's own settings.
  const std::vector<std::string> splits = split_configs(trace, options.split_values);
  const std::vector<std::string> singles = single_division_configs();
  const std::vector<std::string> gcs = gc_configs();
  const std::vector<std::string> expandables{kExpandable};
  std::vector<std::string> stage1{"", baseline};
  for (const auto* group : {&splits, &singles, &gcs, &expandables})
    stage1.insert(stage1.end(), group->begin(), group->end());
  search.evaluate(stage1);
  if (!search.get("").error.empty()) {
    throw Error(fmt::format("advise: {} cannot be replayed on the torch emulation: {}",
                            trace.source, search.get("").error));
  }

  // Stage 2: per-size lists around the byte-weighted median, with the best single value.
  const std::vector<std::string> lists =
      division_lists(trace, best_single_division(search, singles));
  search.evaluate(lists);

  // Stage 3: combinations of each option's best values, and expandable segments with every
  // rounding (their blocks are cut to the rounded sizes, so the best rounding may differ).
  std::vector<std::string> roundings = singles;
  roundings.insert(roundings.end(), lists.begin(), lists.end());
  search.evaluate(combine_options(search.best_of(splits, 3), search.best_of(roundings, 3),
                                  search.best_of(gcs, 1), roundings));
  search.evaluate({""}, "cistern");

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
