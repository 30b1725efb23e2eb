// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The replay's device adaptors and passes: ForwardingDevice and MeteredDevice honour the device
// contract (the conformance suite through them), the meter counts and prices every call an
// allocator can make - checked with a small page-mapping allocator of this file and with the
// classic CachingAllocator - and `Options::repeat` replays the window pass after pass with each
// pass's own figures.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/sim_device.hpp"
#include "device_conformance.hpp"
#include "replay/engine.hpp"
#include "replay/forwarding_device.hpp"
#include "replay/metered_device.hpp"
#include "trace/readers.hpp"

namespace cistern {
namespace {

using replay::CostModel;
using replay::ForwardingDevice;
using replay::detail::DeviceCalls;
using replay::detail::MeteredDevice;

SimDeviceOptions small_sim() {
  SimDeviceOptions options;
  options.capacity = 64 * MiB;
  return options;
}

/// A SimDevice seen through a meter and a plain forwarder: every call crosses both adaptors.
class ThroughAdaptors final : public ForwardingDevice {
 public:
  explicit ThroughAdaptors(std::unique_ptr<SimDevice> sim)
      : ForwardingDevice(*sim), sim_(std::move(sim)) {}
  SimDevice& sim() { return *sim_; }

 private:
  std::unique_ptr<SimDevice> sim_;
};

/// The meter sits between the forwarder and the SimDevice.
class MeteredStack final : public ForwardingDevice {
 public:
  explicit MeteredStack(std::unique_ptr<SimDevice> sim, std::unique_ptr<MeteredDevice> meter)
      : ForwardingDevice(static_cast<Device&>(*meter)),
        sim_(std::move(sim)),
        meter_(std::move(meter)) {}
  static std::unique_ptr<MeteredStack> make() {
    auto sim = std::make_unique<SimDevice>(small_sim());
    auto meter = std::make_unique<MeteredDevice>(*sim, CostModel::defaults());
    return std::make_unique<MeteredStack>(std::move(sim), std::move(meter));
  }
  SimDevice& sim() { return *sim_; }

 private:
  std::unique_ptr<SimDevice> sim_;
  std::unique_ptr<MeteredDevice> meter_;
};

}  // namespace

namespace conformance {

struct ForwardingFactory {
  static bool available() { return true; }
  static std::unique_ptr<Device> make() {
    return std::make_unique<ThroughAdaptors>(std::make_unique<SimDevice>(small_sim()));
  }
  static Stream make_stream(Device& device) {
    return static_cast<ThroughAdaptors&>(device).sim().create_stream();
  }
  static void destroy_stream(Device&, Stream) {}
  // A failure injected in the simulated device below reaches the caller through the adaptors.
  static bool fail_next(Device& device, DeviceOp op) {
    static_cast<ThroughAdaptors&>(device).sim().fail_nth(op, 1, Status::device_error);
    return true;
  }
  static constexpr std::size_t kFreeMemoryDriftGranules = 0;  // a SimDevice below
};

struct MeteredFactory {
  static bool available() { return true; }
  static std::unique_ptr<Device> make() { return MeteredStack::make(); }
  static Stream make_stream(Device& device) {
    return static_cast<MeteredStack&>(device).sim().create_stream();
  }
  static void destroy_stream(Device&, Stream) {}
  static bool fail_next(Device& device, DeviceOp op) {
    static_cast<MeteredStack&>(device).sim().fail_nth(op, 1, Status::device_error);
    return true;
  }
  static constexpr std::size_t kFreeMemoryDriftGranules = 0;  // a SimDevice below
};

INSTANTIATE_TYPED_TEST_SUITE_P(Forwarding, DeviceConformance, ::testing::Types<ForwardingFactory>);
INSTANTIATE_TYPED_TEST_SUITE_P(Metered, DeviceConformance, ::testing::Types<MeteredFactory>);

}  // namespace conformance

namespace {

/// Prices every kind of call differently, so that a sum names which calls were priced.
CostModel distinct_costs() {
  CostModel c;
  c.alloc_ns = 1;
  c.alloc_ns_per_mib = 0.5;
  c.free_ns = 2;
  c.free_ns_per_mib = 0.25;
  c.reserve_ns = 3;
  c.release_reservation_ns = 5;
  c.create_ns = 10;
  c.create_ns_per_mib = 4;
  c.release_ns = 20;
  c.release_ns_per_mib = 8;
  c.map_ns = 100;
  c.access_ns = 300;
  c.access_ns_per_mib = 16;
  c.unmap_ns = 200;
  c.unmap_ns_per_mib = 32;
  c.event_record_ns = 1000;
  c.event_query_ns = 3000;
  c.sync_stream_ns = 10'000;
  c.sync_event_ns = 20'000;
  c.sync_device_ns = 40'000;
  return c;
}

/// A minimal page allocator over the device contract: each request gets its own address range,
/// backed by one physical handle per 2 MiB page, each mapped on its own; a free waits for the
/// request's stream, then unmaps and releases every page.
class PageAllocator {
 public:
  explicit PageAllocator(Device& device) : device_(device) {}

