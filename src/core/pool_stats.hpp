// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Statistics bookkeeping without a global lock on the hot path.
//
// Each stream pool keeps its own `Stats` (plain integers, under the pool's lock). While the
// allocator has a single pool - the common case: one stream - those are the allocator's
// statistics, exactly. Once a second pool exists, allocator-wide peaks need allocator-wide
// current values (a peak of a sum cannot be derived from per-pool peaks): pools then publish
// their changes into `SharedStats`, relaxed atomics. Publishing on every operation would make
// every thread write the same cache lines - exactly the serialisation per-stream pools avoid -
// so a pool publishes in batches: after kPublishOps hot-path operations, after every segment
// change, and before any read. Current values and running sums are therefore always exact when
// read. An allocator-wide peak can miss (or, when a pool's free is held back while another pool
// publishes, overstate) a transient by at most the unpublished change of each pool: at most
// kPublishOps blocks, and, in bytes, at most that pool's reserved bytes (a pool's allocated bytes
// stay within its segments, and every segment change is published). The bound is relative to
// the pool's size on purpose: a byte threshold (2 MiB until issue 11) made every request of that
// size or more write every shared cell, so that threads on separate streams ran up to 27 times
// slower per operation than one thread alone. With one pool everything is exact.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cistern/stats.hpp"
#include "debug_assert.hpp"
#include "hot.hpp"

namespace cistern::detail {

/// Allocator-wide current values and peaks, used once several pools exist.
class SharedStats {
 public:
  void add(int kind, int pool, std::int64_t delta) noexcept { apply(array_[kind][pool], delta); }
  void add_oversize_allocations(std::int64_t delta) noexcept { apply(oversize_alloc_, delta); }
  void add_oversize_segments(std::int64_t delta) noexcept { apply(oversize_seg_, delta); }

  /// Starts from the statistics of the only pool so far (current values and peaks).
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
///
/// To keep the hot path short, the small- and large-pool rows keep their current value, peak and
/// allocated sum, the freed sum derived from them (freed = allocated - current + base, `base`
/// moving only when a segment changes pools or the sums are reset); the "all" row keeps only its
/// peak (its current value and sums are those of the rows added up). A decrement is then one
/// subtraction. The three
/// activity statistics are derived: `active`, `active_bytes` and `requested_bytes` are the
/// allocated blocks (`allocation`, `allocated_bytes`, the requested bytes of allocated blocks,
/// stored in the `requested_bytes` row) plus the pending ones (counted here). While nothing is
/// pending - almost always - they equal the stored figures; the peaks they reach while frees are
/// pending are tracked explicitly (`track_activity_peaks`), so every derived peak is exact.
class PoolStats {
 public:
  // 256: a cross-stream free makes three hot operations per pair, so a publication lands at a
  // different point of the cycle each time and writes several shared cells; at 64 that cost two
  // threads freeing across streams 2.5x the same-stream pair's time, at 256 1.7x.
  static constexpr int kPublishOps = 256;

  /// Raises a stored statistic of the pool kind (small/large) and of "all" by `delta` >= 0.
  CISTERN_HOT void inc(StatKind kind, bool small, std::int64_t delta) noexcept {
    const int k = static_cast<int>(kind);
    Row& row = rows_[k][small ? 0 : 1];
    row.current += delta;
    row.allocated += delta;
    if (row.current > row.peak) row.peak = row.current;
    const std::int64_t all = row.current + rows_[k][small ? 1 : 0].current;
    if (all > all_peak_[k]) all_peak_[k] = all;
  }
  /// Lowers a stored statistic by `delta` >= 0 (peaks cannot change; freed is derived).
  CISTERN_HOT void dec(StatKind kind, bool small, std::int64_t delta) noexcept {
    Row& row = rows_[static_cast<int>(kind)][small ? 0 : 1];
    CISTERN_ASSERT_INTERNAL(delta >= 0 && row.current >= delta);
    row.current -= delta;
  }
  void add_oversize_allocations(std::int64_t delta) noexcept {
    oversize_allocations_.update(delta);
  }
  void add_oversize_segments(std::int64_t delta) noexcept { oversize_segments_.update(delta); }
  /// Moves `delta` of a statistic into (or, negative, out of) this pool without counting it as
  /// allocated or freed: a segment changing owner is neither.
  void transfer(StatKind kind, bool small, std::int64_t delta) noexcept {
    const int k = static_cast<int>(kind);
    Row& row = rows_[k][small ? 0 : 1];
    move(row.current, row.peak, delta);
    row.base += delta;  // neither allocated nor freed
    all_peak_[k] = std::max(all_peak_[k], all_current(k));
  }
  void transfer_oversize_segments(std::int64_t delta) noexcept {
    move(oversize_segments_.current, oversize_segments_.peak, delta);
  }

