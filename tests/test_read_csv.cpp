// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The two CSV readers: lifetime lists (minimalloc, SOMAS) and RMM logs. The RMM logs here are
// small but written as rmm::mr::logging_resource_adaptor writes them (the shared folder has none).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "trace/native_text.hpp"
#include "trace/readers.hpp"
#include "trace_test_util.hpp"

namespace {

namespace trace = cistern::trace;
using cistern::testing::error_of;
using cistern::testing::expect_contains;
using cistern::testing::ScratchDir;

trace::Trace read(const std::string& text, const std::string& name,
                  trace::ReadOptions options = {}) {
  return trace::read_trace_bytes(text, name, options);
}

std::string read_error(const std::string& text, const std::string& name,
                       trace::ReadOptions options = {}) {
  return error_of([&] { read(text, name, options); });
}

// ---- lifetime lists ---------------------------------------------------------------------------

TEST(LifetimeReader, FreesComeBeforeAllocationsAtEqualSteps) {
  const trace::Trace t = read(
      "id,lower,upper,size\n"
      "b1,0,3,4\n"
      "b2,3,9,4\n"
      "b3,0,9,4\n"
      "b4,9,21,4\n"
      "b5,0,21,4\n",
      "example.csv");
  EXPECT_EQ(t.format, "lifetimes");
  EXPECT_EQ(t.peak_live(), 12U);  // never 16: b1 ends as b2 begins
  ASSERT_EQ(t.events.size(), 10U);
  // Allocation order (by lower, ties in file order) numbers the ids: b1 0, b3 1, b5 2, b2 3, b4 4.
  // Frees of one step come in file order: b2 before b3, b4 before b5.
  const trace::Op A = trace::Op::alloc, F = trace::Op::free;
  const std::pair<trace::Op, std::uint64_t> expected[] = {{A, 0}, {A, 1}, {A, 2}, {F, 0}, {A, 3},
                                                          {F, 3}, {F, 1}, {A, 4}, {F, 4}, {F, 2}};
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    EXPECT_EQ(t.events[i].op, expected[i].first) << i;
    EXPECT_EQ(t.events[i].id, expected[i].second) << i;
  }
  EXPECT_EQ(t.events[4].time, 3);  // the step
}

TEST(LifetimeReader, ColumnsByNameCrlfAndBlankLines) {
  const trace::Trace t = read("size,id,upper,lower\r\n10,x,5,1\r\n\r\n20,y,6,2\r\n", "swapped.csv");
  EXPECT_EQ(t.peak_live(), 30U);
  EXPECT_EQ(t.events[0].size, 10U);
  EXPECT_EQ(t.events[0].time, 1);
}

TEST(LifetimeReader, ByteOrderMarkAndCrlfAsWindowsEditorsWriteThem) {
  const std::string bom = "\xef\xbb\xbf";
  const std::string csv = "id,lower,upper,size\r\na,0,2,4\r\nb,1,3,8\r\n";
  for (const std::string& text : {bom + csv, csv, bom + "id,lower,upper,size\na,0,2,4\nb,1,3,8"}) {
    const trace::Trace t = read(text, "excel.csv");
    EXPECT_EQ(t.format, "lifetimes");
    EXPECT_EQ(t.peak_live(), 12U);
    ASSERT_EQ(t.events.size(), 4U);
    EXPECT_EQ(t.events[1].size, 8U);
  }
  trace::ReadOptions forced;
  forced.format = trace::Format::lifetimes;
  EXPECT_EQ(read(bom + csv, "excel.csv", forced).peak_live(), 12U);
}

TEST(LifetimeReader, Scale) {
  const std::string text = "id,lower,upper,size\n0,0,2,3\n1,1,3,5\n";
  trace::ReadOptions options;
  options.scale = 1 << 20;
  EXPECT_EQ(read(text, "units.csv", options).peak_live(), 8U << 20);
  options.scale = 0.5;  // rounded to the nearest byte: 1.5 -> 2, 2.5 -> 2 (ties to even)
  EXPECT_EQ(read(text, "units.csv", options).peak_live(), 4U);
  options.scale = 0;
  expect_contains(read_error(text, "units.csv", options), {"units.csv", "scale 0", "positive"});
  options.scale = 0.01;  // 3 * 0.01 rounds to 0 bytes
  expect_contains(read_error(text, "units.csv", options), {"units.csv:2:", "rounds to 0 bytes"});
  options.scale = double(std::uint64_t{1} << 55);
  expect_contains(read_error(text, "units.csv", options), {"units.csv:2:", "size 3", "absurd"});
}