  void* allocate(std::size_t pages, Stream stream) {
    const std::size_t page = device_.granularity();
    Request r{nullptr, pages, stream, {}};
    EXPECT_EQ(device_.reserve(pages * page, 0, &r.va), Status::ok);
    for (std::size_t i = 0; i < pages; ++i) {
      PhysicalHandle handle;
      EXPECT_EQ(device_.create_physical(page, &handle), Status::ok);
      EXPECT_EQ(device_.map(static_cast<char*>(r.va) + i * page, handle), Status::ok);
      r.handles.push_back(handle);
    }
    requests_.push_back(r);
    return r.va;
  }

  void free(void* va) {
    for (auto it = requests_.begin(); it != requests_.end(); ++it) {
      if (it->va != va) continue;
      const std::size_t page = device_.granularity();
      EXPECT_EQ(device_.synchronize_stream(it->stream), Status::ok);
      for (std::size_t i = 0; i < it->pages; ++i) {
        EXPECT_EQ(device_.unmap(static_cast<char*>(va) + i * page, page), Status::ok);
        EXPECT_EQ(device_.release_physical(it->handles[i]), Status::ok);
      }
      EXPECT_EQ(device_.release_reservation(va, it->pages * page), Status::ok);
      requests_.erase(it);
      return;
    }
    ADD_FAILURE() << "free of an unknown range";
  }

