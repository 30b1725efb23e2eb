// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// cistern's own trace format (docs/trace-format.md): a hand-written file read field by field, an
// exact round trip of a trace that uses every part of the model, malformed files; and what the
// readers share: format recognition, the override, `Trace::check` and `peak_live`.
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "trace/native.hpp"
#include "trace/readers.hpp"
#include "trace_test_util.hpp"

namespace {

namespace trace = cistern::trace;
using cistern::testing::error_of;
using cistern::testing::expect_contains;
using cistern::testing::expect_same_trace;

trace::Trace read(const std::string& text, trace::ReadOptions options = {}) {
  return trace::read_trace_bytes(text, "t.trace", options);
}

std::string read_error(const std::string& text, trace::ReadOptions options = {}) {
  return error_of([&] { read(text, options); });
}

std::string write(const trace::Trace& t) {
  std::ostringstream out;
  trace::write_native(out, t);
  return out.str();
}

const char* const example =
    "# cistern-trace v1\n"
    "# a comment\n"
    "format pytorch\n"
    "device 1\n"
    "stream 0x0\n"
    "stream 0x7f00aa\n"
    "live 0 1048576 0 0x7f0000000000\n"
    "segment 0x7f0000000000 20971520 0 large\n"
    "segment 0x7f0002000000 2097152 1 small expandable\n"
    "initial_reserved 23068672\n"
    "setting max_split_size -1\n"
    "setting PYTORCH_CUDA_ALLOC_CONF \"\"\n"
    "setting note two\\x20words\n"
    "\n"
    "segment_alloc 0x7f0004000000 2097152 1 99\n"
    "a 1 512 1 0x7f0004000000 100\n"
    "reserved 25165824\n"
    "a 2 100\n"
    "  f   1 1 101\n"
    "oom 4096 0 1 102\n"
    "s\n"
    "free_completed 1 103\n"
    "e 0 104\n"
    "f 0\n"
    "peak_reserved 25165824\n";

TEST(NativeFormat, ReadsEveryLineKind) {
  const trace::Trace t = read(example);
  EXPECT_EQ(t.source, "t.trace");
  EXPECT_EQ(t.format, "pytorch");
  EXPECT_EQ(t.device, 1);
  EXPECT_EQ(t.streams, (std::vector<std::uint64_t>{0, 0x7f00aa}));
  ASSERT_EQ(t.live_before.size(), 1U);
  EXPECT_EQ(t.live_before[0].addr, 0x7f0000000000U);
  ASSERT_EQ(t.recorded.initial_segments.size(), 2U);
  EXPECT_FALSE(t.recorded.initial_segments[1].is_large);
  EXPECT_TRUE(t.recorded.initial_segments[1].is_expandable);
  EXPECT_EQ(t.recorded.initial_reserved, 23068672U);
  EXPECT_EQ(t.recorded.peak_reserved, 25165824U);
  using Setting = std::pair<std::string, std::string>;
  EXPECT_EQ(t.recorded.settings,
            (std::vector<Setting>{
                {"max_split_size", "-1"}, {"PYTORCH_CUDA_ALLOC_CONF", ""}, {"note", "two words"}}));
  ASSERT_EQ(t.events.size(), 6U);
  EXPECT_EQ(t.events[0].stream, 1U);
  EXPECT_EQ(t.events[0].time, 100);
  EXPECT_EQ(t.events[1].stream, 0U);  // defaults
  EXPECT_EQ(t.events[1].addr, 0U);
  EXPECT_EQ(t.events[2].op, trace::Op::free);
  EXPECT_EQ(t.events[2].size, 512U);  // a free carries its allocation's size and address
  EXPECT_EQ(t.events[2].addr, 0x7f0004000000U);
  EXPECT_EQ(t.events[3].op, trace::Op::synchronize);
  EXPECT_EQ(t.events[4].op, trace::Op::empty_cache);
  EXPECT_EQ(t.events[4].time, 104);
  ASSERT_EQ(t.recorded.segment_events.size(), 1U);
  EXPECT_EQ(t.recorded.segment_events[0].before_event, 0U);
  EXPECT_EQ(t.recorded.reserved_samples,
            (std::vector<std::pair<std::size_t, std::uint64_t>>{{0, 25165824}}));
  ASSERT_EQ(t.recorded.ooms.size(), 1U);
  EXPECT_EQ(t.recorded.ooms[0].before_event, 3U);
  ASSERT_EQ(t.recorded.deferred_frees.size(), 1U);
  EXPECT_EQ(t.recorded.deferred_frees[0].before_event, 4U);
  EXPECT_EQ(t.peak_live(), 1048576U + 612U);
  // Written back and read again: the same trace.
  expect_same_trace(t, read(write(t)));
}

/// A trace that uses every field, with values at the edges of their ranges.
trace::Trace everything() {
  trace::Trace t;
  t.source = "made";
  t.format = "odd format\nname";
  t.device = 7;
  t.streams = {0xffffffffffffffffULL, 0, 42};
  t.live_before = {{5, 1, 0, 2}, {9, trace::max_allocation_size, 0x10, 0}};
  t.events = {
      {trace::Op::alloc, 2, 100, 7, 0, -5},
      {trace::Op::synchronize, 1, 0, 0, 0, 0},
      {trace::Op::free, 0, 5, 1, 0, 0},
      {trace::Op::alloc, 0, 0, 0, 0xdeadbeef000, 0},
      {trace::Op::empty_cache, 0, 0, 0, 0, INT64_MIN},
      {trace::Op::free, 1, 100, 7, 0, INT64_MAX},
  };
  t.recorded.initial_segments = {{0x1000, 2097152, 2, false, true}};
  t.recorded.segment_events = {{trace::RecordedSegmentEvent::Kind::map, 0, 0x3000, 4096, 2, 1},
                               {trace::RecordedSegmentEvent::Kind::unmap, 6, 0x3000, 4096, 0, 0}};
  t.recorded.initial_reserved = 0;
  t.recorded.peak_reserved = 1;
  t.recorded.reserved_samples = {{0, 3}, {5, 0}};
  t.recorded.settings = {{"", "\\x41 \"quoted\"\t"}, {"k", ""}};
  t.recorded.deferred_frees = {{5, 3, -1}};
  t.recorded.ooms = {{0, 12, 34, 1, 56}, {6, 0, 0, 0, 0}};
  return t;
}

TEST(NativeFormat, RoundTripIsExact) {
  const trace::Trace original = everything();
  ASSERT_NO_THROW(original.check());
  const std::string text = write(original);
  expect_same_trace(original, read(text));
  // Stable: writing the copy gives the same text (but for the source comment).
  trace::Trace copy = read(text);
  copy.source = original.source;
  EXPECT_EQ(write(copy), text);
}

TEST(NativeFormat, EmptyTrace) {
  const trace::Trace t = read("# cistern-trace v1\n");
  EXPECT_EQ(t.format, "cistern");
  EXPECT_EQ(t.streams, std::vector<std::uint64_t>{0});
  EXPECT_TRUE(t.events.empty());
  expect_same_trace(t, read(write(t)));
}

TEST(NativeFormat, Malformed) {
  const std::string magic = "# cistern-trace v1\n";
  const auto error = [&](const std::string& body) { return read_error(magic + body); };
  expect_contains(error("a 1 10\nf 2\n"), {"t.trace:3:", "id 2 was never allocated"});
  expect_contains(error("a 1 10\na 1 20\n"), {"t.trace:3:", "id 1 is already used (line 2)"});
  expect_contains(error("a 1 10\nf 1\nf 1\n"), {"t.trace:4:", "already freed on line 3"});
  expect_contains(error("live 3 10\na 3 20\n"), {"t.trace:3:", "id 3 is already used (line 2)"});
  expect_contains(error("a 1 -10\n"), {"t.trace:2:", "size '-10' is negative"});
  expect_contains(error("a 1 72057594037927937\n"), {"t.trace:2:", "absurd"});
  expect_contains(error("a 1 10 1\n"), {"t.trace:2:", "stream index 1", "1 streams"});
  expect_contains(error("a 1\n"), {"t.trace:2:", "'a' takes 2 to 5 fields, found 1"});
  expect_contains(error("a 1 2 0 0x10 5 6 7 8 9\n"), {"t.trace:2:", "too many fields"});
  expect_contains(error("a 1 2 0 xyz\n"), {"t.trace:2:", "address 'xyz'"});
  expect_contains(error("a 1 2 0 0x1 soon\n"), {"t.trace:2:", "time 'soon'"});
  expect_contains(error("allocate 1 2\n"), {"t.trace:2:", "unknown line kind 'allocate'"});
  expect_contains(error("a 1 2\ndevice 3\n"), {"t.trace:3:", "'device' belongs to the header"});
  expect_contains(error("a 1 2\nstream 0x5\n"), {"t.trace:3:", "header"});
  expect_contains(error("live 1 2 0\nstream 0x5\n"),
                  {"t.trace:3:", "before any line that uses a stream"});
  expect_contains(error("live 1 2 0 0x20\nlive 2 2 0 0x10\n"), {"t.trace:3:", "address order"});
  expect_contains(error("reserved 5\n"), {"t.trace:2:", "before the first event"});
  expect_contains(error("a 1 2\nreserved 5\nreserved 6\n"), {"t.trace:4:", "second 'reserved'"});
  expect_contains(error("a 1 2\nfree_completed 1\n"), {"t.trace:3:", "not freed"});
  expect_contains(error("setting k \\x4\n"), {"t.trace:2:", "malformed escape"});
  expect_contains(error("setting k \"x\n"), {"t.trace:2:", "malformed escape"});
  expect_contains(error("segment 0x0 10 0 medium\n"), {"t.trace:2:", "'medium'"});
  expect_contains(error("device -1\n"), {"t.trace:2:", "negative"});
  expect_contains(error("device 1\ndevice 1\n"), {"t.trace:3:", "second 'device'"});
  expect_contains(error("peak_reserved 1\npeak_reserved 2\n"),
                  {"t.trace:3:", "second 'peak_reserved'"});
  expect_contains(read_error("# cistern-trace v2\n"),
                  {"t.trace:1:", "unsupported cistern trace version ' v2'"});
  trace::ReadOptions as_native;
  as_native.format = trace::Format::cistern;
  expect_contains(read_error("a 1 2\n", as_native), {"t.trace:1:", "not a cistern trace"});
  as_native.device = 4;
  expect_contains(read_error(magic, as_native), {"t.trace", "device 0, not device 4"});
}

TEST(NativeFormat, WriterRefusesBrokenTraces) {
  trace::Trace t;
  t.source = "broken";
  t.events = {{trace::Op::free, 0, 3, 0, 0, 0}};
  std::ostringstream out;
  expect_contains(error_of([&] { trace::write_native(out, t); }),
                  {"broken: events[0]: free of id 3, which is not live"});
}

// ---- shared by every reader -------------------------------------------------------------------

TEST(TraceFormats, RecognisedByContent) {
  const std::string n = "x";
  EXPECT_EQ(trace::detect_format("\x80\x04\x95", n), trace::Format::pytorch);
  EXPECT_EQ(trace::detect_format("# cistern-trace v1\n", n), trace::Format::cistern);
  EXPECT_EQ(trace::detect_format("\xef\xbb\xbf \n{\"traceEvents\": []}", n), trace::Format::kineto);
  EXPECT_EQ(trace::detect_format("id,lower,upper,size\r\n", n), trace::Format::lifetimes);
  EXPECT_EQ(trace::detect_format("Thread,Time,Action,Pointer,Size,Stream\n", n),
            trace::Format::rmm);
  expect_contains(error_of([&] { trace::detect_format("hello\x01 world", "mystery.bin"); }),
                  {"mystery.bin", "unknown trace format", "'hello\\x01 world'"});
  expect_contains(error_of([&] { trace::detect_format("", "empty"); }),
                  {"empty", "unknown trace format"});
  for (const auto format : {trace::Format::pytorch, trace::Format::lifetimes, trace::Format::rmm,
                            trace::Format::kineto, trace::Format::cistern}) {
    EXPECT_EQ(trace::format_from_string(trace::to_string(format)), format);
  }
  EXPECT_FALSE(trace::format_from_string("pickle").has_value());
}

TEST(TraceFormats, OverrideReadsAsTheNamedFormat) {
  trace::ReadOptions as_kineto;
  as_kineto.format = trace::Format::kineto;
  expect_contains(read_error("id,lower,upper,size\n0,0,1,1\n", as_kineto), {"t.trace", "JSON"});
  trace::ReadOptions as_pytorch;
  as_pytorch.format = trace::Format::pytorch;
  expect_contains(read_error("# cistern-trace v1\n", as_pytorch),
                  {"t.trace", "offset 0", "pickle"});
}

TEST(TraceModel, PeakLiveAndCheck) {
  trace::Trace t;
  t.live_before = {{0, 100, 0, 0}};
  t.events = {{trace::Op::alloc, 0, 1, 50, 0, 0},
              {trace::Op::free, 0, 0, 100, 0, 0},
              {trace::Op::alloc, 0, 2, 80, 0, 0},
              {trace::Op::free, 0, 2, 80, 0, 0}};
  EXPECT_EQ(t.peak_live(), 150U);
  EXPECT_EQ(t.allocations(), 2U);
  EXPECT_NO_THROW(t.check());
  EXPECT_STREQ(trace::to_string(trace::Op::empty_cache), "empty_cache");

  trace::Trace reused = t;
  reused.events.push_back({trace::Op::alloc, 0, 1, 10, 0, 0});
  expect_contains(error_of([&] { reused.check(); }), {"trace: events[4]: alloc reuses id 1"});
  trace::Trace bad_stream = t;
  bad_stream.events[0].stream = 3;
  expect_contains(error_of([&] { bad_stream.check(); }), {"events[0]: stream index 3"});
  trace::Trace bad_free = t;
  bad_free.events[1].size = 99;
  expect_contains(error_of([&] { bad_free.check(); }), {"events[1]", "size 99", "100"});
  trace::Trace bad_sync = t;
  bad_sync.events.push_back({trace::Op::synchronize, 0, 4, 0, 0, 0});
  expect_contains(error_of([&] { bad_sync.check(); }),
                  {"events[4]: synchronize with a nonzero id"});
  trace::Trace bad_segment = t;
  bad_segment.recorded.segment_events = {{trace::RecordedSegmentEvent::Kind::alloc, 9, 0, 1, 0, 0}};
  expect_contains(error_of([&] { bad_segment.check(); }),
                  {"recorded.segment_events[0]: position 9"});
  trace::Trace bad_sample = t;
  bad_sample.recorded.reserved_samples = {{2, 1}, {2, 1}};
  expect_contains(error_of([&] { bad_sample.check(); }), {"recorded.reserved_samples[1]"});
  trace::Trace early = t;
  early.recorded.deferred_frees = {{2, 1, 0}};
  expect_contains(error_of([&] { early.check(); }),
                  {"recorded.deferred_frees[0]: id 2 completes before"});
  trace::Trace huge;
  for (std::uint64_t id = 0; id < 300; ++id) {
    huge.events.push_back({trace::Op::alloc, 0, id, trace::max_allocation_size, 0, 0});
  }
  expect_contains(error_of([&] { huge.check(); }), {"events[255]", "live bytes exceed 2^64"});
}

}  // namespace
