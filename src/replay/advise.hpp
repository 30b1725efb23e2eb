// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern advise`: which PYTORCH_ALLOC_CONF (the variable PyTorch 2.9 and earlier read is
// PYTORCH_CUDA_ALLOC_CONF) needs the smallest device for a workload, and what cistern's own
// allocator needs beside it.
//
// Every configuration is replayed on the `torch` emulation (cold start: each configuration
// builds its own cache from an empty device, the snapshot's own settings included), and its
// min_capacity - the smallest simulated device, to 2 MiB, on which the whole trace runs without
// an out-of-memory error, PyTorch's release-and-retry included - is the figure compared.
//
// The search is staged, which is how it stays small (tens of configurations, not the thousands
// of the full product):
//  1. each option alone: `max_split_size_mb` at values drawn from the trace's own sizes (a
//     threshold acts on a request only through which side of it the request falls, so one value
//     per gap between distinct large sizes covers every behaviour; at most `split_values` of
//     them, evenly spread), `roundup_power2_divisions` 2, 4, 8 and 16, and
//     `garbage_collection_threshold` 0.6 and 0.8 with `per_process_memory_fraction:0.99` (the
//     threshold does nothing without a fraction), and `expandable_segments:True`;
//  2. per-size `roundup_power2_divisions` lists around the trace's byte-weighted median size:
//     the best single value above it and no rounding below, and the reverse;
//  3. combinations (combine_options): every combination of the three best split values, the
//     three best roundings and the best garbage-collection setting, "unset" counting as a value
//     (at most 4 x 4 x 2), and `expandable_segments:True` with each rounding tried in stages 1
//     and 2 (at most 8). Expandable segments are not combined with `max_split_size_mb` (their
//     blocks split whatever the threshold; PyTorch's maintainers call the pair meaningless and it
//     is reported to grow reserved memory, pytorch#123548) nor with
//     `garbage_collection_threshold` (which never frees expandable blocks: only the memory
//     fraction it needs would remain).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "replay/engine.hpp"
#include "trace/trace.hpp"

namespace cistern::replay {

/// One configuration tried, with its figures.
struct AdviceCandidate {
  std::string config;  ///< in PYTORCH_ALLOC_CONF syntax; "" is PyTorch's defaults (for cistern: "")
  std::uint64_t min_capacity = 0;
  std::uint64_t device_allocs = 0;  ///< cudaMalloc calls of a replay on `Options::capacity`
  std::uint64_t device_maps = 0;    ///< its page mappings (expandable segments)
  double device_ms = 0;             ///< their simulated device time (cost model)
  std::string error;  ///< why the configuration could not be replayed, if it could not
  /// Its place in `Advice::candidates`, from 1; candidates with the same figures (min_capacity,
  /// device_allocs, device_maps, device_ms) share the place of the first of them ("1, 1, 3").
  /// 0 outside the ranking.
  std::size_t rank = 0;
};

/// What `advise` found for one trace.
struct Advice {
  std::string trace;  ///< source path
  int device = 0;
  AdviceCandidate baseline;  ///< the trace's own settings (PyTorch's defaults when it has none)
  AdviceCandidate defaults;  ///< PyTorch's defaults
  /// Every configuration replayed without error, best first: smallest min_capacity, then least
  /// device time, then the shortest configuration string.
  std::vector<AdviceCandidate> candidates;
  /// cistern's own allocator with its default options, replayed as the candidates are.
  AdviceCandidate cistern;
  double seconds = 0;  ///< wall time of the search
};

/// How `advise` runs.
struct AdviseOptions {
  Options replay;                ///< capacity (device calls are counted on it) and cost model
  unsigned threads = 0;          ///< replays at once (0: one per core)
  std::size_t split_values = 8;  ///< most max_split_size_mb values tried alone
};

/// The `max_split_size_mb` values (MiB) that stage 1 tries for `trace`: one per gap between
/// the distinct request sizes of at least the large segment size (20 MiB), rounded up to a
/// whole MiB, at most `limit` of them evenly spread over the sorted values.
std::vector<std::uint64_t> max_split_values(const trace::Trace& trace, std::size_t limit);

/// The per-size `roundup_power2_divisions` lists stage 2 tries with `divisions` as the best
/// single value: "[K:1,>:d]" and "[K:d,>:1]" for K the power of two (MiB) at or below the
/// trace's byte-weighted median request, and twice that.
std::vector<std::string> division_lists(const trace::Trace& trace, unsigned divisions);

/// Stage 3's configurations (see the file comment) from each option's best values, best first:
/// `splits` (max_split_size_mb), `roundings` (the best roundup_power2_divisions), `gcs` (the best
/// garbage-collection setting) and `expandable_roundings` (every rounding tried, each combined
/// with expandable segments). "Unset" is added to the first three; the result has no duplicates.
std::vector<std::string> combine_options(const std::vector<std::string>& splits,
                                         const std::vector<std::string>& roundings,
                                         const std::vector<std::string>& gcs,
                                         const std::vector<std::string>& expandable_roundings);

/// The most replays `advise` runs for a trace whose stage 1 tries `splits` max_split_size_mb
/// values and `singles` roundup_power2_divisions values, `gcs` garbage-collection settings and
/// `stage1` configurations in all (duplicates removed), and whose stage 2 tries `lists` lists:
/// stages 1 and 2, stage 3's combinations that no earlier stage tried (if every option's best
/// values could be replayed), and cistern's own replay.
std::size_t most_replays(std::size_t stage1, std::size_t splits, std::size_t singles,
                         std::size_t gcs, std::size_t lists);

/// Searches PyTorch's options for `trace` (see the file comment). `progress(done, total)` is
/// called from the calling thread as replays finish; `total` is `most_replays` for the trace
/// from the first call on and never changes, and `done` only grows (by a stage's unused
/// replays at its end, where fewer configurations than the most were left to try), reaching
/// `total` at the last call. Throws `cistern::Error` when the trace cannot be replayed at all.
Advice advise(const trace::Trace& trace, const AdviseOptions& options,
              const std::function<void(std::size_t, std::size_t)>& progress = {});

}  // namespace cistern::replay
