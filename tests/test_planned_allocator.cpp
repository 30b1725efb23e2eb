// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Plan mode (src/plan/planned_allocator): a recorded step is served from its plan with no device
// calls; steps that deviate (another size, an extra request, a missing one, a second stream) are
// served correctly - no two live allocations overlap, checked by an oracle here - with check()
// after every step; repeated mismatches lead to a new plan; cross-stream reuse waits for events.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"
#include "plan/planned_allocator.hpp"
#include "replay/engine.hpp"
#include "trace/readers.hpp"

namespace {

using cistern::MiB;
using cistern::SimDevice;
using cistern::Stream;
using cistern::plan::PlannedAllocator;
using cistern::plan::PlannedOptions;

/// One operation of a step: allocate request k (size, stream) or free it.
struct Op {
  bool alloc;
  int k;
  std::size_t size = 0;
  Stream stream{};
};

/// A step shaped like a forward and backward pass: activations kept for the backward pass,
/// temporaries freed at once, gradients freed in reverse.
std::vector<Op> training_step(Stream s) {
  std::vector<Op> ops;
  const std::size_t sizes[] = {8 * MiB, 3 * MiB, 12 * MiB, 5 * MiB, 700 * 1024, 9 * MiB};
  int k = 0;
  std::vector<int> activations;
  for (const std::size_t size : sizes) {
    ops.push_back({true, k, size, s});
    ops.push_back({true, k + 1, size / 2 + 4096, s});  // a temporary
    ops.push_back({false, k + 1});
    activations.push_back(k);
    k += 2;
  }
  while (!activations.empty()) {
    ops.push_back({true, k, 2 * MiB + 512, s});  // a gradient
    ops.push_back({false, activations.back()});
    ops.push_back({false, k});
    activations.pop_back();
    ++k;
  }
  return ops;
}

/// Runs steps against the allocator, checking that live allocations never overlap.
class Runner {
 public:
  explicit Runner(PlannedAllocator& alloc) : alloc_(alloc) {}

  /// The largest live total (sizes rounded to 512) of any step run so far.
  std::size_t peak_live() const { return peak_live_; }

  void run(const std::vector<Op>& ops) {
    std::map<int, std::pair<char*, std::size_t>> live;
    std::size_t live_bytes = 0;
    for (const Op& op : ops) {
      if (op.alloc) {
        auto* p = static_cast<char*>(alloc_.allocate(op.size, op.stream));
        ASSERT_NE(p, nullptr);
        for (const auto& [k, range] : live) {
          const bool apart = p + op.size <= range.first || range.first + range.second <= p;
          ASSERT_TRUE(apart) << "request " << op.k << " overlaps live request " << k;
        }
        live[op.k] = {p, op.size};
        live_bytes += (op.size + 511) / 512 * 512;
        peak_live_ = std::max(peak_live_, live_bytes);
        streams_[op.k] = op.stream;
      } else {
        live_bytes -= (live.at(op.k).second + 511) / 512 * 512;
        alloc_.deallocate(live.at(op.k).first, streams_.at(op.k));
        live.erase(op.k);
      }
      alloc_.check();
    }
    ASSERT_TRUE(live.empty()) << "a step of this test frees everything it allocates";
    alloc_.end_step();
    alloc_.check();
  }

