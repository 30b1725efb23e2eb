// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// PassThroughAllocator: one device allocation per request (see the header). Everything runs
// under one mutex: every request calls the device, which costs far more than the lock.
#include "cistern/pass_through_allocator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "cistern/errors.hpp"
#include "device_call.hpp"
#include "history_log.hpp"
#include "memory_limit.hpp"
#include "size_policy.hpp"

namespace cistern {
namespace {

/// One live allocation (and the segment it is).
struct Live {
  std::size_t size = 0;       // rounded: the segment's size
  std::size_t requested = 0;  // the caller's size
  Stream stream;
  bool small = false;
};

StatPool pool_of(bool small) noexcept {
  return small ? StatPool::small_pool : StatPool::large_pool;
}

/// Adds `delta` to a statistic of the "all" row and of the allocation's pool.
void count(Stats& s, StatKind kind, bool small, std::int64_t delta) noexcept {
  s.get(kind, StatPool::all).update(delta);
  s.get(kind, pool_of(small)).update(delta);
}

/// Every Stat of `s`, for the resets.
template <class F>
void for_each_stat(Stats& s, F&& f) {
  for (auto& row : s.array)
    for (Stat& stat : row) f(stat);
  f(s.oversize_allocations);
  f(s.oversize_segments);
}

}  // namespace

class PassThroughAllocator::Impl {
 public:
  Impl(Device& device, Config config)
      : device_(device), config_(std::move(config)), policy_(config_) {
    config_.validate();
    MemoryInfo info;
    if (device_.memory_info(&info) == Status::ok) device_total_ = info.total;
    update_allowed();
  }

  void* allocate(std::size_t bytes, Stream stream);
  void deallocate(void* ptr, Stream stream);
  void record_stream(void* ptr) const {
    std::lock_guard<std::mutex> lock(mutex_);
    (void)live_at(reinterpret_cast<std::uintptr_t>(ptr), "record_stream");
  }
  Stats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  Snapshot snapshot() const;
  void check() const;
  std::size_t allocation_size(void* ptr) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_at(reinterpret_cast<std::uintptr_t>(ptr), "allocation_size").size;
  }
  std::optional<std::size_t> requested_size(void* ptr) const noexcept;
  std::pair<void*, std::size_t> base_allocation(void* ptr) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {ptr, live_at(reinterpret_cast<std::uintptr_t>(ptr), "base_allocation").size};
  }
  void set_memory_fraction(double fraction);
  void record_history(bool enabled, std::size_t max_entries);
  std::vector<HistoryEntry> history() const;

  std::size_t reserved_bytes() const noexcept { return reserved_.load(std::memory_order_relaxed); }
  const Config& config() const noexcept { return config_; }
  Device& device() const noexcept { return device_; }

 private:
  void count_allocation(const Live& a, std::int64_t sign) noexcept;
  const Live& live_at(std::uintptr_t addr, const char* what) const;
  [[noreturn]] void throw_invalid_pointer(std::uintptr_t addr, const char* what) const;
  [[noreturn]] void throw_out_of_memory(std::size_t bytes, std::size_t size, Stream stream);
  void record(HistoryEntry::Action action, std::uintptr_t addr, std::size_t size, Stream stream) {
    if (recording_) log_->add(action, addr, size, stream);
  }
  void update_allowed() noexcept { allowed_ = detail::allowed_bytes(config_, device_total_); }

  Device& device_;
  Config config_;
  detail::SizePolicy policy_;  // config_'s size options
  mutable std::mutex mutex_;   // guards everything below but the two atomics
  std::unordered_map<std::uintptr_t, Live> live_;
  Stats stats_;                              // exact: every change is made under mutex_
  std::atomic<std::size_t> reserved_{0};     // every byte held is allocated
  std::unique_ptr<detail::HistoryLog> log_;  // the latest history, kept after recording stops
  bool recording_ = false;
  std::size_t device_total_ = 0;
  std::size_t allowed_ = SIZE_MAX;  // from the memory fraction and memory_limit
};

// --- requests -------------------------------------------------------------------------------------

