// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Writes the seed corpora of the fuzz harnesses with the project's own writers: a caching
// allocator on a simulated device runs small seeded workloads (two streams, cross-stream frees,
// record_stream, empty_cache) with its history recorded; each run becomes a PyTorch snapshot
// (the snapshot writer) and a cistern trace (the trace writer, via trace_from_history), plain
// and gzipped. fuzz_pickle gets the pickles; fuzz_readers gets every file behind each of its
// format bytes (tests/fuzz/fuzz_readers.cpp). Usage: make_corpus PICKLE_DIR READERS_DIR
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/pytorch_snapshot.hpp"
#include "cistern/sim_device.hpp"
#include "snapshot/file_output.hpp"
#include "trace/history_trace.hpp"
#include "trace/native.hpp"
#include "trace/native_text.hpp"

namespace {

namespace fs = std::filesystem;

/// One seeded workload: `operations` allocations and frees of sizes from 512 B to 24 MiB.
struct Recording {
  std::string pickle;
  std::string native;
};

/// Gives the history PyTorch's frames: a few stacks shared by many events (written once, then
/// memo references), so that the fuzzers start from the readers' frames path too.
void with_frames(cistern::DeviceRecord& record) {
  using Action = cistern::HistoryEntry::Action;
  cistern::StackTable& table = record.stacks;
  const std::uint32_t inner = table.frame_id("model.py", 12, "forward");
  const std::uint32_t outer = table.frame_id("train.py", 40, "main");
  const std::uint32_t stacks[] = {0, table.stack_id({inner, outer}), table.stack_id({outer})};
  std::unordered_map<std::uintptr_t, std::uint32_t> live;
  std::size_t allocs = 0;
  for (cistern::HistoryEntry& entry : record.history) {
    if (entry.action == Action::alloc) {
      entry.stack = stacks[allocs++ % 3];
      live[entry.addr] = entry.stack;
    } else if (entry.action == Action::free_requested || entry.action == Action::free_completed) {
      const auto found = live.find(entry.addr);
      if (found != live.end()) entry.stack = found->second;
    }
  }
}

Recording record(std::uint64_t seed, int operations) {
  cistern::SimDevice device;
  cistern::Config config;
  cistern::CachingAllocator allocator(device, config);
  allocator.record_history(true);
  const cistern::Stream streams[] = {cistern::Stream{}, device.create_stream()};
  std::mt19937_64 random(seed);
  std::vector<std::pair<void*, cistern::Stream>> live;
  for (int i = 0; i < operations; ++i) {
    const std::uint64_t pick = random() % 16;
    if (pick < 9 || live.empty()) {
      const std::size_t size = std::size_t{512} << (random() % 16);
      const cistern::Stream stream = streams[random() % 2];
      live.emplace_back(allocator.allocate(size + random() % 512, stream), stream);
    } else if (pick < 14) {
      const std::size_t at = random() % live.size();
      allocator.deallocate(live[at].first, streams[random() % 2]);  // sometimes cross-stream
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
    } else if (pick == 14) {
      allocator.record_stream(live[random() % live.size()].first, streams[1]);
    } else {
      allocator.empty_cache();
    }
  }
  Recording out;
  cistern::DeviceRecord record;
  record.device = allocator.device_index();
  record.snapshot = allocator.snapshot();
  record.history = allocator.history();
  with_frames(record);
  out.pickle = cistern::pytorch_snapshot_pickle({record}, allocator.config());
  const cistern::trace::Trace trace =
      cistern::trace::trace_from_history(allocator.history(), nullptr, 0, "corpus");
  std::ostringstream text;
  cistern::trace::write_native(text, trace);
  out.native = text.str();
  for (const auto& [ptr, stream] : live) allocator.deallocate(ptr, stream);
  return out;
}

void put(const fs::path& path, const std::string& bytes) {
  cistern::detail::write_whole_file(path.string(), bytes, "make_corpus");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_corpus PICKLE_DIR READERS_DIR\n");
    return 2;
  }
  const fs::path pickles = argv[1], readers = argv[2];
  fs::create_directories(pickles);
  fs::create_directories(readers);
  // fuzz_readers' first byte: 0 pytorch, 4 cistern, anything else recognises by content.
  const char pytorch = 0, cistern_format = 4, detect = 'd';
  int index = 0;
  for (const int operations : {4, 12, 40, 120}) {
    for (std::uint64_t seed = 1; seed <= 3; ++seed, ++index) {
      const Recording r = record(seed * 1000 + static_cast<std::uint64_t>(operations), operations);
      const std::string gz_pickle = cistern::trace::native::gzip(r.pickle, "corpus");
      const std::string gz_native = cistern::trace::native::gzip(r.native, "corpus");
      put(pickles / fmt::format("snapshot{}.pickle", index), r.pickle);
      put(pickles / fmt::format("snapshot{}.pickle.gz", index), gz_pickle);
      put(readers / fmt::format("pytorch{}", index), pytorch + r.pickle);
      put(readers / fmt::format("pytorch_detect{}", index), detect + r.pickle);
      put(readers / fmt::format("pytorch_gz{}", index), detect + gz_pickle);
      put(readers / fmt::format("cistern{}", index), cistern_format + r.native);
      put(readers / fmt::format("cistern_detect{}", index), detect + r.native);
      put(readers / fmt::format("cistern_gz{}", index), detect + gz_native);
    }
  }
  std::printf("make_corpus: %d workloads written to %s and %s\n", index, pickles.c_str(),
              readers.c_str());
  return 0;
}