 private:
  struct Request {
    void* va;
    std::size_t pages;
    Stream stream;
    std::vector<PhysicalHandle> handles;
  };
  Device& device_;
  std::vector<Request> requests_;
};

TEST(MeteredDevice, CountsAndPricesEveryCallOfAPageAllocator) {
  SimDevice sim(small_sim());
  MeteredDevice meter(sim, distinct_costs());
  PageAllocator pages(meter);
  const Stream stream = sim.create_stream();
  void* a = pages.allocate(3, stream);
  void* b = pages.allocate(2, default_stream);
  pages.free(a);
  pages.free(b);
  Event event;
  ASSERT_EQ(meter.create_event(&event), Status::ok);
  ASSERT_EQ(meter.record_event(event, stream), Status::ok);
  ASSERT_EQ(meter.query_event(event), Status::ok);
  ASSERT_EQ(meter.stream_wait_event(default_stream, event), Status::ok);
  ASSERT_EQ(meter.synchronize_event(event), Status::ok);
  ASSERT_EQ(meter.destroy_event(event), Status::ok);
  ASSERT_EQ(meter.synchronize_device(), Status::ok);

  const DeviceCalls& calls = meter.calls();
  EXPECT_EQ(calls.allocs, 0u);
  EXPECT_EQ(calls.frees, 0u);
  EXPECT_EQ(calls.reserves, 2u);
  EXPECT_EQ(calls.unreserves, 2u);
  EXPECT_EQ(calls.creates, 5u);
  EXPECT_EQ(calls.releases, 5u);
  EXPECT_EQ(calls.maps, 5u);
  EXPECT_EQ(calls.unmaps, 5u);
  EXPECT_EQ(calls.events, 5u);  // create, record, query, wait, destroy
  EXPECT_EQ(calls.syncs, 4u);   // two streams, one event, the device
  // Address space per call; handles, access grants and unmaps per call and per MiB of the 2 MiB
  // page; maps per call; record and wait as records, the query as a query (create and destroy
  // free); each synchronisation at its own price.
  EXPECT_DOUBLE_EQ(calls.ns, 2 * 3 + 2 * 5 + 5 * (10 + 2 * 4) + 5 * (20 + 2 * 8) +
                                 5 * (100 + 300 + 2 * 16) + 5 * (200 + 2 * 32) + 1000 + 3000 +
                                 1000 + 2 * 10'000 + 20'000 + 40'000);
  EXPECT_EQ(sim.used_bytes(), 0u);
}

TEST(MeteredDevice, PricesAHandlePerCallAndBySizeAndAFailedCallAtItsFixedCost) {
  SimDevice sim(small_sim());
  MeteredDevice meter(sim, distinct_costs());
  PhysicalHandle handle;
  ASSERT_EQ(meter.create_physical(6 * MiB, &handle), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns, 10 + 6 * 4);
  ASSERT_EQ(meter.release_physical(handle), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns, 10 + 6 * 4 + 20 + 6 * 8);
  PhysicalHandle too_big;
  EXPECT_EQ(meter.create_physical(128 * MiB, &too_big), Status::out_of_memory);
  EXPECT_DOUBLE_EQ(meter.calls().ns, 10 + 6 * 4 + 20 + 6 * 8 + 10);
  EXPECT_EQ(meter.calls().creates, 1u);
  EXPECT_EQ(meter.calls().releases, 1u);
}

TEST(MeteredDevice, PricesAMapRunAsAMapAndAnAccessGrantPerHandleEachByItsSize) {
  SimDevice sim(small_sim());
  MeteredDevice meter(sim, distinct_costs());
  void* va = nullptr;
  ASSERT_EQ(meter.reserve(8 * MiB, 0, &va), Status::ok);
  PhysicalHandle big;
  PhysicalHandle small;
  PhysicalHandle last;
  ASSERT_EQ(meter.create_physical(2 * MiB, &small), Status::ok);
  ASSERT_EQ(meter.create_physical(4 * MiB, &big), Status::ok);
  ASSERT_EQ(meter.create_physical(2 * MiB, &last), Status::ok);
  double before = meter.calls().ns;
  const PhysicalHandle handles[] = {small, big, last};
  ASSERT_EQ(meter.map_run(va, handles, 3), Status::ok);
  EXPECT_EQ(meter.calls().maps, 3u);
  // One cuMemSetAccess over the run costs what three would: per mapping, each by its size.
  EXPECT_DOUBLE_EQ(meter.calls().ns - before,
                   3 * 100 + (300 + 2 * 16) + (300 + 4 * 16) + (300 + 2 * 16));
  // Each handle is a mapping of its own: the middle one unmaps alone, at its size's price.
  before = meter.calls().ns;
  EXPECT_EQ(meter.unmap(static_cast<char*>(va) + 2 * MiB, 4 * MiB), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns - before, 200 + 4 * 32);
  EXPECT_EQ(meter.unmap(va, 2 * MiB), Status::ok);
  EXPECT_EQ(meter.unmap(static_cast<char*>(va) + 6 * MiB, 2 * MiB), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns - before, 200 + 4 * 32 + 2 * (200 + 2 * 32));
  EXPECT_EQ(meter.calls().unmaps, 3u);
  // A refused run (it leaves the reservation) costs the fixed parts of its maps and grants.
  before = meter.calls().ns;
  const PhysicalHandle outside[] = {small, big};
  EXPECT_NE(meter.map_run(static_cast<char*>(va) + 6 * MiB, outside, 2), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns - before, 2 * (100 + 300));
  EXPECT_EQ(meter.calls().maps, 3u);
  ASSERT_EQ(meter.release_physical(big), Status::ok);
  ASSERT_EQ(meter.release_physical(small), Status::ok);
  ASSERT_EQ(meter.release_physical(last), Status::ok);
  ASSERT_EQ(meter.release_reservation(va, 8 * MiB), Status::ok);
  EXPECT_EQ(sim.used_bytes(), 0u);
}

TEST(MeteredDevice, PricesAnUnmapPerMappingItCoversEachByItsSize) {
  SimDevice sim(small_sim());
  MeteredDevice meter(sim, distinct_costs());
  void* va = nullptr;
  ASSERT_EQ(meter.reserve(8 * MiB, 0, &va), Status::ok);
  PhysicalHandle handles[3];
  ASSERT_EQ(meter.create_physical(2 * MiB, &handles[0]), Status::ok);
  ASSERT_EQ(meter.create_physical(2 * MiB, &handles[1]), Status::ok);
  ASSERT_EQ(meter.create_physical(4 * MiB, &handles[2]), Status::ok);
  ASSERT_EQ(meter.map_run(va, handles, 3), Status::ok);
  const double before = meter.calls().ns;
  // The first two mappings in one call: what two calls would cost.
  ASSERT_EQ(meter.unmap(va, 4 * MiB), Status::ok);
  EXPECT_EQ(meter.calls().unmaps, 1u);
  EXPECT_DOUBLE_EQ(meter.calls().ns - before, 2 * (200 + 2 * 32));
  // A refused unmap (part of a mapping) costs one mapping's fixed part and leaves the meter's
  // mappings alone.
  EXPECT_EQ(meter.unmap(static_cast<char*>(va) + 4 * MiB, 2 * MiB), Status::invalid_argument);
  EXPECT_DOUBLE_EQ(meter.calls().ns - before, 2 * (200 + 2 * 32) + 200);
  // The last one, 4 MiB, is one mapping.
  ASSERT_EQ(meter.unmap(static_cast<char*>(va) + 4 * MiB, 4 * MiB), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns - before, 2 * (200 + 2 * 32) + 200 + (200 + 4 * 32));
  EXPECT_EQ(meter.calls().unmaps, 2u);
  for (const PhysicalHandle handle : handles) ASSERT_EQ(meter.release_physical(handle), Status::ok);
  ASSERT_EQ(meter.release_reservation(va, 8 * MiB), Status::ok);
  EXPECT_EQ(sim.used_bytes(), 0u);
}

TEST(MeteredDevice, PricesAnUnmapOfMappingsItDidNotSeeAsOneMappingOfItsSize) {
  SimDevice sim(small_sim());
  MeteredDevice meter(sim, distinct_costs());
  void* va = nullptr;
  ASSERT_EQ(sim.reserve(8 * MiB, 0, &va), Status::ok);
  PhysicalHandle handle;
  ASSERT_EQ(sim.create_physical(4 * MiB, &handle), Status::ok);
  ASSERT_EQ(sim.map(va, handle), Status::ok);  // not through the meter (a warm start's cache)
  ASSERT_EQ(meter.unmap(va, 4 * MiB), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns, 200 + 4 * 32);
  ASSERT_EQ(sim.release_physical(handle), Status::ok);
  ASSERT_EQ(sim.release_reservation(va, 8 * MiB), Status::ok);
}

TEST(MeteredDevice, PricesSegmentsBySizeAndAFailedAllocationAtItsFixedCost) {
  SimDevice sim(small_sim());
  MeteredDevice meter(sim, distinct_costs());
  void* p = nullptr;
  ASSERT_EQ(meter.allocate(6 * MiB, &p), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns, 1 + 6 * 0.5);
  ASSERT_EQ(meter.deallocate(p), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns, 1 + 6 * 0.5 + 2 + 6 * 0.25);
  void* too_big = nullptr;
  EXPECT_EQ(meter.allocate(128 * MiB, &too_big), Status::out_of_memory);
  EXPECT_DOUBLE_EQ(meter.calls().ns, 1 + 6 * 0.5 + 2 + 6 * 0.25 + 1);
  MemoryInfo info;
  ASSERT_EQ(meter.memory_info(&info), Status::ok);  // a driver query
  EXPECT_DOUBLE_EQ(meter.calls().ns, 1 + 6 * 0.5 + 2 + 6 * 0.25 + 1 + 3000);
  EXPECT_EQ(meter.calls().allocs, 1u);
  EXPECT_EQ(meter.calls().frees, 1u);
}

// On the H200 one GiB costs ~15 ms to map as 512 handles of 2 MiB and ~0.13 ms as one handle
// (docs/cost-model.md): the meter prices both from the model's fields.
TEST(MeteredDevice, TheH200ModelPricesAGibAsManyHandlesOrOne) {
  SimDeviceOptions options;
  options.capacity = 4 * GiB;
  SimDevice sim(options);
  const CostModel m = CostModel::h200();
  MeteredDevice meter(sim, m);
  void* va = nullptr;
  ASSERT_EQ(meter.reserve(GiB, 0, &va), Status::ok);
  std::vector<PhysicalHandle> pages(512);
  for (PhysicalHandle& page : pages) ASSERT_EQ(meter.create_physical(2 * MiB, &page), Status::ok);
  double before = meter.calls().ns;
  ASSERT_EQ(meter.map_run(va, pages.data(), pages.size()), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns - before,
                   512 * (m.map_ns + m.access_ns + 2 * m.access_ns_per_mib));
  before = meter.calls().ns;
  ASSERT_EQ(meter.unmap(va, GiB), Status::ok);  // one call over 512 mappings
  EXPECT_DOUBLE_EQ(meter.calls().ns - before, 512 * (m.unmap_ns + 2 * m.unmap_ns_per_mib));
  for (const PhysicalHandle page : pages) ASSERT_EQ(meter.release_physical(page), Status::ok);

  PhysicalHandle whole;
  ASSERT_EQ(meter.create_physical(GiB, &whole), Status::ok);
  before = meter.calls().ns;
  ASSERT_EQ(meter.map(va, whole), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns - before, m.map_ns + m.access_ns + 1024 * m.access_ns_per_mib);
  before = meter.calls().ns;
  ASSERT_EQ(meter.unmap(va, GiB), Status::ok);
  EXPECT_DOUBLE_EQ(meter.calls().ns - before, m.unmap_ns + 1024 * m.unmap_ns_per_mib);
  ASSERT_EQ(meter.release_physical(whole), Status::ok);
  ASSERT_EQ(meter.release_reservation(va, GiB), Status::ok);
}

// The recorded row prices PyTorch's segment_map / segment_unmap as the meter prices the calls
// PyTorch makes for them: a 40 MiB growth of the large pool is two 20 MiB handles created,
// mapped side by side with one access grant over them; its shrink unmaps and releases each.
TEST(MeteredDevice, PricesPyTorchsExpansionAsTheRecordedRowPricesItsSegmentMap) {
  SimDevice sim(small_sim());
  const CostModel m = CostModel::h200();
  MeteredDevice meter(sim, m);
  void* va = nullptr;
  ASSERT_EQ(meter.reserve(40 * MiB, 0, &va), Status::ok);
  const double start = meter.calls().ns;
  PhysicalHandle handles[2];
  for (PhysicalHandle& h : handles) ASSERT_EQ(meter.create_physical(20 * MiB, &h), Status::ok);
  ASSERT_EQ(meter.map_run(va, handles, 2), Status::ok);
  const double grow = meter.calls().ns - start;
  for (std::size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(meter.unmap(static_cast<char*>(va) + i * 20 * MiB, 20 * MiB), Status::ok);
    ASSERT_EQ(meter.release_physical(handles[i]), Status::ok);
  }
  const double shrink = meter.calls().ns - start - grow;
  EXPECT_DOUBLE_EQ(grow, 2 * (m.create_ns + m.map_ns + m.access_ns) +
                             40 * (m.create_ns_per_mib + m.access_ns_per_mib));
  EXPECT_DOUBLE_EQ(
      shrink, 2 * (m.unmap_ns + m.release_ns) + 40 * (m.unmap_ns_per_mib + m.release_ns_per_mib));
  ASSERT_EQ(meter.release_reservation(va, 40 * MiB), Status::ok);

  using Kind = trace::RecordedSegmentEvent::Kind;
  trace::Trace t;
  t.recorded.initial_reserved = 0;
  t.recorded.peak_reserved = 40 * MiB;
  t.recorded.segment_events = {{Kind::map, 0, 0x200000000, 40 * MiB, 0, 0},
                               {Kind::unmap, 0, 0x200000000, 40 * MiB, 0, 0}};
  const std::optional<replay::Result> r = replay::recorded(t);
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->device_ms.has_value());
  EXPECT_NEAR(*r->device_ms * 1e6, grow + shrink, 1e-6 * (grow + shrink));
  EXPECT_EQ(r->device_maps, 1u);
  EXPECT_EQ(r->device_unmaps, 1u);
}

TEST(MeteredDevice, CountsTheClassicAllocatorsSegmentsAndEvents) {
  SimDevice sim(small_sim());
  MeteredDevice meter(sim, distinct_costs());
  const Stream other = sim.create_stream();
  {
    CachingAllocator alloc(meter, Config::parse("vmm:False"));  // classic segments
    void* p = alloc.allocate(1000, default_stream);
    alloc.record_stream(p, other);  // the free must wait for `other`: an event is recorded
    alloc.deallocate(p, default_stream);
    alloc.empty_cache();
  }
  const DeviceCalls& calls = meter.calls();
  EXPECT_EQ(calls.allocs, 1u);
  EXPECT_EQ(calls.frees, 1u);
  EXPECT_GE(calls.events, 1u);
  EXPECT_EQ(calls.maps + calls.unmaps + calls.creates + calls.releases, 0u);
  EXPECT_EQ(sim.used_bytes(), 0u);
}

// --- passes ---------------------------------------------------------------------------------------

trace::Event event(trace::Op op, std::uint64_t id, std::uint64_t size) {
  trace::Event e;
  e.op = op;
  e.id = id;
  e.size = size;
  return e;
}

/// A 3 MiB block (a 20 MiB large segment) and a 1000-byte block (a 2 MiB small segment).
trace::Trace large_and_small() {
  trace::Trace t;
  t.source = "hand-built";
  t.events = {event(trace::Op::alloc, 0, 3 * MiB), event(trace::Op::alloc, 1, 1000),
              event(trace::Op::free, 0, 3 * MiB), event(trace::Op::free, 1, 1000)};
  return t;
}

/// Block 0 (1 MiB) is live before the window and freed in it; block 1 (2 MiB) is allocated and
/// left live: each pass must start with block 0 live again and without block 1.
trace::Trace step_that_swaps() {
  trace::Trace t;
  t.source = "hand-built";
  t.live_before = {{0, 1 * MiB, 0, 0}};
  t.events = {event(trace::Op::alloc, 1, 2 * MiB), event(trace::Op::free, 0, 1 * MiB)};
  return t;
}

replay::Options passes(std::size_t n) {
  replay::Options o;
  o.repeat = n;
  return o;
}

TEST(ReplayPasses, ACachingPolicyMakesNoDeviceCallsAfterTheFirstPass) {
  const replay::Result r =
      replay::run(large_and_small(), replay::Policy::parse("cistern:vmm=false"), passes(3));
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.passes.size(), 3u);
  EXPECT_EQ(r.passes[0].peak_reserved, 22 * MiB);
  EXPECT_EQ(r.passes[0].device_allocs, 2u);
  for (std::size_t i = 1; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(r.passes[i].peak_reserved, 22 * MiB);
    EXPECT_EQ(r.passes[i].device_allocs, 0u);
    EXPECT_EQ(r.passes[i].device_frees, 0u);
    EXPECT_EQ(r.passes[i].maps, 0u);
    EXPECT_EQ(r.passes[i].unmaps, 0u);
    EXPECT_EQ(r.passes[i].device_ms, 0.0);
  }
  EXPECT_EQ(r.device_allocs, 2u);
  EXPECT_EQ(r.peak_reserved, 22 * MiB);
  // Each pass's device time is its calls' price: the first pass's two segments are all of it.
  const replay::CostModel costs = replay::CostModel::h200();
  ASSERT_TRUE(r.device_ms.has_value());
  EXPECT_GE(r.passes[0].device_ms,
            (costs.alloc_price(20 * MiB) + costs.alloc_price(2 * MiB)) / 1e6);
  EXPECT_DOUBLE_EQ(r.passes[0].device_ms, *r.device_ms);
}

// The virtual-memory engine keeps its pages mapped in cached blocks: the first pass maps them,
// the later ones make no device call at all.
TEST(ReplayPasses, TheEngineMapsOnlyInTheFirstPass) {
  const replay::Result r =
      replay::run(large_and_small(), replay::Policy::parse("cistern"), passes(3));
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.passes.size(), 3u);
  EXPECT_EQ(r.passes[0].device_allocs, 0u);
  // Far from the limit, as expandable segments: one 20 MiB page handle for the 3 MiB block, one
  // 2 MiB page for the small one (1000 B).
  EXPECT_EQ(r.passes[0].maps, 2u);
  EXPECT_EQ(r.passes[0].peak_reserved, 22 * MiB);
  for (std::size_t i = 1; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(r.passes[i].peak_reserved, r.passes[0].peak_reserved);
    EXPECT_EQ(r.passes[i].device_allocs, 0u);
    EXPECT_EQ(r.passes[i].device_frees, 0u);
    EXPECT_EQ(r.passes[i].maps, 0u);
    EXPECT_EQ(r.passes[i].unmaps, 0u);
  }
}

