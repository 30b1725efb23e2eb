// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`): what the window's events give
// (readers.hpp says how each action maps) and the state before the window, rebuilt from the
// final `segments`. The pickle is parsed by our data-only reader; everything read from it is
// checked here for kind and range, with the place named in messages.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/history.hpp"
#include "cistern/stacks.hpp"
#include "trace/address_lifetimes.hpp"
#include "trace/pickle.hpp"
#include "trace/pytorch_segments.hpp"
#include "trace/reader_support.hpp"

namespace cistern::trace::detail {
namespace {

using pickle::Value;

/// The two parts of a snapshot the reader needs.
struct Snapshot {
  Value segments;
  Value device_traces;
  std::optional<Value> settings;
};

Snapshot open_snapshot(const pickle::Document& document) {
  const Value root = document.root();
  const auto fail = [&](std::string_view problem) {
    throw InvalidArgument(
        fmt::format("{}: not a PyTorch memory snapshot: {}", document.name(), problem));
  };
  if (!root.is_dict()) fail(fmt::format("the pickle holds a {}, not a dict", root.type_name()));
  const std::optional<Value> segments = root.find("segments");
  const std::optional<Value> traces = root.find("device_traces");
  if (!segments || !segments->is_list()) fail("no list under the key 'segments'");
  if (!traces || !traces->is_list()) {
    fail(
        "no list under the key 'device_traces' (record with "
        "torch.cuda.memory._record_memory_history before dumping)");
  }
  return Snapshot{*segments, *traces, root.find("allocator_settings")};
}

/// A place in the snapshot for messages: "device_traces[0][17]". The text is formatted only
/// when a message needs it: there is one place per event.
struct Place {
  const std::string& name;
  const char* pattern;  ///< fmt pattern taking `first` and `second`, e.g. "segments[{}]"
  std::size_t first = 0;
  std::size_t second = 0;

