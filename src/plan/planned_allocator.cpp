// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Plan mode (see planned_allocator.hpp).
#include "plan/planned_allocator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "cistern/errors.hpp"
#include "plan/planner.hpp"

namespace cistern::plan {
namespace {

/// Planned sizes and offsets are multiples of this (PyTorch's block granularity).
constexpr std::uint64_t kAlignment = 512;
constexpr std::size_t kNever = std::numeric_limits<std::size_t>::max();

std::uint64_t aligned(std::uint64_t size, std::uint64_t to) { return (size + to - 1) / to * to; }

void expect_ok(Device& device, Status status, const char* operation) {
  if (status == Status::ok) return;
  throw DeviceError(operation, fmt::format("plan mode: {} failed: {} ({})", operation,
                                           to_string(status), device.last_error()));
}

}  // namespace

/// One allocation of a recorded step, by its index in the step.
struct PlannedAllocator::Request {
  std::uint64_t size = 0;
  Stream stream;
  std::size_t lower = 0;       ///< the step's event position of the allocation
  std::size_t upper = kNever;  ///< of its free (kNever: not freed within the step)
  std::uint64_t offset = 0;    ///< planned offset (valid when `planned`)
  bool planned = false;
  bool any_stream = false;  ///< planned ahead from a trace: matched by index and size only
};

/// The arena: one segment, or a reservation backed by one physical handle.
struct PlannedAllocator::Arena {
  Device& device;
  void* base = nullptr;
  std::size_t bytes = 0;   ///< usable bytes (the plan's arena)
  std::size_t mapped = 0;  ///< bytes obtained from the device
  bool vmm = false;
  PhysicalHandle handle{};

  Arena(Device& d, std::size_t arena_bytes) : device(d), bytes(arena_bytes) {
    if (device.supports_virtual_memory()) {
      vmm = true;
      mapped = aligned(bytes, device.granularity());
      expect_ok(device, device.reserve(mapped, 0, &base), "reserve");
      if (const Status s = device.create_physical(mapped, &handle); s != Status::ok) {
        device.release_reservation(base, mapped);
        expect_ok(device, s, "create_physical");
      }
      if (const Status s = device.map(base, handle); s != Status::ok) {
        device.release_physical(handle);
        device.release_reservation(base, mapped);
        expect_ok(device, s, "map");
      }
    } else {
      mapped = aligned(bytes, kAlignment);
      expect_ok(device, device.allocate(mapped, &base), "allocate");
    }
  }

  ~Arena() {
    // Unmapping does not wait for queued work (deallocate does): wait for it first.
    if (vmm) {
      device.synchronize_device();
      device.unmap(base, mapped);
      device.release_physical(handle);
      device.release_reservation(base, mapped);
    } else {
      device.deallocate(base);
    }
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  bool contains(const void* ptr) const {
    const auto* p = static_cast<const char*>(ptr);
    const auto* b = static_cast<const char*>(base);
    return p >= b && p < b + bytes;
  }
};

PlannedAllocator::PlannedAllocator(Device& device, PlannedOptions options)
    : device_(device), options_(std::move(options)), fallback_(device, options_.fallback) {}

PlannedAllocator::~PlannedAllocator() {
  if (have_event_) device_.destroy_event(event_);
}

void* PlannedAllocator::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_step_) return allocate_planned(bytes, stream);
  void* ptr = fallback_.allocate(bytes, stream);
  recording_live_[ptr] = recording_.size();
  recording_.push_back(Request{bytes, stream, position_++});
  ++counters_.recorded;
  return ptr;
}

void* PlannedAllocator::allocate_planned(std::size_t bytes, Stream stream) {
  const std::size_t index = next_request_++;
  const std::uint64_t size = aligned(bytes, kAlignment);
  if (index < plan_.size() && arena_) {
    const Request& r = plan_[index];
    const bool same = r.size == bytes && (r.any_stream || r.stream == stream);
    if (same && r.planned && range_free(r.offset, r.offset + size)) {
      ++counters_.hits;
      ++position_;
      return occupy(r.offset, r.offset + size, stream);
    }
    if (same && !r.planned) {
      // Recorded as living past the step's end: the fallback serves it, as it did then.
      void* ptr = fallback_.allocate(bytes, stream);
      ++counters_.fallbacks;
      ++position_;
      return ptr;
    }
  }
  step_mismatched_ = true;
  std::uint64_t offset = 0;
  if (arena_ && idle_fit(size, &offset)) {
    ++counters_.idle_fits;
    ++position_;
    return occupy(offset, offset + size, stream);
  }
  void* ptr = fallback_.allocate(bytes, stream);
  ++counters_.fallbacks;
  ++position_;
  return ptr;
}

