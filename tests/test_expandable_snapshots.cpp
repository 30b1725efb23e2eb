// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Warm starts of snapshots PyTorch takes with `expandable_segments:True`, built here with the
// project's PyTorch snapshot writer: segments `is_expandable`, history `segment_map` /
// `segment_unmap`. A snapshot does not say where a reservation begins; the warm start infers it
// (replay/warm_start.hpp, `infer_reservations`) so that the emulation maps and unmaps the same
// ranges PyTorch did. Each test replays through the engine's Replayer and compares every
// allocation's address, every map and unmap (address and size) and the peak reserved with the
// recording, with check() after every event.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "cistern/pytorch_snapshot.hpp"
#include "cistern/sim_device.hpp"
#include "replay/engine.hpp"
#include "replay/forwarding_device.hpp"
#include "replay/plan.hpp"
#include "replay/replayer.hpp"
#include "replay/torch_allocator.hpp"
#include "replay/warm_start.hpp"
#include "trace/readers.hpp"

namespace cistern::replay {
namespace {

constexpr std::uint64_t MiB = std::uint64_t{1} << 20;
constexpr std::uint64_t GiB = std::uint64_t{1} << 30;
// PyTorch's reservations (1.125 x an 80 GiB device each): the large and the small pool of the
// default stream, and the large pool of a second stream, reserved in the window.
constexpr std::uintptr_t kLarge = 0x7f0000000000;
constexpr std::uintptr_t kSmall = kLarge + 128 * GiB;
constexpr std::uintptr_t kLarge1 = kLarge + 256 * GiB;
constexpr std::uint64_t kStream1 = 0x51;  // the second stream's handle

using Action = HistoryEntry::Action;
using Kind = trace::RecordedSegmentEvent::Kind;

HistoryEntry entry(Action action, std::uintptr_t addr, std::uint64_t size,
                   std::uint64_t stream = 0) {
  HistoryEntry e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  e.stream = Stream{stream};
  return e;
}

/// alloc, or free_requested + free_completed.
void add(std::vector<HistoryEntry>& h, Action action, std::uintptr_t addr, std::uint64_t size,
         std::uint64_t stream = 0) {
  if (action != Action::free_requested) {
    h.push_back(entry(action, addr, size, stream));
    return;
  }
  h.push_back(entry(Action::free_requested, addr, size, stream));
  h.push_back(entry(Action::free_completed, addr, size, stream));
}

BlockInfo block(std::uintptr_t address, std::uint64_t size, std::uint64_t requested) {
  BlockInfo b;
  b.address = address;
  b.size = size;
  b.requested_size = requested;
  b.state = requested == 0 ? BlockState::inactive : BlockState::active_allocated;
  return b;
}

SegmentInfo segment(std::uintptr_t address, std::uint64_t size, bool large,
                    std::vector<BlockInfo> blocks) {
  SegmentInfo s;
  s.address = address;
  s.total_size = size;
  s.is_large = large;
  s.is_expandable = true;
  s.blocks = std::move(blocks);
  return s;
}

/// The window, as PyTorch 2.x with expandable segments writes it. When it opens, pages 2-3 of the
/// large reservation are mapped and hold block X (30 MiB at +40 MiB, live), pages 0-1 were
/// unmapped by an earlier empty_cache(); the small reservation's first page holds Y (1000 B).
///   alloc A 50 MiB: grows the 10 MiB free after X by mapping pages 4-5     map +80 MiB, 40 MiB
///   alloc B 1000 B: the small page's free space
///   free A; empty_cache(): pages 4-5 are whole and free                  unmap +80 MiB, 40 MiB
///   alloc C 30 MiB: the lowest hole with room, pages 0-1                   map +0, 40 MiB
///   alloc D 25 MiB on stream 1: a new reservation                          map kLarge1, 40 MiB
///   free D, C, X; empty_cache(): both large reservations lose every page and are released
///                                                                      unmap +0, 80 MiB;
///                                                                      unmap kLarge1, 40 MiB
///   alloc E 60 MiB: a new reservation, at the address just released      map +0, 60 MiB
DeviceRecord expandable_window() {
  DeviceRecord record;
  std::vector<HistoryEntry>& h = record.history;
  add(h, Action::segment_map, kLarge + 80 * MiB, 40 * MiB);
  add(h, Action::alloc, kLarge + 70 * MiB, 50 * MiB);
  add(h, Action::alloc, kSmall + 1024, 1000);
  add(h, Action::free_requested, kLarge + 70 * MiB, 50 * MiB);
  add(h, Action::segment_unmap, kLarge + 80 * MiB, 40 * MiB);
  add(h, Action::segment_map, kLarge, 40 * MiB);
  add(h, Action::alloc, kLarge, 30 * MiB);
  add(h, Action::segment_map, kLarge1, 40 * MiB, kStream1);
  add(h, Action::alloc, kLarge1, 25 * MiB, kStream1);
  add(h, Action::free_requested, kLarge1, 25 * MiB, kStream1);
  add(h, Action::free_requested, kLarge, 30 * MiB);
  add(h, Action::free_requested, kLarge + 40 * MiB, 30 * MiB);
  add(h, Action::segment_unmap, kLarge, 80 * MiB);
  add(h, Action::segment_unmap, kLarge1, 40 * MiB, kStream1);
  add(h, Action::segment_map, kLarge, 60 * MiB);
  add(h, Action::alloc, kLarge, 60 * MiB);
  for (std::size_t i = 0; i < h.size(); ++i) {
    h[i].time_us = 1000 + i;
    h[i].sequence = i;
  }
  record.snapshot.segments = {
      segment(kLarge, 60 * MiB, true, {block(kLarge, 60 * MiB, 60 * MiB)}),
      segment(kSmall, 2 * MiB, false,
              {block(kSmall, 1024, 1000), block(kSmall + 1024, 1024, 1000),
               block(kSmall + 2048, 2 * MiB - 2048, 0)}),
  };
  return record;
}

Config expandable_config() {
  Config config;
  config.expandable_segments = true;
  return config;
}

trace::Trace read_window() {
  return trace::read_trace_bytes(
      pytorch_snapshot_pickle({expandable_window()}, expandable_config()), "expandable.pickle");
}

/// One segment event: (kind, address, size).
using SegmentEvent = std::tuple<Kind, std::uint64_t, std::uint64_t>;

/// Logs the maps and unmaps of pages below the meter, as PyTorch's history shows them: the pages
/// one event maps (or unmaps) side by side form one range.
class SegmentLog final : public ForwardingDevice {
 public:
  explicit SegmentLog(Device& device) : ForwardingDevice(device) {}

