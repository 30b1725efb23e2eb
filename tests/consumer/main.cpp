// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Uses an installed cistern through its public headers only: allocates and frees on a simulated
// device and checks what the statistics say. Exits non-zero with a message on any mismatch.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include "cistern/caching_allocator.hpp"
#include "cistern/config.hpp"
#include "cistern/sim_device.hpp"
#include "cistern/stats.hpp"
#include "cistern/types.hpp"

namespace {

int failures = 0;

void expect_eq(const char* what, std::int64_t actual, std::int64_t expected) {
  if (actual == expected) return;
  std::fprintf(stderr, "consumer: %s is %lld, expected %lld\n", what,
               static_cast<long long>(actual), static_cast<long long>(expected));
  ++failures;
}

int run() {
  cistern::SimDeviceOptions options;
  options.capacity = 1 * cistern::GiB;
  cistern::SimDevice device(options);
  cistern::CachingAllocator allocator(device, cistern::Config{});
  const cistern::Stream stream = device.create_stream();

  void* small = allocator.allocate(1000, stream);              // rounded to 1024, small pool
  void* large = allocator.allocate(3 * cistern::MiB, stream);  // large pool
  if (small == nullptr || large == nullptr) {
    std::fprintf(stderr, "consumer: allocate returned nullptr\n");
    return 1;
  }
  const std::int64_t expected_allocated = 1024 + 3 * static_cast<std::int64_t>(cistern::MiB);
  std::map<std::string, std::int64_t> stats = allocator.stats().flatten();
  expect_eq("allocated_bytes.all.current", stats.at("allocated_bytes.all.current"),
            expected_allocated);
  expect_eq("allocation.all.current", stats.at("allocation.all.current"), 2);
  expect_eq("requested_bytes.all.current", stats.at("requested_bytes.all.current"),
            1000 + 3 * static_cast<std::int64_t>(cistern::MiB));

  allocator.deallocate(small, stream);
  allocator.deallocate(large, stream);
  stats = allocator.stats().flatten();
  expect_eq("allocated_bytes.all.current", stats.at("allocated_bytes.all.current"), 0);
  expect_eq("allocated_bytes.all.peak", stats.at("allocated_bytes.all.peak"), expected_allocated);
  if (stats.at("reserved_bytes.all.current") <= 0) {
    std::fprintf(stderr, "consumer: freed blocks should stay cached (reserved_bytes > 0)\n");
    ++failures;
  }
  allocator.check();

  allocator.empty_cache();
  expect_eq("reserved_bytes.all.current",
            allocator.stats().flatten().at("reserved_bytes.all.current"), 0);
  expect_eq("device segments", static_cast<std::int64_t>(device.live_segments()), 0);
  allocator.check();

  if (failures > 0) return 1;
  std::printf("consumer: %s allocator on %s: OK\n", allocator.name().c_str(),
              device.name().c_str());
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
