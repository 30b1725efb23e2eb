// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Fidelity of the PyTorch emulation: on every PyTorch snapshot under ../shared/traces/pytorch,
// started warm from the cache PyTorch held when the window opened, the emulation must place
// every allocation at the address PyTorch recorded, allocate the same sequence of segment sizes
// as the recorded segment_alloc events, and reach PyTorch's recorded peak reserved to the byte;
// and at the end of the window its segments and blocks (address, size, state) must be exactly
// the `segments` PyTorch wrote into the snapshot. The replay is the engine's own (its Replayer,
// warm start and event loop), with hooks that compare each step with the recording.
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
#include <string>
#include <unordered_map>
#include <vector>

#include "cistern/sim_device.hpp"
#include "replay/engine.hpp"
#include "replay/plan.hpp"
#include "replay/replayer.hpp"
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

/// The blocks of PyTorch's final `segments` for `device`, by address.
std::vector<FinalBlock> recorded_final_blocks(const std::string& path, int device) {
  const trace::pickle::Document doc = trace::pickle::parse(trace::read_file(path), path);
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
    for (const trace::RecordedFreeCompletion& c : t.recorded.deferred_frees) {
      completion_[c.id] = c.before_event;
    }
  }
  void attach(detail::Replayer& replayer) { replayer_ = &replayer; }

  void before_event(std::size_t i) override {
    for (auto it = deferred_.begin(); it != deferred_.end() && it->first <= i;) {
      replayer_->free_slot(it->second, default_stream);
      it = deferred_.erase(it);
    }
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
  bool freeing(std::size_t i, const detail::Step& step, void*, Stream) override {
    const auto c = completion_.find(t_.events[i].id);
    if (c == completion_.end() || c->second <= i) return true;
    deferred_.emplace(c->second, step.slot);
    return false;
  }

 private:
  const trace::Trace& t_;
  Fidelity& f_;
  detail::Replayer* replayer_ = nullptr;
  std::map<std::size_t, bool> empty_cache_before_;
  std::unordered_map<std::uint64_t, std::size_t> completion_;
  std::multimap<std::size_t, std::uint32_t> deferred_;  // completion event -> slot
  std::size_t reserved_before_ = 0;
};

/// Replays `t` warm on the emulation through the engine and compares it with what PyTorch
/// recorded.
Fidelity replay_warm(const trace::Trace& t) {
  Policy policy;
  policy.name = policy.label = "torch";
  policy.config = recorded_config(t);
  Options options;
  options.capacity = std::size_t{1} << 40;  // ample: no out-of-memory path in the window
  options.start = Start::warm;
  const detail::Plan plan = detail::compile(t);
  EXPECT_EQ(plan.error, "");
  Fidelity f;
  for (const trace::RecordedSegmentEvent& s : t.recorded.segment_events) {
    if (s.kind == trace::RecordedSegmentEvent::Kind::alloc) f.recorded_segments.push_back(s.size);
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

TEST(TorchFidelity, ReproducesEveryRecordedPyTorchSnapshot) {
  const std::string root = cistern::testing::shared_dir() + "/traces/pytorch";
  if (!std::filesystem::is_directory(root)) {
    GTEST_SKIP() << "no PyTorch snapshots at " << root << " (set CISTERN_SHARED_DIR)";
  }
  const std::vector<std::string> files = pytorch_snapshots(root);
  ASSERT_FALSE(files.empty()) << "no snapshots under " << root;
  std::string table =
      fmt::format("{:<52} {:>7} {:>9} {:>9} {:>15} {:>15} {:>11}\n", "snapshot", "allocs", "addr",
                  "segments", "recorded peak", "emulated peak", "final state");
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    const trace::Trace t = trace::read_trace(path);
    ASSERT_TRUE(t.recorded.peak_reserved.has_value()) << "the reader gave no recorded peak";
    const Fidelity f = replay_warm(t);
    EXPECT_EQ(f.matched, f.allocations) << f.first_divergence;
    EXPECT_EQ(f.segments, f.recorded_segments) << "segment sizes differ";
    EXPECT_EQ(f.peak_reserved, f.recorded_peak);
    const std::string final_difference = compare_final_blocks(recorded_final_blocks(path, t.device),
                                                              emulated_final_blocks(f.final_state));
    EXPECT_EQ(final_difference, "");
    const double rate = f.allocations == 0
                            ? 1.0
                            : static_cast<double>(f.matched) / static_cast<double>(f.allocations);
    table += fmt::format(
        "{:<52} {:>7} {:>8.4f}% {:>9} {:>15} {:>15} {:>11}\n",
        std::filesystem::relative(path, root).string(), f.allocations, 100.0 * rate,
        f.segments == f.recorded_segments
            ? fmt::format("{}/{}", f.segments.size(), f.recorded_segments.size())
            : std::string("DIFFER"),
        f.recorded_peak, f.peak_reserved, final_difference.empty() ? "same" : "DIFFERS");
  }
  std::cout << table;
}

}  // namespace
}  // namespace cistern::replay
