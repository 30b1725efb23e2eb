// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Damaged input of every format never crashes a reader: random byte flips, insertions and
// truncations of valid files either read (into a trace that passes `check`) or throw
// `cistern::InvalidArgument`. Deterministic (fixed seeds); CISTERN_TEST_FULL=1 runs more rounds.
// Most useful under -DCISTERN_SANITIZE=address,undefined.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#include "cistern/errors.hpp"
#include "support/trace_sizes.hpp"
#include "trace/input.hpp"
#include "trace/native.hpp"
#include "trace/readers.hpp"

namespace {

namespace trace = cistern::trace;

int rounds() { return std::getenv("CISTERN_TEST_FULL") != nullptr ? 3000 : 150; }

/// A damaged copy of `bytes`: a few flipped bytes, an inserted or removed run, or a cut.
std::string damage(const std::string& bytes, std::mt19937_64& random) {
  std::string out = bytes;
  const auto pick = [&](std::size_t n) {
    return n == 0 ? 0 : std::uniform_int_distribution<std::size_t>(0, n - 1)(random);
  };
  switch (random() % 4) {
    case 0:
      for (int i = 0, n = 1 + static_cast<int>(random() % 4); i < n && !out.empty(); ++i) {
        out[pick(out.size())] = static_cast<char>(random());
      }
      break;
    case 1:
      out.insert(pick(out.size() + 1), std::string(1 + random() % 8, static_cast<char>(random())));
      break;
    case 2:
      if (!out.empty()) out.erase(pick(out.size()), 1 + random() % 16);
      break;
    default: out.resize(pick(out.size() + 1)); break;
  }
  return out;
}

void survive(const std::string& original, const char* name, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  int refused = 0;
  for (int round = 0; round < rounds(); ++round) {
    const std::string bytes = damage(original, random);
    try {
      const trace::Trace t = trace::read_trace_bytes(bytes, name);
      t.check();  // what a reader returns is always a valid trace
    } catch (const cistern::InvalidArgument& error) {
      ++refused;
      EXPECT_NE(std::string(error.what()).find(name), std::string::npos) << error.what();
    }
  }
  std::cout << "[corrupt] " << name << ": " << refused << " of " << rounds()
            << " damaged copies refused\n";
}

const char* const lifetimes =
    "id,lower,upper,size\n0,0,3,4\n1,3,9,4\n2,0,9,4\n3,9,21,4\n4,0,21,4\n";
const char* const rmm =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "1,10:00:00.000001,allocate,0x7f0000001000,64,0\n"
    "1,10:00:00.000002,free,0x7f0000009000,128,7f00aa\n"
    "1,10:00:00.000003,allocate failure,(nil),999999,0\n"
    "1,10:00:00.000004,free,0x7f0000001000,64,0\n";
const char* const kineto =
    R"({"traceEvents": [{"name": "[memory]", "ts": 2, "args": {"Ev Idx": 1, "Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 512, "Total Allocated": 1536, "Total Reserved": 2097152}},)"
    R"({"name": "[memory]", "ts": 1, "args": {"Ev Idx": 0, "Device Type": 1, "Device Id": 0, "Addr": 8192, "Bytes": -1024, "Total Allocated": 1024, "Total Reserved": 2097152}},)"
    R"({"ph": "X", "name": "kernel", "ts": 0, "args": {"stream": 7}}]})";

TEST(CorruptInput, TextFormats) {
  survive(lifetimes, "lifetimes.csv", 1);
  survive(rmm, "rmm.csv", 2);
  survive(kineto, "kineto.json", 3);
}

TEST(CorruptInput, RealSnapshotAndItsNativeForm) {
  const std::string shared = cistern::testing::shared_dir();
  if (!cistern::testing::traces_available(shared))
    GTEST_SKIP() << "no shared traces at " << shared << "/traces";
  const std::string path =
      shared + "/traces/pytorch/cs336_Wedsonlin/medium_ctx128_inference.pickle.gz";
  const std::string pickle = trace::read_file(path);
  survive(pickle, "snapshot.pickle", 4);
  std::ostringstream native;
  trace::write_native(native, trace::read_trace(path));
  // The native text is long; damage its first part, where the header and the first events are.
  survive(native.str().substr(0, 20000), "snapshot.trace", 5);
}

}  // namespace
