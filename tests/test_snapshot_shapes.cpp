// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The snapshot shapes the shared snapshots do not show, each built here with the project's
// PyTorch snapshot writer and replayed warm on the torch emulation: a window that opens with
// PyTorch's `empty_cache()` (segment_free events first), a release in the middle of the window
// without an out-of-memory, an `oom` event after a release, and events on two devices. For each,
// the exact addresses of every allocation, the reserved bytes after every event and the engine's
// figures (peak reserved, segment frees) are those PyTorch recorded.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cistern/pytorch_snapshot.hpp"
#include "cistern/sim_device.hpp"
#include "replay/engine.hpp"
#include "replay/torch_allocator.hpp"
#include "replay/warm_start.hpp"
#include "trace/readers.hpp"
#include "trace_test_util.hpp"

namespace cistern::replay {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::uintptr_t kSegA = 0x7f0000000000;  // 20 MiB, held throughout
constexpr std::uintptr_t kSegB = 0x7f0002000000;  // 20 MiB, released when the window opens
constexpr std::uintptr_t kSegC = 0x7f0004000000;  // 2 MiB small, released when the window opens
constexpr std::uintptr_t kSegD = 0x7f0006000000;  // 30 MiB, allocated then released mid-window
constexpr std::uintptr_t kSegE = 0x7f0008000000;  // 2 MiB small, allocated after the release

using Action = HistoryEntry::Action;

HistoryEntry entry(Action action, std::uintptr_t addr, std::size_t size) {
  HistoryEntry e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  return e;
}

BlockInfo block(std::uintptr_t address, std::size_t size, std::size_t requested) {
  BlockInfo b;
  b.address = address;
  b.size = size;
  b.requested_size = requested;
  b.state = requested == 0 ? BlockState::inactive : BlockState::active_allocated;
  return b;
}

SegmentInfo segment(int device, std::uintptr_t address, std::size_t size, bool large,
                    std::vector<BlockInfo> blocks) {
  SegmentInfo s;
  s.device = device;
  s.address = address;
  s.total_size = size;
  s.is_large = large;
  s.blocks = std::move(blocks);
  return s;
}

/// The window of device `device`, as PyTorch writes it:
///   empty_cache() on entry: segment_free B (20 MiB), segment_free C (2 MiB small);
///   alloc 8 MiB in A after a 4 MiB block live throughout; free it;
///   alloc 30 MiB: segment_alloc D; free it;
///   empty_cache(): segment_free D;
///   alloc 1000 B: segment_alloc E (small), placed at its start.
/// A keeps the live 4 MiB block, so no release can take it.
DeviceRecord release_window(int device, std::uintptr_t offset) {
  DeviceRecord record;
  record.device = device;
  record.history = {
      entry(Action::segment_free, kSegB + offset, 20 * MiB),
      entry(Action::segment_free, kSegC + offset, 2 * MiB),
      entry(Action::alloc, kSegA + offset + 4 * MiB, 8 * MiB),
      entry(Action::free_requested, kSegA + offset + 4 * MiB, 8 * MiB),
      entry(Action::free_completed, kSegA + offset + 4 * MiB, 8 * MiB),
      entry(Action::segment_alloc, kSegD + offset, 30 * MiB),
      entry(Action::alloc, kSegD + offset, 30 * MiB),
      entry(Action::free_requested, kSegD + offset, 30 * MiB),
      entry(Action::free_completed, kSegD + offset, 30 * MiB),
      entry(Action::segment_free, kSegD + offset, 30 * MiB),
      entry(Action::segment_alloc, kSegE + offset, 2 * MiB),
      entry(Action::alloc, kSegE + offset, 1000),
  };
  for (std::size_t i = 0; i < record.history.size(); ++i) {
    record.history[i].time_us = 1000 + i;
    record.history[i].sequence = i;
  }
  record.snapshot.segments = {
      segment(
          device, kSegA + offset, 20 * MiB, true,
          {block(kSegA + offset, 4 * MiB, 4 * MiB), block(kSegA + offset + 4 * MiB, 16 * MiB, 0)}),
      segment(device, kSegE + offset, 2 * MiB, false,
              {block(kSegE + offset, 1024, 1000), block(kSegE + offset + 1024, 2 * MiB - 1024, 0)}),
  };
  return record;
}

trace::Trace read(const std::vector<DeviceRecord>& devices,
                  const trace::ReadOptions& options = {}) {
  return trace::read_trace_bytes(pytorch_snapshot_pickle(devices, Config{}), "shape.pickle",
                                 options);
}

/// What the emulation did, event by event: the address of every allocation and the reserved
/// bytes after every event (the warm start's first).
struct Steps {
  std::vector<std::uint64_t> addresses;
  std::vector<std::uint64_t> reserved;
};

/// Replays `t` warm on the emulation, checking its invariants after every event.
Steps replay_steps(const trace::Trace& t) {
  SimDeviceOptions options;
  options.capacity = std::size_t{1} << 40;
  SimDevice device(options);
  TorchAllocator alloc(device, recorded_config(t));
  const WarmStartResult warm = apply_warm_start(t, alloc, device);
  std::vector<void*> pointers(t.live_before.size() + t.events.size(), nullptr);
  for (const auto& [id, ptr] : warm.live) pointers.at(id) = ptr;
  Steps steps;
  steps.reserved.push_back(alloc.reserved_bytes());
  for (const trace::Event& e : t.events) {
    if (e.op == trace::Op::alloc) {
      pointers.at(e.id) = alloc.allocate(e.size, default_stream);
      steps.addresses.push_back(reinterpret_cast<std::uintptr_t>(pointers.at(e.id)));
    } else if (e.op == trace::Op::free) {
      alloc.deallocate(pointers.at(e.id), default_stream);
    } else if (e.op == trace::Op::empty_cache) {
      alloc.empty_cache();
    }
    alloc.check();
    steps.reserved.push_back(alloc.reserved_bytes());
  }
  return steps;
}

TEST(SnapshotShapes, ReleasesBecomeEmptyCacheCallsAtTheirPlace) {
  const trace::Trace t = read({release_window(0, 0)});
  using trace::Op;
  std::vector<Op> ops;
  for (const trace::Event& e : t.events) ops.push_back(e.op);
  const std::vector<Op> expected{Op::empty_cache, Op::alloc,       Op::free, Op::alloc,
                                 Op::free,        Op::empty_cache, Op::alloc};
  EXPECT_EQ(ops, expected);
  // The window opens with A, B and C held (42 MiB); the peak is A and D (50 MiB).
  ASSERT_EQ(t.recorded.initial_segments.size(), 3u);
  EXPECT_EQ(*t.recorded.initial_reserved, 42 * MiB);
  EXPECT_EQ(*t.recorded.peak_reserved, 50 * MiB);
  // Each release's segment events follow its empty_cache event.
  ASSERT_EQ(t.recorded.segment_events.size(), 5u);
  EXPECT_EQ(t.recorded.segment_events[0].before_event, 1u);
  EXPECT_EQ(t.recorded.segment_events[1].before_event, 1u);
  EXPECT_EQ(t.recorded.segment_events[3].before_event, 6u);
  EXPECT_TRUE(t.recorded.notes.empty()) << t.recorded.notes.front();
}

TEST(SnapshotShapes, EmulationReleasesWherePyTorchDid) {
  const trace::Trace t = read({release_window(0, 0)});
  const Steps steps = replay_steps(t);
  const std::vector<std::uint64_t> addresses{kSegA + 4 * MiB, kSegD, kSegE};
  EXPECT_EQ(steps.addresses, addresses);
  const std::vector<std::uint64_t> reserved{
      42 * MiB,  // warm start: A, B, C
      20 * MiB,  // empty_cache(): B and C go, A holds a live block
      20 * MiB, 20 * MiB,
      50 * MiB,  // segment_alloc D
      50 * MiB,
      20 * MiB,  // empty_cache(): D goes
      22 * MiB,  // segment_alloc E
  };
  EXPECT_EQ(steps.reserved, reserved);
}

TEST(SnapshotShapes, EngineMatchesRecordedFigures) {
  const trace::Trace t = read({release_window(0, 0)});
  Options options;
  options.start = Start::warm;
  options.check_invariants = true;
  const Result r = run(t, Policy::parse("torch"), options);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(*r.peak_reserved, *t.recorded.peak_reserved);
  EXPECT_EQ(r.device_allocs, 2u);  // D and E, as the recorded segment_alloc events
  EXPECT_EQ(r.device_frees, 3u);   // B, C and D, as the recorded segment_free events
}

TEST(SnapshotShapes, OomAfterAReleaseIsNotedAndTheReleaseReplayed) {
  DeviceRecord record = release_window(0, 0);
  // After the second release, an allocation of 60 GiB failed (PyTorch records the rounded
  // request and the device's free bytes), and the program went on.
  HistoryEntry oom = entry(Action::oom, 512 * MiB, std::size_t{60} << 30);
  record.history.insert(record.history.begin() + 10, oom);
  const trace::Trace t = read({record});
  ASSERT_EQ(t.recorded.ooms.size(), 1u);
  EXPECT_EQ(t.recorded.ooms[0].before_event, 6u);
  EXPECT_EQ(t.recorded.ooms[0].size, std::size_t{60} << 30);
  ASSERT_EQ(t.recorded.notes.size(), 1u);
  EXPECT_NE(t.recorded.notes[0].find("failed"), std::string::npos);
  EXPECT_EQ(replay_steps(t).reserved.back(), 22 * MiB);
}

TEST(SnapshotShapes, PartialReleasesAreNotedUnderMaxSplitSize) {
  Config config;
  config.max_split_size = 64 * MiB;
  const trace::Trace t = trace::read_trace_bytes(
      pytorch_snapshot_pickle({release_window(0, 0)}, config), "split.pickle");
  ASSERT_EQ(t.recorded.notes.size(), 1u);
  EXPECT_NE(t.recorded.notes[0].find("2 release(s)"), std::string::npos) << t.recorded.notes[0];
}

TEST(SnapshotShapes, EveryDeviceIsReadAsItsOwnTrace) {
  const std::uintptr_t offset = std::uintptr_t{1} << 36;
  const std::string bytes =
      pytorch_snapshot_pickle({release_window(0, 0), release_window(1, offset)}, Config{});
  EXPECT_THROW(trace::read_trace_bytes(bytes, "two.pickle"), InvalidArgument);
  const trace::Trace one = read({release_window(0, 0), release_window(1, offset)}, [] {
    trace::ReadOptions o;
    o.device = 1;
    return o;
  }());
  EXPECT_EQ(one.device, 1);
  const Steps steps = replay_steps(one);
  const std::vector<std::uint64_t> addresses{kSegA + offset + 4 * MiB, kSegD + offset,
                                             kSegE + offset};
  EXPECT_EQ(steps.addresses, addresses);
  EXPECT_EQ(*one.recorded.peak_reserved, 50 * MiB);

  const testing::ScratchDir dir;
  const std::vector<trace::Trace> all = trace::read_trace_devices(dir.write("two.pickle", bytes));
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].device, 0);
  EXPECT_EQ(all[1].device, 1);
  EXPECT_EQ(replay_steps(all[0]).reserved, replay_steps(read({release_window(0, 0)})).reserved);
  EXPECT_EQ(replay_steps(all[1]).addresses, addresses);
}

}  // namespace
}  // namespace cistern::replay
