// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// GraphPools (see Note [Graph pools] in graph_pools.hpp).
#include "plugin/graph_pools.hpp"

#include <algorithm>

#include "cistern/errors.hpp"
#include "plugin/plugin_state.hpp"  // SizeMismatch

namespace cistern::plugin {
namespace {

std::string name_of(PoolId id) {
  return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

void add_stat(Stat& total, const Stat& add) {
  total.current += add.current;
  total.peak += add.peak;
  total.allocated += add.allocated;
  total.freed += add.freed;
}

/// A destroyed pool's counters: what it still held is given back with it.
Stats retire(Stats stats) {
  auto settle = [](Stat& s) {
    s.freed += s.current;
    s.current = 0;
  };
  for (auto& kind : stats.array) {
    for (Stat& s : kind) settle(s);
  }
  settle(stats.oversize_allocations);
  settle(stats.oversize_segments);
  return stats;
}

}  // namespace

void add_stats(Stats& total, const Stats& add) {
  for (int kind = 0; kind < kStatKinds; ++kind) {
    for (int pool = 0; pool < kStatPools; ++pool) {
      add_stat(total.array[kind][pool], add.array[kind][pool]);
    }
  }
  add_stat(total.oversize_allocations, add.oversize_allocations);
  add_stat(total.oversize_segments, add.oversize_segments);
  total.num_alloc_retries += add.num_alloc_retries;
  total.num_ooms += add.num_ooms;
  total.num_sync_all_streams += add.num_sync_all_streams;
  total.num_device_alloc += add.num_device_alloc;
  total.num_device_free += add.num_device_free;
  total.num_cross_stream_reuse += add.num_cross_stream_reuse;
  total.num_pages_mapped += add.num_pages_mapped;
  total.num_pages_unmapped += add.num_pages_unmapped;
  total.num_pages_reclaimed += add.num_pages_reclaimed;
  total.num_handles_created += add.num_handles_created;
  total.num_handles_released += add.num_handles_released;
  total.num_reclaim_syncs += add.num_reclaim_syncs;
  total.num_handle_splits += add.num_handle_splits;
  total.num_oom_rescues += add.num_oom_rescues;
  total.num_fine_cuts += add.num_fine_cuts;
  total.num_vmm_fallbacks += add.num_vmm_fallbacks;
}

GraphPools::GraphPools(Device& device, const Config& config, const CaptureState& capture,
                       DeviceAllocator& general)
    : device_(device), config_(config), capture_(capture), general_(general) {
  retired_.max_split_size = 0;
}

GraphPools::~GraphPools() = default;

const char* GraphPools::capture_oom_note() noexcept {
  return " During a capture cistern does not free the general pool's cache (freeing memory "
         "would break the capture, as in PyTorch): call torch.cuda.empty_cache() before "
         "capturing.";
}

GraphPools::Pool& GraphPools::find(PoolId id, const char* what) {
  const auto it = pools_.find(id);
  if (it == pools_.end()) {
    throw InvalidArgument(std::string("cistern: ") + what + " on device " +
                          std::to_string(device_.index()) + ": no graph pool " + name_of(id) +
                          " (never begun, or released already)");
  }
  return it->second;
}

void GraphPools::begin(PoolId id, StreamFilter filter) {
  if (id == PoolId{0, 0}) {
    throw InvalidArgument("cistern: begin_allocate_to_pool on device " +
                          std::to_string(device_.index()) +
                          ": pool (0, 0) is the general pool, not a graph pool");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, created] = pools_.try_emplace(id);
  Pool& pool = it->second;
  if (created) {
    pool.id = id;
    try {
      pool.device = std::make_unique<CaptureGuardDevice>(device_, capture_, GuardRole::graph_pool);
      pool.allocator = make_allocator(*pool.device, config_);
    } catch (...) {
      pools_.erase(it);
      throw;
    }
  }
  begun_list_.push_back({id, std::move(filter)});
  ++pool.uses;
  begun_.store(begun_list_.size(), std::memory_order_relaxed);
}

void GraphPools::end(PoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto newest = std::find_if(begun_list_.rbegin(), begun_list_.rend(),
                                   [&](const Begun& b) { return b.id == id; });
  if (newest == begun_list_.rend()) {
    throw InvalidArgument("cistern: end_allocate_to_pool on device " +
                          std::to_string(device_.index()) + ": pool " + name_of(id) +
                          " is not begun");
  }
  begun_list_.erase(std::next(newest).base());
  begun_.store(begun_list_.size(), std::memory_order_relaxed);
  destroy_if_unused(id);  // released before its end
}

void GraphPools::release(PoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pool& pool = find(id, "release_pool");
  if (pool.uses == 0) {
    throw InvalidArgument("cistern: release_pool on device " + std::to_string(device_.index()) +
                          ": pool " + name_of(id) + " has no use left to release");
  }
  --pool.uses;
  destroy_if_unused(id);
}

void GraphPools::destroy_if_unused(PoolId id) {
  const auto it = pools_.find(id);
  if (it == pools_.end() || it->second.uses != 0 || it->second.live != 0) return;
  const bool still_begun = std::any_of(begun_list_.begin(), begun_list_.end(),
                                       [&](const Begun& b) { return b.id == id; });
  if (still_begun) return;  // released before its end: routing goes on until then
  it->second.allocator->empty_cache();
  add_stats(retired_, retire(it->second.allocator->stats()));
  pools_.erase(it);  // the allocator gives back whatever it still caches
}

std::optional<void*> GraphPools::allocate(std::size_t size, Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto b = begun_list_.rbegin(); b != begun_list_.rend(); ++b) {
    if (!b->filter || b->filter(stream)) return allocate_in(pools_.at(b->id), size, stream);
  }
  return std::nullopt;
}

void* GraphPools::allocate_in(Pool& pool, std::size_t size, Stream stream) {
  void* ptr = nullptr;
  try {
    ptr = pool.allocator->allocate(size, stream);
  } catch (const OutOfMemory&) {
    if (capture_.is_capturing(stream)) throw;
    general_.empty_cache();  // the general pool's cached memory first, as PyTorch frees its own
    ptr = pool.allocator->allocate(size, stream);
  }
  if (ptr == nullptr) return nullptr;
  try {
    owners_.emplace(ptr, &pool);
  } catch (...) {
    pool.allocator->deallocate(ptr, stream);
    throw;
  }
  ++pool.live;
  live_.fetch_add(1, std::memory_order_relaxed);
  return ptr;
}

std::optional<std::size_t> GraphPools::requested_size(void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = owners_.find(ptr);
  if (it == owners_.end()) return std::nullopt;
  return it->second->allocator->requested_size(ptr);
}

bool GraphPools::deallocate(void* ptr, std::size_t size, Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = owners_.find(ptr);
  if (it == owners_.end()) return false;
  Pool& pool = *it->second;
  const std::optional<std::size_t> requested = pool.allocator->requested_size(ptr);
  if (requested != size) {
    throw SizeMismatch("cistern: free of a graph pool's allocation with size " +
                       std::to_string(size) + ": the allocation has size " +
                       std::to_string(requested.value_or(0)) + "; nothing was freed");
  }
  pool.allocator->deallocate(ptr, stream);
  owners_.erase(it);
  --pool.live;
  live_.fetch_sub(1, std::memory_order_relaxed);
  if (pool.live == 0 && pool.uses == 0) {
    destroy_if_unused(pool.id);
  }
  return true;
}

bool GraphPools::with_owner(void* ptr, const std::function<void(DeviceAllocator&)>& use) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = owners_.find(ptr);
  if (it == owners_.end()) return false;
  use(*it->second->allocator);
  return true;
}

