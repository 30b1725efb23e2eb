// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The prices of device calls. docs/cost-model.md names the measurement behind every figure and
// says which are assumed; change both together. The measurements: ../shared/reference/h200/
// bench_vmm.json (the project's bench_vmm on an NVIDIA H200, medians) and section 4 of
// ../shared/reference/vmm-and-planning.md (the same GPU: the 2 GiB sizes and the ranges of 1, 8,
// 64 and 512 mappings).
#include <cmath>

#include "cistern/errors.hpp"
#include "replay/engine.hpp"

namespace cistern::replay {
namespace {

double mib(std::size_t bytes) noexcept {
  return static_cast<double>(bytes) / static_cast<double>(MiB);
}

/// A price `fixed + per_mib x MiB` through two measured points: the call's time on `small_mib`
/// and on `large_mib`.
struct Line {
  double fixed = 0;
  double per_mib = 0;
};
Line through(double small_mib, double small_ns, double large_mib, double large_ns) {
  const double per_mib = (large_ns - small_ns) / (large_mib - small_mib);
  return {small_ns - per_mib * small_mib, per_mib};
}

// One 2 MiB mapping's share of a cuMemSetAccess / cuMemUnmap over n mappings: the slope of a
// least-squares line (relative errors, intercept and slope; bench_vmm fits it the same way)
// through one call over 1, 8, 64 and 512 mappings of 2 MiB handles on the H200:
// cuMemSetAccess 27.52, 254, 1,884, 14,216 us (slope 29.46 us, intercept -1.7 us);
// cuMemUnmap 18.63, 158, 1,056, 10,340 us (slope 18.45 us, intercept 0.3 us).
constexpr double kAccessPerMapping2MiB = 29'456;
constexpr double kUnmapPerMapping2MiB = 18'455;
// One handle of 512 granules (1 GiB) mapped whole: cuMemSetAccess 131 us, cuMemUnmap 53 us.
constexpr double kAccessOneGiBHandle = 131'000;
constexpr double kUnmapOneGiBHandle = 53'000;

}  // namespace

CostModel CostModel::h200() {
  CostModel c;
  c.name = "h200";
  // Calls whose cost grows with the size: a line through the 2 MiB median (bench_vmm.json) and
  // the 2 GiB median (vmm-and-planning.md section 4). Exact at both ends; at 20 and 200 MiB the
  // test of the model (tests/test_cost_model.cpp) checks it against the measurements.
  const Line alloc = through(2, 45'014.5, 2048, 231'000);    // cudaMalloc
  const Line free = through(2, 35'925.5, 2048, 1'276'000);   // cudaFree
  const Line create = through(2, 12'141.5, 2048, 71'000);    // cuMemCreate
  const Line release = through(2, 14'324, 2048, 1'076'000);  // cuMemRelease
  c.alloc_ns = alloc.fixed;
  c.alloc_ns_per_mib = alloc.per_mib;
  c.free_ns = free.fixed;
  c.free_ns_per_mib = free.per_mib;
  c.create_ns = create.fixed;
  c.create_ns_per_mib = create.per_mib;
  c.release_ns = release.fixed;
  c.release_ns_per_mib = release.per_mib;
  // Address space (a 157 GiB range; no size dependence measured).
  c.reserve_ns = 2'414.5;
  c.release_reservation_ns = 2'961.5;
  // cuMemMap: one 2 MiB mapping (0.7 us per mapping in a row of 512: not used, the replays map
  // a few at a time).
  c.map_ns = 933;
  // Access grants and unmaps per mapping covered: a line through a 2 MiB mapping's share and a
  // 1 GiB handle mapped whole.
  const Line access = through(2, kAccessPerMapping2MiB, 1024, kAccessOneGiBHandle);
  const Line unmap = through(2, kUnmapPerMapping2MiB, 1024, kUnmapOneGiBHandle);
  c.access_ns = access.fixed;
  c.access_ns_per_mib = access.per_mib;
  c.unmap_ns = unmap.fixed;
  c.unmap_ns_per_mib = unmap.per_mib;
  // Events and synchronisations on an idle stream. cudaStreamWaitEvent and cudaMemGetInfo were
  // not measured: priced as a record and a query; cudaEventSynchronize as a stream's.
  c.event_record_ns = 417.5;
  c.event_query_ns = 587.5;
  c.sync_stream_ns = 698;
  c.sync_event_ns = 698;
  c.sync_device_ns = 983.5;
  return c;
}

CostModel CostModel::a100() {
  CostModel c = h200();
  c.name = "a100";
  // kvcached's bench_vmm on an A100, 2 MiB pages, one thread (vmm-and-planning.md section 4):
  // the price of a 2 MiB call is the published figure; the parts per MiB stay the H200's.
  c.reserve_ns = 19'000;  // an 8 GB range
  c.create_ns = 193'000 - 2 * c.create_ns_per_mib;
  c.map_ns = 1'450;
  c.access_ns = 36'000 - 2 * c.access_ns_per_mib;
  c.unmap_ns = 25'600 - 2 * c.unmap_ns_per_mib;
  return c;
}

CostModel CostModel::defaults() { return h200(); }

CostModel CostModel::named(const std::string& name) {
  if (name == "h200") return h200();
  if (name == "a100") return a100();
  throw InvalidArgument("unknown cost model '" + name + "' (models: h200, a100)");
}

const std::vector<CostModel::Field>& CostModel::fields() {
  static const std::vector<Field> all = {
      {"alloc_ns", &CostModel::alloc_ns},
      {"alloc_ns_per_mib", &CostModel::alloc_ns_per_mib},
      {"free_ns", &CostModel::free_ns},
      {"free_ns_per_mib", &CostModel::free_ns_per_mib},
      {"reserve_ns", &CostModel::reserve_ns},
      {"release_reservation_ns", &CostModel::release_reservation_ns},
      {"create_ns", &CostModel::create_ns},
      {"create_ns_per_mib", &CostModel::create_ns_per_mib},
      {"release_ns", &CostModel::release_ns},
      {"release_ns_per_mib", &CostModel::release_ns_per_mib},
      {"map_ns", &CostModel::map_ns},
      {"access_ns", &CostModel::access_ns},
      {"access_ns_per_mib", &CostModel::access_ns_per_mib},
      {"unmap_ns", &CostModel::unmap_ns},
      {"unmap_ns_per_mib", &CostModel::unmap_ns_per_mib},
      {"event_record_ns", &CostModel::event_record_ns},
      {"event_query_ns", &CostModel::event_query_ns},
      {"sync_stream_ns", &CostModel::sync_stream_ns},
      {"sync_event_ns", &CostModel::sync_event_ns},
      {"sync_device_ns", &CostModel::sync_device_ns},
  };
  return all;
}

namespace {

const CostModel::Field& find_field(const std::string& name) {
  for (const CostModel::Field& f : CostModel::fields()) {
    if (name == f.name) return f;
  }
  std::string known;
  for (const CostModel::Field& f : CostModel::fields()) {
    known += (known.empty() ? "" : ", ") + std::string(f.name);
  }
  throw InvalidArgument("unknown cost model field '" + name + "' (fields: " + known + ")");
}

}  // namespace

double CostModel::get(const std::string& field) const { return this->*find_field(field).value; }

void CostModel::set(const std::string& field, double ns) {
  const Field& f = find_field(field);
  if (!std::isfinite(ns) || ns < 0) {
    throw InvalidArgument("cost model field '" + field + "' needs a time of 0 ns or more");
  }
  this->*f.value = ns;
}

double CostModel::alloc_price(std::size_t bytes) const noexcept {
  return alloc_ns + alloc_ns_per_mib * mib(bytes);
}

double CostModel::free_price(std::size_t bytes) const noexcept {
  return free_ns + free_ns_per_mib * mib(bytes);
}

double CostModel::create_price(std::size_t bytes) const noexcept {
  return create_ns + create_ns_per_mib * mib(bytes);
}

double CostModel::release_price(std::size_t bytes) const noexcept {
  return release_ns + release_ns_per_mib * mib(bytes);
}

double CostModel::access_price(std::size_t bytes) const noexcept {
  return access_ns + access_ns_per_mib * mib(bytes);
}

double CostModel::unmap_price(std::size_t bytes) const noexcept {
  return unmap_ns + unmap_ns_per_mib * mib(bytes);
}

}  // namespace cistern::replay
