// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The warm start: the recorded cache rebuilt on a SimDevice (see warm_start.hpp).
#include "replay/warm_start.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "cistern/errors.hpp"
#include "core/size_policy.hpp"

namespace cistern::replay {
namespace {

void* pointer_to(std::uint64_t address) {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
}

/// The integers of a text such as "{'1': 0, '2': 4}" or "-1", in order.
std::vector<long long> integers_in(const std::string& text) {
  std::vector<long long> out;
  const char* p = text.c_str();
  while (*p != '\0') {
    const bool starts_number = std::isdigit(static_cast<unsigned char>(*p)) != 0 ||
                               (*p == '-' && std::isdigit(static_cast<unsigned char>(p[1])) != 0);
    if (!starts_number) {
      ++p;
      continue;
    }
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    p = end;
    if (*p == '.') {  // a float: skip its fraction
      ++p;
      while (std::isdigit(static_cast<unsigned char>(*p)) != 0) ++p;
    }
  }
  return out;
}

/// PyTorch's `roundup_power2_divisions` setting as its snapshot writes it: a dict from the start
/// of each interval in MB ("1", "2", ... "32768") to its divisions.
void apply_divisions(const std::string& text, Config& config) {
  const std::vector<long long> numbers = integers_in(text);
  if (numbers.size() == 1) {
    config.roundup_power2_divisions.fill(static_cast<std::uint32_t>(std::max(0LL, numbers[0])));
    return;
  }
  for (std::size_t i = 0; i + 1 < numbers.size(); i += 2) {
    const long long mb = numbers[i];
    if (mb <= 0 || (mb & (mb - 1)) != 0) continue;
    const int index = detail::log2_floor(static_cast<std::uint64_t>(mb));
    if (index >= kRoundupIntervals) continue;
    config.roundup_power2_divisions[static_cast<std::size_t>(index)] =
        static_cast<std::uint32_t>(std::max(0LL, numbers[i + 1]));
  }
}

/// The live-before blocks of one recorded segment, by address.
struct SegmentBlocks {
  const trace::RecordedSegment* segment = nullptr;
  std::vector<std::size_t> blocks;  ///< indices into Trace::live_before
};

/// Groups the live-before blocks by the initial segment that holds them (blocks in no segment
/// are left out: placing them will fail with a message).
std::vector<SegmentBlocks> blocks_by_segment(const trace::Trace& trace) {
  std::map<std::uint64_t, SegmentBlocks> by_address;
  for (const trace::RecordedSegment& segment : trace.recorded.initial_segments) {
    by_address[segment.addr].segment = &segment;
  }
  for (std::size_t i = 0; i < trace.live_before.size(); ++i) {
    const std::uint64_t addr = trace.live_before[i].addr;
    auto it = by_address.upper_bound(addr);
    if (it == by_address.begin()) continue;
    --it;
    if (addr < it->first + it->second.segment->size) it->second.blocks.push_back(i);
  }
  std::vector<SegmentBlocks> out;
  for (auto& [addr, group] : by_address) {
    std::sort(group.blocks.begin(), group.blocks.end(), [&](std::size_t a, std::size_t b) {
      return trace.live_before[a].addr < trace.live_before[b].addr;
    });
    out.push_back(std::move(group));
  }
  return out;
}

/// Where the window allocates, and when each live-before block is freed.
class WindowAddresses {
 public:
  explicit WindowAddresses(const trace::Trace& trace) {
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      const trace::Event& event = trace.events[i];
      if (event.op == trace::Op::alloc && event.addr != 0) {
        allocs_.emplace(event.addr, i);
      } else if (event.op == trace::Op::free) {
        first_free_.emplace(event.id, i);  // keeps the first
      }
    }
  }

  /// The event index at which allocation `id` is first freed (events.size() if never).
  std::size_t free_of(std::uint64_t id, std::size_t none) const {
    const auto found = first_free_.find(id);
    return found == first_free_.end() ? none : found->second;
  }

  /// The address of the earliest allocation before event `until` in [lo, hi], if any.
  std::optional<std::uint64_t> first_alloc_in(std::uint64_t lo, std::uint64_t hi,
                                              std::size_t until) const {
    std::optional<std::uint64_t> addr;
    std::size_t earliest = until;
    for (auto it = allocs_.lower_bound(lo); it != allocs_.end() && it->first <= hi; ++it) {
      if (it->second < earliest) {
        earliest = it->second;
        addr = it->first;
      }
    }
    return addr;
  }