TEST(ReplayPasses, NocachePaysEveryPass) {
  const replay::Result r =
      replay::run(large_and_small(), replay::Policy::parse("nocache"), passes(2));
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.passes.size(), 2u);
  for (const replay::PassResult& p : r.passes) {
    EXPECT_EQ(p.device_allocs, 2u);
    EXPECT_EQ(p.device_frees, 2u);
    EXPECT_EQ(p.peak_reserved, 3 * MiB + 1024);
  }
  EXPECT_EQ(r.device_allocs, 4u);
}

TEST(ReplayPasses, EachPassStartsFromTheSameLiveSet) {
  const replay::Result r =
      replay::run(step_that_swaps(), replay::Policy::parse("nocache"), passes(3));
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.passes.size(), 3u);
  // Pass 1: the start's block 0 and block 1 allocated, block 0 freed; its end frees block 1 and
  // allocates block 0 again. Pass 2: block 1, then the same free, free and allocation. Pass 3,
  // the last, ends with the window: block 1 and the free of block 0.
  EXPECT_EQ(r.passes[0].device_allocs, 3u);
  EXPECT_EQ(r.passes[0].device_frees, 2u);
  EXPECT_EQ(r.passes[1].device_allocs, 2u);
  EXPECT_EQ(r.passes[1].device_frees, 2u);
  EXPECT_EQ(r.passes[2].device_allocs, 1u);
  EXPECT_EQ(r.passes[2].device_frees, 1u);
  for (const replay::PassResult& p : r.passes) {
    EXPECT_EQ(p.peak_reserved, 3 * MiB);  // blocks 0 and 1 live at once
  }
  EXPECT_EQ(r.ooms, 0u);
}