  std::string what() const { return fmt::format(fmt::runtime(pattern), first, second); }
  [[noreturn]] void fail(std::string_view problem) const {
    throw InvalidArgument(fmt::format("{}: {}: {}", name, what(), problem));
  }
  Value field(Value dict, std::string_view key) const {
    if (!dict.is_dict()) fail(fmt::format("expected a dict, got {}", dict.describe(40)));
    const std::optional<Value> value = dict.find(key);
    if (!value) fail(fmt::format("missing key '{}' in {}", key, dict.describe(60)));
    return *value;
  }
  std::int64_t integer(Value dict, std::string_view key) const {
    const Value value = field(dict, key);
    if (value.kind() == pickle::Kind::big_integer) {
      fail(fmt::format("'{}' is {}, an integer beyond the 64-bit range", key, value.describe(40)));
    }
    if (!value.is_int()) {
      fail(fmt::format("'{}' is {} {}, expected an int", key, value.type_name(),
                       value.describe(40)));
    }
    return value.as_int();
  }
  std::uint64_t address(Value dict, std::string_view key) const {
    const std::int64_t value = integer(dict, key);
    if (value < 0) fail(fmt::format("'{}' is negative: {}", key, value));
    return static_cast<std::uint64_t>(value);
  }
  std::uint64_t size(Value dict, std::string_view key) const {
    const std::uint64_t value = address(dict, key);
    if (value > max_allocation_size) {
      fail(fmt::format("'{}' is {} bytes, over the limit of {} (corrupt?)", key, value,
                       max_allocation_size));
    }
    return value;
  }
  /// The optional 'stream' as a handle (a cudaStream_t's bits); 0 when absent.
  std::uint64_t stream(Value dict) const {
    return dict.find("stream") ? static_cast<std::uint64_t>(integer(dict, "stream")) : 0;
  }
};

/// Device of a final segment: its 'device' key (0 in snapshots too old to have one).
int segment_device(Value segment, const Place& place) {
  if (!segment.find("device")) return 0;
  const std::int64_t device = place.integer(segment, "device");
  if (device < 0 || device > std::numeric_limits<int>::max()) {
    place.fail(fmt::format("device {} out of range", device));
  }
  return static_cast<int>(device);
}

std::set<int> devices_with_events(const Snapshot& snapshot) {
  std::set<int> devices;
  int device = 0;
  for (const Value events : snapshot.device_traces) {
    if (events.is_sequence() && events.size() > 0) devices.insert(device);
    ++device;
  }
  return devices;
}

std::set<int> devices_with_segments(const Snapshot& snapshot, const std::string& name) {
  std::set<int> devices;
  std::size_t index = 0;
  for (const Value segment : snapshot.segments) {
    devices.insert(segment_device(segment, Place{name, "segments[{}]", index++}));
  }
  return devices;
}

int choose_device(const Snapshot& snapshot, const std::string& name, const ReadOptions& options) {
  const std::set<int> with_events = devices_with_events(snapshot);
  const std::set<int> with_segments = devices_with_segments(snapshot, name);
  if (options.device) {
    const int wanted = *options.device;
    if (with_events.count(wanted) == 0 && with_segments.count(wanted) == 0) {
      throw InvalidArgument(fmt::format("{}: no device {} in this snapshot; it holds devices [{}]",
                                        name, wanted, fmt::join(with_events, ", ")));
    }
    return wanted;
  }
  const std::set<int>& candidates = with_events.empty() ? with_segments : with_events;
  if (candidates.size() > 1) {
    throw InvalidArgument(fmt::format(
        "{}: the snapshot has events of devices [{}]: choose one (--device N) or replay each", name,
        fmt::join(candidates, ", ")));
  }
  return candidates.empty() ? 0 : *candidates.begin();
}

/// Reads events' and blocks' `frames` into a trace's stack table. PyTorch's pickle shares one
/// frames list among the events of one stack (and one frame dict among the stacks that hold it),
/// so each shared object is converted once: the cost is a lookup per event and memory per
/// distinct stack, not per event.
class FrameReader {
 public:
  explicit FrameReader(StackTable& table) : table_(table) {}

  /// The stack id of `object`'s 'frames' (0 when it has none or an empty list). Fails, naming
  /// the place, for frames of the wrong shape.
  std::uint32_t of(Value object, const Place& at) {
    const std::optional<Value> frames = object.find("frames");
    if (!frames || frames->is_none()) return 0;
    if (!frames->is_list()) {
      at.fail(fmt::format("'frames' is {} {}, expected a list of frames", frames->type_name(),
                          frames->describe(40)));
    }
    if (frames->size() == 0) return 0;
    const auto [known, added] = stacks_.emplace(frames->identity(), 0);
    if (!added) return known->second;
    ids_.clear();
    for (const Value frame : *frames) ids_.push_back(frame_id(frame, at));
    known->second = table_.stack_id(ids_);
    return known->second;
  }

 private:
  std::uint32_t frame_id(Value frame, const Place& at) {
    const auto found = frames_.find(frame.identity());
    if (found != frames_.end()) return found->second;
    if (!frame.is_dict()) {
      at.fail(fmt::format("a frame is {} {}, expected a dict with 'filename', 'line' and 'name'",
                          frame.type_name(), frame.describe(40)));
    }
    const Value filename = at.field(frame, "filename");
    const Value name = at.field(frame, "name");
    if (!filename.is_string() || !name.is_string()) {
      at.fail(fmt::format("a frame's 'filename' and 'name' must be str: {}", frame.describe(60)));
    }
    const std::uint32_t id =
        table_.frame_id(filename.as_string(), at.integer(frame, "line"), name.as_string());
    frames_.emplace(frame.identity(), id);
    return id;
  }