  Status map(void* va, PhysicalHandle handle) noexcept override {
    const Status status = upstream().map(va, handle);
    if (status == Status::ok) note(Kind::map, va, handle.bytes);
    return status;
  }
  Status unmap(void* va, std::size_t bytes) noexcept override {
    const Status status = upstream().unmap(va, bytes);
    if (status == Status::ok) note(Kind::unmap, va, bytes);
    return status;
  }
  /// Starts a new event: ranges never join across events.
  void next_event() { joinable_ = false; }
  /// Whether calls are logged (not the warm start's).
  bool on = false;
  std::vector<SegmentEvent> events;

 private:
  void note(Kind kind, void* va, std::size_t bytes) noexcept {
    if (!on) return;
    const auto addr = reinterpret_cast<std::uintptr_t>(va);
    if (joinable_ && !events.empty()) {
      auto& [last_kind, last_addr, last_size] = events.back();
      if (last_kind == kind && last_addr + last_size == addr) {
        last_size += bytes;
        return;
      }
    }
    events.emplace_back(kind, addr, bytes);
    joinable_ = true;
  }
  bool joinable_ = false;
};

/// The engine's hooks: every allocation's address, check() after every event.
class Watch final : public detail::LoopHooks {
 public:
  Watch(SegmentLog& log, const TorchAllocator*& alloc) : log_(log), alloc_(alloc) {}
  void before_event(std::size_t) override {
    if (alloc_ != nullptr) alloc_->check();
    log_.next_event();
  }
  void allocated(std::size_t, const detail::Step&, void* ptr, Stream) override {
    addresses.push_back(reinterpret_cast<std::uintptr_t>(ptr));
  }
  std::vector<std::uint64_t> addresses;

