// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Fidelity of the PyTorch emulation: on every PyTorch snapshot under ../shared/traces/pytorch and
// ../shared/traces/h200, started warm from the cache PyTorch held when the window opened, plain
// `torch` (which takes the snapshot's recorded allocator settings) must place every allocation
// at the address PyTorch recorded, obtain the same sequence of segment and map sizes as the
// recorded segment_alloc / segment_map events, and reach PyTorch's recorded peak reserved to the
// byte; and at the end of the window its segments and blocks (address, size, state: allocated,
// pending free, inactive) must be exactly the `segments` PyTorch wrote into the snapshot. The
// replay is the engine's own (its Replayer, warm start and event loop, with the frees PyTorch
// completed late made with uses of other streams), with hooks that compare each step with the
// recording. The h200 snapshots hold two allocating streams and frees deferred by
// `record_stream`; a snapshot recorded with expandable segments is written here from a
// `torch:expandable_segments=true` run with the project's own snapshot writer.
//
// On a mismatch the first divergence is printed with its context: the event, the expected and
// the actual address, the cached blocks of that stream's pool that could have served it, and
// the events before it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cistern/pytorch_snapshot.hpp"
#include "cistern/sim_device.hpp"
#include "replay/engine.hpp"
#include "replay/plan.hpp"
#include "replay/replayer.hpp"
#include "replay/snapshot_run.hpp"
#include "replay/torch_allocator.hpp"
#include "replay/warm_start.hpp"
#include "support/trace_sizes.hpp"
#include "trace/input.hpp"
#include "trace/pickle.hpp"
#include "trace/readers.hpp"