void* PassThroughAllocator::Impl::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > detail::kMaxRequest) throw_out_of_memory(bytes, 0, stream);
  const std::size_t size = policy_.round(bytes);
  if (allowed_ != SIZE_MAX && reserved_bytes() + size > allowed_) {
    throw_out_of_memory(bytes, size, stream);
  }
  void* ptr = nullptr;
  const Status status = device_.allocate(size, &ptr);
  if (status == Status::out_of_memory) throw_out_of_memory(bytes, size, stream);
  detail::check_device(device_, status, DeviceOp::allocate);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const Live a{size, bytes, stream, policy_.is_small(size)};
  try {
    live_.emplace(addr, a);
  } catch (...) {  // out of host memory: the device allocation goes back, nothing is counted
    (void)device_.deallocate(ptr);
    throw;
  }
  ++stats_.num_device_alloc;
  count_allocation(a, +1);
  record(HistoryEntry::Action::segment_alloc, addr, size, stream);
  record(HistoryEntry::Action::alloc, addr, bytes, stream);
  return ptr;
}

// The device's free is ordered after the work that may still use the memory (cudaFree waits for
// the device), so no stream needs an event and the memory is gone at once.
void PassThroughAllocator::Impl::deallocate(void* ptr, Stream stream) {
  if (ptr == nullptr) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  const Live a = live_at(addr, "deallocate");
  const Status status = device_.deallocate(ptr);
  if (status != Status::ok) {
    throw DeviceError("deallocate",
                      fmt::format("cistern: returning {:#x} to the device failed (it stays "
                                  "allocated): {}: {}",
                                  addr, to_string(status), device_.last_error()));
  }
  live_.erase(addr);
  ++stats_.num_device_free;
  count_allocation(a, -1);
  record(HistoryEntry::Action::free_requested, addr, a.requested, stream);
  record(HistoryEntry::Action::free_completed, addr, a.requested, stream);
  record(HistoryEntry::Action::segment_free, addr, a.size, stream);
}

// An allocation is a segment, an allocated block and an active one at once.
void PassThroughAllocator::Impl::count_allocation(const Live& a, std::int64_t sign) noexcept {
  const auto size = static_cast<std::int64_t>(a.size) * sign;
  for (StatKind kind : {StatKind::allocation, StatKind::segment, StatKind::active}) {
    count(stats_, kind, a.small, sign);
  }
  for (StatKind kind :
       {StatKind::allocated_bytes, StatKind::reserved_bytes, StatKind::active_bytes}) {
    count(stats_, kind, a.small, size);
  }
  count(stats_, StatKind::requested_bytes, a.small, static_cast<std::int64_t>(a.requested) * sign);
  if (policy_.is_oversize(a.size)) {
    stats_.oversize_allocations.update(sign);
    stats_.oversize_segments.update(sign);
  }
  reserved_.fetch_add(static_cast<std::size_t>(size), std::memory_order_relaxed);
}

// --- pointers ---------------------------------------------------------------------------------------

const Live& PassThroughAllocator::Impl::live_at(std::uintptr_t addr, const char* what) const {
  const auto it = live_.find(addr);
  if (it == live_.end()) throw_invalid_pointer(addr, what);
  return it->second;
}

std::optional<std::size_t> PassThroughAllocator::Impl::requested_size(void* ptr) const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == live_.end()) return std::nullopt;
  return it->second.requested;
}

// Misuse only: a scan of the live allocations names an interior pointer. Freed memory went back
// to the device, so a double free cannot be told from a foreign pointer.
void PassThroughAllocator::Impl::throw_invalid_pointer(std::uintptr_t addr,
                                                       const char* what) const {
  for (const auto& [base, a] : live_) {
    if (addr <= base || addr >= base + a.size) continue;
    throw InvalidPointer(fmt::format(
        "cistern: {}({:#x}): the pointer lies {} bytes inside the allocated block at {:#x}; pass "
        "the pointer that allocate() returned",
        what, addr, addr - base, base));
  }
  throw InvalidPointer(fmt::format(
      "cistern: {}({:#x}): not a live allocation of this pass-through allocator (device {}): "
      "freed already (double free), or allocated by another allocator or on another device",
      what, addr, device_.index()));
}