  StackTable& table_;
  std::unordered_map<std::uint32_t, std::uint32_t> stacks_;  ///< frames list's identity -> stack
  std::unordered_map<std::uint32_t, std::uint32_t> frames_;  ///< frame dict's identity -> frame
  std::vector<std::uint32_t> ids_;
};

/// Reads one device's window into a trace.
class WindowReader {
 public:
  WindowReader(const Snapshot& snapshot, const std::string& name, int device, Trace& trace)
      : snapshot_(snapshot), name_(name), device_(device), trace_(trace), lifetimes_(trace) {}

  void run() {
    if (static_cast<std::size_t>(device_) < snapshot_.device_traces.size()) {
      read_events(snapshot_.device_traces[static_cast<std::size_t>(device_)]);
    }
    SegmentHistory history(name_, device_);
    read_final_segments(history);
    history.rebuild(trace_.recorded, segment_positions_);
    defer_pending_frees();
    lifetimes_.finish();
    trace_.streams = streams_.handles();
  }

 private:
  void read_events(Value events) {
    if (!events.is_list()) {
      Place{name_, "device_traces[{}]", static_cast<std::size_t>(device_)}.fail(
          fmt::format("expected a list of events, got {}", events.type_name()));
    }
    std::size_t position = 0;
    for (const Value event : events) {
      read_event(event,
                 Place{name_, "device_traces[{}][{}]", static_cast<std::size_t>(device_), position},
                 position);
      ++position;
    }
  }

  void read_event(Value event, const Place& at, std::size_t position) {
    const Value action_value = at.field(event, "action");
    if (!action_value.is_string()) at.fail("'action' is not a str");
    const std::string_view action = action_value.as_string();
    if (action == "alloc") return on_alloc(event, at, position);
    if (action == "free_requested") return on_free_requested(event, at, position);
    if (action == "free_completed") return on_free_completed(event, at, position);
    if (action == "oom") return on_oom(event, at, position);
    if (action.substr(0, 8) == "segment_") return on_segment(event, at, action, position);
    if (action == "snapshot" || action == "annotate") return;  // markers, no memory changes hands
    at.fail(
        fmt::format("unknown action {}: expected alloc, free_requested, free_completed, "
                    "segment_alloc, segment_free, segment_map, segment_unmap, oom or snapshot",
                    quote(action)));
  }

  /// `time_us`, or the event's position in the window when the snapshot has no times.
  std::int64_t time(Value event, const Place& at, std::size_t position) const {
    const std::optional<Value> value = event.find("time_us");
    if (!value) return static_cast<std::int64_t>(position);
    if (value->is_int()) return value->as_int();
    constexpr double max_time = 9.0e18;  // keeps the conversion to int64 defined
    if (value->is_double() && std::fabs(value->as_double()) < max_time) {
      return static_cast<std::int64_t>(value->as_double());
    }
    at.fail(fmt::format("'time_us' is {}, expected a number of microseconds", value->describe(40)));
  }

  void on_alloc(Value event, const Place& at, std::size_t position) {
    in_release_ = false;
    const std::uint64_t addr = at.address(event, "addr");
    if (lifetimes_.live_at(addr)) {
      at.fail(fmt::format("alloc at {:#x}, which is already allocated and not freed", addr));
    }
    const std::uint64_t size = at.size(event, "size");
    refuse_overlap(at, "alloc", addr, size);
    pending_.erase(addr);
    lifetimes_.alloc(addr, size, streams_.index(at.stream(event)), time(event, at, position),
                     stacks_.of(event, at));
  }

  void on_free_requested(Value event, const Place& at, std::size_t position) {
    in_release_ = false;
    const std::uint64_t addr = at.address(event, "addr");
    if (lifetimes_.freed_at(addr)) {
      at.fail(fmt::format("free_requested of {:#x}, which the window already freed", addr));
    }
    // PyTorch's free events carry the allocation's frames: kept for a block allocated before
    // the window, which has no alloc event.
    const std::uint32_t stack = lifetimes_.live_at(addr) ? 0 : stacks_.of(event, at);
    const AddressLifetimes::Freed freed =
        lifetimes_.free(addr, at.size(event, "size"), streams_.index(at.stream(event)),
                        time(event, at, position), stack);
    pending_[addr] = Pending{freed.id, trace_.events.size() - 1};
  }

