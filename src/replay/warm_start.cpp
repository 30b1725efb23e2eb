// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The warm start: the recorded cache rebuilt on a SimDevice (see warm_start.hpp).
#include "replay/warm_start.hpp"

#include <fmt/format.h>

#include <algorithm>
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

// --- expandable segments ---------------------------------------------------------------------------

using SegmentKind = trace::RecordedSegmentEvent::Kind;

/// The reservations held when the window opens: one per (stream, pool) of the expandable initial
/// segments, from the lowest address mapped in it (before or during the window), `bytes_of` long
/// or long enough for its mapped ranges.
std::vector<InferredReservation> group_initial(const trace::Trace& trace,
                                               const std::function<std::uint64_t(bool)>& bytes_of,
                                               std::uint64_t small_page) {
  std::map<std::pair<std::uint32_t, bool>, InferredReservation> groups;
  std::map<std::pair<std::uint32_t, bool>, std::uint64_t> ends;
  const auto& segments = trace.recorded.initial_segments;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const trace::RecordedSegment& s = segments[i];
    if (!s.is_expandable) continue;
    const auto key = std::make_pair(s.stream, s.is_large);
    InferredReservation& r = groups[key];
    if (r.mapped.empty()) {
      r.stream = s.stream;
      r.is_large = s.is_large;
      r.base = s.addr;
    }
    r.base = std::min(r.base, s.addr);
    ends[key] = std::max(ends[key], s.addr + s.size);
    r.mapped.push_back(i);
  }
  // Pages below the lowest one held that the window maps (PyTorch had unmapped them before it).
  for (const trace::RecordedSegmentEvent& e : trace.recorded.segment_events) {
    if (e.kind != SegmentKind::map) continue;
    const auto key = std::make_pair(e.stream, e.size != small_page);
    const auto found = groups.find(key);
    if (found == groups.end() || e.addr >= found->second.base) continue;
    if (e.addr + bytes_of(key.second) >= ends[key]) found->second.base = e.addr;
  }
  std::vector<InferredReservation> out;
  for (auto& [key, r] : groups) {
    r.bytes = std::max(bytes_of(key.second), ends[key] - r.base);
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const InferredReservation& a, const InferredReservation& b) {
    return a.base < b.base;
  });
  return out;
}

/// Walks the window's map and unmap events over the reservations held: a map outside every
/// reservation of its stream opens a new one at its address; a reservation whose last page is
/// unmapped is released. Returns the new reservations' bases in order.
std::vector<std::uint64_t> window_reservations(const trace::Trace& trace,
                                               const std::vector<InferredReservation>& initial,
                                               const std::function<std::uint64_t(bool)>& bytes_of,
                                               std::uint64_t small_page) {
  struct Held {
    std::uint32_t stream;
    std::uint64_t base, end, mapped;
  };
  std::vector<Held> held;
  for (const InferredReservation& r : initial) {
    std::uint64_t mapped = 0;
    for (const std::size_t i : r.mapped) mapped += trace.recorded.initial_segments[i].size;
    held.push_back({r.stream, r.base, r.base + r.bytes, mapped});
  }
  std::vector<std::uint64_t> bases;
  for (const trace::RecordedSegmentEvent& e : trace.recorded.segment_events) {
    if (e.kind != SegmentKind::map && e.kind != SegmentKind::unmap) continue;
    const auto it = std::find_if(held.begin(), held.end(), [&](const Held& h) {
      return h.stream == e.stream && h.base <= e.addr && e.addr + e.size <= h.end;
    });
    if (e.kind == SegmentKind::map && it == held.end()) {
      bases.push_back(e.addr);
      held.push_back({e.stream, e.addr, e.addr + bytes_of(e.size != small_page), e.size});
    } else if (e.kind == SegmentKind::map) {
      it->mapped += e.size;
    } else if (it != held.end()) {
      it->mapped -= std::min(it->mapped, e.size);
      if (it->mapped == 0) held.erase(it);
    }
  }
  return bases;
}

