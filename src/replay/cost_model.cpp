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

}  // namespace cistern::replay