bool PlannedAllocator::range_free(std::uint64_t offset, std::uint64_t end) const {
  auto it = live_.lower_bound(end);  // first range starting at or after `end`
  if (it == live_.begin()) return true;
  --it;  // the last range starting before `end`: the only one that can overlap
  return it->second.end <= offset;
}

void* PlannedAllocator::occupy(std::uint64_t offset, std::uint64_t end, Stream stream) {
  order_after_previous_users(offset, end, stream);
  live_[offset] = Live{offset, end, {stream}};
  return static_cast<char*>(arena_->base) + offset;
}

bool PlannedAllocator::idle_fit(std::uint64_t size, std::uint64_t* offset) const {
  // Space that no planned buffer uses from now to the end of the step and nothing occupies now.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> used;
  for (const Request& r : plan_) {
    if (r.planned && r.upper > position_) {
      used.emplace_back(r.offset, r.offset + aligned(r.size, kAlignment));
    }
  }
  for (const auto& [start, live] : live_) used.emplace_back(start, live.end);
  std::sort(used.begin(), used.end());
  std::uint64_t top = 0;
  for (const auto& [start, end] : used) {
    if (start >= top + size) break;
    top = std::max(top, end);
  }
  if (top + size > arena_->bytes) return false;
  *offset = top;
  return true;
}

void PlannedAllocator::wait_for(Stream user, Stream stream) {
  // The work `user` submitted so far (which includes everything before its frees) precedes the
  // work `stream` submits from now on.
  if (!have_event_) {
    expect_ok(device_, device_.create_event(&event_), "create_event");
    have_event_ = true;
  }
  expect_ok(device_, device_.record_event(event_, user), "record_event");
  expect_ok(device_, device_.stream_wait_event(stream, event_), "stream_wait_event");
  ++counters_.cross_stream_waits;
}

void PlannedAllocator::order_after_previous_users(std::uint64_t offset, std::uint64_t end,
                                                  Stream stream) {
  // A stream new to the arena waits once for every stream that used it before: that orders it
  // after all their frees so far, so frees need no records while one stream has the arena.
  if (std::find(arena_streams_.begin(), arena_streams_.end(), stream) == arena_streams_.end()) {
    for (const Stream user : arena_streams_) wait_for(user, stream);
    arena_streams_.push_back(stream);
  }
  if (arena_streams_.size() == 1) return;
  std::vector<Stream> waited;
  for (const auto& [range, user] : last_users_) {
    if (range.second <= offset || end <= range.first || user == stream) continue;
    if (std::find(waited.begin(), waited.end(), user) != waited.end()) continue;
    wait_for(user, stream);
    waited.push_back(user);
  }
  // Records inside the new range are superseded: later users will be ordered after this one.
  last_users_.erase(std::remove_if(last_users_.begin(), last_users_.end(),
                                   [&](const auto& record) {
                                     return offset <= record.first.first &&
                                            record.first.second <= end;
                                   }),
                    last_users_.end());
}

void PlannedAllocator::deallocate(void* ptr, Stream stream) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (arena_ && arena_->contains(ptr)) {
    const auto offset =
        static_cast<std::uint64_t>(static_cast<char*>(ptr) - static_cast<char*>(arena_->base));
    const auto it = live_.find(offset);
    if (it == live_.end()) {
      throw InvalidPointer(fmt::format("plan mode: {} is inside the arena but not allocated", ptr));
    }
    std::vector<Stream> users = it->second.users;
    users[0] = stream;  // reusable by the freeing stream at once, by others after its work
    for (const Stream user : users) {
      if (std::find(arena_streams_.begin(), arena_streams_.end(), user) == arena_streams_.end()) {
        arena_streams_.push_back(user);  // a record_stream user: later streams wait for it too
      }
    }
    if (arena_streams_.size() > 1) {
      for (const Stream user : users) last_users_.push_back({{offset, it->second.end}, user});
    }
    live_.erase(it);
    ++position_;
    return;
  }
  fallback_.deallocate(ptr, stream);  // throws for a foreign pointer, changing nothing
  if (recording_step_) {
    const auto it = recording_live_.find(ptr);
    if (it != recording_live_.end()) {
      recording_[it->second].upper = position_;
      recording_live_.erase(it);
    }
  }
  ++position_;
}

void PlannedAllocator::record_stream(void* ptr, Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (arena_ && arena_->contains(ptr)) {
    const auto offset =
        static_cast<std::uint64_t>(static_cast<char*>(ptr) - static_cast<char*>(arena_->base));
    const auto it = live_.find(offset);
    if (it == live_.end()) {
      throw InvalidPointer(fmt::format("plan mode: {} is inside the arena but not allocated", ptr));
    }
    it->second.users.push_back(stream);
    return;
  }
  fallback_.record_stream(ptr, stream);
}