TEST(ReplayPasses, OnePassHasNoPassList) {
  const replay::Result r = replay::run(large_and_small(), replay::Policy::parse("cistern"), {});
  EXPECT_TRUE(r.passes.empty());
}

TEST(ReplayPasses, MinCapacityCoversEveryPass) {
  EXPECT_EQ(replay::min_capacity(large_and_small(), replay::Policy::parse("cistern:vmm=false"),
                                 passes(3)),
            22 * MiB);
  // The engine: two 2 MiB pages for the 3 MiB block, one small-pool page for the 1000 B one.
  EXPECT_EQ(replay::min_capacity(large_and_small(), replay::Policy::parse("cistern"), passes(3)),
            6 * MiB);
  EXPECT_EQ(replay::min_capacity(step_that_swaps(), replay::Policy::parse("nocache"), passes(3)),
            4 * MiB);
}

// --- the traces the project ships -----------------------------------------------------------------

TEST(BundledTraces, ReplayUnderEveryPolicyWithASteadyStateAfterTheFirstStep) {
  // peak_live of each synthetic training step (traces/README.md), to the byte.
  const std::pair<const char*, std::uint64_t> traces[] = {
      {"transformer_6l_512h.trace.gz", 1459269636},
      {"transformer_12l_1024h.trace.gz", 5687582724},
  };
  for (const auto& [name, peak_live] : traces) {
    SCOPED_TRACE(name);
    const trace::Trace t =
        trace::read_trace(std::string(CISTERN_SOURCE_DIR) + "/traces/synthetic/" + name);
    for (const char* policy : {"cistern", "torch", "nocache"}) {
      SCOPED_TRACE(policy);
      const replay::Result r = replay::run(t, replay::Policy::parse(policy), passes(2));
      ASSERT_EQ(r.error, "");
      EXPECT_EQ(r.peak_live, peak_live);
      EXPECT_EQ(r.ooms, 0u);
      ASSERT_EQ(r.passes.size(), 2u);
      EXPECT_EQ(r.passes[1].peak_reserved, r.passes[0].peak_reserved);
      if (std::string(policy) != "nocache") EXPECT_EQ(r.passes[1].device_allocs, 0u);
    }
  }
}

}  // namespace
}  // namespace cistern