TEST(LifetimeReader, MalformedLines) {
  const std::string header = "id,lower,upper,size\n";
  const auto error = [&](const std::string& body) { return read_error(header + body, "bad.csv"); };
  expect_contains(error("0,0,5,-5\n"), {"bad.csv:2:", "size '-5' is negative"});
  expect_contains(error("0,0,5,8\ngarbage\n"),
                  {"bad.csv:3:", "expected 4 comma-separated fields", "'garbage'"});
  expect_contains(error("0,0,5,8,9\n"), {"bad.csv:2:", "found 5"});
  expect_contains(error("0,0,5\n"), {"bad.csv:2:", "found 3"});
  expect_contains(error("0,0,5,1.5\n"), {"bad.csv:2:", "'1.5' is not a non-negative integer"});
  expect_contains(error("0,x,5,8\n"), {"bad.csv:2:", "lower 'x'"});
  expect_contains(error("0,0,5,0\n"), {"bad.csv:2:", "size 0"});
  expect_contains(error("0,5,5,8\n"), {"bad.csv:2:", "upper 5 is not after lower 5"});
  expect_contains(error("0,7,5,8\n"), {"bad.csv:2:", "upper 5 is not after lower 7"});
  expect_contains(error("a,0,5,8\nb,0,5,8\na,1,2,3\n"), {"bad.csv:4:", "duplicate id 'a'"});
  expect_contains(error(",0,5,8\n"), {"bad.csv:2:", "empty id"});
  expect_contains(error("0,0,5,72057594037927937\n"), {"bad.csv:2:", "absurd"});
  expect_contains(error("0,0,99999999999999999999999,8\n"), {"bad.csv:2:", "upper"});
  expect_contains(error(std::string("0,0,5,8\n\x01\xff\x7f,junk\n")), {"bad.csv:3:", "\\x01\\xff"});
}

TEST(LifetimeReader, MalformedHeader) {
  // Recognised as a lifetime list by its columns, then refused for the extra one.
  expect_contains(read_error("id,lower,upper,size,color\n0,0,1,1,red\n", "h.csv"),
                  {"h.csv:1:", "unknown column 'color'"});
  trace::ReadOptions as_lifetimes;
  as_lifetimes.format = trace::Format::lifetimes;
  expect_contains(read_error("id,lower,size\n0,0,1\n", "h.csv", as_lifetimes),
                  {"h.csv:1:", "lacks the column 'upper'"});
  expect_contains(read_error("id,lower,upper,size,size\n", "h.csv"),
                  {"h.csv:1:", "'size' appears twice"});
  expect_contains(read_error("\n\n", "empty.csv", as_lifetimes), {"empty.csv", "empty file"});
}

// ---- RMM logs ---------------------------------------------------------------------------------

// A log as logging_resource_adaptor writes it: thread id, wall clock, action, %p pointer,
// requested size, stream in hex without 0x.
const char* const rmm_log =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "140241183188800,23:59:59.999000,allocate,0x7f6c24000000,1024,0\n"
    "140241183188800,23:59:59.999500,free,0x7f6c3c000000,4096,0\n"  // live before the log
    "140241183188800,00:00:00.000100,allocate,0x7f6c24000400,2048,7f6c2c8d1230\n"
    "140241183188800,00:00:00.000200,allocate failure,(nil),1099511627776,0\n"
    "140241175000000,00:00:00.000300,free,0x7f6c24000000,1024,0\n"
    "140241175000000,00:00:00.000400,allocate,0x7f6c24000000,512,7f6c2c8d1230\n";

