// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// An oracle for randomized tests of cistern's allocators on a SimDevice, kept entirely outside the
// allocator: what is live, what the statistics must say, and - the important part - which
// memory some stream may still be touching.
//
// The safety model. When a block is freed, every stream that used it (the allocating stream,
// the streams recorded with record_stream, the freeing stream) may still have work in flight on
// it, until `busy_until` = the latest of those streams' `stream_done_at` at the moment of the
// free. When the allocator later hands out an overlapping range on stream S, any work S does from
// then on must start after `busy_until`: either the clock has passed it, or S was made to wait
// for it on the device (`stream_wait_event`). So right after `allocate` returns,
//     busy_until <= max(now, stream_done_at(S))
// must hold for every earlier freed range that overlaps the new one. Freed ranges whose
// `busy_until` the clock has passed can no longer matter and are pruned.
//
// Every check throws `OracleViolation` with the details, so that a driver can add its own
// context (the seed, the last operations) before it fails the test.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/sim_device.hpp"
#include "cistern/stats.hpp"

namespace cistern::testing {

/// An oracle check failed; the message says what and where.
class OracleViolation : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// One live allocation as the caller sees it.
struct LiveAllocation {
  std::size_t requested = 0;  ///< the caller's size
  std::size_t size = 0;       ///< allocation_size() when it was returned
  Stream stream;              ///< the allocating stream
  std::vector<Stream> users;  ///< streams recorded with record_stream
  std::uint64_t op = 0;       ///< the operation that allocated it
};

/// A range that was freed while streams may still have had work on it.
struct FreedRange {
  std::uintptr_t end = 0;
  std::uint64_t busy_until = 0;  ///< when the last user's work known at the free completes
  Stream allocated_on;
  Stream freed_on;
  std::vector<Stream> users;  ///< every stream that may touch it until busy_until
  std::uint64_t op = 0;       ///< the operation that freed it
};

class Oracle {
 public:
  Oracle(SimDevice& device, DeviceAllocator& alloc) : device_(device), alloc_(alloc) {}

  // --- events the driver reports -------------------------------------------------------------------

  /// `p` was returned by allocate(bytes, stream) at operation `op`.
  void on_allocate(void* p, std::size_t bytes, Stream stream, std::uint64_t op) {
    const auto a = address(p);
    if (bytes == 0) return expect(p == nullptr, "allocate(0) did not return nullptr");
    expect(p != nullptr, fmt::format("allocate({}) returned nullptr", bytes));
    expect(a % 512 == 0, fmt::format("allocate({}) returned {:#x}, not 512-aligned", bytes, a));
    check_no_overlap(a, bytes);
    const std::size_t size = alloc_.allocation_size(p);
    check_rounded(bytes, size);
    check_event_gating(a, a + bytes, stream, op);
    live_.emplace(a, LiveAllocation{bytes, size, stream, {}, op});
    live_bytes_ += size;
    live_requested_ += bytes;
    max_live_bytes_ = std::max(max_live_bytes_, live_bytes_);
    max_live_count_ = std::max(max_live_count_, live_.size());
  }

  /// record_stream(p, stream) succeeded.
  void on_record(void* p, Stream stream) {
    LiveAllocation& live = find_live(p);
    auto& users = live.users;
    if (std::find(users.begin(), users.end(), stream) == users.end()) users.push_back(stream);
  }

  /// About to deallocate(p, stream): records who may still use the range.
  void on_free(void* p, Stream stream, std::uint64_t op) {
    const LiveAllocation live = find_live(p);
    std::vector<Stream> users = live.users;
    users.push_back(live.stream);
    users.push_back(stream);
    std::uint64_t busy = 0;
    for (Stream s : users) busy = std::max(busy, device_.stream_done_at(s));
    const auto a = address(p);
    if (busy > device_.now()) {
      freed_.emplace(a, FreedRange{a + live.requested, busy, live.stream, stream, users, op});
      longest_freed_ = std::max(longest_freed_, live.requested);
    }
    live_.erase(a);
    live_bytes_ -= live.size;
    live_requested_ -= live.requested;
  }