 private:
  PlannedAllocator& alloc_;
  std::map<int, Stream> streams_;
  std::size_t peak_live_ = 0;
};

PlannedOptions quick() {
  PlannedOptions options;
  options.node_limit = 2000;
  return options;
}

std::uint64_t device_calls(const SimDevice& device) {
  std::uint64_t calls = 0;
  for (const std::uint64_t c : device.counters().calls) calls += c;
  return calls;
}

TEST(PlannedAllocator, RepeatedStepsAreServedFromThePlanWithoutDeviceCalls) {
  SimDevice device;
  PlannedAllocator alloc(device, quick());
  Runner runner(alloc);
  const std::vector<Op> step = training_step(Stream{});
  runner.run(step);
  ASSERT_TRUE(alloc.planned());
  EXPECT_GT(alloc.arena_bytes(), 0u);
  const std::uint64_t calls = device_calls(device);
  for (int i = 0; i < 3; ++i) runner.run(step);
  EXPECT_EQ(device_calls(device), calls) << "a planned step made device calls";
  const auto c = alloc.counters();
  EXPECT_EQ(c.plans, 1u);
  EXPECT_EQ(c.hits, 3 * (c.recorded));
  EXPECT_EQ(c.fallbacks + c.idle_fits, 0u);
  // The plan reaches the lower bound: the step's peak of live bytes (rounded to 512).
  EXPECT_EQ(alloc.arena_bytes(), runner.peak_live());
}

TEST(PlannedAllocator, ADifferentSizeIsServedOutsideItsPlannedRange) {
  SimDevice device;
  PlannedAllocator alloc(device, quick());
  Runner runner(alloc);
  const std::vector<Op> step = training_step(Stream{});
  runner.run(step);
  std::vector<Op> changed = step;
  changed[3].size = 30 * MiB;  // request 2: larger than planned
  runner.run(changed);
  const auto c = alloc.counters();
  EXPECT_GE(c.fallbacks + c.idle_fits, 1u);
  EXPECT_EQ(c.hits + c.fallbacks + c.idle_fits, c.recorded);
}

TEST(PlannedAllocator, AnExtraAndAMissingRequestAreServed) {
  SimDevice device;
  PlannedAllocator alloc(device, quick());
  Runner runner(alloc);
  const std::vector<Op> step = training_step(Stream{});
  runner.run(step);
  std::vector<Op> extra = step;
  extra.insert(extra.begin() + 2, Op{true, 100, 1 * MiB, Stream{}});
  extra.push_back(Op{false, 100});
  extra.push_back(Op{true, 101, 64 * MiB, Stream{}});  // beyond the plan, larger than the arena
  extra.push_back(Op{false, 101});
  runner.run(extra);
  std::vector<Op> missing;
  for (const Op& op : step) {
    if (op.k != 1) missing.push_back(op);  // the first temporary is never allocated
  }
  runner.run(missing);
  runner.run(step);
  const auto c = alloc.counters();
  EXPECT_GE(c.fallbacks, 1u);
  EXPECT_GT(c.hits, 0u);
}

TEST(PlannedAllocator, ASecondStreamIsServedAndOrderedByEvents) {
  SimDevice device;
  const Stream s1 = device.create_stream();
  const Stream s2 = device.create_stream();
  PlannedAllocator alloc(device, quick());
  Runner runner(alloc);
  runner.run(training_step(s1));
  // The same step on another stream: nothing matches the recorded stream.
  runner.run(training_step(s2));
  EXPECT_GT(alloc.counters().fallbacks + alloc.counters().idle_fits, 0u);

  // A recorded step over two streams: request 1 (s2) reuses request 0's range (s1).
  PlannedAllocator two(device, quick());
  const std::vector<Op> step = {
      {true, 0, 4 * MiB, s1}, {false, 0}, {true, 1, 4 * MiB, s2}, {false, 1}};
  Runner r2(two);
  r2.run(step);
  void* a = two.allocate(4 * MiB, s1);
  device.launch(s1, 1'000'000);  // work that uses `a`
  two.deallocate(a, s1);
  void* b = two.allocate(4 * MiB, s2);
  EXPECT_EQ(a, b) << "the plan puts both at one offset";
  EXPECT_EQ(two.counters().cross_stream_waits, 1u);
  device.launch(s2, 0);  // ordered after s1's work by the event
  EXPECT_GE(device.stream_done_at(s2), device.stream_done_at(s1));
  two.deallocate(b, s2);
  two.end_step();
  two.check();
}

TEST(PlannedAllocator, RecordStreamMakesTheNextUserWaitForTheExtraStream) {
  SimDevice device;
  const Stream s1 = device.create_stream();
  const Stream s2 = device.create_stream();
  PlannedAllocator alloc(device, quick());
  Runner runner(alloc);
  const std::vector<Op> step = {
      {true, 0, 4 * MiB, s1}, {false, 0}, {true, 1, 4 * MiB, s1}, {false, 1}};
  runner.run(step);
  void* a = alloc.allocate(4 * MiB, s1);
  alloc.record_stream(a, s2);
  device.launch(s2, 5'000'000);  // s2 still reads `a`
  alloc.deallocate(a, s1);
  EXPECT_EQ(alloc.counters().cross_stream_waits, 0u);
  void* b = alloc.allocate(4 * MiB, s1);
  EXPECT_EQ(a, b);
  EXPECT_EQ(alloc.counters().cross_stream_waits, 1u) << "s1 must wait for s2's use of the range";
  device.launch(s1, 0);
  EXPECT_GE(device.stream_done_at(s1), device.stream_done_at(s2));
  alloc.deallocate(b, s1);
  alloc.end_step();
  alloc.check();
}

TEST(PlannedAllocator, RepeatedMismatchesLeadToANewPlan) {
  SimDevice device;
  PlannedAllocator alloc(device, quick());
  Runner runner(alloc);
  runner.run(training_step(Stream{}));
  std::vector<Op> bigger = training_step(Stream{});
  for (Op& op : bigger) op.size *= 2;
  runner.run(bigger);  // mismatches: 1
  runner.run(bigger);  // mismatches: 2 -> the next step is recorded
  runner.run(bigger);  // recorded and planned
  EXPECT_EQ(alloc.counters().plans, 2u);
  const std::uint64_t hits = alloc.counters().hits;
  const std::uint64_t calls = device_calls(device);
  runner.run(bigger);
  EXPECT_EQ(alloc.counters().hits, hits + bigger.size() / 2);
  EXPECT_EQ(device_calls(device), calls);
}

TEST(PlannedAllocator, AnAllocationThatOutlivesItsStepIsNoMismatch) {
  // Each step keeps one allocation past its end (a loss, a metric) and frees the previous
  // step's at its start: recorded as living on, it goes to the fallback in every step, which is
  // what the plan expects - no mismatch, no replanning.
  SimDevice device;
  PlannedAllocator alloc(device, quick());
  void* kept = nullptr;
  for (int step = 0; step < 5; ++step) {
    if (kept != nullptr) alloc.deallocate(kept, Stream{});
    void* a = alloc.allocate(3 * MiB, Stream{});
    kept = alloc.allocate(4096, Stream{});
    alloc.deallocate(a, Stream{});
    alloc.check();
    alloc.end_step();
    alloc.check();
  }
  const auto c = alloc.counters();
  EXPECT_EQ(c.plans, 1u);
  EXPECT_EQ(c.hits, 4u);
  EXPECT_EQ(c.fallbacks, 4u);
  EXPECT_EQ(c.idle_fits, 0u);
  alloc.deallocate(kept, Stream{});
  alloc.check();
}

TEST(PlannedAllocator, ForeignPointersAreRefused) {
  SimDevice device;
  PlannedAllocator alloc(device, quick());
  Runner runner(alloc);
  runner.run(training_step(Stream{}));
  void* p = alloc.allocate(8 * MiB, Stream{});
  EXPECT_THROW(alloc.deallocate(static_cast<char*>(p) + 512, Stream{}), cistern::InvalidPointer);
  alloc.deallocate(p, Stream{});
  EXPECT_THROW(alloc.deallocate(p, Stream{}), cistern::InvalidPointer);
  alloc.check();
}

}  // namespace