  void on_free_completed(Value event, const Place& at, std::size_t position) {
    const std::uint64_t addr = at.address(event, "addr");
    const auto found = pending_.find(addr);
    if (found == pending_.end()) {
      // Requested before the window (the program had already freed it) - unless it is live.
      if (lifetimes_.live_at(addr)) {
        at.fail(
            fmt::format("free_completed of {:#x}, which is allocated and was never freed", addr));
      }
      return;
    }
    const std::size_t next = trace_.events.size();
    if (found->second.free_event + 1 != next) {
      trace_.recorded.deferred_frees.push_back(
          RecordedFreeCompletion{found->second.id, next, time(event, at, position)});
    }
    pending_.erase(found);
  }

  void on_oom(Value event, const Place& at, std::size_t position) {
    in_release_ = false;
    RecordedOom oom;
    oom.before_event = trace_.events.size();
    oom.size = at.size(event, "size");
    oom.device_free = event.find("device_free") ? at.address(event, "device_free") : 0;
    oom.stream = streams_.index(at.stream(event));
    oom.time = time(event, at, position);
    trace_.recorded.ooms.push_back(oom);
  }

  void on_segment(Value event, const Place& at, std::string_view action, std::size_t position) {
    using Kind = RecordedSegmentEvent::Kind;
    RecordedSegmentEvent segment;
    if (action == "segment_alloc") segment.kind = Kind::alloc;
    else if (action == "segment_free") segment.kind = Kind::free;
    else if (action == "segment_map") segment.kind = Kind::map;
    else if (action == "segment_unmap") segment.kind = Kind::unmap;
    else at.fail(fmt::format("unknown action {}", quote(action)));
    segment.addr = at.address(event, "addr");
    segment.size = at.size(event, "size");
    segment.stream = streams_.index(at.stream(event));
    segment.time = time(event, at, position);
    // A reclaim's unmap (cistern's own, marked by its writer) gives nothing back to the device.
    const bool releases =
        segment.kind == Kind::free || (segment.kind == Kind::unmap && !is_reclaim(event));
    if (releases && !in_release_) open_release(segment.time);
    in_release_ = releases;
    segment.before_event = trace_.events.size();
    trace_.recorded.segment_events.push_back(segment);
    segment_positions_.push_back(position);
  }

  /// Whether a segment_unmap carries cistern's reclaim frame (HistoryEntry::reclaim).
  static bool is_reclaim(Value event) {
    const std::optional<Value> frames = event.find("frames");
    if (!frames || !frames->is_list()) return false;
    for (const Value frame : *frames) {
      if (!frame.is_dict()) continue;
      const std::optional<Value> name = frame.find("name");
      if (name && name->is_string() && name->as_string() == kReclaimFrame) return true;
    }
    return false;
  }

  /// PyTorch returns cached memory to the device only in `release_cached_blocks` (the program's
  /// `empty_cache()`, or the release-and-retry of an allocation that found the device full) and,
  /// with `garbage_collection_threshold` or `max_split_size` set, in their partial releases: a
  /// run of `segment_free` / `segment_unmap` events with no allocation between. The snapshot
  /// does not say which, so the run becomes an `empty_cache` event at its place - the release the
  /// events show - and the release's own segment events follow it.
  void open_release(std::int64_t time) {
    Event release;
    release.op = Op::empty_cache;
    release.time = time;
    trace_.events.push_back(release);
    release_events_.push_back(trace_.events.size() - 1);
  }

