// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The PyTorch snapshot reader on small hand-made snapshots: a window that opens mid-run, deferred
// free completions, the segments held before the window, several devices and streams, and
// malformed files of every kind. Snapshots are written by a tiny pickler below (protocol 4, the
// opcodes PyTorch's own snapshots use).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "trace/native_text.hpp"
#include "trace/readers.hpp"
#include "trace_test_util.hpp"

namespace {

namespace trace = cistern::trace;
using cistern::testing::error_of;
using cistern::testing::expect_contains;
using cistern::testing::ScratchDir;

// ---- a tiny pickler ---------------------------------------------------------------------------

struct Py;
using PyList = std::vector<Py>;
using PyDict = std::vector<std::pair<std::string, Py>>;
/// A Python value: None, bool, int, float, str, list or dict (string keys).
struct Py {
  std::variant<std::monostate, bool, std::int64_t, double, std::string, PyList, PyDict> value;
  Py() = default;
  Py(bool b) : value(b) {}               // NOLINT(google-explicit-constructor)
  Py(int i) : value(std::int64_t{i}) {}  // NOLINT(google-explicit-constructor)
  Py(std::int64_t i) : value(i) {}       // NOLINT(google-explicit-constructor)
  Py(std::uint64_t i) : value(static_cast<std::int64_t>(i)) {}  // NOLINT
  Py(double d) : value(d) {}                    // NOLINT(google-explicit-constructor)
  Py(const char* s) : value(std::string(s)) {}  // NOLINT(google-explicit-constructor)
  Py(std::string s) : value(std::move(s)) {}    // NOLINT(google-explicit-constructor)
  Py(PyList l) : value(std::move(l)) {}         // NOLINT(google-explicit-constructor)
  Py(PyDict d) : value(std::move(d)) {}         // NOLINT(google-explicit-constructor)
};

class Pickler {
 public:
  std::string run(const Py& root) {
    out_ = "\x80\x04";
    write(root);
    out_ += '.';
    return out_;
  }

 private:
  void le(std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_ += static_cast<char>((value >> (8 * i)) & 0xff);
  }
  void write_int(std::int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      le(static_cast<std::uint64_t>(v), 1);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      le(static_cast<std::uint64_t>(v), 4);
    } else {
      out_ += "\x8a\x08";  // LONG1, 8 bytes, two's complement little-endian
      le(static_cast<std::uint64_t>(v), 8);
    }
  }
  void write_string(const std::string& s) {
    if (s.size() < 256) {
      out_ += '\x8c';
      le(s.size(), 1);
    } else {
      out_ += 'X';
      le(s.size(), 4);
    }
    out_ += s;
  }
  void write(const Py& py) {
    std::visit([this](const auto& v) { emit(v); }, py.value);
  }
  void emit(std::monostate) { out_ += 'N'; }
  void emit(bool b) { out_ += b ? '\x88' : '\x89'; }
  void emit(std::int64_t i) { write_int(i); }
  void emit(double d) {
    out_ += 'G';
    std::uint64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
  }
  void emit(const std::string& s) { write_string(s); }
  void emit(const PyList& list) {
    out_ += ']';
    if (list.empty()) return;
    out_ += '(';
    for (const Py& item : list) write(item);
    out_ += 'e';
  }
  void emit(const PyDict& dict) {
    out_ += '}';
    if (dict.empty()) return;
    out_ += '(';
    for (const auto& [key, value] : dict) {
      write_string(key);
      write(value);
    }
    out_ += 'u';
  }
  std::string out_;
};

std::string pickle(const Py& value) { return Pickler().run(value); }

// ---- snapshot pieces ----------------------------------------------------------------------------

constexpr std::int64_t MiB = 1 << 20;
constexpr std::int64_t base = 0x7f0000000000;

Py event(const char* action, std::int64_t addr, std::int64_t size, std::int64_t stream = 0,
         std::int64_t time = 0) {
  return PyDict{{"action", action}, {"addr", addr},    {"size", size},
                {"stream", stream}, {"time_us", time}, {"frames", PyList{}}};
}

