// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Recording a trace from the allocator's own history (trace_from_history), and storing it in
// cistern's trace format.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "allocator_fixture.hpp"
#include "cistern/errors.hpp"
#include "trace/history_trace.hpp"
#include "trace/native.hpp"
#include "trace/readers.hpp"
#include "trace_test_util.hpp"

namespace cistern::testing {
namespace {

using HistoryTraceTest = AllocatorTest;
using trace::Op;

TEST_F(HistoryTraceTest, RecordsWhatTheAllocatorDid) {
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  void* before = alloc->allocate(1000, default_stream);         // freed while recording
  void* throughout = alloc->allocate(3 * MiB, default_stream);  // never freed
  const Snapshot start = alloc->snapshot();
  const std::size_t reserved_at_start = alloc->reserved_bytes();
  alloc->record_history(true);

  void* a = alloc->allocate(5000, s1);
  alloc->record_stream(a, s2);
  device->launch(s2, 10);
  alloc->deallocate(a, s1);  // pending until s2's work is done
  alloc->deallocate(before, default_stream);
  void* big = alloc->allocate(20 * MiB, default_stream);  // a new segment
  device->advance(10);
  alloc->deallocate(alloc->allocate(8192, s1), s1);  // completes a's free first

  const trace::Trace t = trace::trace_from_history(alloc->history(), &start, 0, "test");
  EXPECT_EQ(t.format, "cistern");
  ASSERT_EQ(t.live_before.size(), 2u);
  EXPECT_EQ(t.live_before[0].addr,
            addr(throughout) < addr(before) ? addr(throughout) : addr(before));
  std::vector<std::uint64_t> sizes{t.live_before[0].size, t.live_before[1].size};
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<std::uint64_t>{1000, 3 * MiB}));

  ASSERT_EQ(t.events.size(), 6u);
  const std::vector<Op> ops{Op::alloc, Op::free, Op::free, Op::alloc, Op::alloc, Op::free};
  for (std::size_t i = 0; i < ops.size(); ++i) EXPECT_EQ(t.events[i].op, ops[i]) << i;
  EXPECT_EQ(t.events[0].size, 5000u);
  EXPECT_EQ(t.events[0].addr, addr(a));
  EXPECT_EQ(t.streams[t.events[0].stream], s1.handle);
  EXPECT_EQ(t.events[3].size, 20 * MiB);
  EXPECT_EQ(t.allocations(), 3u);
  EXPECT_EQ(t.peak_live(), 23 * MiB + 8192);

  ASSERT_EQ(t.recorded.deferred_frees.size(), 1u) << "a's free completed two events later";
  EXPECT_EQ(t.recorded.deferred_frees[0].id, t.events[0].id);
  EXPECT_EQ(t.recorded.initial_reserved, reserved_at_start);
  EXPECT_EQ(t.recorded.initial_segments.size(), start.segments.size());
  EXPECT_EQ(t.recorded.peak_reserved, alloc->reserved_bytes());
  ASSERT_EQ(t.recorded.segment_events.size(), 2u) << "s1's small segment, then the large one";
  EXPECT_EQ(t.recorded.segment_events[0].before_event, 0u);
  EXPECT_EQ(t.recorded.segment_events[0].size, 2 * MiB);
  EXPECT_EQ(t.streams[t.recorded.segment_events[0].stream], s1.handle);
  EXPECT_EQ(t.recorded.segment_events[1].before_event, 3u);
  EXPECT_EQ(t.recorded.segment_events[1].size, 20 * MiB);
  alloc->deallocate(big, default_stream);
  alloc->deallocate(throughout, default_stream);
}

TEST_F(HistoryTraceTest, ReadsBackFromCisternsFormat) {
  alloc->record_history(true);
  std::vector<void*> live;
  for (std::size_t i = 1; i <= 50; ++i) {
    live.push_back(alloc->allocate(i * 7919, default_stream));
    if (i % 3 == 0) {
      alloc->deallocate(live.front(), default_stream);
      live.erase(live.begin());
    }
  }
  alloc->empty_cache();
  const trace::Trace t = trace::trace_from_history(alloc->history(), nullptr, 0, "recorded");
  EXPECT_EQ(t.allocations(), 50u);
  EXPECT_FALSE(t.recorded.peak_reserved) << "levels are unknown without a start snapshot";
  std::ostringstream out;
  trace::write_native(out, t);
  trace::Trace back = trace::read_trace_bytes(out.str(), "recorded");
  back.source = t.source;
  expect_same_trace(t, back);
  for (void* p : live) alloc->deallocate(p, default_stream);
}

TEST(HistoryTrace, AnInconsistentHistoryNamesTheEntry) {
  HistoryEntry alloc_entry;
  alloc_entry.action = HistoryEntry::Action::alloc;
  alloc_entry.addr = 0x1000;
  alloc_entry.size = 512;
  const std::vector<HistoryEntry> twice{alloc_entry, alloc_entry};
  try {
    trace::trace_from_history(twice, nullptr, 0, "h");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "h: history[1]: alloc at 0x1000, which is allocated and not freed");
  }
}

}  // namespace
}  // namespace cistern::testing
