// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The replay's cost model (replay::CostModel, docs/cost-model.md): its H200 defaults against
// every configuration measured on the H200, exact at the figures they are derived from; the
// `a100` alternative; fields by name. How the meter applies the prices to device calls is tested
// in test_replay_devices.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "cistern/errors.hpp"
#include "cistern/types.hpp"
#include "replay/engine.hpp"

namespace cistern {
namespace {

using replay::CostModel;

enum class Call { alloc, free, create, release, map, access, unmap };

/// One configuration measured on the H200: one call over `mappings` mappings (or one segment or
/// handle) of `mib` MiB each, its median in us - a range where two runs differ - and the error
/// the model is allowed there.
struct Measured {
  const char* what;
  Call call;
  std::size_t mappings;
  std::size_t mib;
  double low_us;
  double high_us;
  double tolerance;
};

// docs/cost-model.md, "How close the model is": within 20% everywhere but at three points a
// straight line cannot reach (their own tolerance, and a bound on the absolute excess below).
constexpr double kTolerance = 0.20;
// Sources: ../shared/reference/vmm-and-planning.md section 4 (ranges: two runs), and
// ../shared/reference/h200/bench_vmm.json (medians: rows named in docs/cost-model.md).
constexpr Measured kMeasured[] = {
    {"cudaMalloc 2 MiB", Call::alloc, 1, 2, 45, 51, kTolerance},
    {"cudaMalloc 20 MiB", Call::alloc, 1, 20, 45, 53, kTolerance},
    {"cudaMalloc 200 MiB", Call::alloc, 1, 200, 60, 93, kTolerance},
    {"cudaMalloc 2 GiB", Call::alloc, 1, 2048, 231, 231, kTolerance},
    {"cudaFree 2 MiB", Call::free, 1, 2, 36, 41, kTolerance},
    {"cudaFree 20 MiB", Call::free, 1, 20, 53, 57, kTolerance},
    {"cudaFree 200 MiB", Call::free, 1, 200, 155, 179, kTolerance},
    {"cudaFree 2 GiB", Call::free, 1, 2048, 1276, 1276, kTolerance},
    {"cuMemCreate 2 MiB", Call::create, 1, 2, 11, 12, kTolerance},
    {"cuMemCreate 20 MiB", Call::create, 1, 20, 8, 12, kTolerance},
    // Flat to 200 MiB, steep above: the line through 2 MiB and 2 GiB overprices 200 MiB.
    {"cuMemCreate 200 MiB", Call::create, 1, 200, 9, 9, 1.00},
    {"cuMemCreate 2 GiB", Call::create, 1, 2048, 71, 71, kTolerance},
    {"cuMemRelease 2 MiB", Call::release, 1, 2, 13, 14, kTolerance},
    {"cuMemRelease 20 MiB", Call::release, 1, 20, 15, 26, kTolerance},
    {"cuMemRelease 200 MiB", Call::release, 1, 200, 65, 65, 0.85},
    {"cuMemRelease 2 GiB", Call::release, 1, 2048, 1076, 1076, kTolerance},
    {"cuMemMap 1 x 2 MiB", Call::map, 1, 2, 0.9, 1.8, kTolerance},
    {"cuMemMap 1 x 20 MiB", Call::map, 1, 20, 1.03, 1.03, kTolerance},
    // About 0.7 us per mapping in a row of 512; the model keeps the single call's 0.93.
    {"cuMemMap 512 x 2 MiB in a row", Call::map, 512, 2, 0.7 * 512, 0.7 * 512, 0.35},
    {"cuMemSetAccess 1 x 2 MiB", Call::access, 1, 2, 27.52, 33, kTolerance},
    {"cuMemSetAccess 1 x 20 MiB", Call::access, 1, 20, 27.69, 27.69, kTolerance},
    {"cuMemSetAccess 8 x 2 MiB", Call::access, 8, 2, 254, 254, kTolerance},
    {"cuMemSetAccess 10 x 2 MiB", Call::access, 10, 2, 255.09, 255.09, kTolerance},
    {"cuMemSetAccess 64 x 2 MiB", Call::access, 64, 2, 1884, 1884, kTolerance},
    {"cuMemSetAccess 512 x 2 MiB", Call::access, 512, 2, 14216, 14216, kTolerance},
    {"cuMemSetAccess 1 x 1 GiB (512 granules)", Call::access, 1, 1024, 131, 131, kTolerance},
    {"cuMemUnmap 1 x 2 MiB", Call::unmap, 1, 2, 18.63, 20, kTolerance},
    {"cuMemUnmap 1 x 20 MiB", Call::unmap, 1, 20, 18.06, 18.06, kTolerance},
    {"cuMemUnmap 8 x 2 MiB", Call::unmap, 8, 2, 158, 158, kTolerance},
    {"cuMemUnmap 10 x 2 MiB", Call::unmap, 10, 2, 174.52, 174.52, kTolerance},
    {"cuMemUnmap 64 x 2 MiB", Call::unmap, 64, 2, 1056, 1056, kTolerance},
    {"cuMemUnmap 512 x 2 MiB", Call::unmap, 512, 2, 10340, 10340, kTolerance},
    {"cuMemUnmap 1 x 1 GiB (512 granules)", Call::unmap, 1, 1024, 53, 53, kTolerance},
};

/// The model's price of a measured configuration, in us.
double price_us(const CostModel& m, const Measured& p) {
  const std::size_t bytes = p.mib * MiB;
  const auto n = static_cast<double>(p.mappings);
  double ns = 0;
  switch (p.call) {
    case Call::alloc: ns = m.alloc_price(bytes); break;
    case Call::free: ns = m.free_price(bytes); break;
    case Call::create: ns = m.create_price(bytes); break;
    case Call::release: ns = m.release_price(bytes); break;
    case Call::map: ns = n * m.map_ns; break;
    case Call::access: ns = n * m.access_price(bytes); break;
    case Call::unmap: ns = n * m.unmap_price(bytes); break;
  }
  return ns / 1000;
}

/// The relative error of `us` against the measured range: 0 inside it, else against its
/// nearest end.
double error(double us, const Measured& p) {
  if (us > p.high_us) return (us - p.high_us) / p.high_us;
  if (us < p.low_us) return (us - p.low_us) / p.low_us;
  return 0;
}

TEST(CostModel, H200DefaultsReproduceTheMeasurements) {
  const CostModel m = CostModel::defaults();
  EXPECT_EQ(m.name, "h200");
  double worst = 0;
  std::string worst_what;
  double worst_within_default = 0;
  for (const Measured& p : kMeasured) {
    const double us = price_us(m, p);
    const double e = error(us, p);
    EXPECT_LE(std::abs(e), p.tolerance)
        << p.what << ": model " << us << " us, measured " << p.low_us << "-" << p.high_us << " us";
    if (std::abs(e) > std::abs(worst)) {
      worst = e;
      worst_what = p.what;
    }
    if (p.tolerance == kTolerance)
      worst_within_default = std::max(worst_within_default, std::abs(e));
  }
  EXPECT_LE(worst_within_default, kTolerance);
  RecordProperty("worst_error", std::to_string(worst) + " (" + worst_what + ")");
  // The three points over 20% cost little in absolute terms.
  EXPECT_LT(m.create_price(200 * MiB) - 9'000, 10'000);
  EXPECT_LT(m.release_price(200 * MiB) - 65'000, 60'000);
  EXPECT_LT(m.map_ns - 700, 250);  // per mapping, in a row of 512
}

TEST(CostModel, H200DefaultsAreExactAtTheFiguresTheyAreDerivedFrom) {
  const CostModel m = CostModel::h200();
  const auto near = [](double actual, double expected) {
    EXPECT_NEAR(actual, expected, 1e-9 * expected);
  };
  // A line through the 2 MiB median (bench_vmm.json) and the 2 GiB one (section 4).
  near(m.alloc_price(2 * MiB), 45'014.5);
  near(m.alloc_price(2 * GiB), 231'000);
  near(m.free_price(2 * MiB), 35'925.5);
  near(m.free_price(2 * GiB), 1'276'000);
  near(m.create_price(2 * MiB), 12'141.5);
  near(m.create_price(2 * GiB), 71'000);
  near(m.release_price(2 * MiB), 14'324);
  near(m.release_price(2 * GiB), 1'076'000);
  // Per mapping: the fitted share of a 2 MiB mapping, and one 1 GiB handle mapped whole.
  near(m.access_price(2 * MiB), 29'456);
  near(m.access_price(GiB), 131'000);
  near(m.unmap_price(2 * MiB), 18'455);
  near(m.unmap_price(GiB), 53'000);
  // Single medians (bench_vmm.json).
  EXPECT_EQ(m.map_ns, 933);
  EXPECT_EQ(m.reserve_ns, 2'414.5);
  EXPECT_EQ(m.release_reservation_ns, 2'961.5);
  EXPECT_EQ(m.event_record_ns, 417.5);
  EXPECT_EQ(m.event_query_ns, 587.5);
  EXPECT_EQ(m.sync_stream_ns, 698);
  EXPECT_EQ(m.sync_event_ns, 698);  // not measured: a stream's
  EXPECT_EQ(m.sync_device_ns, 983.5);
}

TEST(CostModel, A100TakesThePublishedTwoMiBFiguresAndTheH200sForTheRest) {
  const CostModel a = CostModel::a100();
  const CostModel h = CostModel::h200();
  EXPECT_EQ(a.name, "a100");
  EXPECT_EQ(CostModel::named("a100").create_ns, a.create_ns);
  EXPECT_NEAR(a.create_price(2 * MiB), 193'000, 1e-6);
  EXPECT_NEAR(a.access_price(2 * MiB), 36'000, 1e-6);
  EXPECT_NEAR(a.unmap_price(2 * MiB), 25'600, 1e-6);
  EXPECT_EQ(a.map_ns, 1'450);
  EXPECT_EQ(a.reserve_ns, 19'000);
  const std::set<std::string> published = {"create_ns", "access_ns", "unmap_ns", "map_ns",
                                           "reserve_ns"};
  for (const CostModel::Field& f : CostModel::fields()) {
    if (published.count(f.name) == 0) EXPECT_EQ(a.*f.value, h.*f.value) << f.name;
  }
}

TEST(CostModel, FieldsAreReadAndWrittenByNameAndBadOnesAreNamed) {
  std::set<std::string> names;
  CostModel m;
  double value = 1;
  for (const CostModel::Field& f : CostModel::fields()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    m.set(f.name, value);
    EXPECT_EQ(m.*f.value, value) << f.name;
    EXPECT_EQ(m.get(f.name), value) << f.name;
    value += 1;
  }
  EXPECT_EQ(names.size(), 20u);
  m.set("map_ns", 0);  // free is a price
  EXPECT_EQ(m.map_ns, 0);

  const auto message = [&m](const std::string& field, double ns) {
    try {
      m.set(field, ns);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("bogus_ns", 1).find("unknown cost model field 'bogus_ns' (fields: alloc_ns, "),
            std::string::npos);
  for (const double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_NE(message("unmap_ns", bad).find("'unmap_ns' needs a time of 0 ns or more"),
              std::string::npos)
        << bad;
  }
  EXPECT_THROW((void)m.get("create_us"), InvalidArgument);
  EXPECT_EQ(CostModel::named("h200").name, "h200");
  try {
    (void)CostModel::named("b200");
    ADD_FAILURE() << "b200 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown cost model 'b200' (models: h200, a100)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cistern