Py block(std::int64_t addr, std::int64_t size, std::int64_t requested, const char* state) {
  return PyDict{{"address", addr},
                {"size", size},
                {"requested_size", requested},
                {"state", state},
                {"frames", PyList{}}};
}

Py segment(std::int64_t addr, std::int64_t total, PyList blocks, const char* type = "large",
           std::int64_t stream = 0, int device = 0, bool expandable = false) {
  return PyDict{{"device", device},
                {"address", addr},
                {"total_size", total},
                {"allocated_size", 0},
                {"active_size", 0},
                {"requested_size", 0},
                {"stream", stream},
                {"segment_type", type},
                {"segment_pool_id", PyList{}},
                {"is_expandable", expandable},
                {"frames", PyList{}},
                {"blocks", std::move(blocks)}};
}

Py snapshot(PyList segments, PyList device_traces) {
  return PyDict{{"segments", std::move(segments)},
                {"device_traces", std::move(device_traces)},
                {"allocator_settings", PyDict{{"PYTORCH_CUDA_ALLOC_CONF", ""},
                                              {"max_split_size", -1},
                                              {"garbage_collection_threshold", 0.0},
                                              {"expandable_segments", false},
                                              {"roundup_power2_divisions", PyDict{{"1", 0}}}}},
                {"external_annotations", PyList{}}};
}

trace::Trace read(const Py& value, const trace::ReadOptions& options = {}) {
  return trace::read_trace_bytes(pickle(value), "snap.pickle", options);
}

std::string read_error(const std::string& bytes, const trace::ReadOptions& options = {}) {
  return error_of([&] { trace::read_trace_bytes(bytes, "snap.pickle", options); });
}

// ---- the window and what came before it -------------------------------------------------------

TEST(PyTorchReader, WindowOpeningMidRun) {
  // Live before: B (freed in the window, 3000 bytes requested) and C (live throughout, 700).
  // The window allocates A, frees B, allocates D at B's address, frees A.
  const std::int64_t a = base, b = base + 4096, c = base + 8192;
  const Py snap = snapshot(
      PyList{
          segment(base, 2 * MiB,
                  PyList{block(a, 2048, 2000, "inactive"), block(b, 4096, 1000, "active_allocated"),
                         block(c, 1024, 700, "active_allocated")},
                  "small")},
      PyList{PyList{event("alloc", a, 2000, 0, 10), event("free_requested", b, 3000, 0, 11),
                    event("free_completed", b, 3000, 0, 11), event("alloc", b, 1000, 0, 12),
                    event("free_requested", a, 2000, 0, 13),
                    event("free_completed", a, 2000, 0, 13)}});
  const trace::Trace t = read(snap);
  EXPECT_EQ(t.format, "pytorch");
  ASSERT_EQ(t.live_before.size(), 2U);
  // Address order, ids 0..L-1.
  EXPECT_EQ(t.live_before[0].id, 0U);
  EXPECT_EQ(t.live_before[0].addr, static_cast<std::uint64_t>(b));
  EXPECT_EQ(t.live_before[0].size, 3000U);
  EXPECT_EQ(t.live_before[1].id, 1U);
  EXPECT_EQ(t.live_before[1].addr, static_cast<std::uint64_t>(c));
  EXPECT_EQ(t.live_before[1].size, 700U);
  ASSERT_EQ(t.events.size(), 4U);
  EXPECT_EQ(t.events[0].op, trace::Op::alloc);
  EXPECT_EQ(t.events[0].id, 2U);  // allocations follow the live blocks
  EXPECT_EQ(t.events[0].time, 10);
  EXPECT_EQ(t.events[1].op, trace::Op::free);
  EXPECT_EQ(t.events[1].id, 0U);
  EXPECT_EQ(t.events[1].size, 3000U);
  EXPECT_EQ(t.events[2].id, 3U);
  EXPECT_EQ(t.events[3].id, 2U);
  EXPECT_EQ(t.allocations(), 2U);
  // 3000 + 700 + 2000 at the first alloc.
  EXPECT_EQ(t.peak_live(), 5700U);
  EXPECT_TRUE(t.recorded.deferred_frees.empty());
  ASSERT_EQ(t.recorded.initial_segments.size(), 1U);
  EXPECT_FALSE(t.recorded.initial_segments[0].is_large);
  EXPECT_EQ(t.recorded.initial_reserved, static_cast<std::uint64_t>(2 * MiB));
  EXPECT_EQ(t.recorded.peak_reserved, static_cast<std::uint64_t>(2 * MiB));
}