// ---- the replay's planned policy ----------------------------------------------------------------

namespace {

TEST(PlannedPolicy, PlansALifetimeListAheadAndServesItFromTheArena) {
  // 3 MiB buffers, at most three live together: the arena is 9 MiB, mapped as 10 MiB of pages.
  const std::string csv =
      "id,lower,upper,size\n"
      "a,0,4,3145728\n"
      "b,1,3,3145728\n"
      "c,2,6,3145728\n"
      "d,3,5,3145728\n"
      "e,5,7,3145728\n";
  const cistern::trace::Trace trace = cistern::trace::read_trace_bytes(csv, "list.csv");
  const cistern::replay::Policy planned = cistern::replay::Policy::parse("planned");
  const cistern::replay::Result r = cistern::replay::run(trace, planned, {});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.peak_live, 9u * MiB);
  EXPECT_EQ(r.peak_reserved, std::optional<std::uint64_t>(10 * MiB));
  EXPECT_EQ(r.device_allocs, 0u) << "no segment: the arena is mapped once";
  EXPECT_EQ(r.device_maps, 1u);
  EXPECT_EQ(r.ooms, 0u);
}

/// A snapshot-like trace in cistern's format: two blocks live before the window (one freed in it,
/// one never), a second stream, 12 MiB live at the peak.
const char* const kTwoStreamStep =
    "# cistern-trace v1\n"
    "format pytorch\n"
    "stream 0x0\n"
    "stream 0x7\n"
    "live 0 4194304 0 0x100000000\n"
    "live 1 2097152 0 0x100400000\n"
    "a 2 6291456 0\n"
    "f 1 0\n"
    "a 3 2097152 1\n"
    "f 2 0\n"
    "a 4 4194304 1\n"
    "f 3 1\n"
    "f 4 1\n";

