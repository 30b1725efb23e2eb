// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The PyTorch memory snapshot writer (include/cistern/pytorch_snapshot.hpp): cistern's segments,
// blocks and history as the dict `torch.cuda.memory._snapshot()` returns, pickled.
#include "cistern/pytorch_snapshot.hpp"

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "cistern/errors.hpp"
#include "snapshot/file_output.hpp"
#include "snapshot/pickle_writer.hpp"

namespace cistern {
namespace {

using detail::PickleWriter;

void key(PickleWriter& w, const char* name) { w.string(name); }

void empty_list(PickleWriter& w, const char* name) {
  key(w, name);
  w.begin_list();
  w.end_list();
}

/// Writes `frames` lists from one device's stack table. Each stack, and each frame, is written in
/// full once and stored in the pickle's memo; later uses refer to it (PyTorch's pickles share
/// them the same way), so the file grows with the distinct stacks, not with the events.
class StackWriter {
 public:
  StackWriter(const StackTable& stacks, std::uint32_t& next_key)
      : stacks_(stacks), next_key_(next_key) {}

  /// The key "frames" and the list of `stack`'s frames, innermost first ({filename, line, name}).
  void write(PickleWriter& w, std::uint32_t stack) {
    key(w, "frames");
    if (stack == 0) return empty_list_value(w);
    const auto [it, added] = stack_keys_.emplace(stack, next_key_);
    if (!added) return w.memo_get(it->second);
    ++next_key_;
    w.begin_list();
    for (const std::uint32_t id : stacks_.stack(stack)) write_frame(w, id);
    w.end_list();
    w.memo_put(it->second);
  }

 private:
  static void empty_list_value(PickleWriter& w) {
    w.begin_list();
    w.end_list();
  }
  void write_frame(PickleWriter& w, std::uint32_t id) {
    const auto [it, added] = frame_keys_.emplace(id, next_key_);
    if (!added) return w.memo_get(it->second);
    ++next_key_;
    const StackFrame& frame = stacks_.frame(id);
    w.begin_dict();
    key(w, "filename");
    w.string(frame.filename);
    key(w, "line");
    w.integer(frame.line);
    key(w, "name");
    w.string(frame.name);
    w.end_dict();
    w.memo_put(it->second);
  }

  const StackTable& stacks_;
  std::uint32_t& next_key_;  ///< shared by every device's writer: keys are the pickle's
  std::unordered_map<std::uint32_t, std::uint32_t> stack_keys_;  ///< stack id -> memo key
  std::unordered_map<std::uint32_t, std::uint32_t> frame_keys_;  ///< frame id -> memo key
};

/// The stack of each allocated block: that of the last alloc at its address in the history.
using BlockStacks = std::unordered_map<std::uintptr_t, std::uint32_t>;

BlockStacks block_stacks(const DeviceRecord& record) {
  BlockStacks stacks;
  if (record.stacks.size() == 1) return stacks;  // no frames at all
  for (const HistoryEntry& entry : record.history) {
    if (entry.action == HistoryEntry::Action::alloc) stacks[entry.addr] = entry.stack;
  }
  return stacks;
}

/// Where `write_segment` finds a block's frames.
struct SegmentFrames {
  StackWriter& stacks;
  const BlockStacks& blocks;