void PassThroughAllocator::Impl::throw_out_of_memory(std::size_t bytes, std::size_t size,
                                                     Stream stream) {
  ++stats_.num_ooms;
  OutOfMemoryInfo info;
  info.device = device_.index();
  info.requested = bytes;
  info.rounded = size;
  info.segment = size;
  info.reserved = reserved_bytes();
  info.allocated = info.reserved;  // nothing is cached
  info.limit = allowed_ == SIZE_MAX ? 0 : allowed_;
  MemoryInfo mem;
  if (device_.memory_info(&mem) == Status::ok) {
    info.device_total = mem.total;
    info.device_free = mem.free;
  }
  record(HistoryEntry::Action::oom, info.device_free, size, stream);
  std::string message = fmt::format(
      "cistern: out of memory on device {} (pass-through: no caching). Tried to allocate {} (a "
      "request of {} bytes). The device has a total capacity of {} of which {} is free; {} is "
      "allocated through this allocator.",
      info.device, format_bytes(size == 0 ? bytes : size), bytes, format_bytes(info.device_total),
      format_bytes(info.device_free), format_bytes(info.allocated));
  if (info.limit != 0) {
    message += fmt::format(" cistern may hold at most {} (memory fraction or limit).",
                           format_bytes(info.limit));
  }
  message +=
      " Reduce the working set (for example the batch size) or free what is no longer needed.";
  throw OutOfMemory(info, message);
}

// --- statistics and inspection ---------------------------------------------------------------------

Stats PassThroughAllocator::Impl::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = stats_;
  s.max_split_size =
      config_.max_split_size == SIZE_MAX ? -1 : static_cast<std::int64_t>(config_.max_split_size);
  return s;
}

void PassThroughAllocator::Impl::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for_each_stat(stats_, [](Stat& s) { s.peak = s.current; });
}

void PassThroughAllocator::Impl::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for_each_stat(stats_, [](Stat& s) { s.allocated = s.freed = 0; });
  stats_.num_alloc_retries = stats_.num_ooms = stats_.num_sync_all_streams = 0;
  stats_.num_device_alloc = stats_.num_device_free = 0;
}

Snapshot PassThroughAllocator::Impl::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Snapshot snap;
  snap.segments.reserve(live_.size());
  for (const auto& [base, a] : live_) {
    SegmentInfo seg;
    seg.device = device_.index();
    seg.address = base;
    seg.total_size = seg.allocated_size = seg.active_size = a.size;
    seg.requested_size = a.requested;
    seg.stream = a.stream;
    seg.is_large = !a.small;
    seg.blocks.push_back(BlockInfo{base, a.size, a.requested, BlockState::active_allocated});
    snap.segments.push_back(std::move(seg));
  }
  std::sort(snap.segments.begin(), snap.segments.end(),
            [](const SegmentInfo& x, const SegmentInfo& y) { return x.address < y.address; });
  return snap;
}

// Recomputes every statistic from the live allocations.
void PassThroughAllocator::Impl::check() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats expected;
  std::size_t bytes = 0;
  std::int64_t oversize = 0;
  for (const auto& [base, a] : live_) {
    const auto size = static_cast<std::int64_t>(a.size);
    for (StatPool pool : {StatPool::all, pool_of(a.small)}) {
      for (StatKind kind : {StatKind::allocation, StatKind::segment, StatKind::active}) {
        expected.get(kind, pool).current += 1;
      }
      for (StatKind kind :
           {StatKind::allocated_bytes, StatKind::reserved_bytes, StatKind::active_bytes}) {
        expected.get(kind, pool).current += size;
      }
      expected.get(StatKind::requested_bytes, pool).current +=
          static_cast<std::int64_t>(a.requested);
    }
    bytes += a.size;
    oversize += policy_.is_oversize(a.size) ? 1 : 0;
  }
  const auto violated = [](const std::string& what) {
    throw InvariantViolation("pass_through::check: " + what);
  };
  for (int k = 0; k < kStatKinds; ++k) {
    for (int p = 0; p < kStatPools; ++p) {
      const Stat& have = stats_.array[k][p];
      const std::int64_t want = expected.array[k][p].current;
      if (have.current != want || have.peak < have.current) {
        violated(fmt::format("{}.{} is {} (peak {}); the live allocations make {}",
                             to_string(static_cast<StatKind>(k)),
                             to_string(static_cast<StatPool>(p)), have.current, have.peak, want));
      }
    }
  }
  if (stats_.oversize_allocations.current != oversize ||
      stats_.oversize_segments.current != oversize) {
    violated(fmt::format("oversize counts {} / {}; the live allocations make {}",
                         stats_.oversize_allocations.current, stats_.oversize_segments.current,
                         oversize));
  }
  if (reserved_bytes() != bytes) {
    violated(fmt::format("reserved_bytes() is {}; the live allocations hold {}", reserved_bytes(),
                         bytes));
  }
}

