// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// make_allocator: the one place that turns `pass_through` into a choice of allocator.
#include "cistern/caching_allocator.hpp"
#include "cistern/device_allocator.hpp"
#include "cistern/pass_through_allocator.hpp"

namespace cistern {

std::unique_ptr<DeviceAllocator> make_allocator(Device& device, const Config& config) {
  if (config.pass_through) return std::make_unique<PassThroughAllocator>(device, config);
  return std::make_unique<CachingAllocator>(device, config);
}

}  // namespace cistern