  std::uint32_t of(const BlockInfo& block) const {
    if (block.state == BlockState::inactive) return 0;
    const auto found = blocks.find(block.address);
    return found == blocks.end() ? 0 : found->second;
  }
};

void write_block(PickleWriter& w, const BlockInfo& block, const SegmentFrames& frames) {
  w.begin_dict();
  key(w, "address");
  w.unsigned_integer(block.address);
  key(w, "size");
  w.unsigned_integer(block.size);
  key(w, "requested_size");
  w.unsigned_integer(block.requested_size);
  key(w, "state");
  w.string(to_string(block.state));
  frames.stacks.write(w, frames.of(block));
  w.end_dict();
}

void write_segment(PickleWriter& w, const SegmentInfo& segment, const SegmentFrames& frames) {
  w.begin_dict();
  key(w, "device");
  w.integer(segment.device);
  key(w, "address");
  w.unsigned_integer(segment.address);
  key(w, "total_size");
  w.unsigned_integer(segment.total_size);
  key(w, "allocated_size");
  w.unsigned_integer(segment.allocated_size);
  key(w, "active_size");
  w.unsigned_integer(segment.active_size);
  key(w, "requested_size");
  w.unsigned_integer(segment.requested_size);
  key(w, "stream");
  w.unsigned_integer(segment.stream.handle);
  key(w, "segment_type");
  w.string(segment.is_large ? "large" : "small");
  key(w, "segment_pool_id");
  w.begin_tuple();
  w.integer(0);
  w.integer(0);
  w.end_tuple();
  key(w, "is_expandable");
  w.boolean(segment.is_expandable);
  empty_list(w, "frames");
  key(w, "blocks");
  w.begin_list();
  for (const BlockInfo& block : segment.blocks) write_block(w, block, frames);
  w.end_list();
  w.end_dict();
}

/// An entry's `frames`: its stack's, or for a reclaim's unmap the frame that says so.
void write_frames(PickleWriter& w, const HistoryEntry& entry, StackWriter& stacks) {
  if (!entry.reclaim) return stacks.write(w, entry.stack);
  key(w, "frames");
  w.begin_list();
  w.begin_dict();
  key(w, "filename");
  w.string("cistern");
  key(w, "line");
  w.integer(0);
  key(w, "name");
  w.string(kReclaimFrame);
  w.end_dict();
  w.end_list();
}

void write_entry(PickleWriter& w, const HistoryEntry& entry, StackWriter& stacks) {
  w.begin_dict();
  key(w, "action");
  w.string(to_string(entry.action));
  // PyTorch's oom entry names what the device reported free instead of an address.
  key(w, entry.action == HistoryEntry::Action::oom ? "device_free" : "addr");
  w.unsigned_integer(entry.addr);
  key(w, "size");
  w.unsigned_integer(entry.size);
  key(w, "stream");
  w.unsigned_integer(entry.stream.handle);
  key(w, "time_us");
  w.unsigned_integer(entry.time_us);
  write_frames(w, entry, stacks);
  key(w, "compile_context");
  w.string("N/A");
  w.end_dict();
}

/// `device_traces`: one list per device 0..max, empty for devices not written.
void write_traces(PickleWriter& w, const std::vector<DeviceRecord>& devices,
                  std::vector<StackWriter>& stacks) {
  int last = -1;
  for (const DeviceRecord& d : devices) last = std::max(last, d.device);
  w.begin_list();
  for (int device = 0; device <= last; ++device) {
    w.begin_list();
    for (std::size_t i = 0; i < devices.size(); ++i) {
      if (devices[i].device != device) continue;
      for (const HistoryEntry& entry : devices[i].history) write_entry(w, entry, stacks[i]);
    }
    w.end_list();
  }
  w.end_list();
}

void write_settings(PickleWriter& w, const Config& config) {
  w.begin_dict();
  key(w, "PYTORCH_CUDA_ALLOC_CONF");
  w.string(config.to_string());
  key(w, "max_split_size");
  w.integer(config.max_split_size == SIZE_MAX ? -1
                                              : static_cast<std::int64_t>(config.max_split_size));
  key(w, "garbage_collection_threshold");
  w.real(config.garbage_collection_threshold);
  key(w, "expandable_segments");
  w.boolean(config.expandable_segments);
  key(w, "release_lock_on_cudamalloc");
  w.boolean(config.release_lock_on_cudamalloc);
  key(w, "roundup_power2_divisions");
  w.begin_dict();
  for (int i = 0; i < kRoundupIntervals; ++i) {
    w.string(std::to_string(std::uint64_t{1} << static_cast<unsigned>(i)));
    w.unsigned_integer(config.roundup_power2_divisions[static_cast<std::size_t>(i)]);
  }
  w.end_dict();
  w.end_dict();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  detail::write_whole_file(path, bytes, "snapshot");
}

}  // namespace

std::string pytorch_snapshot_pickle(const std::vector<DeviceRecord>& devices,
                                    const Config& config) {
  for (const DeviceRecord& d : devices) {
    if (d.device < 0) throw InvalidArgument("pytorch_snapshot_pickle: negative device ordinal");
  }
  std::uint32_t memo_keys = 0;
  std::vector<StackWriter> stacks;
  stacks.reserve(devices.size());
  for (const DeviceRecord& d : devices) stacks.emplace_back(d.stacks, memo_keys);
  PickleWriter w;
  w.begin_dict();
  key(w, "segments");
  w.begin_list();
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const BlockStacks blocks = block_stacks(devices[i]);
    const SegmentFrames frames{stacks[i], blocks};
    for (const SegmentInfo& segment : devices[i].snapshot.segments) {
      write_segment(w, segment, frames);
    }
  }
  w.end_list();
  key(w, "device_traces");
  write_traces(w, devices, stacks);
  key(w, "allocator_settings");
  write_settings(w, config);
  empty_list(w, "external_annotations");
  w.end_dict();
  return w.finish();
}

std::string pytorch_snapshot_pickle(const DeviceAllocator& allocator) {
  DeviceRecord record;
  record.device = allocator.device_index();
  record.snapshot = allocator.snapshot();
  record.history = allocator.history();
  return pytorch_snapshot_pickle({record}, allocator.config());
}

void write_pytorch_snapshot(const std::string& path, const std::vector<DeviceRecord>& devices,
                            const Config& config) {
  write_bytes(path, pytorch_snapshot_pickle(devices, config));
}

void write_pytorch_snapshot(const std::string& path, const DeviceAllocator& allocator) {
  write_bytes(path, pytorch_snapshot_pickle(allocator));
}

}  // namespace cistern
