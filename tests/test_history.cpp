// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The allocator's event history (PyTorch's action names, order, ring-buffer limit).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "allocator_fixture.hpp"
#include "cistern/errors.hpp"

namespace cistern::testing {
namespace {

using HistoryTest = AllocatorTest;
using Action = HistoryEntry::Action;

std::vector<std::string> actions(const std::vector<HistoryEntry>& h) {
  std::vector<std::string> out;
  for (const HistoryEntry& e : h) out.emplace_back(to_string(e.action));
  return out;
}

TEST_F(HistoryTest, NothingIsRecordedUntilAsked) {
  alloc->deallocate(alloc->allocate(100, default_stream), default_stream);
  EXPECT_TRUE(alloc->history().empty());
}

TEST_F(HistoryTest, RecordsAllocationsFreesAndSegmentsInOrder) {
  alloc->record_history(true);
  void* a = alloc->allocate(1000, default_stream);
  alloc->deallocate(a, default_stream);
  alloc->empty_cache();
  const auto h = alloc->history();
  EXPECT_EQ(actions(h), (std::vector<std::string>{"segment_alloc", "alloc", "free_requested",
                                                  "free_completed", "segment_free"}));
  EXPECT_EQ(h[0].size, 2 * MiB);
  EXPECT_EQ(h[1].addr, addr(a));
  EXPECT_EQ(h[1].size, 1000u);  // the caller's size, as PyTorch records it
  EXPECT_EQ(h[2].size, 1000u);
  EXPECT_EQ(h[4].addr, h[0].addr);
  for (std::size_t i = 1; i < h.size(); ++i) {
    EXPECT_EQ(h[i].sequence, h[i - 1].sequence + 1);
    EXPECT_GE(h[i].time_us, h[i - 1].time_us);
  }
  EXPECT_GT(h[0].time_us, 1600000000000000u);  // epoch microseconds
}

TEST_F(HistoryTest, APendingFreeCompletesLater) {
  const Stream s1 = device->create_stream();
  const Stream s2 = device->create_stream();
  alloc->record_history(true);
  void* a = alloc->allocate(4096, s1);
  alloc->record_stream(a, s2);
  device->launch(s2, 10);
  alloc->deallocate(a, s1);
  EXPECT_EQ(actions(alloc->history()).back(), "free_requested");
  device->advance(10);
  alloc->deallocate(alloc->allocate(8192, s1), s1);  // processes the event
  const auto h = alloc->history();
  EXPECT_EQ(actions(h),
            (std::vector<std::string>{"segment_alloc", "alloc", "free_requested", "free_completed",
                                      "alloc", "free_requested", "free_completed"}));
  EXPECT_EQ(h[3].addr, addr(a));
  EXPECT_EQ(h[3].stream, s1);
}

TEST_F(HistoryTest, RecordsOutOfMemoryWithTheDevicesFreeBytes) {
  make("", 4 * MiB);
  alloc->record_history(true);
  EXPECT_THROW(alloc->allocate(3 * MiB, default_stream), OutOfMemory);
  const auto h = alloc->history();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].action, Action::oom);
  EXPECT_EQ(h[0].addr, 4 * MiB);  // what the device reported as free
  EXPECT_EQ(h[0].size, 3 * MiB);  // the rounded request
}

TEST_F(HistoryTest, TheRingBufferDropsTheOldestEntries) {
  make("", 4 * MiB);
  alloc->record_history(true, 3);
  EXPECT_THROW(alloc->allocate(3 * MiB, default_stream), OutOfMemory);
  void* b = alloc->allocate(100, default_stream);
  alloc->deallocate(b, default_stream);
  const auto h = alloc->history();
  EXPECT_EQ(actions(h), (std::vector<std::string>{"alloc", "free_requested", "free_completed"}));
  EXPECT_EQ(h.front().sequence, 2u);  // oom (0) and segment_alloc (1) were dropped
  alloc->record_history(false);
  alloc->deallocate(alloc->allocate(100, default_stream), default_stream);
  EXPECT_EQ(alloc->history().size(), 3u);  // stopped: the last history stays readable
}

}  // namespace
}  // namespace cistern::testing