TEST(PyTorchReader, ASnapshotWithoutHistoryIsKnownAsSuch) {
  // Dumped without _record_memory_history: segments, no event on any device.
  const PyList segments{segment(base, 2 * MiB,
                                PyList{block(base, 1024, 1000, "active_allocated"),
                                       block(base + 1024, 2 * MiB - 1024, 0, "inactive")},
                                "small")};
  const trace::Trace without = read(snapshot(segments, PyList{PyList{}}));
  EXPECT_FALSE(without.recorded.has_history);
  EXPECT_TRUE(without.events.empty());
  EXPECT_EQ(without.live_before.size(), 1U);
  EXPECT_EQ(error_of([&] { trace::require_history(without); }),
            "snap.pickle: the snapshot holds no allocation history (device_traces has no events): "
            "it was dumped without recording one. Call "
            "torch.cuda.memory._record_memory_history() before the work, then "
            "torch.cuda.memory._dump_snapshot(\"memory.pickle\") after it");
  // One entry on any device, even one that is not a block's (an oom), is a history.
  const Py oom = PyDict{{"action", "oom"}, {"size", 4096}, {"device_free", 0},
                        {"stream", 0},     {"time_us", 1}, {"frames", PyList{}}};
  const trace::Trace with = read(snapshot(segments, PyList{PyList{oom}}));
  EXPECT_TRUE(with.recorded.has_history);
  EXPECT_NO_THROW(trace::require_history(with));
  // Other formats always have one.
  EXPECT_NO_THROW(trace::require_history(trace::Trace{}));
}

TEST(PyTorchReader, LateCompletionsAreKept) {
  const std::int64_t a = base, b = base + 512, c = base + 1024;
  const Py snap = snapshot(
      PyList{segment(base, 2 * MiB, PyList{}, "small")},
      PyList{PyList{event("alloc", a, 100, 0, 1), event("alloc", b, 100, 0, 2),
                    event("free_requested", a, 100, 0, 3),
                    event("alloc", c, 100, 0, 4),           // a's completion waits for this
                    event("free_completed", a, 100, 0, 5),  // deferred: before event 4
                    event("free_requested", b, 100, 0, 6),
                    event("free_completed", b, 100, 0, 6),           // at once: not listed
                    event("free_completed", base + 9999, 64, 0, 7),  // requested before the window
                    event("free_requested", c, 100, 0, 8), event("free_completed", c, 100, 0, 8)}});
  const trace::Trace t = read(snap);
  ASSERT_EQ(t.recorded.deferred_frees.size(), 1U);
  EXPECT_EQ(t.recorded.deferred_frees[0].id, 0U);
  EXPECT_EQ(t.recorded.deferred_frees[0].before_event, 4U);
  EXPECT_EQ(t.recorded.deferred_frees[0].time, 5);
  EXPECT_TRUE(t.live_before.empty());
  EXPECT_EQ(t.events.size(), 6U);
}

