// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Plan mode: an allocator that learns one step of a loop that repeats (a training or inference
// step), plans it (planner.hpp), and serves the following steps from the plan.
//
//   cistern::plan::PlannedAllocator alloc(device);
//   for (int step = 0; step < n; ++step) {
//     ... alloc.allocate(...) / alloc.deallocate(...) as usual ...
//     alloc.end_step();  // the first step is recorded and planned here
//   }
//
// The first step is served by an online CachingAllocator (the fallback) and recorded: each
// allocation's size and stream by its index in the step, and when it was freed. At its end the
// buffers allocated and freed within the step are planned into one arena, obtained from the
// device once (mapped pages where the device has virtual memory, else one segment), after the
// fallback has returned the memory it cached for the recorded step. Allocations that outlived the
// recorded step stay with the fallback, and their counterparts in later steps go to it too. Later
// steps match each request - its index in the step, size and stream - to its planned offset, and
// so make no device calls. A request that does not match (another size or stream, one more
// request than recorded, or a planned range still occupied because an earlier request deviated)
// goes into an idle interval of the plan if one fits: arena space no planned buffer uses from now
// to the end of the step and nothing occupies now; else to the fallback. After `replan_after`
// steps in a row with mismatches, the next step is recorded and planned again.
//
// Stream semantics: arena memory freed on stream S is handed to a request on the same stream at
// once (the stream orders them); handed to another stream B, B first waits for an event recorded
// on S (a device call, only on such cross-stream reuse).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cistern/allocator.hpp"
#include "cistern/caching_allocator.hpp"
#include "cistern/device.hpp"
#include "trace/trace.hpp"

namespace cistern::plan {

/// Options of plan mode.
struct PlannedOptions {
  Config fallback;               ///< the online allocator's options
  double time_limit_s = 0.5;     ///< the planner's search time per plan
  std::uint64_t node_limit = 0;  ///< the planner's node limit (0: none; tests set it)
  unsigned replan_after = 2;     ///< steps in a row with mismatches before planning again
};

/// How requests were served (cumulative).
struct PlannedCounters {
  std::uint64_t steps = 0;      ///< end_step() calls
  std::uint64_t plans = 0;      ///< plans computed
  std::uint64_t hits = 0;       ///< requests served at their planned offset
  std::uint64_t idle_fits = 0;  ///< mismatched requests placed in an idle interval of the plan
  std::uint64_t fallbacks = 0;  ///< requests served by the online allocator in planned steps
  std::uint64_t recorded = 0;   ///< requests served by the online allocator while recording
  std::uint64_t cross_stream_waits = 0;  ///< arena reuses ordered by an event
};

/// See the file comment. Thread-safe (one lock).
class PlannedAllocator final : public Allocator {
 public:
  explicit PlannedAllocator(Device& device, PlannedOptions options = {});
  ~PlannedAllocator() override;

  void* allocate(std::size_t bytes, Stream stream) override;
  void deallocate(void* ptr, Stream stream) override;
  void record_stream(void* ptr, Stream stream) override;
  /// Returns the fallback's cached segments (the arena stays mapped).
  void empty_cache() override;
  /// The fallback's statistics (the arena is in `arena_bytes()` and `reserved_bytes()`).
  Stats stats() const override;
  /// The fallback's reserved bytes plus the arena's.
  std::size_t reserved_bytes() const noexcept override;
  void reset_peak_stats() override;
  /// The fallback's segments and blocks (the arena is not listed).
  Snapshot snapshot() const override;
  int device_index() const noexcept override;
  std::string name() const override { return "planned"; }

  /// Ends a step: a recording step is planned; a planned step counts toward replanning if it
  /// had mismatches.
  void end_step();
  /// Plans the whole of `trace` ahead of time, as one step, instead of recording it: its
  /// allocations (the blocks live before the window first, in address order, then the events)
  /// are matched by index and size, on whatever streams the caller maps the trace's to (arena
  /// reuse across streams is still ordered by events). Allocations never freed are left to the
  /// fallback. Call before the first allocation. This is how the replay's `planned` policy
  /// serves lifetime lists, whose future is known.
  void plan_ahead(const trace::Trace& trace);
  /// Whether later requests are served from a plan.
  bool planned() const;
  /// Bytes of the arena (0 before the first plan).
  std::size_t arena_bytes() const;
  PlannedCounters counters() const;
  /// The online allocator, e.g. for its check().
  CachingAllocator& fallback() { return fallback_; }
  /// Verifies that no two occupied arena ranges overlap and the counters add up; throws
  /// `InvariantViolation` naming the problem. Also runs the fallback's check().
  void check() const override;

 private:
  struct Request;
  struct Arena;
  struct Live {
    std::uint64_t offset = 0;
    std::uint64_t end = 0;
    std::vector<Stream> users;  ///< the allocating stream, then record_stream's
  };

  void* allocate_planned(std::size_t bytes, Stream stream);
  bool range_free(std::uint64_t offset, std::uint64_t end) const;
  void* occupy(std::uint64_t offset, std::uint64_t end, Stream stream);
  bool idle_fit(std::uint64_t size, std::uint64_t* offset) const;
  void order_after_previous_users(std::uint64_t offset, std::uint64_t end, Stream stream);
  void wait_for(Stream user, Stream stream);
  void finish_recording();
  void release_arena();

  Device& device_;
  PlannedOptions options_;
  CachingAllocator fallback_;
  mutable std::mutex mutex_;
  std::vector<Request> recording_;
  std::unordered_map<void*, std::size_t> recording_live_;  ///< fallback ptr -> request index
  std::unique_ptr<Arena> arena_;
  std::vector<Request> plan_;
  std::map<std::uint64_t, Live> live_;  ///< occupied arena ranges by offset
  /// Freed arena ranges and the stream whose work last used them: (offset, end, stream).
  /// Kept only once several streams use the arena (see order_after_previous_users).
  std::vector<std::pair<std::pair<std::uint64_t, std::uint64_t>, Stream>> last_users_;
  std::vector<Stream> arena_streams_;  ///< every stream that has used the arena since it was mapped
  Event event_{};
  bool have_event_ = false;
  bool recording_step_ = true;
  std::size_t position_ = 0;      ///< events (allocations and frees) so far in this step
  std::size_t next_request_ = 0;  ///< allocations so far in this step
  bool step_mismatched_ = false;
  unsigned mismatched_steps_ = 0;
  PlannedCounters counters_;
};

}  // namespace cistern::plan
