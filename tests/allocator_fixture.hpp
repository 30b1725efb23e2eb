// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Shared helpers for the allocator tests: a SimDevice and a CachingAllocator built from a config
// string, and short names for the statistics the tests assert on.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "cistern/caching_allocator.hpp"
#include "cistern/config.hpp"
#include "cistern/sim_device.hpp"

namespace cistern::testing {

inline SimDeviceOptions sim_options(std::size_t capacity) {
  SimDeviceOptions o;
  o.capacity = capacity;
  return o;
}

/// A configuration string parsed over the classic path (`vmm:False`): the tests written against
/// the classic segment layout pin it; `conf` may turn the engine back on.
inline Config classic_config(const std::string& conf) {
  Config config;
  config.vmm = Config::Vmm::off;
  config.apply(conf);
  return config;
}

/// A SimDevice and a CachingAllocator over it; check() runs after every test. The allocator
/// uses classic segments unless `conf` sets `vmm` (engine tests: test_vmm.cpp).
class AllocatorTest : public ::testing::Test {
 protected:
  void make(const std::string& conf = "", std::size_t capacity = 1 * GiB) {
    alloc.reset();
    device = std::make_unique<SimDevice>(sim_options(capacity));
    alloc = std::make_unique<CachingAllocator>(*device, classic_config(conf));
  }
  void SetUp() override { make(); }
  void TearDown() override {
    if (alloc) alloc->check();
  }

  std::int64_t stat(StatKind kind, StatPool pool = StatPool::all) const {
    return alloc->stats().get(kind, pool).current;
  }
  std::int64_t peak(StatKind kind, StatPool pool = StatPool::all) const {
    return alloc->stats().get(kind, pool).peak;
  }
  std::int64_t allocated() const { return stat(StatKind::allocated_bytes); }
  std::int64_t reserved() const { return stat(StatKind::reserved_bytes); }
  std::uint64_t device_calls(DeviceOp op) const { return device->counters().of(op); }
  static std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

  std::unique_ptr<SimDevice> device;
  std::unique_ptr<CachingAllocator> alloc;
};

}  // namespace cistern::testing