namespace cistern::replay {
namespace {

/// What one warm replay of a snapshot gave, beside what PyTorch recorded.
struct Fidelity {
  std::size_t allocations = 0;
  std::size_t matched = 0;
  std::vector<std::uint64_t> segments;           ///< sizes of the segments the emulation allocated
  std::vector<std::uint64_t> recorded_segments;  ///< sizes of the recorded segment_alloc events
  std::uint64_t peak_reserved = 0;
  std::uint64_t recorded_peak = 0;
  std::string first_divergence;  ///< empty when every address matched
  Snapshot final_state;          ///< the emulation's segments at the end of the window
};

/// One block of a snapshot's segments: (address, size, state).
struct FinalBlock {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::string state;
  friend bool operator==(const FinalBlock& a, const FinalBlock& b) {
    return a.address == b.address && a.size == b.size && a.state == b.state;
  }
};

/// The blocks of PyTorch's final `segments` for `device` in the snapshot `bytes`, by address.
std::vector<FinalBlock> recorded_final_blocks(std::string bytes, const std::string& name,
                                              int device) {
  const trace::pickle::Document doc = trace::pickle::parse(std::move(bytes), name);
  std::vector<FinalBlock> out;
  for (const trace::pickle::Value segment : doc.root().at("segments")) {
    if (segment.at("device").as_int() != device) continue;
    for (const trace::pickle::Value block : segment.at("blocks")) {
      out.push_back({static_cast<std::uint64_t>(block.at("address").as_int()),
                     static_cast<std::uint64_t>(block.at("size").as_int()),
                     std::string(block.at("state").as_string())});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const FinalBlock& a, const FinalBlock& b) { return a.address < b.address; });
  return out;
}

/// The blocks of the emulation's snapshot, by address.
std::vector<FinalBlock> emulated_final_blocks(const Snapshot& snapshot) {
  std::vector<FinalBlock> out;
  for (const SegmentInfo& segment : snapshot.segments) {
    for (const BlockInfo& block : segment.blocks) {
      out.push_back({block.address, block.size, to_string(block.state)});
    }
  }
  return out;
}

/// "" if the two block lists are equal, else where they first differ.
std::string compare_final_blocks(const std::vector<FinalBlock>& pytorch,
                                 const std::vector<FinalBlock>& emulated) {
  const std::size_t n = std::min(pytorch.size(), emulated.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (pytorch[i] == emulated[i]) continue;
    return fmt::format("final block {}: PyTorch ({:#x}, {}, {}), emulation ({:#x}, {}, {})", i,
                       pytorch[i].address, pytorch[i].size, pytorch[i].state, emulated[i].address,
                       emulated[i].size, emulated[i].state);
  }
  if (pytorch.size() != emulated.size()) {
    return fmt::format("PyTorch ends with {} blocks, the emulation with {}", pytorch.size(),
                       emulated.size());
  }
  return {};
}

/// The snapshots to check, sorted by path.
std::vector<std::string> pytorch_snapshots(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    const std::string path = entry.path().string();
    if (entry.is_regular_file() && path.find(".pickle") != std::string::npos) out.push_back(path);
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// The context of a divergence: the event, the cached blocks of that stream's pool that are
/// large enough, and the events before it.
std::string describe_divergence(const trace::Trace& t, std::size_t index, const void* actual,
                                const TorchAllocator& alloc, Stream stream) {
  const trace::Event& e = t.events[index];
  const std::size_t rounded = alloc.round_size(static_cast<std::size_t>(e.size));
  const bool large = rounded > alloc.config().small_size;
  std::string out = fmt::format(
      "first divergence at event {} (alloc id {}, {} bytes, rounded {}, stream {}): PyTorch "
      "{:#x}, emulation {:#x}\n  cached blocks of the {} pool of that stream, >= {} bytes "
      "(size, address):",
      index, e.id, e.size, rounded, e.stream, e.addr, reinterpret_cast<std::uintptr_t>(actual),
      large ? "large" : "small", rounded);
  std::vector<std::pair<std::size_t, std::uintptr_t>> free_blocks;
  for (const SegmentInfo& segment : alloc.snapshot().segments) {
    if (segment.is_large != large || segment.stream != stream) continue;
    for (const BlockInfo& block : segment.blocks) {
      if (block.state == BlockState::inactive && block.size >= rounded) {
        free_blocks.emplace_back(block.size, block.address);
      }
    }
  }
  std::sort(free_blocks.begin(), free_blocks.end());
  for (std::size_t i = 0; i < free_blocks.size() && i < 12; ++i) {
    out += fmt::format(" ({}, {:#x})", free_blocks[i].first, free_blocks[i].second);
  }
  out += "\n  events before it:";
  for (std::size_t i = index >= 8 ? index - 8 : 0; i < index; ++i) {
    const trace::Event& p = t.events[i];
    out += fmt::format("\n    {} {} id {} size {} addr {:#x}", i, trace::to_string(p.op), p.id,
                       p.size, p.addr);
  }
  return out;
}

/// The engine's loop hooks of a fidelity run: PyTorch's segment_free bursts are empty_cache()
/// calls of the program, and frees that completed later than requested (record_stream) become
/// reusable only at their recorded completion; every allocation's address and every new
/// segment are compared with the recording.
class FidelityHooks final : public detail::LoopHooks {
 public:
  FidelityHooks(const trace::Trace& t, Fidelity& f) : t_(t), f_(f) {
    for (const trace::RecordedSegmentEvent& s : t.recorded.segment_events) {
      if (s.kind == trace::RecordedSegmentEvent::Kind::free)
        empty_cache_before_[s.before_event] = true;
    }
  }
  void attach(detail::Replayer& replayer) { replayer_ = &replayer; }

  void before_event(std::size_t i) override {
    if (empty_cache_before_.count(i) != 0) replayer_->allocator().empty_cache();
    reserved_before_ = replayer_->allocator().reserved_bytes();
  }
  void allocated(std::size_t i, const detail::Step&, void* p, Stream stream) override {
    if (i == detail::kAtStart) return;
    const std::size_t reserved = replayer_->allocator().reserved_bytes();
    if (reserved > reserved_before_) f_.segments.push_back(reserved - reserved_before_);
    ++f_.allocations;
    if (reinterpret_cast<std::uintptr_t>(p) == t_.events[i].addr) {
      ++f_.matched;
    } else if (f_.first_divergence.empty()) {
      const auto& alloc = dynamic_cast<const TorchAllocator&>(replayer_->allocator());
      f_.first_divergence = describe_divergence(t_, i, p, alloc, stream);
    }
  }

 private:
  const trace::Trace& t_;
  Fidelity& f_;
  detail::Replayer* replayer_ = nullptr;
  std::map<std::size_t, bool> empty_cache_before_;
  std::size_t reserved_before_ = 0;
};

/// Replays `t` warm on the emulation (policy `policy`) through the engine and compares it with
/// what PyTorch recorded.
Fidelity replay_warm(const trace::Trace& t, std::size_t capacity) {
  const Policy policy = Policy::parse("torch");
  Options options;
  options.capacity = capacity;
  options.start = Start::warm;
  const detail::Plan plan = detail::compile(t);
  EXPECT_EQ(plan.error, "");
  Fidelity f;
  // What PyTorch obtained: segments, and pages mapped into expandable segments.
  for (const trace::RecordedSegmentEvent& s : t.recorded.segment_events) {
    using Kind = trace::RecordedSegmentEvent::Kind;
    if (s.kind == Kind::alloc || s.kind == Kind::map) f.recorded_segments.push_back(s.size);
  }
  f.recorded_peak = t.recorded.peak_reserved.value_or(0);
  FidelityHooks hooks(t, f);
  detail::Replayer replayer(t, plan, policy, options, options.capacity, &hooks);
  hooks.attach(replayer);
  replayer.start(false);
  replayer.replay(plan.steps.size(), false, nullptr);
  f.peak_reserved = replayer.measures().peak_reserved;
  const auto& alloc = dynamic_cast<const TorchAllocator&>(replayer.allocator());
  alloc.check();
  f.final_state = alloc.snapshot();
  return f;
}

/// Checks the replay of the snapshot in `bytes` (read as `name`) against its recording; returns
/// its row of the table.
/// `capacity`: the replay's device; ample, so that the window takes no out-of-memory path, and
/// no larger than the recording's when it used expandable segments (a reservation spans 1.125 x
/// the device, and new ones go where PyTorch's went).
std::string check_snapshot(const trace::Trace& t, std::string bytes, const std::string& name,
                           const std::string& label, std::size_t capacity) {
  EXPECT_TRUE(t.recorded.peak_reserved.has_value()) << "the reader gave no recorded peak";
  const Fidelity f = replay_warm(t, capacity);
  EXPECT_EQ(f.matched, f.allocations) << f.first_divergence;
  EXPECT_EQ(f.segments, f.recorded_segments) << "segment sizes differ";
  EXPECT_EQ(f.peak_reserved, f.recorded_peak);
  const std::string final_difference =
      compare_final_blocks(recorded_final_blocks(std::move(bytes), name, t.device),
                           emulated_final_blocks(f.final_state));
  EXPECT_EQ(final_difference, "");
  const double rate = f.allocations == 0
                          ? 1.0
                          : static_cast<double>(f.matched) / static_cast<double>(f.allocations);
  return fmt::format(
      "{:<52} {:>7} {:>8.4f}% {:>9} {:>15} {:>15} {:>11}\n", label, f.allocations, 100.0 * rate,
      f.segments == f.recorded_segments
          ? fmt::format("{}/{}", f.segments.size(), f.recorded_segments.size())
          : std::string("DIFFER"),
      f.recorded_peak, f.peak_reserved, final_difference.empty() ? "same" : "DIFFERS");
}

std::string table_header() {
  return fmt::format("{:<52} {:>7} {:>9} {:>9} {:>15} {:>15} {:>11}\n", "snapshot", "allocs",
                     "addr", "segments", "recorded peak", "emulated peak", "final state");
}

/// Checks every snapshot under ../shared/traces/<folder>; returns the traces read.
std::vector<trace::Trace> check_shared_folder(const std::string& folder) {
  const std::string root = cistern::testing::shared_dir() + "/traces/" + folder;
  std::vector<trace::Trace> traces;
  if (!std::filesystem::is_directory(root)) return traces;
  const std::vector<std::string> files = pytorch_snapshots(root);
  EXPECT_FALSE(files.empty()) << "no snapshots under " << root;
  std::string table = table_header();
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    traces.push_back(trace::read_trace(path));
    table += check_snapshot(traces.back(), trace::read_file(path), path,
                            std::filesystem::relative(path, root).string(), std::size_t{1} << 40);
  }
  std::cout << table;
  return traces;
}

TEST(TorchFidelity, ReproducesEveryRecordedPyTorchSnapshot) {
  const std::string root = cistern::testing::shared_dir() + "/traces/pytorch";
  if (!std::filesystem::is_directory(root)) {
    GTEST_SKIP() << "../shared is missing: no PyTorch snapshots at " << root
                 << " (set CISTERN_SHARED_DIR)";
  }
  check_shared_folder("pytorch");
}

TEST(TorchFidelity, ReproducesEveryRecordedH200Snapshot) {
  const std::string root = cistern::testing::shared_dir() + "/traces/h200";
  if (!std::filesystem::is_directory(root)) {
    GTEST_SKIP() << "../shared is missing: no H200 snapshots at " << root
                 << " (set CISTERN_SHARED_DIR)";
  }
  const std::vector<trace::Trace> traces = check_shared_folder("h200");
  // What these snapshots add: two allocating streams, and frees PyTorch completed late
  // (record_stream), some still pending when the snapshot was taken.
  const bool multi_stream = std::any_of(traces.begin(), traces.end(), [](const trace::Trace& t) {
    return t.streams.size() > 1 && !t.recorded.deferred_frees.empty();
  });
  EXPECT_TRUE(multi_stream) << "no h200 snapshot with several streams and deferred frees";
}

// --- a snapshot recorded with expandable segments ---------------------------------------------

/// A program of 600 events on two streams (fixed seed): requests of 4 KiB to 70 MiB, frees in
/// random order, and an empty_cache() in the middle, so that PyTorch with expandable segments
/// maps pages in both pools of both streams and unmaps some.
trace::Trace synthetic_program() {
  trace::Trace t;
  t.source = "synthetic";
  t.format = "cistern";
  t.streams = {0, 0x51};
  const std::uint64_t sizes[] = {4096,     700 * 1024, 3 * MiB, 9 * MiB,
                                 24 * MiB, 70 * MiB,   1000,    5 * MiB + 3};
  std::mt19937_64 random(20260119);
  std::vector<std::pair<std::uint64_t, trace::Event>> live;  // id, its alloc event
  std::uint64_t next_id = 0;
  for (std::int64_t time = 0; time < 600; ++time) {
    trace::Event e;
    e.time = time;
    if (time == 300) {
      e.op = trace::Op::empty_cache;
    } else if (!live.empty() && (live.size() > 40 || random() % 5 < 2)) {
      const std::size_t pick = random() % live.size();
      e = live[pick].second;
      e.op = trace::Op::free;
      e.time = time;
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
    } else {
      e.op = trace::Op::alloc;
      e.id = next_id++;
      e.size = sizes[random() % std::size(sizes)];
      e.stream = static_cast<std::uint32_t>(random() % 4 == 0 ? 1 : 0);
      live.emplace_back(e.id, e);
    }
    t.events.push_back(e);
  }
  t.check();
  return t;
}

/// The device the synthetic snapshots are recorded on.
constexpr std::size_t kRecordingCapacity = 80 * GiB;

/// The snapshot of a `policy` run of `program`, written by the project's PyTorch snapshot writer.
std::string recorded_snapshot(const trace::Trace& program, const std::string& policy) {
  Options options;
  options.capacity = kRecordingCapacity;
  const RecordedRun run = record_run(program, Policy::parse(policy), options);
  return pytorch_snapshot_pickle({run.record}, run.config);
}

TEST(TorchFidelity, ReplaysASnapshotRecordedWithExpandableSegmentsAsRecorded) {
  const std::string bytes =
      recorded_snapshot(synthetic_program(), "torch:expandable_segments=true");
  const trace::Trace t = trace::read_trace_bytes(bytes, "expandable.pickle");
  std::size_t maps = 0, unmaps = 0;
  for (const trace::RecordedSegmentEvent& e : t.recorded.segment_events) {
    maps += e.kind == trace::RecordedSegmentEvent::Kind::map ? 1 : 0;
    unmaps += e.kind == trace::RecordedSegmentEvent::Kind::unmap ? 1 : 0;
  }
  ASSERT_GT(maps, 10U) << "the recording maps pages";
  ASSERT_GT(unmaps, 0U) << "the recording's empty_cache unmaps pages";
  // Plain torch takes expandable_segments:True from the snapshot: every address, map, the peak
  // and the final state as recorded.
  std::cout << table_header()
            << check_snapshot(t, bytes, "expandable.pickle", "expandable", kRecordingCapacity);

  Options warm;
  warm.start = Start::warm;
  const Result plain = run(t, Policy::parse("torch"), warm);
  ASSERT_EQ(plain.error, "");
  EXPECT_EQ(plain.policy, "torch");
  EXPECT_EQ(plain.peak_reserved, t.recorded.peak_reserved);
  EXPECT_EQ(plain.note, "");
  ASSERT_EQ(plain.settings.size(), 4U);
  EXPECT_EQ(plain.settings[0].key, "expandable_segments");
  EXPECT_EQ(plain.settings[0].value, "True");
  EXPECT_EQ(plain.settings[0].source, SettingSource::recorded);
  for (const SettingUse& use : plain.settings) EXPECT_EQ(use.source, SettingSource::recorded);

  // An explicit option wins over the recording: no expandable segments, more reserved memory.
  const Result given = run(t, Policy::parse("torch:expandable_segments=false"), warm);
  ASSERT_EQ(given.error, "");
  EXPECT_EQ(given.settings[0].value, "False");
  EXPECT_EQ(given.settings[0].source, SettingSource::given);
  EXPECT_EQ(given.settings[1].source, SettingSource::recorded);
  EXPECT_GT(given.peak_reserved.value_or(0), plain.peak_reserved.value_or(0));
  EXPECT_NE(given.note, "");
}

TEST(TorchFidelity, TracesWithoutRecordedSettingsKeepPyTorchsDefaults) {
  // The same program as a cistern trace (no allocator_settings): torch runs PyTorch's defaults.
  const trace::Trace program = synthetic_program();
  const Result r = run(program, Policy::parse("torch"), Options{});
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.settings.size(), 4U);
  for (const SettingUse& use : r.settings) EXPECT_EQ(use.source, SettingSource::defaults);
  EXPECT_EQ(r.settings[0].value, "False");
  EXPECT_EQ(r.device_maps, 0U);
  // A snapshot of a default run records the defaults: the same figures, now "recorded".
  const trace::Trace t =
      trace::read_trace_bytes(recorded_snapshot(program, "torch"), "defaults.pickle");
  const Result again = run(t, Policy::parse("torch"), Options{});
  EXPECT_EQ(again.peak_reserved, r.peak_reserved);
  EXPECT_EQ(again.settings[0].source, SettingSource::recorded);
}

TEST(TorchFidelity, RefusesRecordedSettingsNoConfigurationTakesAndNamesTheOverride) {
  // A damaged snapshot may record a value PyTorch would never have started with: torch refuses
  // the replay with an error naming the setting and the way out; the option given overrides it.
  trace::Trace t =
      trace::read_trace_bytes(recorded_snapshot(synthetic_program(), "torch"), "damaged.pickle");
  bool found = false;
  for (auto& [key, value] : t.recorded.settings) {
    if (key != "garbage_collection_threshold") continue;
    value = "3.5";
    found = true;
  }
  ASSERT_TRUE(found) << "the snapshot records no garbage_collection_threshold";
  const Result refused = run(t, Policy::parse("torch"), Options{});
  EXPECT_NE(refused.error.find("garbage_collection_threshold"), std::string::npos) << refused.error;
  EXPECT_NE(refused.error.find("recorded allocator_settings"), std::string::npos) << refused.error;
  EXPECT_NE(refused.error.find("override"), std::string::npos) << refused.error;
  EXPECT_THROW((void)Policy::parse("torch").for_trace(t), ConfigError);
  const Result overridden =
      run(t, Policy::parse("torch:garbage_collection_threshold=0"), Options{});
  EXPECT_EQ(overridden.error, "");
  EXPECT_EQ(overridden.peak_reserved,
            run(synthetic_program(), Policy::parse("torch"), Options{}).peak_reserved);
  // cistern does not read PyTorch's settings: the same snapshot replays.
  EXPECT_EQ(run(t, Policy::parse("cistern"), Options{}).error, "");
}

}  // namespace
}  // namespace cistern::replay