 private:
  SegmentLog& log_;
  const TorchAllocator*& alloc_;
};

/// What the emulation did over the window.
struct Replayed {
  std::vector<std::uint64_t> addresses;
  std::vector<SegmentEvent> segment_events;
  std::uint64_t peak_reserved = 0;
  std::uint64_t reserved_at_start = 0;
};

/// Replays `t` warm on the emulation with `config` on a device of `capacity` bytes.
Replayed replay(const trace::Trace& t, const Config& config, std::uint64_t capacity) {
  SimDeviceOptions device_options;
  device_options.capacity = static_cast<std::size_t>(capacity);
  SimDevice sim(device_options);
  SegmentLog log(sim);
  const TorchAllocator* alloc = nullptr;
  Watch watch(log, alloc);
  Policy policy = Policy::parse("torch");
  policy.config = config;
  policy.take_recorded = false;  // `config` as it is, whatever the snapshot recorded
  Options options;
  options.start = Start::warm;
  options.check_invariants = true;
  const detail::Plan plan = detail::compile(t);
  EXPECT_EQ(plan.error, "");
  detail::Rig rig;
  rig.device = rig.sim = &sim;
  rig.below_meter = &log;
  rig.streams = detail::map_streams(t, [&sim] { return sim.create_stream(); });
  detail::Replayer replayer(t, plan, policy, options, std::move(rig), &watch);
  alloc = &dynamic_cast<const TorchAllocator&>(replayer.allocator());
  replayer.start(false);
  Replayed out;
  out.reserved_at_start = replayer.allocator().reserved_bytes();
  log.on = true;
  replayer.replay(plan.steps.size(), false, nullptr);
  alloc->check();
  out.addresses = watch.addresses;
  out.segment_events = log.events;
  out.peak_reserved = replayer.measures().peak_reserved;
  return out;
}

std::vector<SegmentEvent> recorded_events(const trace::Trace& t) {
  std::vector<SegmentEvent> out;
  for (const trace::RecordedSegmentEvent& e : t.recorded.segment_events) {
    out.emplace_back(e.kind, e.addr, e.size);
  }
  return out;
}

TEST(ExpandableSnapshots, TheReaderRebuildsTheMappedRangesHeldWhenTheWindowOpens) {
  const trace::Trace t = read_window();
  ASSERT_EQ(t.recorded.initial_segments.size(), 2u);
  EXPECT_EQ(t.recorded.initial_segments[0].addr, kLarge + 40 * MiB);
  EXPECT_EQ(t.recorded.initial_segments[0].size, 40 * MiB);
  EXPECT_TRUE(t.recorded.initial_segments[0].is_large);
  EXPECT_TRUE(t.recorded.initial_segments[0].is_expandable);
  EXPECT_EQ(t.recorded.initial_segments[1].addr, kSmall);
  EXPECT_FALSE(t.recorded.initial_segments[1].is_large);
  EXPECT_EQ(*t.recorded.initial_reserved, 42 * MiB);
  // 42 + 40 (A) - 40 (release) + 40 (C) + 40 (D) = 122 MiB.
  EXPECT_EQ(*t.recorded.peak_reserved, 122 * MiB);
  EXPECT_TRUE(t.recorded.notes.empty()) << t.recorded.notes.front();
}

TEST(ExpandableSnapshots, ReservationsAreInferredFromTheLowestMappedAddress) {
  const trace::Trace t = read_window();
  const auto bytes_of = [](bool is_large) { return is_large ? 1160 * MiB : 1152 * MiB; };
  const ReservationLayout layout = infer_reservations(t, bytes_of);
  ASSERT_EQ(layout.initial.size(), 2u);
  // Pages 0-1, unmapped before the window, are mapped in it: the reservation begins there.
  EXPECT_EQ(layout.initial[0].base, kLarge);
  EXPECT_EQ(layout.initial[0].bytes, 1160 * MiB);
  EXPECT_TRUE(layout.initial[0].is_large);
  EXPECT_EQ(layout.initial[1].base, kSmall);
  EXPECT_EQ(layout.initial[1].bytes, 1152 * MiB);
  EXPECT_FALSE(layout.initial[1].is_large);
  // Stream 1's reservation, then the default stream's again after its release.
  const std::vector<std::uint64_t> bases{kLarge1, kLarge};
  EXPECT_EQ(layout.window_bases, bases);
  // A replay device larger than the gap between two reservations cuts the first one short, to
  // whole 20 MiB pages.
  const ReservationLayout wide =
      infer_reservations(t, [](bool) -> std::uint64_t { return 200 * GiB; });
  EXPECT_EQ(wide.initial[0].bytes, 6553 * 20 * MiB);
}

TEST(ExpandableSnapshots, WarmStartMapsWhatPyTorchMappedWherePyTorchDid) {
  const trace::Trace t = read_window();
  const Replayed r = replay(t, recorded_config(t), GiB);
  EXPECT_EQ(r.reserved_at_start, 42 * MiB);
  const std::vector<std::uint64_t> addresses{kLarge + 70 * MiB, kSmall + 1024, kLarge, kLarge1,
                                             kLarge};
  EXPECT_EQ(r.addresses, addresses);
  EXPECT_EQ(r.segment_events, recorded_events(t));
  EXPECT_EQ(r.peak_reserved, *t.recorded.peak_reserved);
}

TEST(ExpandableSnapshots, EngineRowMatchesTheRecordedRow) {
  const trace::Trace t = read_window();
  Options options;
  options.start = Start::warm;
  options.capacity = 80 * GiB;
  options.check_invariants = true;
  // Plain torch takes expandable_segments:True from the snapshot's allocator_settings.
  const Result r = run(t, Policy::parse("torch"), options);
  ASSERT_EQ(r.error, "");
  const std::optional<Result> rec = recorded(t, options);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(*r.peak_reserved, *rec->peak_reserved);
  EXPECT_EQ(r.device_allocs, 0u);  // no cudaMalloc with expandable segments
  EXPECT_EQ(rec->device_maps, 4u);
  // The emulation maps and unmaps page by page (PyTorch too: one handle per page); the history
  // shows one range per event: 2 + 2 + 2 + 3 pages mapped, 2 + 4 + 2 unmapped.
  EXPECT_EQ(r.device_maps, 9u);
  EXPECT_EQ(r.device_unmaps, 8u);
}

TEST(ExpandableSnapshots, WithoutExpandableSegmentsTheRangesAreFixedSegmentsAndTheRowSaysSo) {
  // The emulation told to go without expandable segments cannot map pages: the mapped ranges
  // held when the window opens become cudaMalloc segments, and the replay differs from the
  // recording.
  const trace::Trace t = read_window();
  const Replayed r = replay(t, Config{}, GiB);
  EXPECT_EQ(r.reserved_at_start, 42 * MiB);
  EXPECT_TRUE(r.segment_events.empty());
  EXPECT_NE(r.addresses[0], kLarge + 70 * MiB);
  Options options;
  options.start = Start::warm;
  const Result row = run(t, Policy::parse("torch:expandable_segments=false"), options);
  ASSERT_EQ(row.error, "");
  EXPECT_NE(row.note.find("plain torch"), std::string::npos) << row.note;
  EXPECT_EQ(run(t, Policy::parse("torch"), options).note, "");
}

TEST(ExpandableSnapshots, ASecondReservationOfAStreamAndPoolIsNoted) {
  // The default stream's large pool maps 100 GiB above its reservation while holding it: PyTorch
  // reserved a second range, as its first (1.125 x the recording device's memory) was full.
  DeviceRecord record = expandable_window();
  const std::uintptr_t far = kLarge + 100 * GiB;
  add(record.history, Action::segment_map, far, 20 * MiB);
  add(record.history, Action::alloc, far, 20 * MiB);
  record.snapshot.segments.push_back(
      segment(far, 20 * MiB, true, {block(far, 20 * MiB, 20 * MiB)}));
  const trace::Trace t = trace::read_trace_bytes(
      pytorch_snapshot_pickle({record}, expandable_config()), "second.pickle");
  ASSERT_EQ(t.recorded.notes.size(), 1u);
  EXPECT_NE(t.recorded.notes[0].find("expandable segments"), std::string::npos);
  EXPECT_NE(t.recorded.notes[0].find("0x7f1900000000"), std::string::npos) << t.recorded.notes[0];
  EXPECT_TRUE(read_window().recorded.notes.empty());
}

}  // namespace
}  // namespace cistern::replay
