// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// PickleWriter: writes plain data (None, bools, ints, floats, strings, lists, tuples, dicts) as a
// Python pickle of protocol 2, which `pickle.load` reads in every Python 3 and which cistern's own
// data-only reader (src/trace/pickle.hpp) accepts. Only data opcodes are written: never a global
// or a call, so the output is exactly as safe to load as the values it holds. A value written
// many times (a call stack shared by thousands of events) can be stored in the pickle's memo once
// and referred to after (`memo_put`, `memo_get`), as Python's pickler does for shared objects.
//
// Values are written in order, containers bracketed by begin/end calls:
//
//   PickleWriter w;
//   w.begin_dict();
//   w.string("size"); w.integer(512);
//   w.string("frames"); w.begin_list(); w.end_list();
//   w.end_dict();
//   std::string bytes = w.finish();
//
// A dict takes alternating keys and values. Misuse (an end without a begin, a dict with a key and
// no value, finish with open containers) is a bug in the caller and throws `std::logic_error`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cistern::detail {

/// See the file comment.
class PickleWriter {
 public:
  /// Starts a pickle (writes the PROTO 2 header).
  PickleWriter();

  void none();
  void boolean(bool value);
  void integer(std::int64_t value);
  /// An int from an unsigned value (addresses, sizes): values of 2^63 and more stay positive.
  void unsigned_integer(std::uint64_t value);
  void real(double value);
  /// A `str` (the bytes must be UTF-8).
  void string(std::string_view text);

  void begin_list();
  void end_list();
  void begin_tuple();
  void end_tuple();
  void begin_dict();
  void end_dict();

  /// Stores the value just written (the last complete one) in the memo under `key`
  /// (BINPUT / LONG_BINPUT); writes nothing that counts as a value.
  void memo_put(std::uint32_t key);
  /// Writes the value stored under `key` again, as a reference to the same object (BINGET /
  /// LONG_BINGET). The key must have been stored earlier in this pickle.
  void memo_get(std::uint32_t key);

  /// Writes STOP and returns the pickle. The writer is empty afterwards.
  std::string finish();

 private:
  enum class Open : std::uint8_t { list, tuple, dict };
  void begin(Open kind, char empty_opcode);
  void end(Open kind, char close_opcode);
  void value_written();
  void put_uint(std::uint64_t value, int bytes);

  std::string out_;
  std::vector<Open> open_;
  std::vector<std::uint64_t> counts_;  ///< values written into each open container
};

}  // namespace cistern::detail
