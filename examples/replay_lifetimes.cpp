// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Replays a lifetime list (CSV `id,lower,upper,size`: the buffer is live in [lower, upper))
// through cistern's public API on a simulated device, and prints what the workload needed:
// the peak of live bytes (the lower bound for any allocator), the peak reserved by the caching
// allocator, the device calls it made and its time per operation.
//
//   replay_lifetimes TRACE.csv [--capacity 80GiB] [--scale N] [--config "max_split_size_mb:64"]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"

namespace {

struct Buffer {
  long long lower = 0;
  long long upper = 0;
  std::size_t size = 0;
};

struct Event {
  long long time;
  bool is_free;  // frees come before allocations at equal times
  std::size_t buffer;
};

struct Options {
  std::string path;
  std::size_t capacity = 80 * cistern::GiB;
  std::size_t scale = 1;
  std::string config;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "replay_lifetimes: %s\nusage: replay_lifetimes TRACE.csv [--capacity BYTES] "
               "[--scale N] [--config CISTERN_ALLOC_CONF-string]\n",
               problem.c_str());
  std::exit(2);
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--capacity") o.capacity = cistern::parse_bytes(value());
    else if (arg == "--scale") o.scale = cistern::parse_bytes(value());
    else if (arg == "--config") o.config = value();
    else if (!arg.empty() && arg[0] == '-') usage("unknown option " + arg);
    else if (o.path.empty()) o.path = arg;
    else usage("more than one trace given");
  }
  if (o.path.empty()) usage("no trace given");
  return o;
}

std::vector<Buffer> read_lifetimes(const std::string& path, std::size_t scale) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::vector<Buffer> buffers;
  std::string line;
  std::getline(in, line);  // header
  for (long line_no = 2; std::getline(in, line); ++line_no) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string id, lower, upper, size;
    if (!std::getline(fields, id, ',') || !std::getline(fields, lower, ',') ||
        !std::getline(fields, upper, ',') || !std::getline(fields, size)) {
      throw std::runtime_error(path + ":" + std::to_string(line_no) +
                               ": expected id,lower,upper,size");
    }
    Buffer b{std::stoll(lower), std::stoll(upper), std::stoull(size) * scale};
    if (b.upper <= b.lower || b.size == 0) {
      throw std::runtime_error(path + ":" + std::to_string(line_no) + ": empty lifetime or size");
    }
    buffers.push_back(b);
  }
  return buffers;
}

std::vector<Event> schedule(const std::vector<Buffer>& buffers) {
  std::vector<Event> events;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    events.push_back({buffers[i].lower, false, i});
    events.push_back({buffers[i].upper, true, i});
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : a.is_free > b.is_free;
  });
  return events;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse_args(argc, argv);
  const std::vector<Buffer> buffers = read_lifetimes(opt.path, opt.scale);
  const std::vector<Event> events = schedule(buffers);

  cistern::SimDeviceOptions dev;
  dev.capacity = opt.capacity;
  cistern::SimDevice device(dev);
  cistern::CachingAllocator alloc(device, cistern::Config::parse(opt.config));

  std::vector<void*> ptrs(buffers.size(), nullptr);
  std::size_t live = 0, peak_live = 0, ooms = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const Event& e : events) {
    const Buffer& b = buffers[e.buffer];
    if (e.is_free) {
      if (ptrs[e.buffer] == nullptr) continue;  // its allocation failed
      alloc.deallocate(ptrs[e.buffer], cistern::default_stream);
      live -= b.size;
      continue;
    }
    try {
      ptrs[e.buffer] = alloc.allocate(b.size, cistern::default_stream);
      live += b.size;
      peak_live = std::max(peak_live, live);
    } catch (const cistern::OutOfMemory&) {
      ++ooms;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  alloc.check();

  const cistern::Stats s = alloc.stats();
  const auto peak_reserved = static_cast<std::size_t>(
      s.get(cistern::StatKind::reserved_bytes, cistern::StatPool::all).peak);
  std::printf("trace              %s (%zu buffers, %zu events)\n", opt.path.c_str(), buffers.size(),
              events.size());
  std::printf("device             %s\n", device.name().c_str());
  std::printf("config             %s\n", opt.config.empty() ? "(defaults)" : opt.config.c_str());
  std::printf("peak live          %zu bytes (%s)\n", peak_live,
              cistern::format_bytes(peak_live).c_str());
  std::printf("peak reserved      %zu bytes (%s)\n", peak_reserved,
              cistern::format_bytes(peak_reserved).c_str());
  if (peak_live > 0) {
    std::printf(
        "overhead           %.2f%%\n",
        100.0 * (static_cast<double>(peak_reserved) / static_cast<double>(peak_live) - 1.0));
  }
  std::printf("device allocs      %lld, frees %lld\n", static_cast<long long>(s.num_device_alloc),
              static_cast<long long>(s.num_device_free));
  std::printf("out of memory      %zu\n", ooms);
  std::printf("allocator time     %.1f ns/op\n",
              1e9 * seconds / static_cast<double>(events.size()));
  return ooms == 0 ? 0 : 3;
} catch (const std::exception& e) {
  std::fprintf(stderr, "replay_lifetimes: %s\n", e.what());
  return 1;
}