TEST(PyTorchReader, FreesPendingAtTheEndCompleteAfterTheLastEvent) {
  // a and b are freed at the end of the window and never completed. The final segments show a
  // as active_pending_free (other streams' work was outstanding): its free completes after the
  // last event. b's block is shown inactive, so its missing completion is taken as immediate.
  const std::int64_t a = base, b = base + 512, c = base + 1024;
  const Py snap = snapshot(
      PyList{segment(base, 2 * MiB,
                     PyList{block(a, 512, 100, "active_pending_free"), block(b, 512, 0, "inactive"),
                            block(c, 512, 100, "active_allocated"),
                            block(base + 1536, 2 * MiB - 1536, 0, "inactive")},
                     "small")},
      PyList{PyList{event("alloc", a, 100, 0, 1), event("alloc", b, 100, 0, 2),
                    event("alloc", c, 100, 0, 3), event("free_requested", a, 100, 0, 4),
                    event("free_requested", b, 100, 0, 5)}});
  const trace::Trace t = read(snap);
  ASSERT_EQ(t.events.size(), 5U);
  ASSERT_EQ(t.recorded.deferred_frees.size(), 1U);
  EXPECT_EQ(t.recorded.deferred_frees[0].id, t.events[0].id);
  EXPECT_EQ(t.recorded.deferred_frees[0].before_event, 5U);  // after the last event
  EXPECT_EQ(t.recorded.deferred_frees[0].time, 5);
}

TEST(PyTorchReader, SegmentsBeforeTheWindowAreRebuilt) {
  // Final: S1 (allocated in the window) and S2 (held throughout). S3 (2 MiB) and S4 (20 MiB)
  // were freed in the window, so they were held when it opened.
  const std::int64_t s1 = base, s2 = base + 100 * MiB, s3 = base + 200 * MiB, s4 = base + 300 * MiB;
  const Py snap = snapshot(
      PyList{segment(s1, 40 * MiB, PyList{}, "large", 7),
             segment(s2, 2 * MiB, PyList{}, "small", 7)},
      PyList{PyList{event("segment_free", s3, 2 * MiB, 7, 1), event("alloc", s2, 512, 7, 2),
                    event("segment_free", s4, 20 * MiB, 7, 3),
                    event("segment_alloc", s1, 40 * MiB, 7, 4), event("alloc", s1, 30 * MiB, 7, 5),
                    event("oom", 0, 80 * MiB, 7, 6)}});
  trace::Trace t = read(snap);
  EXPECT_EQ(t.streams, std::vector<std::uint64_t>{7});
  const auto& initial = t.recorded.initial_segments;
  ASSERT_EQ(initial.size(), 3U);
  EXPECT_EQ(initial[0].addr, static_cast<std::uint64_t>(s2));
  EXPECT_FALSE(initial[0].is_large);
  EXPECT_EQ(initial[1].addr, static_cast<std::uint64_t>(s3));
  EXPECT_FALSE(initial[1].is_large);  // 2 MiB: the small pool's size
  EXPECT_EQ(initial[2].addr, static_cast<std::uint64_t>(s4));
  EXPECT_TRUE(initial[2].is_large);
  EXPECT_EQ(t.recorded.initial_reserved, static_cast<std::uint64_t>(24 * MiB));
  // 24 -> 22 -> 2 -> 42 MiB.
  EXPECT_EQ(t.recorded.peak_reserved, static_cast<std::uint64_t>(42 * MiB));
  const auto& events = t.recorded.segment_events;
  ASSERT_EQ(events.size(), 3U);
  // Each release (a segment_free with no allocation before it) is an empty_cache event, and its
  // segment events follow it: empty_cache, alloc, empty_cache, alloc.
  ASSERT_EQ(t.events.size(), 4U);
  EXPECT_EQ(t.events[0].op, trace::Op::empty_cache);
  EXPECT_EQ(t.events[0].time, 1);
  EXPECT_EQ(t.events[2].op, trace::Op::empty_cache);
  EXPECT_EQ(events[0].kind, trace::RecordedSegmentEvent::Kind::free);
  EXPECT_EQ(events[0].before_event, 1U);
  EXPECT_EQ(events[1].before_event, 3U);
  EXPECT_EQ(events[2].kind, trace::RecordedSegmentEvent::Kind::alloc);
  EXPECT_EQ(events[2].before_event, 3U);
  EXPECT_EQ(events[2].time, 4);
  ASSERT_EQ(t.recorded.ooms.size(), 1U);
  EXPECT_EQ(t.recorded.ooms[0].before_event, 4U);
  EXPECT_EQ(t.recorded.ooms[0].size, static_cast<std::uint64_t>(80 * MiB));
  ASSERT_GE(t.recorded.settings.size(), 5U);
  EXPECT_EQ(t.recorded.settings[0],
            (std::pair<std::string, std::string>{"PYTORCH_CUDA_ALLOC_CONF", ""}));
  EXPECT_EQ(t.recorded.settings[1].second, "-1");
  EXPECT_EQ(t.recorded.settings[3].second, "False");
  EXPECT_EQ(t.recorded.settings[4].second, "[1:0]");  // PyTorch's option syntax
}

