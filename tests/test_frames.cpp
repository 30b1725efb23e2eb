// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Where the memory went: call stacks (PyTorch's `frames`) kept through cistern. The stack table
// interns; the PyTorch snapshot reader keeps each allocation's frames (and refuses frames of the
// wrong shape with a message); `replay --snapshot`'s recorded run writes them back on the
// allocations' alloc and free events and on their blocks - for DeComFL's real snapshot, the very
// frames its allocations had.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/pytorch_snapshot.hpp"
#include "cistern/stacks.hpp"
#include "replay/snapshot_run.hpp"
#include "snapshot/pickle_writer.hpp"
#include "support/trace_sizes.hpp"
#include "trace/pickle.hpp"
#include "trace/readers.hpp"

namespace cistern {
namespace {

using trace::pickle::Value;
using Frames = std::vector<std::tuple<std::string, std::int64_t, std::string>>;

Frames frames_of(Value frames) {
  Frames out;
  for (const Value f : frames) {
    out.emplace_back(f.at("filename").as_string(), f.at("line").as_int(), f.at("name").as_string());
  }
  return out;
}

Frames frames_of(const StackTable& table, std::uint32_t stack) {
  Frames out;
  for (const std::uint32_t id : table.stack(stack)) {
    const StackFrame& f = table.frame(id);
    out.emplace_back(f.filename, f.line, f.name);
  }
  return out;
}

TEST(StackTable, InternsFramesAndStacks) {
  StackTable table;
  EXPECT_EQ(table.size(), 1u);
  EXPECT_TRUE(table.stack(0).empty());
  const std::uint32_t a = table.frame_id("train.py", 12, "step");
  const std::uint32_t b = table.frame_id("train.py", 40, "main");
  EXPECT_EQ(table.frame_id("train.py", 12, "step"), a);
  EXPECT_NE(a, b);
  // Fields do not run into each other: ("ab", "c") is not ("a", "bc").
  EXPECT_NE(table.frame_id("ab", 1, "c"), table.frame_id("a", 1, "bc"));
  const std::uint32_t s = table.stack_id({a, b});
  EXPECT_EQ(table.stack_id({a, b}), s);
  EXPECT_NE(table.stack_id({b, a}), s);
  EXPECT_EQ(table.stack_id({}), 0u);
  EXPECT_EQ(frames_of(table, s), (Frames{{"train.py", 12, "step"}, {"train.py", 40, "main"}}));
  EXPECT_THROW(table.stack(99), InvalidArgument);
  EXPECT_THROW(table.stack_id({1000}), InvalidArgument);
}

/// A snapshot of one alloc at 0x1000 (frames `alloc_frames`, written by `frames`), its free, and
/// a block 0x9000 live throughout whose frames are `block_frames`.
template <class AllocFrames, class BlockFrames>
std::string snapshot_with(AllocFrames alloc_frames, BlockFrames block_frames) {
  detail::PickleWriter w;
  w.begin_dict();
  w.string("segments");
  w.begin_list();
  w.begin_dict();
  w.string("address");
  w.integer(0x8000);
  w.string("total_size");
  w.integer(0x200000);
  w.string("blocks");
  w.begin_list();
  w.begin_dict();
  w.string("address");
  w.integer(0x9000);
  w.string("size");
  w.integer(512);
  w.string("state");
  w.string("active_allocated");
  w.string("frames");
  block_frames(w);
  w.end_dict();
  w.end_list();
  w.end_dict();
  w.end_list();
  w.string("device_traces");
  w.begin_list();
  w.begin_list();
  for (const char* action : {"alloc", "free_requested", "free_completed"}) {
    w.begin_dict();
    w.string("action");
    w.string(action);
    w.string("addr");
    w.integer(0x1000);
    w.string("size");
    w.integer(256);
    w.string("frames");
    alloc_frames(w);
    w.end_dict();
  }
  w.end_list();
  w.end_list();
  w.end_dict();
  return w.finish();
}

void frame(detail::PickleWriter& w, const char* file, std::int64_t line, const char* name) {
  w.begin_dict();
  w.string("filename");
  w.string(file);
  w.string("line");
  w.integer(line);
  w.string("name");
  w.string(name);
  w.end_dict();
}

TEST(SnapshotFrames, ReaderKeepsEachAllocationsFrames) {
  const std::string bytes = snapshot_with(
      [](detail::PickleWriter& w) {
        w.begin_list();
        frame(w, "model.py", 7, "forward");
        frame(w, "train.py", 30, "main");
        w.end_list();
      },
      [](detail::PickleWriter& w) {
        w.begin_list();
        frame(w, "setup.py", 3, "load");
        w.end_list();
      });
  const trace::Trace t = trace::read_trace_bytes(bytes, "frames.pickle");
  ASSERT_EQ(t.live_before.size(), 1u);
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(frames_of(t.stacks, t.stack_of(t.live_before[0].id)),
            (Frames{{"setup.py", 3, "load"}}));
  EXPECT_EQ(frames_of(t.stacks, t.stack_of(t.events[0].id)),
            (Frames{{"model.py", 7, "forward"}, {"train.py", 30, "main"}}));
}

TEST(SnapshotFrames, FramesOfTheWrongShapeAreRefusedByName) {
  const auto empty = [](detail::PickleWriter& w) {
    w.begin_list();
    w.end_list();
  };
  const auto refused = [&](auto frames, const std::string& expected) {
    try {
      (void)trace::read_trace_bytes(snapshot_with(frames, empty), "bad.pickle");
      ADD_FAILURE() << "accepted; expected " << expected;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("device_traces[0][0]"), std::string::npos) << e.what();
    }
  };
  refused([](detail::PickleWriter& w) { w.integer(5); }, "'frames' is int 5");
  refused(
      [](detail::PickleWriter& w) {
        w.begin_list();
        w.string("x");
        w.end_list();
      },
      "a frame is str");
  refused(
      [](detail::PickleWriter& w) {
        w.begin_list();
        w.begin_dict();
        w.string("filename");
        w.string("a.py");
        w.string("name");
        w.string("f");
        w.end_dict();
        w.end_list();
      },
      "missing key 'line'");
  refused(
      [](detail::PickleWriter& w) {
        w.begin_list();
        w.begin_dict();
        w.string("filename");
        w.integer(1);
        w.string("line");
        w.integer(1);
        w.string("name");
        w.string("f");
        w.end_dict();
        w.end_list();
      },
      "must be str");
  // None and [] are no frames.
  for (const bool none : {true, false}) {
    const trace::Trace t = trace::read_trace_bytes(snapshot_with(
                                                       [none](detail::PickleWriter& w) {
                                                         if (none) return w.none();
                                                         w.begin_list();
                                                         w.end_list();
                                                       },
                                                       empty),
                                                   "none.pickle");
    EXPECT_TRUE(t.alloc_stacks.empty());
  }
}

/// The alloc events of a snapshot's device 0, in order, and the frames of every event.
struct Written {
  std::vector<Frames> allocs;
  std::unordered_map<std::uint64_t, Frames> last_alloc_at;  // address -> its last alloc's
  std::size_t frees_checked = 0;
};

Written check_written(const trace::pickle::Document& doc) {
  Written out;
  for (const Value entry : doc.root().at("device_traces")[0]) {
    const std::string_view action = entry.at("action").as_string();
    const Frames frames = frames_of(entry.at("frames"));
    const auto addr =
        static_cast<std::uint64_t>(entry.find("addr") ? entry.at("addr").as_int() : 0);
    if (action == "alloc") {
      out.allocs.push_back(frames);
      out.last_alloc_at[addr] = frames;
    } else if (action == "free_requested" || action == "free_completed") {
      // A free carries its allocation's frames, as PyTorch's do.
      EXPECT_EQ(frames, out.last_alloc_at[addr]) << action << " at " << addr;
      ++out.frees_checked;
    }
  }
  return out;
}

TEST(SnapshotFrames, ReplayOfDeComFLWritesTheInputsFrames) {
  const std::string path = testing::shared_dir() + "/traces/pytorch/DeComFL/memory.pickle.gz";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "../shared is missing: no " << path << " (set CISTERN_SHARED_DIR)";
  }
  // The input's own frames, per alloc event in order (the trace's window allocations).
  const trace::pickle::Document input = trace::pickle::read_file(path);
  std::vector<Frames> input_allocs;
  for (const Value entry : input.root().at("device_traces")[0]) {
    if (entry.at("action").as_string() == "alloc")
      input_allocs.push_back(frames_of(entry.at("frames")));
  }
  const trace::Trace t = trace::read_trace(path);
  ASSERT_FALSE(t.alloc_stacks.empty()) << "DeComFL's snapshot has frames";
  ASSERT_GT(t.stacks.size(), 1u);
  EXPECT_LT(t.stacks.size(), t.allocations()) << "stacks are shared, interned once";
  ASSERT_EQ(input_allocs.size(), t.allocations());
  bool some_frames = false;
  for (const Frames& f : input_allocs) some_frames = some_frames || !f.empty();
  ASSERT_TRUE(some_frames);

