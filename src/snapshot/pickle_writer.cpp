// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// PickleWriter (see pickle_writer.hpp). Opcodes are those of Python's Lib/pickle.py; a container
// is written as its empty form, a MARK, its items and one APPENDS / SETITEMS (a tuple: MARK, its
// items, TUPLE), which `pickle.load` accepts for any number of items.
#include "snapshot/pickle_writer.hpp"

#include <cstring>
#include <limits>
#include <stdexcept>

namespace cistern::detail {
namespace {

// The opcodes written.
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinInt = 'J';      // 4-byte signed, little-endian
constexpr char kBinInt1 = 'K';     // 1-byte unsigned
constexpr char kBinInt2 = 'M';     // 2-byte unsigned, little-endian
constexpr char kLong1 = '\x8a';    // n bytes of two's complement, little-endian
constexpr char kBinFloat = 'G';    // 8-byte IEEE double, big-endian
constexpr char kBinUnicode = 'X';  // 4-byte length, UTF-8
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kTuple = 't';
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';
constexpr char kBinPut = 'q';      // 1-byte memo key
constexpr char kLongBinPut = 'r';  // 4-byte memo key, little-endian
constexpr char kBinGet = 'h';
constexpr char kLongBinGet = 'j';

}  // namespace

PickleWriter::PickleWriter() {
  out_ += kProto;
  out_ += '\x02';
}

void PickleWriter::value_written() {
  if (!counts_.empty()) ++counts_.back();
}

void PickleWriter::put_uint(std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out_ += static_cast<char>(value & 0xffU);
    value >>= 8U;
  }
}

void PickleWriter::none() {
  out_ += kNone;
  value_written();
}

void PickleWriter::boolean(bool value) {
  out_ += value ? kNewTrue : kNewFalse;
  value_written();
}

void PickleWriter::integer(std::int64_t value) {
  if (value >= 0) return unsigned_integer(static_cast<std::uint64_t>(value));
  if (value >= std::numeric_limits<std::int32_t>::min()) {
    out_ += kBinInt;
    put_uint(static_cast<std::uint32_t>(static_cast<std::int32_t>(value)), 4);
  } else {
    out_ += kLong1;
    out_ += '\x08';
    put_uint(static_cast<std::uint64_t>(value), 8);
  }
  value_written();
}

void PickleWriter::unsigned_integer(std::uint64_t value) {
  if (value <= 0xffU) {
    out_ += kBinInt1;
    put_uint(value, 1);
  } else if (value <= 0xffffU) {
    out_ += kBinInt2;
    put_uint(value, 2);
  } else if (value <= static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
    out_ += kBinInt;
    put_uint(value, 4);
  } else {
    // Fewest bytes whose two's complement keeps the value positive (a clear top bit).
    int bytes = 1;
    while (bytes < 8 && (value >> (8U * static_cast<unsigned>(bytes) - 1U)) != 0) ++bytes;
    if (bytes == 8 && (value >> 63U) != 0) bytes = 9;
    out_ += kLong1;
    out_ += static_cast<char>(bytes);
    put_uint(value, bytes < 8 ? bytes : 8);
    if (bytes == 9) out_ += '\0';
  }
  value_written();
}

void PickleWriter::real(double value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  out_ += kBinFloat;
  for (int shift = 56; shift >= 0; shift -= 8) {
    out_ += static_cast<char>((bits >> static_cast<unsigned>(shift)) & 0xffU);
  }
  value_written();
}

void PickleWriter::string(std::string_view text) {
  if (text.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw std::logic_error("PickleWriter: string over 4 GiB");
  }
  out_ += kBinUnicode;
  put_uint(text.size(), 4);
  out_.append(text.data(), text.size());
  value_written();
}

void PickleWriter::begin(Open kind, char empty_opcode) {
  if (kind != Open::tuple) out_ += empty_opcode;
  out_ += kMark;
  open_.push_back(kind);
  counts_.push_back(0);
}

void PickleWriter::end(Open kind, char close_opcode) {
  if (open_.empty() || open_.back() != kind) {
    throw std::logic_error("PickleWriter: end of a container that is not the open one");
  }
  if (kind == Open::dict && counts_.back() % 2 != 0) {
    throw std::logic_error("PickleWriter: a dict key without a value");
  }
  out_ += close_opcode;
  open_.pop_back();
  counts_.pop_back();
  value_written();
}

void PickleWriter::begin_list() { begin(Open::list, kEmptyList); }
void PickleWriter::end_list() { end(Open::list, kAppends); }
void PickleWriter::begin_tuple() { begin(Open::tuple, kMark); }
void PickleWriter::end_tuple() { end(Open::tuple, kTuple); }
void PickleWriter::begin_dict() { begin(Open::dict, kEmptyDict); }
void PickleWriter::end_dict() { end(Open::dict, kSetItems); }

void PickleWriter::memo_put(std::uint32_t key) {
  out_ += key <= 0xffU ? kBinPut : kLongBinPut;
  put_uint(key, key <= 0xffU ? 1 : 4);
}

void PickleWriter::memo_get(std::uint32_t key) {
  out_ += key <= 0xffU ? kBinGet : kLongBinGet;
  put_uint(key, key <= 0xffU ? 1 : 4);
  value_written();
}

std::string PickleWriter::finish() {
  if (!open_.empty()) throw std::logic_error("PickleWriter: finish with open containers");
  out_ += kStop;
  std::string done;
  done.swap(out_);
  out_ += kProto;
  out_ += '\x02';
  return done;
}

}  // namespace cistern::detail
