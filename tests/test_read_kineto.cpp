// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The Kineto reader on small Chrome-trace files shaped like the PyTorch profiler's: order by
// time, blocks live before the trace, PyTorch's counters, devices, and malformed JSON.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trace/readers.hpp"
#include "trace_test_util.hpp"

namespace {

namespace trace = cistern::trace;
using cistern::testing::error_of;
using cistern::testing::expect_contains;

/// One `[memory]` event as the profiler writes it.
std::string memory(long long ts, long long index, long long addr, long long bytes,
                   long long allocated, long long reserved, int device = 0, int type = 1) {
  return fmt::format(
      R"({{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 2, )"
      R"("ts": {}, "args": {{"Ev Idx": {}, "Device Type": {}, "Device Id": {}, "Addr": {}, )"
      R"("Bytes": {}, "Total Allocated": {}, "Total Reserved": {}}}}})",
      ts, index, type, device, addr, bytes, allocated, reserved);
}

std::string kineto(const std::vector<std::string>& events) {
  std::string out = R"({"schemaVersion": 1, "traceEvents": [)";
  out +=
      R"({"ph": "X", "cat": "kernel", "name": "gemm", "ts": 5, "dur": 3, "args": {"stream": 7}})";
  for (const std::string& event : events) out += ",\n" + event;
  out += R"(], "traceName": "t.json"})";
  return out;
}

trace::Trace read(const std::string& json, trace::ReadOptions options = {}) {
  return trace::read_trace_bytes(json, "t.json", options);
}

std::string read_error(const std::string& json, trace::ReadOptions options = {}) {
  return error_of([&] { read(json, options); });
}

TEST(KinetoReader, OrdersByTimeAndRebuildsWhatCameBefore) {
  // Before the trace: 1000 bytes live at 0x100 (freed in it) and 5000 more never named.
  // Allocated before the first event = 6000.
  const std::string json = kineto({
      memory(30, 4, 0x300, -512, 6000 - 1000 + 512 - 512, 8192),  // free of 0x300, after its alloc
      memory(10, 1, 0x200, 256, 6256, 8192), memory(20, 3, 0x300, 512, 6000 - 1000 + 512, 8192),
      memory(20, 2, 0x100, -1000, 6256 - 1000, 8192),  // same ts: Ev Idx orders
      memory(40, 5, 0x200, -256, 4744, 4096),
      memory(1, 0, 0x999, 64, 64, 64, -1, 0),  // CPU memory: ignored
  });
  const trace::Trace t = read(json);
  EXPECT_EQ(t.format, "kineto");
  EXPECT_EQ(t.device, 0);
  ASSERT_EQ(t.events.size(), 5U);
  EXPECT_EQ(t.events[0].addr, 0x200U);
  EXPECT_EQ(t.events[1].addr, 0x100U);
  EXPECT_EQ(t.events[1].op, trace::Op::free);
  EXPECT_EQ(t.events[2].addr, 0x300U);
  EXPECT_EQ(t.events[0].time, 10);
  ASSERT_EQ(t.live_before.size(), 2U);
  EXPECT_EQ(t.live_before[0].addr, 0U);  // the unnamed rest, as one block
  EXPECT_EQ(t.live_before[0].size, 5000U);
  EXPECT_EQ(t.live_before[1].addr, 0x100U);
  EXPECT_EQ(t.live_before[1].size, 1000U);
  EXPECT_EQ(t.peak_live(), 6256U);  // PyTorch's own Total Allocated peak
  EXPECT_EQ(t.recorded.initial_reserved, 8192U);
  EXPECT_EQ(t.recorded.peak_reserved, 8192U);
  using Sample = std::pair<std::size_t, std::uint64_t>;
  EXPECT_EQ(t.recorded.reserved_samples, (std::vector<Sample>{{0, 8192}, {4, 4096}}));
}

TEST(KinetoReader, TopLevelArrayAndNoCounters) {
  const std::string json =
      R"([{"name": "[memory]", "ts": 1.5, "args": {"Device Type": 1, "Device Id": 0, "Addr": 16, "Bytes": 512}}])";
  const trace::Trace t = read(json);
  EXPECT_EQ(t.events.size(), 1U);
  EXPECT_TRUE(t.live_before.empty());
  EXPECT_FALSE(t.recorded.peak_reserved.has_value());
}

TEST(KinetoReader, ByteOrderMarkAndCrlf) {
  std::string json = kineto({memory(1, 0, 0x100, 512, 512, 2048)});
  for (std::size_t at = json.find('\n'); at != std::string::npos; at = json.find('\n', at + 2)) {
    json.insert(at, "\r");
  }
  const trace::Trace t = read("\xef\xbb\xbf" + json);
  EXPECT_EQ(t.format, "kineto");
  EXPECT_EQ(t.events.size(), 1U);
  EXPECT_EQ(t.peak_live(), 512U);
}

TEST(KinetoReader, Devices) {
  const std::string json =
      kineto({memory(1, 0, 0x100, 512, 512, 2048, 0), memory(2, 1, 0x900, 1024, 1024, 2048, 3)});
  expect_contains(read_error(json), {"t.json", "devices [0, 3]", "--device"});
  trace::ReadOptions three;
  three.device = 3;
  EXPECT_EQ(read(json, three).peak_live(), 1024U);
  three.device = 2;
  expect_contains(read_error(json, three), {"no CUDA [memory] events of device 2", "[0, 3]"});
  const cistern::testing::ScratchDir dir;
  EXPECT_EQ(trace::list_devices(dir.write("t.json", json)), (std::vector<int>{0, 3}));
}

TEST(KinetoReader, NotAMemoryTrace) {
  expect_contains(read_error(kineto({})), {"t.json", "no [memory] events", "profile_memory=True"});
  expect_contains(read_error(R"({"traceEvents": 5})"), {"t.json", "traceEvents"});
  expect_contains(read_error(R"({"other": []})"), {"t.json", "traceEvents"});
  expect_contains(read_error(kineto({memory(1, 0, 0x10, 64, 64, 64, -1, 0)})),
                  {"no CUDA [memory] events"});
}

TEST(KinetoReader, MalformedMemoryEvents) {
  const std::string first = memory(1, 0, 0x100, 512, 512, 2048);
  const auto with = [&](const std::string& event) { return read_error(kineto({first, event})); };
  expect_contains(
      with(
          R"({"name": "[memory]", "ts": 2, "args": {"Device Type": 1, "Device Id": 0, "Addr": 256, "Bytes": "many"}})"),
      {"t.json: traceEvents[2]:", "\"Bytes\" is not an integer"});
  expect_contains(
      with(
          R"({"name": "[memory]", "ts": 2, "args": {"Device Type": 1, "Device Id": 0, "Addr": 256}})"),
      {"traceEvents[2]", "lacks \"Bytes\""});
  expect_contains(with(R"({"name": "[memory]", "ts": 2})"),
                  {"traceEvents[2]", "without an \"args\""});
  expect_contains(
      with(
          R"({"name": "[memory]", "args": {"Device Type": 1, "Device Id": 0, "Addr": 256, "Bytes": 5}})"),
      {"traceEvents[2]", "\"ts\""});
  expect_contains(with(memory(2, 1, 0x100, 512, 1024, 2048)),
                  {"traceEvents[2]", "already allocated"});
  expect_contains(
      read_error(kineto({first, memory(2, 1, 0x100, -512, 0, 0), memory(3, 2, 0x100, -512, 0, 0)})),
      {"traceEvents[3]", "already freed"});
  expect_contains(with(memory(2, 1, 0x100, -256, 256, 2048)),
                  {"traceEvents[2]", "free of 256 bytes", "allocated with 512"});
  expect_contains(with(memory(2, 1, 0x100, std::int64_t{1} << 60, 0, 0)),
                  {"traceEvents[2]", "absurd"});
  expect_contains(with(memory(2, 1, 0x200, 64, -5, 0)),
                  {"traceEvents[2]", "\"Total Allocated\" is negative"});
  expect_contains(with(memory(2, 1, 0x200, 64, 5, 0, -1)), {"traceEvents[2]", "\"Device Id\" -1"});
}

TEST(KinetoReader, InvalidJson) {
  const std::string json =
      kineto({memory(1, 0, 0x100, 512, 512, 2048), memory(2, 1, 0x100, -512, 0, 2048)});
  for (const std::size_t keep : {std::size_t{1}, json.size() / 3, json.size() / 2}) {
    expect_contains(read_error(json.substr(0, keep)), {"t.json"});
  }
  expect_contains(
      read_error(R"({"traceEvents": [{"name": "[memory]", "ts": 1, "args": {"Bytes": 5,}}]})"),
      {"t.json", "JSON"});
  expect_contains(read_error("{\"traceEvents\": [\x01\x02]}"), {"t.json"});
  expect_contains(read_error(R"({"traceEvents": [5]})"),
                  {"t.json: traceEvents[0]:", "not an object"});
}

}  // namespace