  replay::Options options;
  options.capacity = std::uint64_t{80} << 30;
  for (const char* policy : {"cistern", "torch"}) {
    const replay::RecordedRun run = replay::record_run(t, replay::Policy::parse(policy), options);
    const trace::pickle::Document out =
        trace::pickle::parse(pytorch_snapshot_pickle({run.record}, run.config), "out.pickle");
    const Written written = check_written(out);
    // The cold start allocates live_before first, in address order, then the window's.
    ASSERT_EQ(written.allocs.size(), t.live_before.size() + input_allocs.size()) << policy;
    for (std::size_t i = 0; i < t.live_before.size(); ++i) {
      EXPECT_EQ(written.allocs[i], frames_of(t.stacks, t.stack_of(t.live_before[i].id)));
    }
    for (std::size_t k = 0; k < input_allocs.size(); ++k) {
      ASSERT_EQ(written.allocs[t.live_before.size() + k], input_allocs[k])
          << policy << ": alloc " << k;
    }
    EXPECT_GT(written.frees_checked, 0u);
    // Each allocated block at the end carries its allocation's frames.
    std::size_t blocks = 0;
    for (const Value segment : out.root().at("segments")) {
      for (const Value block : segment.at("blocks")) {
        if (block.at("state").as_string() != "active_allocated") continue;
        const auto addr = static_cast<std::uint64_t>(block.at("address").as_int());
        EXPECT_EQ(frames_of(block.at("frames")), written.last_alloc_at.at(addr)) << policy;
        ++blocks;
      }
    }
    EXPECT_GT(blocks, 0u) << policy;
  }
}

}  // namespace
}  // namespace cistern