// --- limits and history ----------------------------------------------------------------------------

void PassThroughAllocator::Impl::set_memory_fraction(double fraction) {
  detail::check_memory_fraction(fraction);
  std::lock_guard<std::mutex> lock(mutex_);
  config_.memory_fraction = fraction;
  update_allowed();
}

void PassThroughAllocator::Impl::record_history(bool enabled, std::size_t max_entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  recording_ = enabled;
  if (enabled) log_ = std::make_unique<detail::HistoryLog>(max_entries);
}

std::vector<HistoryEntry> PassThroughAllocator::Impl::history() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return log_ != nullptr ? log_->entries() : std::vector<HistoryEntry>{};
}

// --- the public class --------------------------------------------------------------------------------

PassThroughAllocator::PassThroughAllocator(Device& device, Config config)
    : impl_(std::make_unique<Impl>(device, std::move(config))) {}
PassThroughAllocator::~PassThroughAllocator() = default;

void* PassThroughAllocator::allocate(std::size_t bytes, Stream stream) {
  return impl_->allocate(bytes, stream);
}
void PassThroughAllocator::deallocate(void* ptr, Stream stream) { impl_->deallocate(ptr, stream); }
void PassThroughAllocator::record_stream(void* ptr, Stream) { impl_->record_stream(ptr); }
void PassThroughAllocator::empty_cache() {}  // nothing is cached
Stats PassThroughAllocator::stats() const { return impl_->stats(); }
std::size_t PassThroughAllocator::reserved_bytes() const noexcept {
  return impl_->reserved_bytes();
}
void PassThroughAllocator::reset_peak_stats() { impl_->reset_peak_stats(); }
Snapshot PassThroughAllocator::snapshot() const { return impl_->snapshot(); }
int PassThroughAllocator::device_index() const noexcept { return impl_->device().index(); }
std::string PassThroughAllocator::name() const { return "pass_through"; }
void PassThroughAllocator::check() const { impl_->check(); }
void PassThroughAllocator::reset_accumulated_stats() { impl_->reset_accumulated_stats(); }
std::size_t PassThroughAllocator::allocation_size(void* ptr) const {
  return impl_->allocation_size(ptr);
}
std::optional<std::size_t> PassThroughAllocator::requested_size(void* ptr) const noexcept {
  return impl_->requested_size(ptr);
}
std::pair<void*, std::size_t> PassThroughAllocator::base_allocation(void* ptr) const {
  return impl_->base_allocation(ptr);
}
std::size_t PassThroughAllocator::allocated_bytes() const noexcept {
  return impl_->reserved_bytes();  // every byte held is allocated: nothing is cached
}
const Config& PassThroughAllocator::config() const noexcept { return impl_->config(); }
Device& PassThroughAllocator::device() const noexcept { return impl_->device(); }
void PassThroughAllocator::set_memory_fraction(double fraction) {
  impl_->set_memory_fraction(fraction);
}
void PassThroughAllocator::record_history(bool enabled, std::size_t max_entries) {
  impl_->record_history(enabled, max_entries);
}
std::vector<HistoryEntry> PassThroughAllocator::history() const { return impl_->history(); }

}  // namespace cistern