/// Cuts each reservation short of the next recorded range above its base (to whole pages, never
/// below its mapped ranges): the replay's device may be larger than the recording one.
void clip_reservations(const trace::Trace& trace, ReservationLayout& layout,
                       const Config& recorded) {
  std::vector<std::uint64_t> starts(layout.window_bases);
  for (const trace::RecordedSegment& s : trace.recorded.initial_segments) {
    if (!s.is_expandable) starts.push_back(s.addr);
  }
  for (const InferredReservation& r : layout.initial) starts.push_back(r.base);
  std::sort(starts.begin(), starts.end());
  for (InferredReservation& r : layout.initial) {
    const auto next = std::upper_bound(starts.begin(), starts.end(), r.base);
    if (next == starts.end() || *next - r.base >= r.bytes) continue;
    const std::uint64_t page =
        r.is_large ? recorded.large_segment_size : recorded.small_segment_size;
    std::uint64_t mapped_end = r.base;
    for (const std::size_t i : r.mapped) {
      const trace::RecordedSegment& s = trace.recorded.initial_segments[i];
      mapped_end = std::max(mapped_end, s.addr + s.size);
    }
    r.bytes = std::max((*next - r.base) / page * page, mapped_end - r.base);
  }
}

/// Takes the inferred reservations at their bases and maps the recorded ranges in them.
void adopt_reservations(const trace::Trace& trace, const ReservationLayout& layout,
                        WarmStart& policy, SimDevice& device,
                        const std::function<Stream(std::uint32_t)>& stream_of,
                        WarmStartResult& result) {
  for (const InferredReservation& r : layout.initial) {
    if (device.reserve_at(pointer_to(r.base), static_cast<std::size_t>(r.bytes)) != Status::ok) {
      throw InvalidArgument(
          fmt::format("{}: warm start: cannot reserve the expandable segment at {:#x} "
                      "({} bytes): {}",
                      trace.source, r.base, r.bytes, device.last_error()));
    }
    policy.adopt_reservation(pointer_to(r.base), static_cast<std::size_t>(r.bytes),
                             stream_of(r.stream), r.is_large);
    for (const std::size_t i : r.mapped) {
      const trace::RecordedSegment& s = trace.recorded.initial_segments[i];
      policy.adopt_mapped(pointer_to(s.addr), static_cast<std::size_t>(s.size));
      ++result.segments;
      result.reserved_bytes += s.size;
    }
  }
  if (layout.window_bases.empty()) return;
  auto queue = std::make_shared<std::deque<std::uintptr_t>>(layout.window_bases.begin(),
                                                            layout.window_bases.end());
  device.set_reservation_plan([queue](std::size_t) -> std::uintptr_t {
    if (queue->empty()) return 0;
    const std::uintptr_t base = queue->front();
    queue->pop_front();
    return base;
  });
}

/// Whether the trace shows expandable segments: held when the window opens, or mapped in it.
bool shows_expandable(const trace::Trace& trace) {
  const auto& rec = trace.recorded;
  return std::any_of(rec.initial_segments.begin(), rec.initial_segments.end(),
                     [](const trace::RecordedSegment& s) { return s.is_expandable; }) ||
         std::any_of(
             rec.segment_events.begin(), rec.segment_events.end(),
             [](const trace::RecordedSegmentEvent& e) { return e.kind == SegmentKind::map; });
}

}  // namespace

ReservationLayout infer_reservations(const trace::Trace& trace,
                                     const std::function<std::uint64_t(bool)>& bytes_of) {
  const Config recorded = recorded_config(trace);
  const std::uint64_t small_page = recorded.small_segment_size;
  ReservationLayout layout;
  layout.initial = group_initial(trace, bytes_of, small_page);
  layout.window_bases = window_reservations(trace, layout.initial, bytes_of, small_page);
  clip_reservations(trace, layout, recorded);
  return layout;
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
  // Expandable segments go into their reservations when the policy has them too.
  const bool expandable = shows_expandable(trace);
  const bool reservations = expandable && policy.expandable_reservation_bytes(true) > 0;
  if (expandable && !reservations) {
    result.note =
        "the recording used expandable segments and this policy maps no pages: PyTorch's mapped "
        "ranges start as fixed segments (plain torch, which takes expandable_segments:True from "
        "the snapshot, reproduces them)";
  }
  for (const trace::RecordedSegment& segment : trace.recorded.initial_segments) {
    if (reservations && segment.is_expandable) continue;
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
  if (reservations) {
    const ReservationLayout layout = infer_reservations(
        trace, [&policy](bool is_large) { return policy.expandable_reservation_bytes(is_large); });
    adopt_reservations(trace, layout, policy, device, stream_of, result);
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