  /// allocate(bytes > 0, stream) is about to be called: the stream has a pool from now on.
  void on_pool(Stream stream) { pools_.insert(stream.handle); }

  /// Whether allocated-byte peaks must be exact (see check_allocated_peak).
  void set_exact_peaks(bool exact) { exact_peaks_ = exact; }

  /// reset_peak_stats() was called.
  void on_reset_peaks() {
    max_live_bytes_ = live_bytes_;
    max_live_count_ = live_.size();
  }

  /// empty_cache() was called: with nothing live, nothing may stay reserved.
  void on_empty_cache() {
    if (!live_.empty()) return;
    const Stats s = alloc_.stats();
    expect(current(s, StatKind::reserved_bytes) == 0,
           fmt::format("empty_cache with nothing live left {} bytes reserved",
                       current(s, StatKind::reserved_bytes)));
    expect(device_.used_bytes() == 0,
           fmt::format("empty_cache with nothing live left {} bytes used on the device",
                       device_.used_bytes()));
  }

  /// Forgets freed ranges whose users' work the clock has passed.
  void prune() {
    const std::uint64_t now = device_.now();
    if (now == pruned_at_) return;
    pruned_at_ = now;
    for (auto it = freed_.begin(); it != freed_.end();) {
      it = it->second.busy_until <= now ? freed_.erase(it) : std::next(it);
    }
    if (freed_.empty()) longest_freed_ = 0;
  }

  // --- checks -------------------------------------------------------------------------------------

  /// The statistics agree with the live set and the device.
  void check_stats() const {
    const Stats s = alloc_.stats();
    const std::int64_t allocated = current(s, StatKind::allocated_bytes);
    expect(allocated == static_cast<std::int64_t>(live_bytes_),
           fmt::format("allocated_bytes.all.current is {} but the live allocations hold {}",
                       allocated, live_bytes_));
    expect(current(s, StatKind::allocation) == static_cast<std::int64_t>(live_.size()),
           fmt::format("allocation.all.current is {} but {} allocations are live",
                       current(s, StatKind::allocation), live_.size()));
    expect(current(s, StatKind::requested_bytes) >= static_cast<std::int64_t>(live_requested_),
           fmt::format("requested_bytes.all.current is {}, below the live requested {}",
                       current(s, StatKind::requested_bytes), live_requested_));
    expect(current(s, StatKind::active_bytes) >= allocated, "active_bytes below allocated_bytes");
    // A pool's unpublished bytes stay within its segments: all pools together, within the
    // reserved bytes (whose peak is exact: segment changes are published at once).
    check_peak("allocated_bytes", peak(s, StatKind::allocated_bytes), max_live_bytes_,
               static_cast<std::size_t>(peak(s, StatKind::reserved_bytes)));
    check_peak("allocation", peak(s, StatKind::allocation), max_live_count_,
               pools_.size() * kPublishBlocks);
    check_peaks(s);
    check_reserved(s);
  }

  /// Every live allocation appears in a snapshot as exactly that block, and nothing else does.
  void check_snapshot(bool pass_through) const {
    const Snapshot snap = alloc_.snapshot();
    std::size_t seen = 0;
    for (const SegmentInfo& seg : snap.segments) {
      for (const BlockInfo& b : seg.blocks) {
        if (b.state != BlockState::active_allocated) continue;
        ++seen;
        const auto it = live_.find(b.address);
        expect(it != live_.end(), fmt::format("snapshot: block {:#x} is allocated but was never "
                                              "returned (or was freed)",
                                              b.address));
        expect(it->second.size == b.size && it->second.requested == b.requested_size,
               fmt::format("snapshot: block {:#x} has size {} requested {}, the caller got {} "
                           "requested {}",
                           b.address, b.size, b.requested_size, it->second.size,
                           it->second.requested));
        if (!pass_through) {
          expect(seg.is_large == (b.size > 1 * MiB),
                 fmt::format("snapshot: block {:#x} of {} bytes in a {} segment", b.address, b.size,
                             seg.is_large ? "large" : "small"));
        }
      }
    }
    expect(seen == live_.size(),
           fmt::format("snapshot holds {} allocated blocks, {} are live", seen, live_.size()));
  }

