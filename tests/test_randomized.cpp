// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Randomized tests of CachingAllocator against an oracle kept outside it (oracle.hpp), and a
// differential test of its placement decisions against a plain model of PyTorch's best fit.
//
// Seeds are fixed, so every failure reproduces. Sizes: the smoke size by default (CTest), the
// full size (over a million operations) with CISTERN_TEST_FULL=1 (`ctest -L long`), or exactly
// CISTERN_TEST_OPS operations per case. The smoke run calls check() after every operation, the
// full run every 1000.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"
#include "oracle.hpp"
#include "support/trace_sizes.hpp"

namespace cistern::testing {
namespace {

// --- size knobs ----------------------------------------------------------------------------------

bool full_mode() {
  const char* full = std::getenv("CISTERN_TEST_FULL");
  return full != nullptr && std::string(full) == "1";
}

/// Operations per case: CISTERN_TEST_OPS if set, else the full or the smoke size.
std::uint64_t operations(std::uint64_t smoke, std::uint64_t full) {
  if (const char* ops = std::getenv("CISTERN_TEST_OPS")) return std::strtoull(ops, nullptr, 10);
  return full_mode() ? full : smoke;
}

// --- randomness ----------------------------------------------------------------------------------

/// mt19937_64's output is fixed by the standard, unlike std::*_distribution's, so draws are
/// made here and every platform sees the same sequence for a seed.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  /// Uniform in [0, n).
  std::uint64_t below(std::uint64_t n) { return engine_() % n; }
  /// Uniform in [lo, hi].
  std::uint64_t between(std::uint64_t lo, std::uint64_t hi) { return lo + below(hi - lo + 1); }
  /// True with probability percent / 100.
  bool percent(std::uint64_t percent) { return below(100) < percent; }
  /// Roughly log-uniform in [lo, hi]: equal weight to every power of two.
  std::uint64_t log_between(std::uint64_t lo, std::uint64_t hi) {
    const int bits_lo = 63 - __builtin_clzll(lo);
    const int bits_hi = 63 - __builtin_clzll(hi);
    const int bits = static_cast<int>(
        between(static_cast<std::uint64_t>(bits_lo), static_cast<std::uint64_t>(bits_hi)));
    const std::uint64_t from = std::max(lo, std::uint64_t{1} << bits);
    const std::uint64_t to = std::min(hi, (std::uint64_t{2} << bits) - 1);
    return between(from, to);
  }

 private:
  std::mt19937_64 engine_;
};

// --- sizes -----------------------------------------------------------------------------------------

/// The requested sizes of the real traces, loaded once; empty when the shared folder is missing.
const std::vector<std::size_t>& real_trace_sizes() {
  static const std::vector<std::size_t> sizes = [] {
    const std::string dir = shared_dir();
    return traces_available(dir) ? load_trace_sizes(dir) : std::vector<std::size_t>{};
  }();
  return sizes;
}

/// Sizes at the edges of the size policy: pools, segment sizes, max_split_size_mb:40.
const std::vector<std::size_t>& boundary_sizes() {
  static const std::vector<std::size_t> sizes = [] {
    std::vector<std::size_t> v = {
        1,           511,          512,          513,          4095,
        4097,        MiB - 1,      MiB,          MiB + 1,      2 * MiB - 1,
        2 * MiB + 1, 10 * MiB - 1, 10 * MiB,     10 * MiB + 1, 20 * MiB - 1,
        20 * MiB,    20 * MiB + 1, 40 * MiB - 1, 40 * MiB,     40 * MiB + 1};
    for (int bits = 9; bits <= 28; ++bits) v.push_back(std::size_t{1} << bits);
    return v;
  }();
  return sizes;
}

/// Draws request sizes: random ranges, and optionally real trace sizes for half of them.
class SizeDrawer {
 public:
  SizeDrawer(Rng& rng, const std::vector<std::size_t>* trace) : rng_(rng), trace_(trace) {}

  std::size_t draw() {
    if (trace_ != nullptr && !trace_->empty() && rng_.percent(50)) {
      return (*trace_)[rng_.below(trace_->size())];
    }
    const std::uint64_t r = rng_.below(1000);
    if (r < 400) return rng_.between(1, 4096);                // tiny
    if (r < 700) return rng_.log_between(4097, MiB);          // medium
    if (r < 880) return rng_.log_between(MiB + 1, 64 * MiB);  // large
    if (r < 900) return rng_.log_between(64 * MiB, GiB);      // huge
    const auto& edges = boundary_sizes();
    return edges[rng_.below(edges.size())];
  }