void PlannedAllocator::end_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.steps;
  if (recording_step_) {
    finish_recording();
  } else {
    mismatched_steps_ = step_mismatched_ ? mismatched_steps_ + 1 : 0;
    // A new arena replaces the old one only once nothing in the old one is live.
    if (mismatched_steps_ >= options_.replan_after && live_.empty()) recording_step_ = true;
  }
  position_ = 0;
  next_request_ = 0;
  step_mismatched_ = false;
}

void PlannedAllocator::finish_recording() {
  std::vector<Buffer> buffers;
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < recording_.size(); ++i) {
    const Request& r = recording_[i];
    if (r.upper == kNever) continue;  // lives on after the step: the online allocator keeps it
    buffers.push_back(Buffer{r.lower, r.upper, r.size});
    which.push_back(i);
  }
  Options options;
  options.time_limit_s = options_.time_limit_s;
  options.node_limit = options_.node_limit;
  options.alignment = kAlignment;
  const Placement placement = plan::plan(buffers, options);
  for (std::size_t k = 0; k < which.size(); ++k) {
    recording_[which[k]].offset = placement.offsets[k];
    recording_[which[k]].planned = true;
  }
  plan_ = std::move(recording_);
  recording_.clear();
  recording_live_.clear();
  last_users_.clear();
  arena_streams_.clear();
  arena_.reset();
  // The recorded step's memory cached by the fallback is what the arena replaces: return it
  // first, so that the two are never held together.
  fallback_.empty_cache();
  if (placement.arena > 0) {
    try {
      arena_ = std::make_unique<Arena>(device_, placement.arena);
    } catch (const DeviceError&) {
      // No room for the arena: the online allocator serves every request, and after
      // `replan_after` steps the allocator tries again.
      arena_.reset();
    }
  }
  ++counters_.plans;
  recording_step_ = false;
  mismatched_steps_ = 0;
}

void PlannedAllocator::plan_ahead(const trace::Trace& trace) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (position_ != 0 || counters_.steps != 0) {
    throw InvalidArgument("plan mode: plan_ahead must come before the first allocation");
  }
  recording_.clear();
  std::unordered_map<std::uint64_t, std::size_t> by_id;
  std::size_t position = 0;
  const auto add = [&](std::uint64_t id, std::uint64_t size) {
    by_id[id] = recording_.size();
    Request r{size, Stream{}, position++};
    r.any_stream = true;
    recording_.push_back(r);
  };
  for (const trace::LiveBlock& b : trace.live_before) add(b.id, b.size);
  for (const trace::Event& e : trace.events) {
    if (e.op == trace::Op::alloc) {
      add(e.id, e.size);
    } else if (e.op == trace::Op::free) {
      const auto it = by_id.find(e.id);
      if (it != by_id.end()) recording_[it->second].upper = position;
      ++position;
    }
  }
  finish_recording();
}

void PlannedAllocator::empty_cache() { fallback_.empty_cache(); }
Stats PlannedAllocator::stats() const { return fallback_.stats(); }
std::size_t PlannedAllocator::reserved_bytes() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return fallback_.reserved_bytes() + (arena_ ? arena_->mapped : 0);
}
void PlannedAllocator::reset_peak_stats() { fallback_.reset_peak_stats(); }
Snapshot PlannedAllocator::snapshot() const { return fallback_.snapshot(); }
int PlannedAllocator::device_index() const noexcept { return fallback_.device_index(); }

bool PlannedAllocator::planned() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !recording_step_ && arena_ != nullptr;
}

std::size_t PlannedAllocator::arena_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return arena_ ? arena_->bytes : 0;
}

PlannedCounters PlannedAllocator::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

void PlannedAllocator::check() const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::uint64_t top = 0;
    for (const auto& [offset, live] : live_) {
      if (!arena_) throw InvariantViolation("plan mode: arena ranges live without an arena");
      if (offset != live.offset || live.end <= offset || live.end > arena_->bytes) {
        throw InvariantViolation(
            fmt::format("plan mode: live range [{}, {}) is not inside the arena of {} bytes",
                        offset, live.end, arena_->bytes));
      }
      if (offset < top) {
        throw InvariantViolation(
            fmt::format("plan mode: live range at {} overlaps the one ending at {}", offset, top));
      }
      top = live.end;
    }
  }
  fallback_.check();
}

}  // namespace cistern::plan
