// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The PyTorch-format snapshot writer: the pickle writer's encodings read back by our data-only
// reader, an allocator's segments, blocks and history written and read back identically (by the
// pickle reader and by the PyTorch trace reader), and the replay's recorded runs for
// `cistern replay --snapshot` of every policy.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "allocator_fixture.hpp"
#include "cistern/errors.hpp"
#include "cistern/pytorch_snapshot.hpp"
#include "replay/snapshot_run.hpp"
#include "snapshot/pickle_writer.hpp"
#include "trace/pickle.hpp"
#include "trace/readers.hpp"

namespace cistern {
namespace {

using trace::pickle::Value;

TEST(PickleWriter, EmptyDictIsPythonsEncoding) {
  detail::PickleWriter w;
  w.begin_dict();
  w.end_dict();
  EXPECT_EQ(w.finish(), std::string("\x80\x02}(u.", 6));
}

TEST(PickleWriter, EveryValueReadsBack) {
  detail::PickleWriter w;
  w.begin_list();
  const std::int64_t ints[] = {0,
                               255,
                               256,
                               65535,
                               65536,
                               2147483647,
                               2147483648LL,
                               -1,
                               -2147483648LL,
                               -2147483649LL,
                               std::numeric_limits<std::int64_t>::max(),
                               std::numeric_limits<std::int64_t>::min()};
  for (const std::int64_t i : ints) w.integer(i);
  w.unsigned_integer(std::uint64_t{1} << 63);
  w.real(-2.5);
  w.string("caf\xc3\xa9");
  w.none();
  w.boolean(true);
  w.boolean(false);
  w.begin_tuple();
  w.integer(1);
  w.integer(2);
  w.end_tuple();
  w.begin_dict();
  w.string("k");
  w.begin_list();
  w.end_list();
  w.end_dict();
  w.end_list();
  const trace::pickle::Document doc = trace::pickle::parse(w.finish(), "test");
  const Value root = doc.root();
  ASSERT_EQ(root.size(), 20u);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(root[i].as_int(), ints[i]) << i;
  EXPECT_EQ(root[12].kind(), trace::pickle::Kind::big_integer);
  EXPECT_EQ(root[12].as_double(), 9223372036854775808.0);
  EXPECT_EQ(root[13].as_double(), -2.5);
  EXPECT_EQ(root[14].as_string(), "caf\xc3\xa9");
  EXPECT_TRUE(root[15].is_none());
  EXPECT_TRUE(root[16].as_bool());
  EXPECT_FALSE(root[17].as_bool());
  EXPECT_TRUE(root[18].is_tuple());
  EXPECT_EQ(root[18][1].as_int(), 2);
  EXPECT_EQ(root[19].at("k").size(), 0u);
}

TEST(PickleWriter, MisuseIsALogicError) {
  detail::PickleWriter w;
  w.begin_dict();
  w.string("key");
  EXPECT_THROW(w.end_dict(), std::logic_error);
  EXPECT_THROW(w.end_list(), std::logic_error);
  EXPECT_THROW(w.finish(), std::logic_error);
}

class PyTorchSnapshot : public testing::AllocatorTest {};

std::uint64_t as_u64(Value v) { return static_cast<std::uint64_t>(v.as_int()); }

TEST_F(PyTorchSnapshot, SegmentsBlocksAndHistoryRoundTrip) {
  alloc->record_history(true);
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* a = alloc->allocate(1000, s1);
  void* b = alloc->allocate(3 * MiB, s1);
  void* c = alloc->allocate(5000, s2);
  alloc->record_stream(a, s2);
  device->launch(s2, 1000);
  alloc->deallocate(a, s1);  // pending on s2's work
  EXPECT_THROW(alloc->allocate(4 * GiB, s1), OutOfMemory);
  alloc->deallocate(c, s2);

  const Snapshot snapshot = alloc->snapshot();
  const std::vector<HistoryEntry> history = alloc->history();
  const trace::pickle::Document doc = trace::pickle::parse(pytorch_snapshot_pickle(*alloc), "rt");
  const Value root = doc.root();

  const Value segments = root.at("segments");
  ASSERT_EQ(segments.size(), snapshot.segments.size());
  for (std::size_t i = 0; i < snapshot.segments.size(); ++i) {
    const SegmentInfo& want = snapshot.segments[i];
    const Value got = segments[i];
    EXPECT_EQ(got.at("device").as_int(), want.device);
    EXPECT_EQ(as_u64(got.at("address")), want.address);
    EXPECT_EQ(as_u64(got.at("total_size")), want.total_size);
    EXPECT_EQ(as_u64(got.at("allocated_size")), want.allocated_size);
    EXPECT_EQ(as_u64(got.at("active_size")), want.active_size);
    EXPECT_EQ(as_u64(got.at("requested_size")), want.requested_size);
    EXPECT_EQ(as_u64(got.at("stream")), want.stream.handle);
    EXPECT_EQ(got.at("segment_type").as_string(), want.is_large ? "large" : "small");
    EXPECT_EQ(got.at("is_expandable").as_bool(), want.is_expandable);
    EXPECT_EQ(got.at("segment_pool_id")[0].as_int(), 0);
    ASSERT_EQ(got.at("blocks").size(), want.blocks.size());
    for (std::size_t j = 0; j < want.blocks.size(); ++j) {
      const Value block = got.at("blocks")[j];
      EXPECT_EQ(as_u64(block.at("address")), want.blocks[j].address);
      EXPECT_EQ(as_u64(block.at("size")), want.blocks[j].size);
      EXPECT_EQ(as_u64(block.at("requested_size")), want.blocks[j].requested_size);
      EXPECT_EQ(block.at("state").as_string(), to_string(want.blocks[j].state));
      EXPECT_EQ(block.at("frames").size(), 0u);
    }
  }
  const Value events = root.at("device_traces")[0];
  ASSERT_EQ(events.size(), history.size());
  for (std::size_t i = 0; i < history.size(); ++i) {
    const HistoryEntry& want = history[i];
    const Value got = events[i];
    EXPECT_EQ(got.at("action").as_string(), to_string(want.action));
    const bool oom = want.action == HistoryEntry::Action::oom;
    EXPECT_EQ(as_u64(got.at(oom ? "device_free" : "addr")), want.addr);
    EXPECT_EQ(as_u64(got.at("size")), want.size);
    EXPECT_EQ(as_u64(got.at("stream")), want.stream.handle);
    EXPECT_EQ(as_u64(got.at("time_us")), want.time_us);
  }
  EXPECT_EQ(root.at("allocator_settings").at("max_split_size").as_int(), -1);
  EXPECT_EQ(root.at("external_annotations").size(), 0u);

  // The PyTorch trace reader sees the program's calls: 3 allocs, 2 frees, one oom, and the
  // release of the out-of-memory path as an empty_cache event in its place.
  const trace::Trace t = trace::read_trace_bytes(pytorch_snapshot_pickle(*alloc), "rt.pickle");
  ASSERT_EQ(t.events.size(), 6u);
  EXPECT_EQ(t.events[1].size, 3 * MiB);
  EXPECT_EQ(t.events[3].op, trace::Op::free);
  EXPECT_EQ(t.events[4].op, trace::Op::empty_cache);
  EXPECT_EQ(t.recorded.ooms.size(), 1u);
  EXPECT_EQ(t.peak_live(), 1000 + 3 * MiB + 5000);
  alloc->deallocate(b, s1);
  device->synchronize_device();
}

TEST(PyTorchSnapshotDevices, TracesHaveOneListPerDevice) {
  DeviceRecord record;
  record.device = 2;
  HistoryEntry entry;
  entry.action = HistoryEntry::Action::segment_alloc;
  entry.addr = 0x1000;
  entry.size = 2 * MiB;
  record.history.push_back(entry);
  const trace::pickle::Document doc = trace::pickle::parse(
      pytorch_snapshot_pickle({record}, Config::parse("max_split_size_mb:256")), "d");
  const Value traces = doc.root().at("device_traces");
  ASSERT_EQ(traces.size(), 3u);
  EXPECT_EQ(traces[0].size(), 0u);
  EXPECT_EQ(traces[2][0].at("action").as_string(), "segment_alloc");
  const Value settings = doc.root().at("allocator_settings");
  EXPECT_EQ(settings.at("max_split_size").as_int(), 256 * static_cast<std::int64_t>(MiB));
  EXPECT_EQ(settings.at("PYTORCH_CUDA_ALLOC_CONF").as_string(), "max_split_size_mb:256");
  EXPECT_EQ(settings.at("roundup_power2_divisions").at("32768").as_int(), 0);
  record.device = -1;
  EXPECT_THROW(pytorch_snapshot_pickle({record}, Config{}), InvalidArgument);
}

trace::Trace small_trace() {
  trace::Trace t;
  t.source = "small";
  t.format = "lifetimes";
  const auto event = [](trace::Op op, std::uint64_t id, std::uint64_t size, std::int64_t time) {
    trace::Event e;
    e.op = op;
    e.id = id;
    e.size = size;
    e.time = time;
    return e;
  };
  t.events = {event(trace::Op::alloc, 0, 1000, 10), event(trace::Op::alloc, 1, 30 * MiB, 20),
              event(trace::Op::free, 0, 1000, 30), event(trace::Op::alloc, 2, 100 * MiB, 40)};
  return t;
}

TEST(ReplaySnapshot, EveryPolicyRecordsItsRun) {
  replay::Options options;
  options.capacity = 64 * MiB;
  for (const char* name : {"cistern", "torch", "nocache"}) {
    const replay::RecordedRun run =
        replay::record_run(small_trace(), replay::Policy::parse(name), options);
    const trace::Trace back =
        trace::read_trace_bytes(pytorch_snapshot_pickle({run.record}, run.config), "back.pickle");
    // The failed 100 MiB alloc (more than the device) is an oom; the release before it (every
    // policy's out-of-memory path returns its cache, as PyTorch's does; nocache returns the
    // freed segment) reads back as an empty_cache event.
    ASSERT_EQ(back.events.size(), 4u) << name;
    EXPECT_EQ(back.events[0].size, 1000u) << name;
    EXPECT_EQ(back.events[1].size, 30 * MiB) << name;
    EXPECT_EQ(back.events[2].op, trace::Op::free) << name;
    EXPECT_EQ(back.events[3].op, trace::Op::empty_cache) << name;
    ASSERT_EQ(back.recorded.ooms.size(), 1u) << name;
    EXPECT_EQ(back.recorded.ooms[0].size, 100 * MiB) << name;
    // The out-of-memory path returned the empty small segment: the 30 MiB block's is left.
    ASSERT_EQ(run.record.snapshot.segments.size(), 1u) << name;
    EXPECT_EQ(run.record.snapshot.segments[0].blocks[0].requested_size, 30 * MiB) << name;
  }
}

/// A window under memory pressure: the 44 MiB block, placed after the 4 MiB one that follows the
/// freed 40 MiB block, needs memory that only the cached 40 MiB block can give, and cistern's
/// engine reclaims it (unmaps its handles to map them again) instead of failing. With
/// `empty_cache`, the program empties the cache before the last allocation.
trace::Trace pressure_trace(bool empty_cache) {
  trace::Trace t = small_trace();
  const auto event = [](trace::Op op, std::uint64_t id, std::uint64_t size, std::int64_t time) {
    trace::Event e;
    e.op = op;
    e.id = id;
    e.size = size;
    e.time = time;
    return e;
  };
  t.events = {event(trace::Op::alloc, 0, 40 * MiB, 10), event(trace::Op::alloc, 1, 1000, 20),
              event(trace::Op::alloc, 4, 4 * MiB, 25),  event(trace::Op::free, 0, 40 * MiB, 30),
              event(trace::Op::alloc, 2, 44 * MiB, 40), event(trace::Op::free, 2, 44 * MiB, 50)};
  if (empty_cache) t.events.push_back(event(trace::Op::empty_cache, 0, 0, 60));
  t.events.push_back(event(trace::Op::alloc, 3, 8 * MiB, 70));
  return t;
}

/// The ops and sizes of a trace's events.
std::vector<std::pair<trace::Op, std::uint64_t>> ops_of(const trace::Trace& t) {
  std::vector<std::pair<trace::Op, std::uint64_t>> out;
  for (const trace::Event& e : t.events) out.emplace_back(e.op, e.size);
  return out;
}

TEST(ReplaySnapshot, ReclaimsReadBackAsTheAllocatorsOwnNotAsEmptyCache) {
  replay::Options options;
  options.capacity = 64 * MiB;
  for (const bool empty_cache : {false, true}) {
    const trace::Trace original = pressure_trace(empty_cache);
    const replay::RecordedRun run =
        replay::record_run(original, replay::Policy::parse("cistern"), options);
    std::size_t reclaims = 0;
    std::size_t releases = 0;
    for (const HistoryEntry& e : run.record.history) {
      if (e.action != HistoryEntry::Action::segment_unmap) continue;
      ++(e.reclaim ? reclaims : releases);
    }
    EXPECT_GT(reclaims, 0u) << "the window must make the engine reclaim pages";
    EXPECT_EQ(releases > 0, empty_cache);
    const std::string bytes = pytorch_snapshot_pickle({run.record}, run.config);
    // The writer marks each reclaim's unmap with cistern's frame, PyTorch's viewer shows it.
    const trace::pickle::Document doc = trace::pickle::parse(bytes, "marked.pickle");
    std::size_t marked = 0;
    for (const Value entry : doc.root().at("device_traces")[0]) {
      const Value frames = entry.at("frames");
      if (frames.size() == 1 && frames[0].at("name").as_string() == kReclaimFrame) ++marked;
    }
    EXPECT_EQ(marked, reclaims);
    // Read back: the same events, an empty_cache only where the program called it.
    const trace::Trace back = trace::read_trace_bytes(bytes, "back.pickle");
    EXPECT_EQ(ops_of(back), ops_of(original)) << "empty_cache " << empty_cache;
    EXPECT_TRUE(back.recorded.ooms.empty());
    std::size_t unmaps = 0;
    for (const trace::RecordedSegmentEvent& e : back.recorded.segment_events) {
      unmaps += e.kind == trace::RecordedSegmentEvent::Kind::unmap ? 1 : 0;
    }
    EXPECT_EQ(unmaps, reclaims + releases);
  }
}

TEST(ReplaySnapshot, FileNamesCarryPolicyAndTrace) {
  EXPECT_EQ(replay::snapshot_path("out.pickle", "torch", 0, false, false), "out.pickle");
  EXPECT_EQ(replay::snapshot_path("out.pickle", "torch", 0, true, false), "out.torch.pickle");
  EXPECT_EQ(replay::snapshot_path("d.x/out", "cistern:max_split_size_mb=256", 2, true, true),
            "d.x/out.cistern_max_split_size_mb_256.2");
  EXPECT_EQ(replay::snapshot_path("/t/s.pickle", "nocache", 1, false, true), "/t/s.1.pickle");
}

}  // namespace
}  // namespace cistern