 private:
  Rng& rng_;
  const std::vector<std::size_t>* trace_;
};

// --- the randomized run ---------------------------------------------------------------------------

/// One configuration of the randomized test.
struct Case {
  const char* name;
  const char* conf;
  std::size_t capacity;
  bool expect_ooms;  // the capacity or limit is small enough that OOM must happen
};

const Case kCases[] = {
    {"defaults", "vmm:False", 512 * MiB, true},
    {"max_split_40", "vmm:False,max_split_size_mb:40", 512 * MiB, true},
    {"roundup_pow2_4", "vmm:False,roundup_power2_divisions:4", 512 * MiB, true},
    {"no_cross_stream", "vmm:False,cross_stream_reuse:False", 512 * MiB, true},
    {"gc_limit", "vmm:False,garbage_collection_threshold:0.6,memory_limit_mb:320", GiB, true},
    {"pass_through", "pass_through:True", 256 * MiB, true},
    {"defaults_roomy", "vmm:False", 16 * GiB, false},
    {"exact_peaks", "vmm:False,exact_peaks:True", 512 * MiB, true},
    {"parking", "vmm:False,park_small_blocks:True", 512 * MiB, true},
    // The virtual-memory engine at tight capacities: reclaim on nearly every miss.
    {"vmm", "vmm:True", 256 * MiB, true},
    {"vmm_page_handles", "vmm:True,large_handle_size_mb:2", 128 * MiB, true},
    {"vmm_limit", "vmm:True,memory_limit_mb:160", GiB, true},
    {"vmm_threshold", "vmm:True,release_threshold_mb:16,park_small_blocks:True", 256 * MiB, true},
    {"vmm_roomy", "vmm:True", 16 * GiB, false},
};

struct Param {
  Case c;
  bool trace_sizes;  // half of the sizes from the real traces
  bool sparse;       // look (statistics, check()) only every kSparseEvery operations
  std::uint64_t seed;
};

/// How often a sparse run looks. Reading statistics or running check() makes the allocator bring
/// its counters up to date; a run that looks after every operation never sees what happens
/// between looks (batched publication of per-pool statistics, for example).
constexpr std::uint64_t kSparseEvery = 97;

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.c.name << " (\"" << p.c.conf << "\", " << format_bytes(p.c.capacity) << "), "
      << (p.trace_sizes ? "trace" : "random") << " sizes, " << (p.sparse ? "sparse" : "dense")
      << " checks, seed " << p.seed;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return fmt::format("{}_{}{}_seed{}", info.param.c.name,
                     info.param.trace_sizes ? "traces" : "random",
                     info.param.sparse ? "_sparse" : "", info.param.seed);
}

/// What the run did, for the report and the coverage assertions.
struct Tally {
  std::uint64_t ops = 0;
  std::uint64_t allocations = 0;
  std::uint64_t ooms = 0;
  std::uint64_t frees_elsewhere = 0;
  std::uint64_t records = 0;
  std::uint64_t misuses = 0;
};

/// One operation, kept for the failure report.
struct LoggedOp {
  std::uint64_t op;
  const char* what;
  std::uintptr_t address;
  std::uint64_t amount;  // bytes, or nanoseconds for launch and advance
  Stream stream;
};

class RandomizedRun {
 public:
  explicit RandomizedRun(const Param& p)
      : param_(p), rng_(p.seed), sizes_(rng_, p.trace_sizes ? &real_trace_sizes() : nullptr) {
    SimDeviceOptions options;
    options.capacity = p.c.capacity;
    device_ = std::make_unique<SimDevice>(options);
    alloc_ = make_allocator(*device_, Config::parse(p.c.conf));  // pass_through: its own class
    oracle_ = std::make_unique<Oracle>(*device_, *alloc_);
    streams_ = {default_stream, device_->create_stream(), device_->create_stream(),
                device_->create_stream()};
    pass_through_ = alloc_->config().pass_through;
  }

  /// Runs `count` random operations; after each the oracle's own checks, every `stats_every`
  /// the statistics, every `check_every` check().
  void run(std::uint64_t count, std::uint64_t stats_every, std::uint64_t check_every) {
    oracle_->set_exact_peaks(stats_every == 1 || alloc_->config().exact_peaks);
    for (std::uint64_t i = 0; i < count; ++i) {
      step();
      verify(stats_every, check_every);
    }
  }