TEST(PyTorchReader, ExpandableSegmentsGrowByMapping) {
  // One expandable segment of 60 MiB at the end; the window mapped its last 20 MiB and unmapped
  // 10 MiB that sat beyond it.
  const std::int64_t s = base;
  const Py snap = snapshot(
      PyList{segment(s, 60 * MiB, PyList{}, "large", 0, 0, true)},
      PyList{PyList{event("segment_unmap", s + 80 * MiB, 10 * MiB),
                    event("segment_map", s + 40 * MiB, 20 * MiB), event("alloc", s, 100)}});
  const trace::Trace t = read(snap);
  const auto& initial = t.recorded.initial_segments;
  ASSERT_EQ(initial.size(), 2U);
  EXPECT_EQ(initial[0].addr, static_cast<std::uint64_t>(s));
  EXPECT_EQ(initial[0].size, static_cast<std::uint64_t>(40 * MiB));
  EXPECT_TRUE(initial[0].is_expandable);
  EXPECT_EQ(initial[1].addr, static_cast<std::uint64_t>(s + 80 * MiB));
  EXPECT_EQ(initial[1].size, static_cast<std::uint64_t>(10 * MiB));
  EXPECT_EQ(t.recorded.initial_reserved, static_cast<std::uint64_t>(50 * MiB));
  EXPECT_EQ(t.recorded.peak_reserved, static_cast<std::uint64_t>(60 * MiB));
}

TEST(PyTorchReader, DevicesAndStreams) {
  const Py snap = snapshot(PyList{segment(base, 2 * MiB, PyList{}, "small", 0, 0),
                                  segment(base + 4 * MiB, 2 * MiB, PyList{}, "small", 0x55, 1)},
                           PyList{PyList{event("alloc", base, 10, 0)},
                                  PyList{event("alloc", base + 4 * MiB, 20, 0x55),
                                         event("alloc", base + 4 * MiB + 512, 30, 0x66),
                                         event("free_requested", base + 4 * MiB, 20, 0x55)}});
  const std::string bytes = pickle(snap);
  expect_contains(read_error(bytes), {"snap.pickle", "devices [0, 1]", "--device"});
  trace::ReadOptions one;
  one.device = 1;
  const trace::Trace t = trace::read_trace_bytes(bytes, "snap.pickle", one);
  EXPECT_EQ(t.device, 1);
  EXPECT_EQ(t.allocations(), 2U);
  EXPECT_EQ(t.streams, (std::vector<std::uint64_t>{0x55, 0x66}));
  EXPECT_EQ(t.events[1].stream, 1U);
  EXPECT_EQ(t.events[2].stream, 0U);
  one.device = 5;
  expect_contains(read_error(bytes, one), {"no device 5", "[0, 1]"});

  const ScratchDir dir;
  EXPECT_EQ(trace::list_devices(dir.write("snap.pickle", bytes)), (std::vector<int>{0, 1}));
}

// ---- malformed snapshots ----------------------------------------------------------------------

TEST(PyTorchReader, TruncatedPickle) {
  const std::string bytes = pickle(snapshot(PyList{}, PyList{PyList{event("alloc", base, 10)}}));
  for (const std::size_t keep : {std::size_t{3}, bytes.size() / 2, bytes.size() - 1}) {
    expect_contains(read_error(bytes.substr(0, keep)), {"snap.pickle", "offset", "truncated"});
  }
}

