// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// libFuzzer harness for the pickle reader (and the gunzip in front of it). Any input must
// either parse or raise cistern::InvalidArgument; sanitizers catch everything else. Build with
// -DCISTERN_BUILD_FUZZERS=ON and clang (tests/fuzz/CMakeLists.txt), or by hand:
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -DFMT_HEADER_ONLY \
//     -Iinclude -Isrc tests/fuzz/fuzz_pickle.cpp src/trace/pickle.cpp src/trace/input.cpp -lz
// Run with a corpus directory outside the repository, seeded with a few real snapshots:
//   ./fuzz_pickle -max_len=4096 /tmp/pickle_corpus
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cistern/errors.hpp"
#include "trace/input.hpp"
#include "trace/pickle.hpp"

namespace {

namespace pickle = cistern::trace::pickle;

/// Touches every reachable value through the public API, visiting at most `budget` values so
/// that heavily shared (but accepted) inputs stay fast to fuzz.
void walk(pickle::Value root, std::size_t budget) {
  std::vector<pickle::Value> pending{root};
  while (!pending.empty() && budget-- > 0) {
    const pickle::Value value = pending.back();
    pending.pop_back();
    (void)value.describe(64);
    switch (value.kind()) {
      case pickle::Kind::integer: (void)value.as_int(); break;
      case pickle::Kind::big_integer:
      case pickle::Kind::real: (void)value.as_double(); break;
      case pickle::Kind::string: (void)value.as_string(); break;
      case pickle::Kind::bytes: (void)value.as_bytes(); break;
      case pickle::Kind::boolean: (void)value.as_bool(); break;
      case pickle::Kind::dict:
        (void)value.find("size");
        for (const auto& [key, item] : value.items()) {
          pending.push_back(key);
          pending.push_back(item);
        }
        break;
      case pickle::Kind::none: break;
      default:
        for (const pickle::Value item : value) pending.push_back(item);
        break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    if (cistern::trace::is_gzip(bytes)) bytes = cistern::trace::gunzip(bytes, "fuzz", 1 << 20);
    const pickle::Document document = pickle::parse(std::move(bytes), "fuzz");
    walk(document.root(), 100000);
  } catch (const cistern::InvalidArgument&) {
    // Refusing bad input cleanly is the expected outcome.
  }
  return 0;
}
