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

/// One pool's statistics; see the file comment. The small- and large-pool rows are kept in
/// full; the "all" row keeps only its current value and peak, as its running sums are the sums
/// of the other two rows - which keeps the hot path short.
class PoolStats {
 public:
  /// Raises a statistic of the pool kind (small/large) and of "all" by `delta` >= 0.
  void inc(StatKind kind, bool small, std::int64_t delta, SharedStats* shared) noexcept {
    const int k = static_cast<int>(kind);
    Stat& row = rows_[k][small ? 0 : 1];
    row.current += delta;
    row.allocated += delta;
    if (row.current > row.peak) row.peak = row.current;
    Level& all = all_[k];
    all.current += delta;
    if (all.current > all.peak) all.peak = all.current;
    if (shared != nullptr) mirror(shared, k, small, delta);
  }
  /// Lowers a statistic by `delta` >= 0 (peaks cannot change).
  void dec(StatKind kind, bool small, std::int64_t delta, SharedStats* shared) noexcept {
    const int k = static_cast<int>(kind);
    Stat& row = rows_[k][small ? 0 : 1];
    row.current -= delta;
    row.freed += delta;
    all_[k].current -= delta;
    if (shared != nullptr) mirror(shared, k, small, -delta);
  }
  void add_oversize_allocations(std::int64_t delta, SharedStats* shared) noexcept {
    oversize_allocations_.update(delta);
    if (shared != nullptr) shared->add_oversize_allocations(delta);
  }
  void add_oversize_segments(std::int64_t delta, SharedStats* shared) noexcept {
    oversize_segments_.update(delta);
    if (shared != nullptr) shared->add_oversize_segments(delta);
  }
  /// Moves `delta` of a statistic into (or, negative, out of) this pool without counting it as
  /// allocated or freed: a segment changing owner is neither.
  void transfer(StatKind kind, bool small, std::int64_t delta) noexcept {
    const int k = static_cast<int>(kind);
    move(rows_[k][small ? 0 : 1].current, rows_[k][small ? 0 : 1].peak, delta);
    move(all_[k].current, all_[k].peak, delta);
  }
  void transfer_oversize_segments(std::int64_t delta) noexcept {
    move(oversize_segments_.current, oversize_segments_.peak, delta);
  }

  /// The current value of one statistic.
  std::int64_t current(StatKind kind, StatPool pool) const noexcept {
    const int k = static_cast<int>(kind);
    return pool == StatPool::all ? all_[k].current
                                 : rows_[k][pool == StatPool::small_pool ? 0 : 1].current;
  }
  std::int64_t oversize_allocations() const noexcept { return oversize_allocations_.current; }
  std::int64_t oversize_segments() const noexcept { return oversize_segments_.current; }

  /// All statistics in PyTorch's shape (the "all" sums derived from the rows).
  void export_to(Stats& s) const noexcept {
    for (int k = 0; k < kStatKinds; ++k) {
      s.array[k][1] = rows_[k][0];
      s.array[k][2] = rows_[k][1];
      Stat& all = s.array[k][0];
      all.current = all_[k].current;
      all.peak = all_[k].peak;
      all.allocated = rows_[k][0].allocated + rows_[k][1].allocated;
      all.freed = rows_[k][0].freed + rows_[k][1].freed;
    }
    s.oversize_allocations = oversize_allocations_;
    s.oversize_segments = oversize_segments_;
  }
  /// Adds this pool's running sums into `s` (allocated and freed only).
  void add_sums_to(Stats& s) const noexcept {
    Stats mine;
    export_to(mine);
    for (int k = 0; k < kStatKinds; ++k) {
      for (int p = 0; p < kStatPools; ++p) {
        s.array[k][p].allocated += mine.array[k][p].allocated;
        s.array[k][p].freed += mine.array[k][p].freed;
      }
    }
    s.oversize_allocations.allocated += oversize_allocations_.allocated;
    s.oversize_allocations.freed += oversize_allocations_.freed;
    s.oversize_segments.allocated += oversize_segments_.allocated;
    s.oversize_segments.freed += oversize_segments_.freed;
  }
  /// Sets every peak to its current value.
  void reset_peaks() noexcept {
    for (int k = 0; k < kStatKinds; ++k) {
      for (Stat& row : rows_[k]) row.peak = row.current;
      all_[k].peak = all_[k].current;
    }
    oversize_allocations_.peak = oversize_allocations_.current;
    oversize_segments_.peak = oversize_segments_.current;
  }
  /// Zeroes the running sums.
  void reset_sums() noexcept {
    for (auto& row : rows_)
      for (Stat& s : row) s.allocated = s.freed = 0;
    oversize_allocations_.allocated = oversize_allocations_.freed = 0;
    oversize_segments_.allocated = oversize_segments_.freed = 0;
  }

 private:
  static void mirror(SharedStats* shared, int k, bool small, std::int64_t delta) noexcept {
    shared->add(k, small ? 1 : 2, delta);
    shared->add(k, 0, delta);
  }
  struct Level {
    std::int64_t current = 0;
    std::int64_t peak = 0;
  };
  static void move(std::int64_t& current, std::int64_t& peak, std::int64_t delta) noexcept {
    current += delta;
    if (current > peak) peak = current;
  }

  Stat rows_[kStatKinds][2];  // small, large
  Level all_[kStatKinds];
  Stat oversize_allocations_;
  Stat oversize_segments_;
};

}  // namespace cistern::detail