void GraphPools::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, pool] : pools_) {
    if (pool.uses == 0) pool.allocator->empty_cache();
  }
}

Stats GraphPools::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats total = retired_;
  for (const auto& [id, pool] : pools_) add_stats(total, pool.allocator->stats());
  return total;
}

void GraphPools::add_segments(Snapshot& snapshot) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [id, pool] : pools_) {
    Snapshot own = pool.allocator->snapshot();
    snapshot.segments.insert(snapshot.segments.end(), own.segments.begin(), own.segments.end());
  }
}

void GraphPools::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, pool] : pools_) pool.allocator->reset_peak_stats();
  for (auto& kind : retired_.array) {
    for (Stat& s : kind) s.peak = s.current;
  }
  retired_.oversize_allocations.peak = retired_.oversize_allocations.current;
  retired_.oversize_segments.peak = retired_.oversize_segments.current;
}

void GraphPools::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, pool] : pools_) pool.allocator->reset_accumulated_stats();
  retired_ = Stats{};
  retired_.max_split_size = 0;
}

void GraphPools::check() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t live = 0;
  for (const auto& [id, pool] : pools_) {
    pool.allocator->check();
    live += pool.live;
  }
  if (live != owners_.size()) {
    throw InvariantViolation("cistern: graph pools of device " + std::to_string(device_.index()) +
                             ": " + std::to_string(owners_.size()) +
                             " live pointers, pools count " + std::to_string(live));
  }
}

std::size_t GraphPools::pool_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pools_.size();
}

}  // namespace cistern::plugin