TEST(RmmLogReader, RealisticLog) {
  const trace::Trace t = read(rmm_log, "rmm_log.dev2.csv");
  EXPECT_EQ(t.format, "rmm");
  EXPECT_EQ(t.device, 2);  // from the ".dev<N>" name rmm gives per-device logs
  ASSERT_EQ(t.live_before.size(), 1U);
  EXPECT_EQ(t.live_before[0].addr, 0x7f6c3c000000U);
  EXPECT_EQ(t.live_before[0].size, 4096U);
  EXPECT_EQ(t.allocations(), 3U);
  EXPECT_EQ(t.peak_live(), 4096U + 1024U);  // 4096 freed before the 2048 arrives
  EXPECT_EQ(t.streams, (std::vector<std::uint64_t>{0, 0x7f6c2c8d1230}));
  EXPECT_EQ(t.events[2].stream, 1U);
  // Microseconds since the first midnight; the clock wrapped into the next day.
  EXPECT_EQ(t.events[0].time, 86'399'999'000);
  EXPECT_EQ(t.events[2].time, 86'400'000'100);
  ASSERT_EQ(t.recorded.ooms.size(), 1U);
  EXPECT_EQ(t.recorded.ooms[0].size, 1099511627776U);
  EXPECT_EQ(t.recorded.ooms[0].before_event, 3U);
  // The address is reused: a new id.
  EXPECT_EQ(t.events[4].addr, t.events[0].addr);
  EXPECT_NE(t.events[4].id, t.events[0].id);
}

TEST(RmmLogReader, NullPointersAndOlderHeaders) {
  // No Thread or Stream column; allocate(0) may give (nil), and freeing nullptr is a no-op.
  const trace::Trace t = read(
      "Time,Action,Pointer,Size\n"
      "10:00:00.5,allocate,(nil),0\n"
      "10:00:01.25,allocate,0x1000,16\n"
      "10:00:02,free,(nil),0\n",
      "old.csv");
  EXPECT_EQ(t.device, 0);
  EXPECT_EQ(t.events.size(), 1U);
  EXPECT_EQ(t.events[0].time, 36'001'250'000);
}

TEST(RmmLogReader, ByteOrderMarkAndCrlf) {
  const trace::Trace t = read(
      "\xef\xbb\xbfThread,Time,Action,Pointer,Size,Stream\r\n"
      "1,10:00:00.000001,allocate,0x10,4,0x0\r\n1,10:00:00.000002,free,0x10,4,0x0\r\n",
      "rmm.csv");
  EXPECT_EQ(t.format, "rmm");
  ASSERT_EQ(t.events.size(), 2U);
  EXPECT_EQ(t.events[0].size, 4U);
}

TEST(RmmLogReader, Malformed) {
  const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";
  const auto error = [&](const std::string& body) { return read_error(header + body, "log.csv"); };
  const std::string ok = "1,10:00:00.000001,allocate,0x1000,64,0\n";
  expect_contains(error(ok + "this is not a log line\n"),
                  {"log.csv:3:", "expected 6 comma-separated fields"});
  expect_contains(error("1,10:00:00.000001,allocate,0x1000,-64,0\n"),
                  {"log.csv:2:", "Size '-64' is negative"});
  expect_contains(error("1,10:00:00.000001,allocate,0x1000,1e3,0\n"), {"log.csv:2:", "Size '1e3'"});
  expect_contains(error("1,10:00:00.000001,allocate,0x1000,99999999999999999,0\n"),
                  {"log.csv:2:", "absurd"});
  expect_contains(error("1,10:00:00.000001,reallocate,0x1000,64,0\n"),
                  {"log.csv:2:", "unknown action 'reallocate'"});
  expect_contains(error("1,10:00:00.000001,allocate,0xZZ,64,0\n"),
                  {"log.csv:2:", "Pointer '0xZZ'"});
  expect_contains(error("1,10:00:00.000001,allocate,0x1000,64,stream\n"),
                  {"log.csv:2:", "Stream 'stream'"});
  expect_contains(error("1,25:00:00.000001,allocate,0x1000,64,0\n"),
                  {"log.csv:2:", "Time '25:00:00.000001'"});
  expect_contains(error("1,10:00,allocate,0x1000,64,0\n"), {"log.csv:2:", "Time"});
  expect_contains(error(ok + ok), {"log.csv:3:", "already allocated"});
  const std::string free = "1,10:00:00.000002,free,0x1000,64,0\n";
  expect_contains(error(ok + free + free),
                  {"log.csv:4:", "free of 0x1000, which is already freed"});
  expect_contains(error(ok + "1,10:00:00.000002,free,0x1000,32,0\n"),
                  {"log.csv:3:", "free of 0x1000 with Size 32", "allocated with Size 64"});
  expect_contains(error("1,10:00:00.000001,allocate,(nil),64,0\n"),
                  {"log.csv:2:", "returned (nil)"});
  expect_contains(read_error("Thread,Time,Action,Pointer,Size,Stream,Extra\n", "log.csv"),
                  {"log.csv:1:", "unknown column 'Extra'"});
  trace::ReadOptions as_rmm;
  as_rmm.format = trace::Format::rmm;
  expect_contains(read_error("Thread,Time,Action,Size\n", "log.csv", as_rmm),
                  {"log.csv:1:", "lacks the column 'Pointer'"});
}

TEST(RmmLogReader, FromAGzippedFile) {
  const ScratchDir dir;
  const trace::Trace direct = read(rmm_log, "log.csv");
  const std::string path = dir.write("log.csv.gz", cistern::trace::native::gzip(rmm_log, "log"));
  EXPECT_EQ(trace::read_trace(path).peak_live(), direct.peak_live());
  EXPECT_EQ(trace::list_devices(path), std::vector<int>{0});
}

}  // namespace