  // --- pending frees (the derived activity statistics) -------------------------------------------

  /// An allocation ended but its block waits for events: it stays active.
  void begin_pending(bool small, std::int64_t bytes, std::int64_t requested) noexcept {
    Pending& p = pending_[small ? 0 : 1];
    ++p.blocks;
    p.bytes += bytes;
    p.requested += requested;
    ++pending_blocks_;
  }
  /// A pending block's events completed: it is no longer active.
  void end_pending(bool small, std::int64_t bytes, std::int64_t requested) noexcept {
    Pending& p = pending_[small ? 0 : 1];
    --p.blocks;
    p.bytes -= bytes;
    p.requested -= requested;
    --pending_blocks_;
  }
  /// Whether any free is pending (then allocations must call track_activity_peaks).
  bool any_pending() const noexcept { return pending_blocks_ != 0; }
  /// Records the activity statistics' current values in their peaks.
  void track_activity_peaks() noexcept {
    for (int d = 0; d < kDerived; ++d) {
      for (int q = 0; q < kStatPools; ++q) {
        std::int64_t& peak = activity_peak_[d][q];
        peak = std::max(peak, current(kDerivedKinds[d], static_cast<StatPool>(q)));
      }
    }
  }

  // --- publication to the allocator-wide statistics ----------------------------------------------

  /// Counts one hot-path operation; whether it is time to publish (see the file comment). Reads
  /// and writes only this pool's own fields.
  bool due_for_publishing() noexcept { return ++ops_since_publish_ >= kPublishOps; }
  /// Adds everything that changed since the last publication to `shared`.
  void publish(SharedStats& shared) noexcept {
    for (int k = 0; k < kStatKinds; ++k) {
      for (int q = 0; q < kStatPools; ++q) {
        const std::int64_t now = current(static_cast<StatKind>(k), static_cast<StatPool>(q));
        const std::int64_t delta = now - published_[k][q];
        if (delta == 0) continue;
        shared.add(k, q, delta);
        published_[k][q] = now;
      }
    }
    if (const std::int64_t d = oversize_allocations_.current - published_oversize_[0]) {
      shared.add_oversize_allocations(d);
      published_oversize_[0] = oversize_allocations_.current;
    }
    if (const std::int64_t d = oversize_segments_.current - published_oversize_[1]) {
      shared.add_oversize_segments(d);
      published_oversize_[1] = oversize_segments_.current;
    }
    ops_since_publish_ = 0;
  }
  /// Records the current values as published (the shared statistics were seeded from them).
  void mark_published() noexcept {
    for (int k = 0; k < kStatKinds; ++k) {
      for (int q = 0; q < kStatPools; ++q) {
        published_[k][q] = current(static_cast<StatKind>(k), static_cast<StatPool>(q));
      }
    }
    published_oversize_[0] = oversize_allocations_.current;
    published_oversize_[1] = oversize_segments_.current;
    ops_since_publish_ = 0;
  }

  // --- reading -----------------------------------------------------------------------------------

  /// The current value of one statistic (derived ones included).
  std::int64_t current(StatKind kind, StatPool pool) const noexcept {
    const int d = derived_index(kind);
    const int k = static_cast<int>(d < 0 ? kind : kBaseKinds[d]);
    const std::int64_t stored = pool == StatPool::all
                                    ? all_current(k)
                                    : rows_[k][pool == StatPool::small_pool ? 0 : 1].current;
    return d < 0 ? stored : stored + pending_amount(d, pool);
  }
  std::int64_t oversize_allocations() const noexcept { return oversize_allocations_.current; }
  std::int64_t oversize_segments() const noexcept { return oversize_segments_.current; }