  // --- observation ---------------------------------------------------------------------------------

  const std::map<std::uintptr_t, LiveAllocation>& live() const noexcept { return live_; }
  std::size_t freed_ranges() const noexcept { return freed_.size(); }
  std::size_t live_bytes() const noexcept { return live_bytes_; }

  static std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

 private:
  static void expect(bool ok, const std::string& what) {
    if (!ok) throw OracleViolation(what);
  }
  static std::int64_t current(const Stats& s, StatKind k) {
    return s.get(k, StatPool::all).current;
  }
  static std::int64_t peak(const Stats& s, StatKind k) { return s.get(k, StatPool::all).peak; }

  LiveAllocation& find_live(void* p) {
    const auto it = live_.find(address(p));
    expect(it != live_.end(), fmt::format("oracle: {:#x} is not live", address(p)));
    return it->second;
  }

  // [a, a+bytes) overlaps no live allocation. Live ranges are disjoint, so only the neighbours of
  // `a` in address order can overlap.
  void check_no_overlap(std::uintptr_t a, std::size_t bytes) const {
    const auto next = live_.lower_bound(a);
    if (next != live_.end()) {
      expect(next->first >= a + bytes,
             fmt::format("allocate({}) returned {:#x}, overlapping the live allocation at {:#x} "
                         "({} bytes, op {})",
                         bytes, a, next->first, next->second.requested, next->second.op));
    }
    if (next != live_.begin()) {
      const auto prev = std::prev(next);
      expect(prev->first + prev->second.requested <= a,
             fmt::format("allocate({}) returned {:#x}, inside the live allocation at {:#x} "
                         "({} bytes, op {})",
                         bytes, a, prev->first, prev->second.requested, prev->second.op));
    }
  }

  // Single-threaded, allocated blocks change only at allocate and deallocate, so the oracle
  // knows the true maximum since the last reset. A peak must equal it when the statistics are
  // read after every operation, with exact_peaks, or while one pool exists; otherwise, by the
  // contract in cistern/stats.hpp, each pool may hold back some changes, so the peak may be off
  // by up to `bound` (what all pools together may hold back), either way.
  void check_peak(const char* what, std::int64_t peak, std::size_t truth, std::size_t bound) const {
    const bool exact = exact_peaks_ || pools_.size() <= 1;
    const std::size_t slack = exact ? 0 : bound;
    const auto max = static_cast<std::int64_t>(truth);
    expect(
        peak <= max + static_cast<std::int64_t>(slack) &&
            peak + static_cast<std::int64_t>(slack) >= max,
        fmt::format("{}.all.peak is {} but the live allocations peaked at {} ({}; {} pools)", what,
                    peak, truth, exact ? "must be exact" : fmt::format("may be off by {}", slack),
                    pools_.size()));
  }

  static void check_rounded(std::size_t bytes, std::size_t size) {
    expect(size >= bytes && size >= 512 && size % 512 == 0,
           fmt::format("allocation_size is {} for a request of {} bytes (must be >= the request, "
                       ">= 512 and a multiple of 512)",
                       size, bytes));
  }

  // Every freed range overlapping [a, end) is no longer used by the time `stream` runs new work.
  void check_event_gating(std::uintptr_t a, std::uintptr_t end, Stream stream,
                          std::uint64_t op) const {
    const std::uint64_t now = device_.now();
    const std::uint64_t ready = std::max(now, device_.stream_done_at(stream));
    const std::uintptr_t from = a > longest_freed_ ? a - longest_freed_ : 0;
    for (auto it = freed_.lower_bound(from); it != freed_.end() && it->first < end; ++it) {
      const FreedRange& f = it->second;
      if (f.end <= a || f.busy_until <= ready) continue;
      throw OracleViolation(fmt::format(
          "op {}: allocate returned [{:#x}, {:#x}) on stream {} although [{:#x}, {:#x}), "
          "allocated on stream {} and freed on stream {} at op {}, may be used by streams [{}] "
          "until t={}; but now={} and stream {}'s new work may start at t={} (it was not made to "
          "wait)",
          op, a, end, stream.handle, it->first, f.end, f.allocated_on.handle, f.freed_on.handle,
          f.op, streams_text(f.users), f.busy_until, now, stream.handle, ready));
    }
  }