  /// The final segments of this device: the held memory for `history`, and the blocks that were
  /// allocated before the window and never freed in it.
  void read_final_segments(SegmentHistory& history) {
    std::size_t index = 0;
    for (const Value segment : snapshot_.segments) {
      const Place at{name_, "segments[{}]", index};
      if (segment_device(segment, at) == device_) {
        const RecordedSegment held = final_segment(segment, at);
        history.add_final(held, index);
        read_blocks(at.field(segment, "blocks"), index, held.stream);
      }
      ++index;
    }
  }

  RecordedSegment final_segment(Value segment, const Place& at) {
    RecordedSegment held;
    held.addr = at.address(segment, "address");
    held.size = at.size(segment, "total_size");
    held.stream = streams_.index(at.stream(segment));
    held.is_large = held.size > small_segment_bytes;
    if (const std::optional<Value> type = segment.find("segment_type")) {
      const std::string_view text = type->is_string() ? type->as_string() : std::string_view();
      if (text != "large" && text != "small") {
        at.fail(
            fmt::format("'segment_type' is {}, expected 'large' or 'small'", type->describe(40)));
      }
      held.is_large = text == "large";
    }
    if (const std::optional<Value> expandable = segment.find("is_expandable")) {
      if (!expandable->is_bool()) at.fail("'is_expandable' is not a bool");
      held.is_expandable = expandable->as_bool();
    }
    return held;
  }

  void read_blocks(Value blocks, std::size_t segment, std::uint32_t stream) {
    if (!blocks.is_list()) Place{name_, "segments[{}]", segment}.fail("'blocks' is not a list");
    std::size_t index = 0;
    for (const Value block : blocks) {
      const Place at{name_, "segments[{}].blocks[{}]", segment, index++};
      const Value state = at.field(block, "state");
      if (state.is_string() && state.as_string() == "active_pending_free") {
        pending_at_end_.insert(at.address(block, "address"));
      }
      if (!state.is_string() || state.as_string() != "active_allocated") continue;
      const std::uint64_t addr = at.address(block, "address");
      if (lifetimes_.live_at(addr)) continue;  // allocated in the window
      if (lifetimes_.freed_at(addr)) {
        at.fail(fmt::format("active_allocated at {:#x}, but the window's last event there frees it",
                            addr));
      }
      const char* key = block.find("requested_size") ? "requested_size" : "size";
      const std::uint64_t size = at.size(block, key);
      refuse_overlap(at, "active_allocated block", addr, size);
      lifetimes_.live_throughout(addr, size, stream, stacks_.of(block, at));
    }
  }

  /// Frees the program requested in the window that PyTorch had not completed when it took the
  /// snapshot (no `free_completed`, and the final `segments` show the block
  /// `active_pending_free`: other streams' work on it was still outstanding) complete after the
  /// last event. Without the final state's word a missing completion is taken as immediate.
  void defer_pending_frees() {
    std::vector<std::pair<std::size_t, std::uint64_t>> pending;  // (free event, id)
    for (const auto& [addr, free] : pending_) {
      if (pending_at_end_.count(addr) != 0) pending.emplace_back(free.free_event, free.id);
    }
    std::sort(pending.begin(), pending.end());
    const std::int64_t end = trace_.events.empty() ? 0 : trace_.events.back().time;
    for (const auto& [event, id] : pending) {
      trace_.recorded.deferred_frees.push_back(
          RecordedFreeCompletion{id, trace_.events.size(), end});
    }
  }

  /// Fails when [addr, addr + size) shares bytes with an allocation live at that point.
  void refuse_overlap(const Place& at, std::string_view what, std::uint64_t addr,
                      std::uint64_t size) const {
    if (const auto other = lifetimes_.overlapping(addr, size)) {
      at.fail(fmt::format("{} of {} bytes at {:#x} overlaps the live allocation [{:#x}, {:#x})",
                          what, size, addr, other->first, other->second));
    }
  }

  struct Pending {
    std::uint64_t id;
    std::size_t free_event;
  };

