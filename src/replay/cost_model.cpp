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
  // Virtual memory, from the A100 measurements in docs/cost-model.md (2 MiB pages, one thread):
  // cuMemCreate 193 us per handle (the high end of the published 7.6-193 us), cuMemMap 1.45 us
  // per mapping, cuMemSetAccess 36 us per run of mappings, cuMemUnmap 25.6 us. cuMemRelease has
  // no public figure: assumed at the lower unmap sample, 11.5 us. Physical memory costs the same
  // per MiB whichever call obtains it: 1 us per MiB, as for cudaMalloc and cudaFree (assumed).
  c.create_ns = kCreateNsHigh;
  c.create_ns_per_mib = 1'000;
  c.release_ns = 11'500;
  c.release_ns_per_mib = 1'000;
  c.map_ns = 1'450;
  c.access_ns = 36'000;
  c.unmap_ns = 25'600;
  // One cuMemUnmap over several whole mappings side by side: the call's fixed part once, and for
  // each further mapping the work of taking one out of the page tables - assumed at a cuMemMap's
  // per-mapping figure, 1.45 us (no public measurement of a multi-mapping unmap was found).
  c.unmap_extra_ns = 1'450;
  // cudaEventRecord / cudaEventQuery: 1.5-3.7 us on average in published nsys summaries.
  c.event_ns = 2'000;
  // Synchronisations: the host's part of the call only (the replay runs no kernels, so there is
  // nothing to wait for); assumed at two event calls, the device-wide one at four.
  c.sync_stream_ns = 4'000;
  c.sync_event_ns = 4'000;
  c.sync_device_ns = 8'000;
  return c;
}

namespace {

double mib(std::size_t bytes) noexcept {
  return static_cast<double>(bytes) / static_cast<double>(MiB);
}

}  // namespace

double CostModel::alloc_size_ns(std::size_t bytes) const noexcept {
  return alloc_ns_per_mib * mib(bytes);
}

double CostModel::free_size_ns(std::size_t bytes) const noexcept {
  return free_ns_per_mib * mib(bytes);
}

double CostModel::create_size_ns(std::size_t bytes) const noexcept {
  return create_ns_per_mib * mib(bytes);
}

double CostModel::release_size_ns(std::size_t bytes) const noexcept {
  return release_ns_per_mib * mib(bytes);
}

}  // namespace cistern::replay
