// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Replay on a given device (replay/device_replay.hpp), the engine of `cistern replay --backend
// cuda`, run here on a SimDevice: it must measure what the engine's own replay measures, write
// every allocation when asked, leave the device as it found it, and report failures as rows.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"
#include "replay/device_replay.hpp"
#include "replay/engine.hpp"
#include "trace/trace.hpp"

namespace cistern::replay {
namespace {

using trace::Op;

trace::Event alloc(std::uint64_t id, std::uint64_t size, std::uint32_t stream = 0) {
  trace::Event e;
  e.op = Op::alloc;
  e.id = id;
  e.size = size;
  e.stream = stream;
  return e;
}

trace::Event free_of(std::uint64_t id, std::uint32_t stream = 0) {
  trace::Event e;
  e.op = Op::free;
  e.id = id;
  e.stream = stream;
  return e;
}

/// Two streams, a block live before the window, cross-sized allocations, one left live at the
/// end, and an empty_cache() in the middle.
trace::Trace small_trace() {
  trace::Trace t;
  t.source = "small.trace";
  t.format = "cistern";
  t.streams = {0, 0x77};
  t.live_before.push_back(trace::LiveBlock{100, 3 * MiB, 0, 0});
  t.events = {alloc(1, 512), alloc(2, 5 * MiB, 1), free_of(1),   alloc(3, 700 * KiB),
              free_of(2, 1), alloc(4, 20 * MiB),   free_of(100), free_of(3)};
  trace::Event empty;
  empty.op = Op::empty_cache;
  t.events.push_back(empty);
  t.events.push_back(alloc(5, 1 * MiB, 1));
  for (std::size_t i = 0; i < t.events.size(); ++i) t.events[i].time = static_cast<std::int64_t>(i);
  return t;
}

struct Recorder {
  std::vector<Stream> created;
  std::vector<Stream> destroyed;
  std::uint64_t touched = 0;
  std::size_t touches = 0;
  int finished = 0;
};

DeviceHooks hooks_over(SimDevice& sim, Recorder& rec, bool touch) {
  DeviceHooks hooks;
  hooks.create_stream = [&sim, &rec] {
    rec.created.push_back(sim.create_stream());
    return rec.created.back();
  };
  hooks.destroy_stream = [&rec](Stream s) { rec.destroyed.push_back(s); };
  if (touch) {
    hooks.touch = [&rec](void*, std::size_t bytes, Stream) {
      rec.touched += bytes;
      ++rec.touches;
    };
  }
  hooks.finish = [&rec] { ++rec.finished; };
  return hooks;
}

SimDeviceOptions sim_of(std::size_t capacity) {
  SimDeviceOptions o;
  o.capacity = capacity;
  return o;
}

TEST(DeviceReplay, MeasuresWhatTheEnginesReplayMeasures) {
  const trace::Trace t = small_trace();
  for (const char* name : {"cistern", "torch", "nocache"}) {
    SCOPED_TRACE(name);
    const Policy policy = Policy::parse(name);
    Options options;
    options.capacity = 1 * GiB;
    const Result engine = run(t, policy, options);
    ASSERT_TRUE(engine.error.empty()) << engine.error;

    SimDevice sim(sim_of(1 * GiB));
    Recorder rec;
    const DeviceResult d = run_on_device(t, policy, sim, hooks_over(sim, rec, true), options);
    ASSERT_TRUE(d.result.error.empty()) << d.result.error;
    EXPECT_EQ(d.device, sim.name());
    EXPECT_EQ(d.result.policy, name);
    EXPECT_EQ(d.result.start, "cold");
    EXPECT_EQ(d.result.capacity, 1 * GiB);
    EXPECT_EQ(d.result.peak_live, engine.peak_live);
    EXPECT_EQ(d.result.peak_live, 23 * MiB + 700 * KiB);  // live-before 3 MiB + 20 MiB + 700 KiB
    EXPECT_EQ(d.result.peak_reserved, engine.peak_reserved);
    EXPECT_EQ(d.result.ooms, 0u);
    EXPECT_EQ(d.result.device_allocs, engine.device_allocs);
    EXPECT_EQ(d.result.device_frees, engine.device_frees);
    EXPECT_DOUBLE_EQ(*d.result.device_ms, *engine.device_ms);
    EXPECT_TRUE(d.result.ns_per_op.has_value());
    EXPECT_TRUE(d.allocator_ns_per_op.has_value());
    EXPECT_EQ(d.touched_bytes, 3 * MiB + 512 + 5 * MiB + 700 * KiB + 20 * MiB + 1 * MiB);
    EXPECT_EQ(rec.touched, d.touched_bytes);
    EXPECT_EQ(rec.touches, 6u);  // the live-before block and five allocations
    // One stream made for the recorded stream 0x77 and given back; stream 0 is the default.
    ASSERT_EQ(rec.created.size(), 1u);
    EXPECT_EQ(rec.destroyed, rec.created);
    EXPECT_EQ(rec.finished, 1);
    // Everything returned: the device is as the replay found it.
    EXPECT_EQ(sim.used_bytes(), 0u);
  }
}

TEST(DeviceReplay, WithoutTouchNothingIsWritten) {
  const trace::Trace t = small_trace();
  SimDevice sim(sim_of(1 * GiB));
  Recorder rec;
  const DeviceResult d =
      run_on_device(t, Policy::parse("cistern"), sim, hooks_over(sim, rec, false), Options{});
  ASSERT_TRUE(d.result.error.empty()) << d.result.error;
  EXPECT_EQ(d.touched_bytes, 0u);
  EXPECT_EQ(rec.touches, 0u);
}

// Classic segments (one device allocation each): the layout below is PyTorch's.
constexpr const char* kClassic = "cistern:vmm=false";

TEST(DeviceReplay, OutOfMemoryOnTheDeviceIsCounted) {
  const trace::Trace t = small_trace();
  // Blocks of 1 to 10 MiB take 20 MiB segments, one per stream: the 3 MiB block's (stream 0)
  // and a 2 MiB small segment leave no room for the 5 MiB block's on stream 1, nor for 20 MiB.
  SimDevice sim(sim_of(40 * MiB));
  Options options;
  options.capacity = 40 * MiB;
  Recorder rec;
  const DeviceResult d =
      run_on_device(t, Policy::parse(kClassic), sim, hooks_over(sim, rec, true), options);
  ASSERT_TRUE(d.result.error.empty()) << d.result.error;
  EXPECT_EQ(d.result.ooms, 2u);
  EXPECT_EQ(run(t, Policy::parse(kClassic), options).ooms, 2u);
  EXPECT_EQ(d.result.capacity, 40 * MiB);
  EXPECT_EQ(d.touched_bytes, 3 * MiB + 512 + 700 * KiB + 1 * MiB);
  EXPECT_EQ(sim.used_bytes(), 0u);
}

TEST(DeviceReplay, AFailingWriteIsAnErrorRowAndTheDeviceIsLeftClean) {
  const trace::Trace t = small_trace();
  SimDevice sim(sim_of(1 * GiB));
  Recorder rec;
  DeviceHooks hooks = hooks_over(sim, rec, true);
  int writes = 0;
  hooks.touch = [&writes](void*, std::size_t, Stream) {
    if (++writes == 3) throw Error("cudaMemsetAsync (--touch) failed: cudaErrorIllegalAddress");
  };
  const DeviceResult d = run_on_device(t, Policy::parse("cistern"), sim, hooks, Options{});
  EXPECT_EQ(d.result.error,
            "events[1] (alloc of id 2, 5242880 bytes): cudaMemsetAsync (--touch) failed: "
            "cudaErrorIllegalAddress");
  EXPECT_FALSE(d.result.peak_reserved.has_value());
  EXPECT_EQ(sim.used_bytes(), 0u);
  EXPECT_EQ(rec.destroyed, rec.created);
}

TEST(DeviceReplay, ATraceThatCannotBeReplayedIsAnErrorRow) {
  trace::Trace t = small_trace();
  t.events.push_back(free_of(999));
  SimDevice sim(sim_of(1 * GiB));
  Recorder rec;
  const DeviceResult d =
      run_on_device(t, Policy::parse("cistern"), sim, hooks_over(sim, rec, false), Options{});
  EXPECT_FALSE(d.result.error.empty());
  EXPECT_TRUE(rec.created.empty()) << "nothing runs for a trace that does not compile";
}

TEST(DeviceReplay, AWarmStartIsRefused) {
  SimDevice sim(sim_of(1 * GiB));
  Recorder rec;
  Options options;
  options.start = Start::warm;
  EXPECT_THROW(run_on_device(small_trace(), Policy::parse("torch"), sim,
                             hooks_over(sim, rec, false), options),
               InvalidArgument);
}

}  // namespace
}  // namespace cistern::replay