  const Snapshot& snapshot_;
  const std::string& name_;
  int device_;
  Trace& trace_;
  AddressLifetimes lifetimes_;
  StreamTable streams_;
  FrameReader stacks_{trace_.stacks};
  std::unordered_map<std::uint64_t, Pending> pending_;  ///< requested, not yet completed frees
  std::unordered_set<std::uint64_t> pending_at_end_;    ///< active_pending_free final blocks
  std::vector<std::size_t> segment_positions_;          ///< where each segment event was read
  bool in_release_ = false;                  ///< the last event read was a segment_free/unmap
  std::vector<std::size_t> release_events_;  ///< the empty_cache events made of releases

 public:
  /// The events made of PyTorch's releases (see `open_release`), in order.
  const std::vector<std::size_t>& release_events() const noexcept { return release_events_; }
};

/// A setting's value as text: strings as they are, dicts in PyTorch's option syntax
/// (`roundup_power2_divisions` becomes "[1:0,2:0,...]", as PYTORCH_CUDA_ALLOC_CONF writes it),
/// anything else as Python prints it.
std::string setting_text(Value value) {
  constexpr std::size_t max_chars = 4096;
  if (value.is_string()) return std::string(value.as_string());
  if (!value.is_dict()) return value.describe(max_chars);
  std::string text = "[";
  for (const auto [key, item] : value.items()) {
    if (text.size() > max_chars) break;
    if (text.size() > 1) text += ',';
    text += setting_text(key) + ':' + setting_text(item);
  }
  return text + ']';
}

/// The allocator's settings (`allocator_settings`), in order.
void read_settings(const std::optional<Value>& settings, Recorded& recorded) {
  if (!settings || !settings->is_dict()) return;
  for (const auto [key, value] : settings->items()) {
    recorded.settings.emplace_back(setting_text(key), setting_text(value));
  }
}

/// The number of entries in `device`'s trace buffer.
std::size_t window_length(const Snapshot& snapshot, int device) {
  const auto index = static_cast<std::size_t>(device);
  if (index >= snapshot.device_traces.size()) return 0;
  const Value events = snapshot.device_traces[index];
  return events.is_sequence() ? events.size() : 0;
}

/// The value of setting `key`, or "".
std::string setting(const Recorded& recorded, std::string_view key) {
  for (const auto& [name, value] : recorded.settings) {
    if (name == key) return value;
  }
  return {};
}

/// Whether PyTorch, with these settings, also releases part of its cache on its own
/// (`garbage_collection_threshold`, or `release_available_cached_blocks` under
/// `max_split_size`), so that a release the window shows may have been partial.
bool releases_partially(const Recorded& recorded) {
  const std::string split = setting(recorded, "max_split_size");
  const std::string gc = setting(recorded, "garbage_collection_threshold");
  const bool split_set = !split.empty() && split != "-1" && split != "0";
  const bool gc_set = !gc.empty() && std::strtod(gc.c_str(), nullptr) > 0;
  return split_set || gc_set;
}

/// The address of the first segment_map of the window that lies more than 1.125 x 80 GiB (the
/// reservation of the largest common device) beyond the expandable ranges its stream and pool
/// hold or have mapped: the sign of a second reservation. None when there is no such map.
std::optional<std::uint64_t> second_reservation(const Recorded& recorded) {
  constexpr std::uint64_t reach = (std::uint64_t{80} << 30) / 8 * 9;
  using Key = std::pair<std::uint32_t, bool>;
  std::map<Key, std::pair<std::uint64_t, std::uint64_t>> spans;  // lowest and highest address
  const auto widen = [&](const Key& key, std::uint64_t lo, std::uint64_t hi) {
    const auto [it, added] = spans.emplace(key, std::make_pair(lo, hi));
    if (!added) it->second = {std::min(it->second.first, lo), std::max(it->second.second, hi)};
  };
  for (const RecordedSegment& s : recorded.initial_segments) {
    if (s.is_expandable) widen({s.stream, s.is_large}, s.addr, s.addr + s.size);
  }
  for (const RecordedSegmentEvent& e : recorded.segment_events) {
    if (e.kind != RecordedSegmentEvent::Kind::map) continue;
    const Key key{e.stream, e.size != small_segment_bytes};
    const auto it = spans.find(key);
    if (it != spans.end() &&
        (e.addr + e.size > it->second.first + reach || e.addr + reach < it->second.second)) {
      return e.addr;
    }
    widen(key, e.addr, e.addr + e.size);
  }
  return std::nullopt;
}

/// `Recorded::notes`: what a replay of this window cannot reproduce exactly, and why.
void add_notes(Trace& trace, const std::vector<std::size_t>& releases, std::size_t entries) {
  Recorded& recorded = trace.recorded;
  // PyTorch keeps the newest `max_entries` events (a ring buffer): a window exactly as long as
  // a round max_entries most likely lost its oldest events, and with them the allocations and
  // releases that made the cache the window opens with.
  constexpr std::size_t round_buffer = 1000;
  if (entries >= round_buffer && entries % round_buffer == 0) {
    recorded.notes.push_back(fmt::format(
        "the window holds exactly {} events, a round _record_memory_history(max_entries=...): "
        "PyTorch's trace buffer most likely overflowed and dropped older events; the cache at "
        "the window's start is rebuilt from the segments, but events before it are lost",
        entries));
  }
  if (!releases.empty() && releases_partially(recorded)) {
    recorded.notes.push_back(fmt::format(
        "{} release(s) of cached segments (segment_free/segment_unmap with no allocation between, "
        "first at event {}) are replayed as empty_cache(); with max_split_size or "
        "garbage_collection_threshold set PyTorch may have released only part of its cache there",
        releases.size(), releases.front()));
  }
  // Expandable segments are reproduced (the warm start infers each reservation's base, see
  // replay/warm_start.hpp) unless a window reserves a second range for a stream and pool that
  // still holds one: PyTorch's first was full, and how far it reached depends on the recording
  // device's memory, which the snapshot does not give.
  if (const std::optional<std::uint64_t> at = second_reservation(recorded)) {
    recorded.notes.push_back(fmt::format(
        "expandable segments: the window maps at {:#x}, far from the reservation its stream and "
        "pool hold (PyTorch's reservations span 1.125 x the device's memory, which the snapshot "
        "does not give): the replay's reservations, sized by its own device, may map there "
        "differently",
        *at));
  }
  if (!recorded.ooms.empty()) {
    recorded.notes.push_back(fmt::format(
        "{} allocation(s) failed in the recording (oom events, first before event {}); the "
        "program went on without them, so they are not replayed",
        recorded.ooms.size(), recorded.ooms.front().before_event));
  }
}

}  // namespace

Trace read_pytorch_snapshot(std::string bytes, const std::string& name,
                            const ReadOptions& options) {
  require_unscaled(options, name, Format::pytorch);
  const pickle::Document document = pickle::parse(std::move(bytes), name);
  const Snapshot snapshot = open_snapshot(document);
  Trace trace;
  trace.source = name;
  trace.format = to_string(Format::pytorch);
  trace.device = choose_device(snapshot, name, options);
  WindowReader reader(snapshot, name, trace.device, trace);
  reader.run();
  read_settings(snapshot.settings, trace.recorded);
  trace.recorded.has_history = !devices_with_events(snapshot).empty();
  add_notes(trace, reader.release_events(), window_length(snapshot, trace.device));
  return trace;
}

std::vector<int> pytorch_snapshot_devices(std::string bytes, const std::string& name) {
  const pickle::Document document = pickle::parse(std::move(bytes), name);
  const Snapshot snapshot = open_snapshot(document);
  std::set<int> devices = devices_with_events(snapshot);
  const std::set<int> with_segments = devices_with_segments(snapshot, name);
  devices.insert(with_segments.begin(), with_segments.end());
  return {devices.begin(), devices.end()};
}

}  // namespace cistern::trace::detail