  /// All statistics in PyTorch's shape.
  void export_to(Stats& s) const noexcept {
    for (int k = 0; k < kStatKinds; ++k) {
      s.array[k][1] = rows_[k][0].stat();
      s.array[k][2] = rows_[k][1].stat();
      Stat& all = s.array[k][0];
      all.current = all_current(k);
      all.peak = all_peak_[k];
      all.allocated = s.array[k][1].allocated + s.array[k][2].allocated;
      all.freed = s.array[k][1].freed + s.array[k][2].freed;
    }
    // The derived statistics: stored (allocated blocks) plus pending blocks; every allocation
    // activates, every completed free deactivates.
    for (int d = 0; d < kDerived; ++d) {
      const int base = static_cast<int>(kBaseKinds[d]);
      const int kind = static_cast<int>(kDerivedKinds[d]);
      for (int q = 0; q < kStatPools; ++q) {
        const Stat& b = s.array[base][q];
        const std::int64_t pending = pending_amount(d, static_cast<StatPool>(q));
        Stat& out = s.array[kind][q];
        out.current = b.current + pending;
        out.peak = std::max(b.peak, activity_peak_[d][q]);
        out.allocated = b.allocated;
        out.freed = b.freed - pending + pending_at_reset_[d][q];
      }
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
      for (Row& row : rows_[k]) row.peak = row.current;
      all_peak_[k] = all_current(k);
    }
    for (int d = 0; d < kDerived; ++d) {
      for (int q = 0; q < kStatPools; ++q) {
        activity_peak_[d][q] = current(kDerivedKinds[d], static_cast<StatPool>(q));
      }
    }
    oversize_allocations_.peak = oversize_allocations_.current;
    oversize_segments_.peak = oversize_segments_.current;
  }
  /// Zeroes the running sums.
  void reset_sums() noexcept {
    for (auto& row : rows_) {
      for (Row& r : row) {
        r.allocated = 0;
        r.base = r.current;  // freed = 0
      }
    }
    for (int d = 0; d < kDerived; ++d) {
      for (int q = 0; q < kStatPools; ++q) {
        pending_at_reset_[d][q] = pending_amount(d, static_cast<StatPool>(q));
      }
    }
    oversize_allocations_.allocated = oversize_allocations_.freed = 0;
    oversize_segments_.allocated = oversize_segments_.freed = 0;
  }

 private:
  // A small- or large-pool row: freed = allocated - current + base.
  struct Row {
    std::int64_t current = 0;
    std::int64_t peak = 0;
    std::int64_t allocated = 0;
    std::int64_t base = 0;
    Stat stat() const noexcept {
      return Stat{current, peak, allocated, allocated - current + base};
    }
  };
  std::int64_t all_current(int k) const noexcept {
    return rows_[k][0].current + rows_[k][1].current;
  }
  struct Pending {
    std::int64_t blocks = 0;
    std::int64_t bytes = 0;
    std::int64_t requested = 0;
  };
  // The derived statistics and the stored statistics they extend.
  static constexpr int kDerived = 3;
  static constexpr StatKind kDerivedKinds[kDerived] = {StatKind::active, StatKind::active_bytes,
                                                       StatKind::requested_bytes};
  static constexpr StatKind kBaseKinds[kDerived] = {StatKind::allocation, StatKind::allocated_bytes,
                                                    StatKind::requested_bytes};
  static constexpr int derived_index(StatKind kind) noexcept {
    return kind == StatKind::active            ? 0
           : kind == StatKind::active_bytes    ? 1
           : kind == StatKind::requested_bytes ? 2
                                               : -1;
  }
  std::int64_t pending_amount(int d, StatPool pool) const noexcept {
    auto amount = [d](const Pending& p) {
      return d == 0 ? p.blocks : d == 1 ? p.bytes : p.requested;
    };
    if (pool == StatPool::small_pool) return amount(pending_[0]);
    if (pool == StatPool::large_pool) return amount(pending_[1]);
    return amount(pending_[0]) + amount(pending_[1]);
  }
  static void move(std::int64_t& current, std::int64_t& peak, std::int64_t delta) noexcept {
    current += delta;
    if (current > peak) peak = current;
  }

  Row rows_[kStatKinds][2];  // small, large; the active rows stay unused (derived)
  std::int64_t all_peak_[kStatKinds] = {};
  Stat oversize_allocations_;
  Stat oversize_segments_;
  Pending pending_[2];  // small, large
  std::int64_t pending_blocks_ = 0;
  std::int64_t activity_peak_[kDerived][kStatPools] = {};     // all, small, large
  std::int64_t pending_at_reset_[kDerived][kStatPools] = {};  // pending when sums were reset
  // What the shared statistics know of this pool, indexed like Stats::array (all, small, large).
  std::int64_t published_[kStatKinds][kStatPools] = {};
  std::int64_t published_oversize_[2] = {};
  int ops_since_publish_ = 0;
};

}  // namespace cistern::detail