TEST(PyTorchReader, ForbiddenOpcodeIsNamed) {
  // cos\nsystem\n: GLOBAL, then a call - never run.
  const std::string evil = std::string("\x80\x04") + "cos\nsystem\n" + "\x8c\x02id\x85R.";
  expect_contains(read_error(evil), {"snap.pickle", "offset 2", "forbidden pickle opcode GLOBAL"});
  const std::string stack_global = std::string("\x80\x04\x8c\x02os\x8c\x06system\x93.");
  expect_contains(read_error(stack_global), {"STACK_GLOBAL"});
}

TEST(PyTorchReader, BadGzip) {
  const ScratchDir dir;
  const std::string good = cistern::trace::native::gzip(pickle(snapshot(PyList{}, PyList{})), "x");
  std::string corrupt = good;
  corrupt[corrupt.size() / 2] = static_cast<char>(corrupt[corrupt.size() / 2] ^ 0x55);
  const std::string truncated = good.substr(0, good.size() - 12);
  const std::vector<std::pair<std::string, std::string>> files{{"corrupt.pickle.gz", corrupt},
                                                               {"cut.pickle.gz", truncated}};
  for (const auto& [name, bytes] : files) {
    const std::string path = dir.write(name, bytes);
    const std::string message = error_of([&] { trace::read_trace(path); });
    expect_contains(message, {path});
    EXPECT_NE(message.find("gzip"), std::string::npos) << message;
  }
  expect_contains(error_of([&] { trace::read_trace(dir.path("missing.pickle")); }),
                  {"missing.pickle"});
}

TEST(PyTorchReader, WrongShape) {
  expect_contains(read_error(pickle(PyList{})), {"not a PyTorch memory snapshot", "list"});
  expect_contains(read_error(pickle(PyDict{{"segments", PyList{}}})), {"device_traces"});
  expect_contains(read_error(pickle(PyDict{{"segments", PyList{}}, {"device_traces", PyList{1}}})),
                  {"device_traces[0]", "list of events"});
}

TEST(PyTorchReader, BadEvents) {
  const auto with = [](Py e) {
    return pickle(snapshot(PyList{}, PyList{PyList{event("alloc", base, 8), e}}));
  };
  expect_contains(read_error(with(PyDict{{"action", "alloc"}, {"addr", base + 512}})),
                  {"snap.pickle: device_traces[0][1]: missing key 'size'"});
  expect_contains(read_error(with(event("alloc", base + 512, -5))),
                  {"device_traces[0][1]", "'size' is negative"});
  expect_contains(read_error(with(event("alloc", base + 512, std::int64_t{1} << 60))),
                  {"device_traces[0][1]", "over the limit"});
  expect_contains(
      read_error(with(PyDict{{"action", "alloc"}, {"addr", base + 512}, {"size", "12"}})),
      {"'size' is str", "expected an int"});
  expect_contains(read_error(with(event("bogus", base, 1))),
                  {"device_traces[0][1]", "unknown action 'bogus'"});
  expect_contains(read_error(with(event("alloc", base, 8))),
                  {"device_traces[0][1]", "already allocated"});
  expect_contains(read_error(with(event("free_completed", base, 8))), {"never freed"});
  expect_contains(read_error(with(PyDict{{"action", 3}})), {"'action' is not a str"});
  const Py double_free = snapshot(
      PyList{}, PyList{PyList{event("free_requested", base, 8), event("free_requested", base, 8)}});
  expect_contains(read_error(pickle(double_free)), {"device_traces[0][1]", "already freed"});
  const Py freed_but_active =
      snapshot(PyList{segment(base, 2 * MiB, PyList{block(base, 512, 8, "active_allocated")})},
               PyList{PyList{event("alloc", base, 8), event("free_requested", base, 8)}});
  expect_contains(read_error(pickle(freed_but_active)), {"segments[0].blocks[0]", "frees it"});
  expect_contains(read_error(with(5)), {"device_traces[0][1]", "expected a dict"});
}

