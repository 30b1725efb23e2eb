// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Names of statistics and snapshot states, and the flat key view of `Stats`, all spelled exactly
// as PyTorch spells them so that tools written for `torch.cuda.memory_stats()` read ours.
#include "cistern/stats.hpp"

namespace cistern {

const char* to_string(StatKind kind) noexcept {
  switch (kind) {
    case StatKind::allocation: return "allocation";
    case StatKind::segment: return "segment";
    case StatKind::active: return "active";
    case StatKind::inactive_split: return "inactive_split";
    case StatKind::allocated_bytes: return "allocated_bytes";
    case StatKind::reserved_bytes: return "reserved_bytes";
    case StatKind::active_bytes: return "active_bytes";
    case StatKind::inactive_split_bytes: return "inactive_split_bytes";
    case StatKind::requested_bytes: return "requested_bytes";
  }
  return "unknown";
}

const char* to_string(StatPool pool) noexcept {
  switch (pool) {
    case StatPool::all: return "all";
    case StatPool::small_pool: return "small_pool";
    case StatPool::large_pool: return "large_pool";
  }
  return "unknown";
}

const char* to_string(BlockState state) noexcept {
  switch (state) {
    case BlockState::active_allocated: return "active_allocated";
    case BlockState::active_pending_free: return "active_pending_free";
    case BlockState::inactive: return "inactive";
  }
  return "unknown";
}

namespace {

/// Adds the four fields of `stat` as "<prefix>.current", "<prefix>.peak", ...
void add_stat(std::map<std::string, std::int64_t>& out, const std::string& prefix,
              const Stat& stat) {
  out[prefix + ".current"] = stat.current;
  out[prefix + ".peak"] = stat.peak;
  out[prefix + ".allocated"] = stat.allocated;
  out[prefix + ".freed"] = stat.freed;
}

}  // namespace

std::map<std::string, std::int64_t> Stats::flatten() const {
  std::map<std::string, std::int64_t> out;
  for (int kind = 0; kind < kStatKinds; ++kind) {
    for (int pool = 0; pool < kStatPools; ++pool) {
      const std::string prefix = std::string(to_string(static_cast<StatKind>(kind))) + "." +
                                 to_string(static_cast<StatPool>(pool));
      add_stat(out, prefix, array[kind][pool]);
    }
  }
  add_stat(out, "oversize_allocations", oversize_allocations);
  add_stat(out, "oversize_segments", oversize_segments);
  out["num_alloc_retries"] = num_alloc_retries;
  out["num_ooms"] = num_ooms;
  out["num_sync_all_streams"] = num_sync_all_streams;
  out["num_device_alloc"] = num_device_alloc;
  out["num_device_free"] = num_device_free;
  out["max_split_size"] = max_split_size;
  // Not a PyTorch key: cistern's own counter, kept in the same flat namespace.
  out["num_cross_stream_reuse"] = num_cross_stream_reuse;
  // The virtual-memory engine's counters (cistern's own keys, PyTorch-style names).
  out["num_pages_mapped"] = num_pages_mapped;
  out["num_pages_unmapped"] = num_pages_unmapped;
  out["num_pages_reclaimed"] = num_pages_reclaimed;
  out["num_handles_created"] = num_handles_created;
  out["num_handles_released"] = num_handles_released;
  out["num_reclaim_syncs"] = num_reclaim_syncs;
  out["num_handle_splits"] = num_handle_splits;
  out["num_oom_rescues"] = num_oom_rescues;
  out["num_fine_cuts"] = num_fine_cuts;
  out["num_vmm_fallbacks"] = num_vmm_fallbacks;
  return out;
}

}  // namespace cistern
