// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The device conformance suite on SimDevice, with and without virtual memory. The CUDA backends
// instantiate the same suite in their own (gpu-labelled) test files.
#include <memory>

#include "cistern/sim_device.hpp"
#include "device_conformance.hpp"

namespace cistern::conformance {

/// Streams of a SimDevice come from `SimDevice::create_stream` and live as long as the device.
/// A small capacity keeps the suite fast; the granularity is the real 2 MiB.
template <bool VirtualMemory>
struct SimFactoryOf {
  static bool available() { return true; }
  static std::unique_ptr<Device> make() {
    SimDeviceOptions options;
    options.capacity = 64 * MiB;
    options.virtual_memory = VirtualMemory;
    return std::make_unique<SimDevice>(options);
  }
  static Stream make_stream(Device& device) {
    return static_cast<SimDevice&>(device).create_stream();
  }
  static void destroy_stream(Device&, Stream) {}
  static bool fail_next(Device& device, DeviceOp op) {
    static_cast<SimDevice&>(device).fail_nth(op, 1, Status::device_error);
    return true;
  }
  static constexpr std::size_t kFreeMemoryDriftGranules = 0;  // exact accounting
};

// Named types (not aliases), so that CTest's test names read
// "...<cistern::conformance::SimFactory>".
struct SimFactory : SimFactoryOf<true> {};
struct SimNoVmmFactory : SimFactoryOf<false> {};

INSTANTIATE_TYPED_TEST_SUITE_P(Sim, DeviceConformance, ::testing::Types<SimFactory>);
INSTANTIATE_TYPED_TEST_SUITE_P(SimNoVmm, DeviceConformance, ::testing::Types<SimNoVmmFactory>);

}  // namespace cistern::conformance