TEST(PyTorchReader, IntegersBeyond64BitsAreNamedAsSuch) {
  // The size 0x7eadbeef12345678 written as LONG1 with 8 bytes, then widened to 9 bytes: 2^64 + 1.
  std::string bytes =
      pickle(snapshot(PyList{}, PyList{PyList{event("alloc", base, 0x7eadbeef12345678)}}));
  const std::string eight = std::string("\x8a\x08") + "\x78\x56\x34\x12\xef\xbe\xad\x7e";
  const std::size_t at = bytes.find(eight);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, eight.size(), std::string("\x8a\x09\x01", 3) + std::string(7, '\0') + "\x01");
  expect_contains(read_error(bytes),
                  {"device_traces[0][0]", "'size' is ", "an integer beyond the 64-bit range"});
}

TEST(PyTorchReader, OverlappingLiveAllocationsAreRefused) {
  // The second alloc starts inside the first, still live: a corrupt or spliced snapshot.
  const Py inside = snapshot(
      PyList{}, PyList{PyList{event("alloc", base, 4096), event("alloc", base + 1024, 512)}});
  EXPECT_EQ(read_error(pickle(inside)),
            "snap.pickle: device_traces[0][1]: alloc of 512 bytes at 0x7f0000000400 overlaps the "
            "live allocation [0x7f0000000000, 0x7f0000001000)");
  // One that ends inside a later live one.
  const Py before = snapshot(
      PyList{}, PyList{PyList{event("alloc", base + 1024, 512), event("alloc", base, 2048)}});
  expect_contains(read_error(pickle(before)), {"device_traces[0][1]",
                                               "overlaps the live allocation [0x7f0000000400, "
                                               "0x7f0000000600)"});
  // A block of the final segments that overlaps an allocation live at the end.
  const Py final_block =
      snapshot(PyList{segment(base, 2 * MiB,
                              PyList{block(base, 512, 512, "active_allocated"),
                                     block(base + 256, 512, 512, "active_allocated")})},
               PyList{PyList{}});
  expect_contains(read_error(pickle(final_block)),
                  {"segments[0].blocks[1]", "overlaps the live allocation"});
  // Freed before the next one starts: no overlap.
  const Py reused = snapshot(
      PyList{}, PyList{PyList{event("alloc", base, 4096), event("free_requested", base, 4096),
                              event("alloc", base + 1024, 512)}});
  EXPECT_EQ(read(reused).events.size(), 3u);
}

TEST(PyTorchReader, DataAfterStopIsRefusedWithItsOffset) {
  const std::string bytes = pickle(snapshot(PyList{}, PyList{PyList{}}));
  EXPECT_EQ(read_error(bytes + "junk"), "snap.pickle: offset " + std::to_string(bytes.size()) +
                                            ": 4 bytes of data after the pickle's STOP");
}

TEST(PyTorchReader, InconsistentSegments) {
  // A segment allocated in the window must still be held at the end, or be freed later in it.
  expect_contains(
      read_error(pickle(snapshot(PyList{}, PyList{PyList{event("segment_alloc", base, 2 * MiB)}}))),
      {"device_traces[0][0]", "segment_alloc", "neither in the final segments"});
  expect_contains(
      read_error(pickle(snapshot(PyList{segment(base, 2 * MiB, PyList{}, "small")},
                                 PyList{PyList{event("segment_free", base + MiB, 2 * MiB)}}))),
      {"device_traces[0][0]", "overlaps"});
  expect_contains(
      read_error(pickle(snapshot(PyList{segment(base, 2 * MiB, PyList{}, "medium")}, PyList{}))),
      {"segments[0]", "'segment_type'"});
  expect_contains(
      read_error(pickle(snapshot(
          PyList{segment(base, 2 * MiB, PyList{}), segment(base, 2 * MiB, PyList{})}, PyList{}))),
      {"segments[1]", "overlaps"});
  expect_contains(
      read_error(pickle(
          snapshot(PyList{segment(base, 2 * MiB, PyList{block(base, 512, -1, "active_allocated")})},
                   PyList{}))),
      {"segments[0].blocks[0]", "negative"});
}

TEST(PyTorchReader, ScaleIsRefused) {
  trace::ReadOptions scaled;
  scaled.scale = 2;
  expect_contains(read_error(pickle(snapshot(PyList{}, PyList{})), scaled),
                  {"--scale", "lifetime lists only"});
}

}  // namespace