 private:
  std::multimap<std::uint64_t, std::size_t> allocs_;           // address -> event index
  std::unordered_map<std::uint64_t, std::size_t> first_free_;  // id -> event index
};

/// The block size of one large-pool live block (see `infer_live_block_sizes`).
std::size_t large_block_size(const trace::Trace& trace, std::size_t index, std::uint64_t next,
                             std::size_t rounded, std::size_t small_size,
                             const WindowAddresses& window) {
  const trace::LiveBlock& block = trace.live_before[index];
  const std::uint64_t round_end = block.addr + rounded;
  if (next <= round_end) return rounded;
  // (1) No free block of a large segment is 1 MiB or smaller: such a rest belongs to the block.
  if (next - round_end <= small_size) return static_cast<std::size_t>(next - block.addr);
  // (2) A block that the window allocates within 1 MiB of the rounded end, while this block is
  // live, starts where this block ends.
  const std::size_t freed = window.free_of(block.id, trace.events.size());
  const std::uint64_t last = std::min<std::uint64_t>(round_end + small_size, next);
  if (const auto x = window.first_alloc_in(round_end, last, freed)) {
    return static_cast<std::size_t>(*x - block.addr);
  }
  return rounded;
}

/// Installs the recorded segment addresses as the device's plan for new segments.
void plan_segment_addresses(const trace::Trace& trace, SimDevice& device) {
  using Queues = std::unordered_map<std::size_t, std::deque<std::uintptr_t>>;
  auto queues = std::make_shared<Queues>();
  for (const trace::RecordedSegmentEvent& event : trace.recorded.segment_events) {
    if (event.kind != trace::RecordedSegmentEvent::Kind::alloc) continue;
    (*queues)[static_cast<std::size_t>(event.size)].push_back(
        static_cast<std::uintptr_t>(event.addr));
  }
  if (queues->empty()) return;
  device.set_address_plan([queues](std::size_t bytes) -> std::uintptr_t {
    const auto found = queues->find(bytes);
    if (found == queues->end() || found->second.empty()) return 0;
    const std::uintptr_t address = found->second.front();
    found->second.pop_front();
    return address;
  });
}

}  // namespace

Config recorded_config(const trace::Trace& trace) {
  Config config;
  for (const auto& [key, value] : trace.recorded.settings) {
    const std::vector<long long> numbers = integers_in(value);
    if (key == "max_split_size" && numbers.size() == 1 && numbers[0] > 0) {
      config.max_split_size = static_cast<std::size_t>(numbers[0]);
    } else if (key == "roundup_power2_divisions") {
      apply_divisions(value, config);
    } else if (key == "garbage_collection_threshold") {
      config.garbage_collection_threshold = std::strtod(value.c_str(), nullptr);
    } else if (key == "expandable_segments") {
      config.expandable_segments = value == "True";
    }
  }
  return config;
}

std::vector<std::size_t> infer_live_block_sizes(const trace::Trace& trace, const Config& recorded) {
  const detail::SizePolicy sizes(recorded);
  std::vector<std::size_t> out(trace.live_before.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = sizes.round(
        static_cast<std::size_t>(std::max<std::uint64_t>(1, trace.live_before[i].size)));
  }
  const WindowAddresses window(trace);
  for (const SegmentBlocks& group : blocks_by_segment(trace)) {
    const trace::RecordedSegment& segment = *group.segment;
    if (!segment.is_large || segment.is_expandable) continue;  // exact: see the header
    for (std::size_t k = 0; k < group.blocks.size(); ++k) {
      const std::size_t index = group.blocks[k];
      const std::uint64_t next = k + 1 < group.blocks.size()
                                     ? trace.live_before[group.blocks[k + 1]].addr
                                     : segment.addr + segment.size;
      out[index] = large_block_size(trace, index, next, out[index], recorded.small_size, window);
    }
  }
  return out;
}

WarmStartResult apply_warm_start(const trace::Trace& trace, WarmStart& policy, SimDevice& device,
                                 const std::vector<Stream>& streams) {
  if (trace.recorded.initial_segments.empty() && !trace.live_before.empty()) {
    throw InvalidArgument(fmt::format(
        "{}: a warm start needs the segments the recording allocator held (PyTorch snapshots); "
        "this trace has blocks live before its window but no recorded segments: start cold",
        trace.source));
  }
  const auto stream_of = [&](std::uint32_t index) {
    if (streams.empty()) return Stream{index};
    if (index >= streams.size()) {
      throw InvalidArgument(
          fmt::format("{}: warm start: stream index {} has no device stream", trace.source, index));
    }
    return streams[index];
  };
  WarmStartResult result;
  for (const trace::RecordedSegment& segment : trace.recorded.initial_segments) {
    void* ptr = pointer_to(segment.addr);
    const auto bytes = static_cast<std::size_t>(segment.size);
    if (device.allocate_at(ptr, bytes) != Status::ok) {
      throw InvalidArgument(
          fmt::format("{}: warm start: cannot take the recorded segment at {:#x} "
                      "({} bytes): {}",
                      trace.source, segment.addr, segment.size, device.last_error()));
    }
    policy.adopt_segment(ptr, bytes, stream_of(segment.stream), segment.is_large);
    ++result.segments;
    result.reserved_bytes += segment.size;
  }
  result.block_sizes = infer_live_block_sizes(trace, recorded_config(trace));
  for (std::size_t i = 0; i < trace.live_before.size(); ++i) {
    const trace::LiveBlock& block = trace.live_before[i];
    if (block.addr == 0) {
      throw InvalidArgument(fmt::format(
          "{}: warm start: live-before block {} ({} bytes) has no recorded address: start cold",
          trace.source, block.id, block.size));
    }
    void* ptr = policy.place_block(pointer_to(block.addr), static_cast<std::size_t>(block.size),
                                   result.block_sizes[i], stream_of(block.stream));
    result.live.emplace_back(block.id, ptr);
  }
  plan_segment_addresses(trace, device);
  return result;
}

}  // namespace cistern::replay