  /// Frees everything, returns the cache, destroys the allocator: nothing may be left behind.
  void finish() {
    drain();
    alloc_->empty_cache();
    oracle_->on_empty_cache();
    alloc_->check();
    oracle_->check_stats();
    const std::int64_t ooms = alloc_->stats().num_ooms;
    EXPECT_EQ(ooms, static_cast<std::int64_t>(tally_.ooms)) << "num_ooms disagrees";
    summary_ = summarize();
    oracle_.reset();
    alloc_.reset();
    EXPECT_EQ(device_->used_bytes(), 0u);
    EXPECT_EQ(device_->live_segments(), 0u);
    EXPECT_EQ(device_->live_events(), 0u) << "events leaked by the allocator";
  }

  /// Context for a failure: the case and the last operations.
  std::string context() const {
    std::string text = fmt::format("case {} ({}), seed {}, after op {}; last operations:\n",
                                   param_.c.name, param_.c.conf, param_.seed, tally_.ops);
    for (const LoggedOp& l : log_) {
      text += fmt::format("  op {}: {} address={:#x} amount={} stream={}\n", l.op, l.what,
                          l.address, l.amount, l.stream.handle);
    }
    return text;
  }

  const Tally& tally() const { return tally_; }
  const std::string& summary() const { return summary_; }

 private:
  void step() {
    ++tally_.ops;
    const bool full = oracle_->live().size() >= kMaxLive;
    const std::uint64_t r = rng_.below(1000);
    if (handles_.empty() || (r < 330 && !full)) return allocate();
    if (r < 500) return free_on_own_stream(pick());
    if (r < 570) return free_on_other_stream(pick());
    if (r < 630) return record(pick());
    if (r < 770) return launch(random_stream());
    if (r < 975) return advance();
    if (r < 985) return misuse();
    if (r < 990) return empty_cache();
    if (r < 996) return reset_peaks();
    return drain();
  }

  void verify(std::uint64_t stats_every, std::uint64_t check_every) {
    oracle_->prune();
    if (tally_.ops % check_every == 0) alloc_->check();
    if (tally_.ops % stats_every == 0) oracle_->check_stats();
    if (tally_.ops % (check_every * 64) == 0) oracle_->check_snapshot(pass_through_);
  }

  // --- operations ---------------------------------------------------------------------------------

  void allocate() {
    const std::size_t bytes = sizes_.draw();
    const Stream s = random_stream();
    log("allocate", 0, bytes, s);
    if (bytes > 0) oracle_->on_pool(s);
    void* p = nullptr;
    try {
      p = alloc_->allocate(bytes, s);
    } catch (const OutOfMemory& e) {
      log_.back().what = "allocate (out of memory)";
      ++tally_.ooms;
      EXPECT_EQ(e.info().requested, bytes);
      alloc_->check();  // the failed request changed nothing it should not have
      return;
    }
    log_.back().address = Oracle::address(p);
    oracle_->on_allocate(p, bytes, s, tally_.ops);
    if (p == nullptr) return;
    ++tally_.allocations;
    handles_.push_back(p);
    if (rng_.percent(80)) device_->launch(s, duration());  // the new owner uses it at once
  }

  void free_on_own_stream(std::size_t i) {
    void* p = handles_[i];
    const Stream s = oracle_->live().at(Oracle::address(p)).stream;
    free(i, s, "free");
  }

  // The freeing stream uses the memory before it frees it, as a consumer stream would.
  void free_on_other_stream(std::size_t i) {
    const Stream own = oracle_->live().at(Oracle::address(handles_[i])).stream;
    const Stream s = other_stream(own);
    if (rng_.percent(70)) device_->launch(s, duration());
    ++tally_.frees_elsewhere;
    free(i, s, "free-elsewhere");
  }

  void free(std::size_t i, Stream s, const char* what) {
    void* p = handles_[i];
    log(what, Oracle::address(p), 0, s);
    oracle_->on_free(p, s, tally_.ops);
    alloc_->deallocate(p, s);
    handles_[i] = handles_.back();
    handles_.pop_back();
    remember_freed(p);
  }

  void record(std::size_t i) {
    void* p = handles_[i];
    const Stream s = random_stream();
    log("record_stream", Oracle::address(p), 0, s);
    alloc_->record_stream(p, s);
    oracle_->on_record(p, s);
    ++tally_.records;
    if (rng_.percent(80)) device_->launch(s, duration());  // the recorded stream uses it
  }

  void launch(Stream s) {
    const std::uint64_t ns = duration();
    log("launch", 0, ns, s);
    device_->launch(s, ns);
  }

