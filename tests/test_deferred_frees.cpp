// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Frees that PyTorch completed later than the program requested them (`record_stream` users on
// other streams; `trace.recorded.deferred_frees`), replayed through the engine: the block gets a
// use on a program stream whose work lasts until the recorded completion (replay/
// deferred_frees.hpp), and each policy waits for it its own way. Hand-built traces whose figures
// follow from PyTorch's size rules: requests of 30 MiB get segments of their own (30 MiB, a
// multiple of 2 MiB), and a cached 30 MiB block serves the next 30 MiB request on its stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cistern/sim_device.hpp"
#include "replay/engine.hpp"
#include "replay/plan.hpp"
#include "replay/replayer.hpp"
#include "trace/trace.hpp"

namespace cistern::replay {
namespace {

constexpr std::uint64_t kBlock = 40 * MiB;  // two whole pages of the engine's grid

/// Builds a two-stream trace whose allocations are all `kBlock` bytes on stream 1.
class Builder {
 public:
  Builder() {
    t_.source = "hand-built";
    t_.format = "pytorch";
    t_.streams = {0, 0x51};
  }
  Builder& alloc(std::uint64_t id) {
    return add({trace::Op::alloc, 1, id, kBlock, 0, static_cast<std::int64_t>(now())});
  }
  /// A free; `completes_before` > its own index: PyTorch completed it just before that event.
  Builder& free(std::uint64_t id, std::size_t completes_before = 0) {
    if (completes_before != 0) {
      t_.recorded.deferred_frees.push_back({id, completes_before, 0});
    }
    return add({trace::Op::free, 1, id, kBlock, 0, static_cast<std::int64_t>(now())});
  }
  trace::Trace build() {
    std::sort(t_.recorded.deferred_frees.begin(), t_.recorded.deferred_frees.end(),
              [](const auto& a, const auto& b) { return a.before_event < b.before_event; });
    t_.check();
    return t_;
  }
  std::size_t now() const { return t_.events.size(); }

 private:
  Builder& add(const trace::Event& e) {
    t_.events.push_back(e);
    return *this;
  }
  trace::Trace t_;
};

Result replay(const trace::Trace& t, const std::string& policy, std::uint64_t capacity = 80 * GiB) {
  Options options;
  options.capacity = capacity;
  options.check_invariants = true;
  const Result r = run(t, Policy::parse(policy), options);
  EXPECT_EQ(r.error, "") << policy;
  return r;
}

/// A freed at 1 (completing before `completes_before`, or at once for 0); B allocated at 2 and
/// freed at 3; C allocated at 4.
trace::Trace one_late_free(std::size_t completes_before) {
  return Builder().alloc(0).free(0, completes_before).alloc(1).free(1).alloc(2).build();
}

TEST(DeferredFrees, ABlockIsReusedOnlyFromItsRecordedCompletion) {
  // At once: B and C reuse A's block. Completed before event 2 (B's allocation, whose
  // process_events sees it): the same. Completed before event 4: B needs a second segment.
  for (const char* policy : {"torch", "cistern"}) {
    SCOPED_TRACE(policy);
    const Result at_once = replay(one_late_free(0), policy);
    EXPECT_EQ(at_once.peak_reserved, kBlock);
    const Result at_b = replay(one_late_free(2), policy);
    EXPECT_EQ(at_b.peak_reserved, kBlock);
    const Result at_c = replay(one_late_free(4), policy);
    EXPECT_EQ(at_c.peak_reserved, 2 * kBlock);
    EXPECT_EQ(at_c.ooms, 0U);
  }
  // torch: C is served from the cache (A's or B's block), no third segment.
  EXPECT_EQ(replay(one_late_free(4), "torch").device_allocs, 2U);
}

TEST(DeferredFrees, OutOfMemoryWaitsForThePendingFreeFirst) {
  // On a device with room for one block, B's miss makes PyTorch synchronize the events and
  // free the cache (synchronize_and_free_events, release_cached_blocks), then retry: A's segment
  // goes back and B gets a new one. No allocation fails.
  const Result r = replay(one_late_free(4), "torch", 48 * MiB);
  EXPECT_EQ(r.ooms, 0U);
  EXPECT_EQ(r.peak_reserved, kBlock);
  EXPECT_EQ(r.device_allocs, 2U);
  EXPECT_EQ(r.device_frees, 1U);
}

TEST(DeferredFrees, UsesCompletingOutOfOrderDoNotWaitForEachOther) {
  // A freed at 2 completes before 7; B freed at 3 completes before 5 - earlier, though made
  // later. C (4) needs a third segment; D (5) takes B's block; E (6) needs a fourth; F (7)
  // takes A's. Had B's use waited behind A's, D and E would have needed new segments: five.
  Builder b;
  b.alloc(0).alloc(1).free(0, 7).free(1, 5).alloc(2).alloc(3).alloc(4).alloc(5);
  const trace::Trace t = b.build();
  const Result torch = replay(t, "torch");
  EXPECT_EQ(torch.peak_reserved, 4 * kBlock);
  EXPECT_EQ(torch.device_allocs, 4U);
  const Result cistern = replay(t, "cistern");
  EXPECT_EQ(cistern.peak_reserved, 4 * kBlock);
}

TEST(DeferredFrees, AFreeStillPendingAtTheEndShowsAsPendingFree) {
  // A's free completes after the last event (PyTorch's snapshot showed it active_pending_free).
  const trace::Trace t = Builder().alloc(0).alloc(1).free(0, 3).build();
  const detail::Plan plan = detail::compile(t);
  Options options;
  detail::Replayer replayer(t, plan, Policy::parse("torch"), options, options.capacity);
  replayer.start(false);
  replayer.replay(plan.steps.size(), false, nullptr);
  std::map<std::string, int> states;
  for (const SegmentInfo& segment : replayer.allocator().snapshot().segments) {
    for (const BlockInfo& block : segment.blocks) ++states[to_string(block.state)];
  }
  EXPECT_EQ(states["active_pending_free"], 1);
  EXPECT_EQ(states["active_allocated"], 1);
  EXPECT_EQ(replayer.measures().peak_reserved, 2 * kBlock);
}

}  // namespace
}  // namespace cistern::replay