cistern::replay::Result replay_planned(const std::string& text, std::size_t repeat) {
  const cistern::trace::Trace trace = cistern::trace::read_trace_bytes(text, "step.trace");
  cistern::replay::Options options;
  options.repeat = repeat;
  options.check_invariants = true;  // plan mode's check() after every event
  return cistern::replay::run(trace, cistern::replay::Policy::parse("planned"), options);
}

TEST(PlannedPolicy, LearnsTheFirstPassOfASnapshotAndServesTheOthersFromThePlan) {
  const cistern::replay::Result r = replay_planned(kTwoStreamStep, 3);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.peak_live, 12 * MiB);
  EXPECT_EQ(r.ooms, 0u);
  ASSERT_EQ(r.passes.size(), 3u);
  // Pass 1: the online allocator, recorded (the two live blocks and three allocations).
  EXPECT_TRUE(r.passes[0].planned);
  EXPECT_EQ(r.passes[0].recorded, 5u);
  EXPECT_EQ(r.passes[0].plan_hits, 0u);
  for (std::size_t i = 1; i < 3; ++i) {
    SCOPED_TRACE(i);
    const cistern::replay::PassResult& p = r.passes[i];
    // Every allocation, the blocks live before the window among them, at its planned offset.
    EXPECT_EQ(p.recorded, 0u);
    EXPECT_EQ(p.plan_hits, 5u);
    EXPECT_EQ(p.idle_fits + p.fallbacks, 0u);
    // The plan reaches the peak live: one 12 MiB arena of pages, mapped at the end of pass 1.
    EXPECT_EQ(p.peak_reserved, 12 * MiB);
    EXPECT_EQ(p.device_allocs + p.device_frees + p.maps + p.unmaps, 0u);
  }
}

TEST(PlannedPolicy, OneStreamPassesAfterTheFirstMakeNoDeviceCallAtAll) {
  // The step above on one stream: no cross-stream reuse to order, so no event either.
  std::string text = kTwoStreamStep;
  for (const char* from : {"a 3 2097152 1", "a 4 4194304 1", "f 3 1", "f 4 1"}) {
    std::string to = from;
    to.back() = '0';
    text.replace(text.find(from), to.size(), to);
  }
  const cistern::replay::Result r = replay_planned(text, 3);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.passes.size(), 3u);
  EXPECT_GT(r.passes[0].device_calls, 0u);
  for (std::size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(r.passes[i].device_calls, 0u) << "pass " << i + 1;
    EXPECT_EQ(r.passes[i].plan_hits, 5u) << "pass " << i + 1;
    EXPECT_EQ(r.passes[i].peak_reserved, 12 * MiB) << "pass " << i + 1;
  }
}

TEST(PlannedPolicy, ASinglePassIsServedOnline) {
  const cistern::replay::Result r = replay_planned(kTwoStreamStep, 1);
  ASSERT_EQ(r.error, "");
  EXPECT_TRUE(r.passes.empty());
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_GE(r.peak_reserved.value_or(0), 12 * MiB);
}

TEST(PlannedPolicy, PlanAheadServesEveryAllocationOfTheListFromThePlan) {
  const std::string csv = "id,lower,upper,size\nb1,0,3,4096\nb2,3,9,4096\nb3,0,9,4096\n";
  const cistern::trace::Trace trace = cistern::trace::read_trace_bytes(csv, "list.csv");
  SimDevice device;
  PlannedAllocator alloc(device, quick());
  alloc.plan_ahead(trace);
  EXPECT_EQ(alloc.arena_bytes(), 2 * 4096u);
  void* b1 = alloc.allocate(4096, Stream{});
  void* b3 = alloc.allocate(4096, Stream{});
  alloc.deallocate(b1, Stream{});
  void* b2 = alloc.allocate(4096, Stream{});
  EXPECT_EQ(b1, b2);
  alloc.deallocate(b2, Stream{});
  alloc.deallocate(b3, Stream{});
  EXPECT_EQ(alloc.counters().hits, 3u);
  alloc.check();
  EXPECT_THROW(alloc.plan_ahead(trace), cistern::InvalidArgument);
}

}  // namespace