  static std::string streams_text(const std::vector<Stream>& streams) {
    std::string text;
    for (Stream s : streams) text += (text.empty() ? "" : ",") + std::to_string(s.handle);
    return text;
  }

  static void check_peaks(const Stats& s) {
    for (int k = 0; k < kStatKinds; ++k) {
      for (int q = 0; q < kStatPools; ++q) {
        const Stat& stat = s.array[k][q];
        expect(stat.peak >= stat.current && stat.current >= 0,
               fmt::format("{}.{}: current {} peak {}", to_string(static_cast<StatKind>(k)),
                           to_string(static_cast<StatPool>(q)), stat.current, stat.peak));
        expect(stat.allocated - stat.freed == stat.current,
               fmt::format("{}.{}: allocated {} - freed {} != current {}",
                           to_string(static_cast<StatKind>(k)), to_string(static_cast<StatPool>(q)),
                           stat.allocated, stat.freed, stat.current));
      }
    }
  }

  // The device charges whole granules: reserved <= used < reserved + segments * granularity.
  // With the virtual-memory engine, reserved_bytes() is the handles held (exactly what the device
  // charges), the statistic the part of it mapped, and segments are address space only.
  void check_reserved(const Stats& s) const {
    const auto reserved = static_cast<std::size_t>(current(s, StatKind::reserved_bytes));
    const auto segments = static_cast<std::size_t>(current(s, StatKind::segment));
    const std::size_t used = device_.used_bytes();
    if (alloc_.uses_virtual_memory()) {
      expect(alloc_.reserved_bytes() == used && reserved <= used,
             fmt::format("engine: reserved_bytes() {}, {} mapped, but the device has {} bytes used",
                         alloc_.reserved_bytes(), reserved, used));
      expect(segments == device_.live_reservations() && device_.live_segments() == 0,
             fmt::format("engine: {} segments but the device has {} reservations, {} segments",
                         segments, device_.live_reservations(), device_.live_segments()));
      return;
    }
    expect(reserved == alloc_.reserved_bytes(),
           fmt::format("reserved_bytes() {} but the statistic says {}", alloc_.reserved_bytes(),
                       reserved));
    expect(reserved <= used && (used - reserved < segments * device_.granularity() || used == 0),
           fmt::format("reserved {} bytes in {} segments but the device has {} bytes used",
                       reserved, segments, used));
    expect(segments == device_.live_segments(),
           fmt::format("segment.all.current is {} but the device has {} live segments", segments,
                       device_.live_segments()));
  }

  SimDevice& device_;
  DeviceAllocator& alloc_;
  std::map<std::uintptr_t, LiveAllocation> live_;
  std::multimap<std::uintptr_t, FreedRange> freed_;
  std::size_t longest_freed_ = 0;  // bounds the backward search among freed ranges
  std::uint64_t pruned_at_ = ~std::uint64_t{0};
  std::size_t live_bytes_ = 0;      // sum of allocation_size over live allocations
  std::size_t live_requested_ = 0;  // sum of requested sizes over live allocations
  std::size_t max_live_bytes_ = 0;  // the running maximum of live_bytes_ since the last reset
  std::size_t max_live_count_ = 0;  // the running maximum of live allocations since then
  std::set<std::uintptr_t> pools_;  // streams that have a pool
  bool exact_peaks_ = true;

  // What a pool may hold back from the allocator-wide statistics (cistern/stats.hpp).
  static constexpr std::size_t kPublishBlocks = 64;
};

}  // namespace cistern::testing