  void advance() {
    const std::uint64_t ns = rng_.below(40'000);
    log("advance", 0, ns, default_stream);
    device_->advance(ns);
  }

  // Frees, records and sizes of pointers that are not live must fail and change nothing.
  void misuse() {
    if (freed_.empty()) return;
    const std::uintptr_t a = freed_[rng_.below(freed_.size())];
    if (oracle_->live().count(a) != 0) return;
    void* p = reinterpret_cast<void*>(a);
    log("misuse", a, 0, default_stream);
    ++tally_.misuses;
    EXPECT_THROW(alloc_->deallocate(p, random_stream()), InvalidPointer);
    EXPECT_THROW(alloc_->record_stream(p, random_stream()), InvalidPointer);
    EXPECT_THROW((void)alloc_->allocation_size(p), InvalidPointer);
  }

  void empty_cache() {
    log("empty_cache", 0, 0, default_stream);
    alloc_->empty_cache();
    oracle_->on_empty_cache();
  }

  void reset_peaks() {
    log("reset_peak_stats", 0, 0, default_stream);
    alloc_->reset_peak_stats();
    oracle_->on_reset_peaks();
  }

  // Frees everything (so that whole segments become free and may be taken over or released).
  void drain() {
    log("drain", 0, handles_.size(), default_stream);
    while (!handles_.empty()) {
      if (rng_.percent(80)) free_on_own_stream(handles_.size() - 1);
      else free_on_other_stream(handles_.size() - 1);
    }
  }

  // --- helpers --------------------------------------------------------------------------------------

  std::size_t pick() { return rng_.below(handles_.size()); }
  Stream random_stream() { return streams_[rng_.below(streams_.size())]; }
  Stream other_stream(Stream s) {
    Stream other = s;
    while (other == s) other = random_stream();
    return other;
  }
  std::uint64_t duration() { return rng_.between(1, 50'000); }

  void remember_freed(void* p) {
    if (freed_.size() < 64) freed_.push_back(Oracle::address(p));
    else freed_[rng_.below(freed_.size())] = Oracle::address(p);
  }

  void log(const char* what, std::uintptr_t address, std::uint64_t amount, Stream s) {
    if (log_.size() == kLogLength) log_.pop_front();
    log_.push_back({tally_.ops, what, address, amount, s});
  }

  std::string summarize() const {
    const Stats s = alloc_->stats();
    return fmt::format(
        "{} ops, {} allocations, {} OOMs, {} retries, {} cross-stream take-overs, {} device "
        "allocs, {} frees on another stream, {} record_stream, {} misuses, peak reserved {}",
        tally_.ops, tally_.allocations, tally_.ooms, s.num_alloc_retries, s.num_cross_stream_reuse,
        s.num_device_alloc, tally_.frees_elsewhere, tally_.records, tally_.misuses,
        format_bytes(
            static_cast<std::uint64_t>(s.get(StatKind::reserved_bytes, StatPool::all).peak)));
  }

  static constexpr std::size_t kMaxLive = 160;
  static constexpr std::size_t kLogLength = 24;

  Param param_;
  Rng rng_;
  SizeDrawer sizes_;
  std::unique_ptr<SimDevice> device_;
  std::unique_ptr<DeviceAllocator> alloc_;
  std::unique_ptr<Oracle> oracle_;
  std::vector<Stream> streams_;
  bool pass_through_ = false;
  std::vector<void*> handles_;         // live allocations, in no order
  std::vector<std::uintptr_t> freed_;  // a sample of freed addresses, for misuse
  std::deque<LoggedOp> log_;
  Tally tally_;
  std::string summary_;
};

class Randomized : public ::testing::TestWithParam<Param> {};

TEST_P(Randomized, AgreesWithTheOracle) {
  const Param& p = GetParam();
  if (p.trace_sizes && real_trace_sizes().empty()) {
    GTEST_SKIP() << "the real traces are not available in " << shared_dir()
                 << "/traces (set CISTERN_SHARED_DIR); the random-size variant still runs";
  }
  const std::uint64_t count = operations(3'000, 25'000);
  const std::uint64_t stats_every = p.sparse ? kSparseEvery : 1;
  const std::uint64_t check_every = p.sparse ? kSparseEvery : full_mode() ? 1000 : 1;
  RandomizedRun run(p);
  try {
    run.run(count, stats_every, check_every);
    run.finish();
  } catch (const std::exception& e) {  // OracleViolation, InvariantViolation, or an Error
    FAIL() << e.what() << "\n" << run.context();
  }
  std::cout << "[ stats    ] " << param_name({p, 0}) << ": " << run.summary() << "\n";
  if (p.c.expect_ooms) {
    EXPECT_GT(run.tally().ooms, 0u) << "the OOM path was never exercised";
  }
}

std::vector<Param> all_params() {
  std::vector<Param> params;
  for (const Case& c : kCases) {
    for (const std::uint64_t seed : {1, 2, 3}) {
      params.push_back({c, /*trace_sizes=*/false, /*sparse=*/false, seed});
      params.push_back({c, /*trace_sizes=*/true, /*sparse=*/false, seed});
      params.push_back({c, /*trace_sizes=*/false, /*sparse=*/true, seed});
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Configs, Randomized, ::testing::ValuesIn(all_params()), param_name);

// --- the differential test of best fit --------------------------------------------------------------

/// PyTorch's placement on one stream (cistern with park_small_blocks:False), written as plainly as
/// possible: blocks in address order, the free ones in a set per pool ordered by (size, address);
/// small requests (<= 1 MiB) from 2 MiB segments, split when the rest is >= 512 bytes; large
/// ones from 20 MiB segments (or their own, rounded to 2 MiB, from 10 MiB), split only when the
/// rest is > 1 MiB; freed blocks coalesce with free neighbours of the same segment.
class BestFitModel {
 public:
  static std::size_t round(std::size_t bytes) {
    return (std::max<std::size_t>(bytes, 1) + 511) / 512 * 512;
  }
  static bool is_small(std::size_t rounded) { return rounded <= MiB; }
  static std::size_t segment_size(std::size_t rounded) {
    if (is_small(rounded)) return 2 * MiB;
    if (rounded < 10 * MiB) return 20 * MiB;
    return (rounded + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
  }

  /// The address best fit gives a request, or 0 when no cached block can serve it.
  std::uintptr_t best_fit(std::size_t rounded) const {
    const auto& pool = free_[is_small(rounded) ? 1 : 0];
    const auto it = pool.lower_bound({rounded, 0});
    return it == pool.end() ? 0 : it->second;
  }

  /// Whether `address` lies in a segment the model knows.
  bool in_a_segment(std::uintptr_t address) const {
    auto it = segments_.upper_bound(address);
    if (it == segments_.begin()) return false;
    --it;
    return address < it->first + it->second.size;
  }

  void add_segment(std::uintptr_t base, std::size_t size, bool small) {
    segments_[base] = {size, !small};
    blocks_[base] = {size, true, base};
    free_[small ? 1 : 0].insert({size, base});
  }

  /// Hands out the free block at `address` for `rounded` bytes; returns the block's size.
  std::size_t take(std::uintptr_t address, std::size_t rounded) {
    Block& b = blocks_.at(address);
    const bool large = segments_.at(b.segment).large;
    free_[large ? 0 : 1].erase({b.size, address});
    const std::size_t rest = b.size - rounded;
    if (large ? rest > MiB : rest >= 512) {
      blocks_[address + rounded] = {rest, true, b.segment};
      free_[large ? 0 : 1].insert({rest, address + rounded});
      b.size = rounded;
    }
    b.free = false;
    return b.size;
  }

  void free(std::uintptr_t address) {
    auto it = blocks_.find(address);
    it->second.free = true;
    const auto next = std::next(it);
    if (next != blocks_.end() && mergeable(it, next)) merge_into(it, next);
    if (it != blocks_.begin() && mergeable(std::prev(it), it)) it = merge_into(std::prev(it), it);
    free_[pool_of(it)].insert({it->second.size, it->first});
  }

  /// empty_cache: every whole free segment goes back.
  void release_whole_free_segments() {
    for (auto it = segments_.begin(); it != segments_.end();) {
      const Block& b = blocks_.at(it->first);
      if (b.free && b.size == it->second.size) {
        free_[it->second.large ? 0 : 1].erase({b.size, it->first});
        blocks_.erase(it->first);
        it = segments_.erase(it);
      } else {
        ++it;
      }
    }
  }

  /// The allocator's snapshot has exactly the model's segments and blocks.
  void compare(const Snapshot& snap) const {
    ASSERT_EQ(snap.segments.size(), segments_.size());
    auto model_block = blocks_.begin();
    auto model_segment = segments_.begin();
    for (const SegmentInfo& seg : snap.segments) {
      ASSERT_EQ(seg.address, model_segment->first);
      ASSERT_EQ(seg.total_size, model_segment->second.size);
      ASSERT_EQ(seg.is_large, model_segment->second.large);
      for (const BlockInfo& b : seg.blocks) {
        ASSERT_EQ(b.address, model_block->first) << "in segment " << seg.address;
        ASSERT_EQ(b.size, model_block->second.size) << "block " << b.address;
        ASSERT_EQ(b.state == BlockState::inactive, model_block->second.free)
            << "block " << b.address;
        ++model_block;
      }
      ++model_segment;
    }
  }

 private:
  struct Segment {
    std::size_t size;
    bool large;
  };
  struct Block {
    std::size_t size;
    bool free;
    std::uintptr_t segment;
  };
  using Iter = std::map<std::uintptr_t, Block>::iterator;

  int pool_of(Iter it) const { return segments_.at(it->second.segment).large ? 0 : 1; }
  static bool mergeable(Iter a, Iter b) {
    return a->second.free && b->second.free && a->second.segment == b->second.segment;
  }
  // Merges the free block `gone` (just after `into`, not yet in a free set unless it was free
  // before) into `into`; returns `into`.
  Iter merge_into(Iter into, Iter gone) {
    const int pool = pool_of(into);
    free_[pool].erase({into->second.size, into->first});
    free_[pool].erase({gone->second.size, gone->first});
    into->second.size += gone->second.size;
    blocks_.erase(gone);
    return into;
  }

  std::map<std::uintptr_t, Segment> segments_;
  std::map<std::uintptr_t, Block> blocks_;
  std::set<std::pair<std::size_t, std::uintptr_t>> free_[2];  // large, small
};

/// Sizes for the best-fit test: many repeats (ties between equal free blocks) and every range;
/// only large-pool sizes (> 1 MiB) when `large_only`.
std::size_t best_fit_size(Rng& rng, bool large_only) {
  static const std::size_t repeated[] = {512,     1024,    4096,     65536,    MiB,
                                         MiB + 1, 3 * MiB, 10 * MiB, 12 * MiB, 40 * MiB};
  static const std::size_t repeated_large[] = {MiB + 1,  3 * MiB,  10 * MiB - 1,   10 * MiB,
                                               12 * MiB, 20 * MiB, 20 * MiB - 512, 40 * MiB};
  const std::uint64_t r = rng.below(100);
  if (large_only) {
    if (r < 40) return repeated_large[rng.below(std::size(repeated_large))];
    if (r < 98) return rng.log_between(MiB + 1, 64 * MiB);
    return rng.log_between(64 * MiB, GiB);
  }
  if (r < 30) return repeated[rng.below(std::size(repeated))];
  if (r < 60) return rng.between(1, 8192);
  if (r < 85) return rng.log_between(8193, MiB);
  if (r < 99) return rng.log_between(MiB + 1, 64 * MiB);
  return rng.log_between(64 * MiB, GiB);
}

/// Drives the allocator and the model side by side on one stream and compares every decision.
class BestFitRun {
 public:
  BestFitRun(std::uint64_t seed, bool large_only)
      : device_(options()),
        alloc_(device_, Config::parse("vmm:False,park_small_blocks:False")),
        rng_(seed),
        large_only_(large_only) {}

  void run(std::uint64_t count) {
    for (op_ = 1; op_ <= count; ++op_) {
      const std::uint64_t r = rng_.below(1000);
      if (live_.empty() || (r < 540 && live_.size() < kMaxLive)) allocate();
      else if (r < 998) free(rng_.below(live_.size()));
      else empty_cache();
      if (::testing::Test::HasFatalFailure()) return;
      if (op_ % 500 == 0) compare();
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (void* p : live_) alloc_.deallocate(p, default_stream);
    alloc_.check();
    EXPECT_EQ(alloc_.stats().num_ooms, 0);
  }

  /// The last operations, addresses written as segment+offset.
  std::string context() const {
    std::string text = "last operations:\n";
    for (const std::string& line : log_) text += "  " + line + "\n";
    return text;
  }

 private:
  static SimDeviceOptions options() {
    SimDeviceOptions o;
    o.capacity = 1024 * GiB;  // never out of memory: every decision is the model's
    return o;
  }

  void allocate() {
    const std::size_t bytes = best_fit_size(rng_, large_only_);
    const std::size_t rounded = BestFitModel::round(bytes);
    const std::uintptr_t expected = model_.best_fit(rounded);
    const auto got = reinterpret_cast<std::uintptr_t>(alloc_.allocate(bytes, default_stream));
    if (expected == 0 && !model_.in_a_segment(got)) {
      model_.add_segment(got, BestFitModel::segment_size(rounded), BestFitModel::is_small(rounded));
      segment_names_[got] = segment_names_.size();
    }
    note(fmt::format("op {}: allocate({}) rounded {} -> {} (model: {})", op_, bytes, rounded,
                     where(got), expected == 0 ? "new segment" : where(expected)));
    ASSERT_EQ(reinterpret_cast<void*>(got), reinterpret_cast<void*>(expected == 0 ? got : expected))
        << "not the best fit\n"
        << context();
    ASSERT_TRUE(expected != 0 || model_.in_a_segment(got))
        << "a new segment was expected, but the block lies in a known one\n"
        << context();
    const std::size_t size = model_.take(got, rounded);
    ASSERT_EQ(alloc_.allocation_size(reinterpret_cast<void*>(got)), size) << context();
    live_.push_back(reinterpret_cast<void*>(got));
  }

  void free(std::size_t i) {
    void* p = live_[i];
    note(fmt::format("op {}: free {}", op_, where(reinterpret_cast<std::uintptr_t>(p))));
    alloc_.deallocate(p, default_stream);
    model_.free(reinterpret_cast<std::uintptr_t>(p));
    live_[i] = live_.back();
    live_.pop_back();
  }

  void empty_cache() {
    note(fmt::format("op {}: empty_cache", op_));
    alloc_.empty_cache();
    model_.release_whole_free_segments();
  }

  void compare() {
    alloc_.check();
    model_.compare(alloc_.snapshot());
    if (::testing::Test::HasFatalFailure()) ADD_FAILURE() << "op " << op_ << "\n" << context();
  }

  // "seg3+0x1e00": the segment in order of creation (by the model) and the offset in it.
  std::string where(std::uintptr_t address) const {
    auto it = segment_names_.upper_bound(address);
    if (it == segment_names_.begin()) return fmt::format("{:#x}", address);
    --it;
    return fmt::format("seg{}+{:#x}", it->second, address - it->first);
  }

  void note(std::string line) {
    if (log_.size() == 16) log_.pop_front();
    log_.push_back(std::move(line));
  }

  static constexpr std::size_t kMaxLive = 400;

  SimDevice device_;
  CachingAllocator alloc_;
  BestFitModel model_;
  Rng rng_;
  std::vector<void*> live_;
  std::map<std::uintptr_t, std::size_t> segment_names_;
  std::deque<std::string> log_;
  std::uint64_t op_ = 0;
  bool large_only_;
};

class RandomizedBestFit : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(RandomizedBestFit, PlacesEveryBlockWhereTheReferenceModelDoes) {
  BestFitRun(GetParam(), /*large_only=*/false).run(operations(20'000, 200'000));
}

// The large pool alone: any deviation here is one of the large pool's best fit or split rules.
TEST_P(RandomizedBestFit, PlacesEveryLargeBlockWhereTheReferenceModelDoes) {
  BestFitRun(GetParam(), /*large_only=*/true).run(operations(10'000, 100'000));
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomizedBestFit, ::testing::Values(11, 12, 13));

// --- the options the randomized tests found to matter ------------------------------------------------

// Found by RandomizedBestFit (seeds 11-13) when small blocks were parked by default: a parked
// block serves only its own size, so a smaller request cuts the rest of the segment instead.
// Without parking (the default) every placement is best fit; parking is an option now
// (tests/test_caching_allocator.cpp covers that side).
TEST(BestFitWithoutParking, AFreedSmallBlockIsTheBestFitForASmallerRequest) {
  SimDevice device;
  CachingAllocator alloc(device, Config::parse("vmm:False,park_small_blocks:False"));
  void* a = alloc.allocate(4096, default_stream);     // [base, base+4 KiB)
  void* guard = alloc.allocate(512, default_stream);  // keeps `a` from joining the rest
  alloc.deallocate(a, default_stream);                // free: 4 KiB at base, ~2 MiB after guard
  void* b = alloc.allocate(1024, default_stream);
  EXPECT_EQ(b, a) << "the 4 KiB free block is the smallest that fits";
  alloc.deallocate(b, default_stream);
  alloc.deallocate(guard, default_stream);
  alloc.check();
}

TEST(BestFitWithoutParking, FreedNeighboursCoalesceAtOnce) {
  SimDevice device;
  CachingAllocator alloc(device, Config::parse("vmm:False,park_small_blocks:False"));
  void* a = alloc.allocate(4096, default_stream);
  alloc.deallocate(a, default_stream);
  ASSERT_EQ(alloc.snapshot().segments.size(), 1u);
  EXPECT_EQ(alloc.snapshot().segments[0].blocks.size(), 1u);
  alloc.check();
}

// Found by the *_sparse_* Randomized cases and ConcurrencyPeaks: with several pools, statistics
// are published in batches by default, so an allocator-wide peak may miss a short-lived maximum
// (an allocation made and freed between two reads) or, when one pool's free is held back while
// another publishes an allocation, count both; stats.hpp states the bound. exact_peaks:True
// publishes every change, and then both cases are exact.
TEST(ExactPeaks, AnAllocationFreedBeforeTheNextReadStillCountsInThePeak) {
  SimDevice device;
  CachingAllocator alloc(device, Config::parse("exact_peaks:True"));
  const Stream s1 = device.create_stream();
  const Stream s2 = device.create_stream();
  void* a = alloc.allocate(512, s1);
  void* b = alloc.allocate(512, s2);  // a second pool: allocator-wide counters in use
  (void)alloc.stats();
  void* c = alloc.allocate(MiB, s1);  // served from s1's cached small segment
  alloc.deallocate(c, s1);
  const Stat peak = alloc.stats().get(StatKind::allocated_bytes, StatPool::all);
  EXPECT_EQ(peak.peak, static_cast<std::int64_t>(512 + 512 + MiB));
  EXPECT_EQ(alloc.stats().get(StatKind::allocation, StatPool::all).peak, 3);
  alloc.deallocate(a, s1);
  alloc.deallocate(b, s2);
  alloc.check();
}

// Runs a: 1 MiB on s1, b: 512 B on s2, reset, free a, c: 3 MiB on s2; returns the peak.
Stats peaks_after_a_free_and_an_allocation(const char* conf) {
  SimDevice device;
  CachingAllocator alloc(device, Config::parse(conf));
  const Stream s1 = device.create_stream();
  const Stream s2 = device.create_stream();
  void* a = alloc.allocate(MiB, s1);
  void* b = alloc.allocate(512, s2);      // a second pool: allocator-wide counters in use
  alloc.reset_peak_stats();               // peak: 1 MiB + 512, everything published
  alloc.deallocate(a, s1);                // -1 MiB: by default held back by pool 1
  void* c = alloc.allocate(3 * MiB, s2);  // +3 MiB and a new segment: published by pool 2
  const Stats s = alloc.stats();
  alloc.deallocate(b, s2);
  alloc.deallocate(c, s2);
  alloc.check();
  return s;
}

TEST(ExactPeaks, APeakNeverExceedsWhatWasAllocatedAtOnce) {
  const Stats s = peaks_after_a_free_and_an_allocation("exact_peaks:True");
  // Never more than b and c were allocated at once: 3 MiB + 512 bytes, 2 blocks.
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::all).peak,
            static_cast<std::int64_t>(3 * MiB + 512));
  EXPECT_EQ(s.get(StatKind::allocation, StatPool::all).peak, 2);
}

TEST(BatchedPeaks, StayWithinTheDocumentedBound) {
  const Stats s = peaks_after_a_free_and_an_allocation("");
  const auto truth = static_cast<std::int64_t>(3 * MiB + 512);
  const std::int64_t peak = s.get(StatKind::allocated_bytes, StatPool::all).peak;
  // Pool 1 held back its free of 1 MiB: within its reserved bytes (one 2 MiB segment).
  EXPECT_LE(peak, truth + static_cast<std::int64_t>(2 * MiB));
  EXPECT_GE(peak, truth);
  EXPECT_EQ(s.get(StatKind::allocated_bytes, StatPool::all).current,
            static_cast<std::int64_t>(3 * MiB + 512));  // current values are exact
}

// The same reproduction seen through a snapshot: a freed block coalesces with its free
// neighbours at once, so a segment whose blocks are all free is one whole free block.
TEST(BestFitReproduction, FreedNeighboursCoalesceAtOnce) {
  SimDevice device;
  CachingAllocator alloc(device, Config{});
  void* a = alloc.allocate(4096, default_stream);
  alloc.deallocate(a, default_stream);
  const Snapshot snap = alloc.snapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  EXPECT_EQ(snap.segments[0].blocks.size(), 1u) << "the freed block did not join the free rest";
  alloc.check();
}

}  // namespace
}  // namespace cistern::testing
