// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The default prices of device calls. docs/cost-model.md gives every figure's source and says
// which are measured and which are assumed; change both together.
#include "replay/engine.hpp"

namespace cistern::replay {

CostModel CostModel::defaults() {
  CostModel c;
  // A cudaMalloc + cudaFree pair of a segment costs about 70 us (RMM's cudaMalloc resource:
  // 6.6-7.6 s for 100,000 random allocations of up to 2 MiB), split 40/30.
  c.alloc_ns = 40'000;
  c.free_ns = 30'000;
  // Larger segments take longer to map into the GPU's page tables; no clean public slope was
  // found, so 1 us per MiB is assumed for both (a 1 GiB segment: ~1 ms to allocate).
  c.alloc_ns_per_mib = 1'000;
  c.free_ns_per_mib = 1'000;
  // cuMemCreate + cuMemMap + cuMemSetAccess, and cuMemUnmap + cuMemRelease, per 2 MiB granule:
  // PyTorch found their cost proportional to the number of physical chunks. Assumed.
  c.map_ns = 20'000;
  c.unmap_ns = 15'000;
  // cudaEventRecord / cudaEventQuery: 1.5-3.7 us on average in published nsys summaries.
  c.event_ns = 2'000;
  return c;
}

namespace {

double mib(std::size_t bytes) noexcept {
  return static_cast<double>(bytes) / static_cast<double>(MiB);
}

double granules(std::size_t bytes, std::size_t granularity) noexcept {
  const std::size_t whole = (bytes + granularity - 1) / granularity;  // a partial one costs whole
  return static_cast<double>(whole);
}

}  // namespace

double CostModel::alloc_size_ns(std::size_t bytes) const noexcept {
  return alloc_ns_per_mib * mib(bytes);
}

double CostModel::free_size_ns(std::size_t bytes) const noexcept {
  return free_ns_per_mib * mib(bytes);
}

double CostModel::map_granules_ns(std::size_t bytes, std::size_t granularity) const noexcept {
  return map_ns * granules(bytes, granularity);
}

double CostModel::unmap_granules_ns(std::size_t bytes, std::size_t granularity) const noexcept {
  return unmap_ns * granules(bytes, granularity);
}

}  // namespace cistern::replay
