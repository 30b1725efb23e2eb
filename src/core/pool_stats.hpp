// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Statistics bookkeeping without a global lock on the hot path.
//
// Each stream pool keeps its own `Stats` (plain integers, under the pool's lock). While the
// allocator has a single pool - the common case: one stream - those are the allocator's
// statistics, exactly. Once a second pool exists, every change is also applied to
// `SharedStats`, relaxed atomics that hold the allocator-wide current values and peaks (a peak
// of a sum cannot be derived from per-pool peaks). Running sums (`allocated`/`freed`) are always
// the sums over the pools.
#pragma once

#include <atomic>
#include <cstdint>

#include "cistern/stats.hpp"

namespace cistern::detail {

/// Allocator-wide current values and peaks, used once several pools exist.
class SharedStats {
 public:
  void add(int kind, int pool, std::int64_t delta) noexcept { apply(array_[kind][pool], delta); }
  void add_oversize_allocations(std::int64_t delta) noexcept { apply(oversize_alloc_, delta); }
  void add_oversize_segments(std::int64_t delta) noexcept { apply(oversize_seg_, delta); }

  /// Starts from a pool's statistics (the only pool so far).
  void seed(const Stats& stats) noexcept {
    for (int k = 0; k < kStatKinds; ++k)
      for (int p = 0; p < kStatPools; ++p) load(array_[k][p], stats.array[k][p]);
    load(oversize_alloc_, stats.oversize_allocations);
    load(oversize_seg_, stats.oversize_segments);
  }
  /// Writes current values and peaks into `stats`.
  void export_to(Stats& stats) const noexcept {
    for (int k = 0; k < kStatKinds; ++k)
      for (int p = 0; p < kStatPools; ++p) store(array_[k][p], stats.array[k][p]);
    store(oversize_alloc_, stats.oversize_allocations);
    store(oversize_seg_, stats.oversize_segments);
  }
  /// Sets every peak to its current value.
  void reset_peaks() noexcept {
    for (auto& row : array_)
      for (auto& s : row) s.peak.store(s.current.load());
    oversize_alloc_.peak.store(oversize_alloc_.current.load());
    oversize_seg_.peak.store(oversize_seg_.current.load());
  }

 private:
  struct Cell {
    std::atomic<std::int64_t> current{0};
    std::atomic<std::int64_t> peak{0};
  };
  static void apply(Cell& cell, std::int64_t delta) noexcept {
    const std::int64_t now = cell.current.fetch_add(delta, std::memory_order_relaxed) + delta;
    if (delta <= 0) return;
    std::int64_t peak = cell.peak.load(std::memory_order_relaxed);
    while (now > peak && !cell.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  static void load(Cell& cell, const Stat& s) noexcept {
    cell.current.store(s.current);
    cell.peak.store(s.peak);
  }
  static void store(const Cell& cell, Stat& s) noexcept {
    s.current = cell.current.load();
    s.peak = cell.peak.load();
  }

  Cell array_[kStatKinds][kStatPools];
  Cell oversize_alloc_;
  Cell oversize_seg_;
};

/// One pool's statistics; see the file comment.
class PoolStats {
 public:
  /// Applies `delta` to a statistic for the pool kind (small/large) and for "all".
  void add(StatKind kind, bool small, std::int64_t delta, SharedStats* shared) noexcept {
    const int k = static_cast<int>(kind);
    const int p = small ? static_cast<int>(StatPool::small_pool) : static_cast<int>(StatPool::large_pool);
    stats_.array[k][p].update(delta);
    stats_.array[k][0].update(delta);
    if (shared != nullptr) {
      shared->add(k, p, delta);
      shared->add(k, 0, delta);
    }
  }
  void add_oversize_allocations(std::int64_t delta, SharedStats* shared) noexcept {
    stats_.oversize_allocations.update(delta);
    if (shared != nullptr) shared->add_oversize_allocations(delta);
  }
  void add_oversize_segments(std::int64_t delta, SharedStats* shared) noexcept {
    stats_.oversize_segments.update(delta);
    if (shared != nullptr) shared->add_oversize_segments(delta);
  }
  /// Moves `delta` of a statistic into (or, negative, out of) this pool without counting it as
  /// allocated or freed: a segment changing owner is neither.
  void transfer(StatKind kind, bool small, std::int64_t delta) noexcept {
    const int k = static_cast<int>(kind);
    const int p = small ? 1 : 2;
    for (Stat* s : {&stats_.array[k][p], &stats_.array[k][0]}) {
      s->current += delta;
      if (s->current > s->peak) s->peak = s->current;
    }
  }
  void transfer_oversize_segments(std::int64_t delta) noexcept {
    stats_.oversize_segments.current += delta;
    if (stats_.oversize_segments.current > stats_.oversize_segments.peak)
      stats_.oversize_segments.peak = stats_.oversize_segments.current;
  }

  const Stats& get() const noexcept { return stats_; }
  Stats& get() noexcept { return stats_; }

 private:
  Stats stats_;
};

}  // namespace cistern::detail
