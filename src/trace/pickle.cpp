// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The pickle reader: an opcode table, the stack machine that runs the data opcodes, the final
// pass that lays containers out contiguously and checks the shape, and the `Value` accessors.
#include "trace/pickle.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "cistern/errors.hpp"
#include "trace/input.hpp"

namespace cistern::trace::pickle {
namespace {

using detail::Node;
using detail::Storage;

// ---- the opcode table -----------------------------------------------------------------------

enum class OpcodeClass : std::uint8_t { unknown, data, forbidden };

struct OpcodeInfo {
  const char* name = nullptr;
  OpcodeClass cls = OpcodeClass::unknown;
  const char* why = nullptr;  ///< for forbidden opcodes: what running it would do
};

constexpr const char* imports = "it would import a global";
constexpr const char* calls = "it would call a function";
constexpr const char* persistent = "it would ask the application for a persistent object";
constexpr const char* extension = "it would import a global from the extension registry";
constexpr const char* buffer = "it would read an out-of-band buffer";

// Opcode byte values are those of CPython's pickle protocol (Lib/pickletools.py lists them).
// clang-format off
enum Op : unsigned char {
  MARK = 0x28, EMPTY_TUPLE = 0x29, STOP = 0x2e, POP = 0x30, POP_MARK = 0x31, DUP = 0x32,
  BINBYTES = 0x42, SHORT_BINBYTES = 0x43, FLOAT = 0x46, BINFLOAT = 0x47, INT = 0x49,
  BININT = 0x4a, BININT1 = 0x4b, LONG = 0x4c, BININT2 = 0x4d, NONE = 0x4e, PERSID = 0x50,
  BINPERSID = 0x51, REDUCE = 0x52, STRING = 0x53, BINSTRING = 0x54, SHORT_BINSTRING = 0x55,
  UNICODE = 0x56, BINUNICODE = 0x58, EMPTY_LIST = 0x5d, APPEND = 0x61, BUILD = 0x62,
  GLOBAL = 0x63, DICT = 0x64, APPENDS = 0x65, GET = 0x67, BINGET = 0x68, INST = 0x69,
  LONG_BINGET = 0x6a, LIST = 0x6c, OBJ = 0x6f, PUT = 0x70, BINPUT = 0x71, LONG_BINPUT = 0x72,
  SETITEM = 0x73, TUPLE = 0x74, SETITEMS = 0x75, EMPTY_DICT = 0x7d, PROTO = 0x80, NEWOBJ = 0x81,
  EXT1 = 0x82, EXT2 = 0x83, EXT4 = 0x84, TUPLE1 = 0x85, TUPLE2 = 0x86, TUPLE3 = 0x87,
  NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b, SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e, EMPTY_SET = 0x8f, ADDITEMS = 0x90, FROZENSET = 0x91,
  NEWOBJ_EX = 0x92, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95, BYTEARRAY8 = 0x96,
  NEXT_BUFFER = 0x97, READONLY_BUFFER = 0x98,
};
// clang-format on

struct DataOpcode {
  Op op;
  const char* name;
};

/// The opcodes that build plain values: the only ones this reader runs.
constexpr DataOpcode data_opcodes[] = {
    {MARK, "MARK"},
    {EMPTY_TUPLE, "EMPTY_TUPLE"},
    {STOP, "STOP"},
    {POP, "POP"},
    {POP_MARK, "POP_MARK"},
    {DUP, "DUP"},
    {BINBYTES, "BINBYTES"},
    {SHORT_BINBYTES, "SHORT_BINBYTES"},
    {FLOAT, "FLOAT"},
    {BINFLOAT, "BINFLOAT"},
    {INT, "INT"},
    {BININT, "BININT"},
    {BININT1, "BININT1"},
    {LONG, "LONG"},
    {BININT2, "BININT2"},
    {NONE, "NONE"},
    {STRING, "STRING"},
    {BINSTRING, "BINSTRING"},
    {SHORT_BINSTRING, "SHORT_BINSTRING"},
    {UNICODE, "UNICODE"},
    {BINUNICODE, "BINUNICODE"},
    {EMPTY_LIST, "EMPTY_LIST"},
    {APPEND, "APPEND"},
    {DICT, "DICT"},
    {APPENDS, "APPENDS"},
    {GET, "GET"},
    {BINGET, "BINGET"},
    {LONG_BINGET, "LONG_BINGET"},
    {LIST, "LIST"},
    {PUT, "PUT"},
    {BINPUT, "BINPUT"},
    {LONG_BINPUT, "LONG_BINPUT"},
    {SETITEM, "SETITEM"},
    {TUPLE, "TUPLE"},
    {SETITEMS, "SETITEMS"},
    {EMPTY_DICT, "EMPTY_DICT"},
    {PROTO, "PROTO"},
    {TUPLE1, "TUPLE1"},
    {TUPLE2, "TUPLE2"},
    {TUPLE3, "TUPLE3"},
    {NEWTRUE, "NEWTRUE"},
    {NEWFALSE, "NEWFALSE"},
    {LONG1, "LONG1"},
    {LONG4, "LONG4"},
    {SHORT_BINUNICODE, "SHORT_BINUNICODE"},
    {BINUNICODE8, "BINUNICODE8"},
    {BINBYTES8, "BINBYTES8"},
    {EMPTY_SET, "EMPTY_SET"},
    {ADDITEMS, "ADDITEMS"},
    {FROZENSET, "FROZENSET"},
    {MEMOIZE, "MEMOIZE"},
    {FRAME, "FRAME"},
    {BYTEARRAY8, "BYTEARRAY8"},
};

struct ForbiddenOpcode {
  Op op;
  const char* name;
  const char* why;
};

/// The opcodes that would reach outside plain data. Named in errors so that the user learns
/// the file holds objects, not that it is corrupt.
constexpr ForbiddenOpcode forbidden_opcodes[] = {
    {GLOBAL, "GLOBAL", imports},
    {STACK_GLOBAL, "STACK_GLOBAL", imports},
    {INST, "INST", imports},
    {REDUCE, "REDUCE", calls},
    {BUILD, "BUILD", calls},
    {OBJ, "OBJ", calls},
    {NEWOBJ, "NEWOBJ", calls},
    {NEWOBJ_EX, "NEWOBJ_EX", calls},
    {EXT1, "EXT1", extension},
    {EXT2, "EXT2", extension},
    {EXT4, "EXT4", extension},
    {PERSID, "PERSID", persistent},
    {BINPERSID, "BINPERSID", persistent},
    {NEXT_BUFFER, "NEXT_BUFFER", buffer},
    {READONLY_BUFFER, "READONLY_BUFFER", buffer},
};

constexpr std::array<OpcodeInfo, 256> make_opcode_table() {
  std::array<OpcodeInfo, 256> table{};
  for (const DataOpcode& entry : data_opcodes)
    table[entry.op] = {entry.name, OpcodeClass::data, nullptr};
  for (const ForbiddenOpcode& entry : forbidden_opcodes) {
    table[entry.op] = {entry.name, OpcodeClass::forbidden, entry.why};
  }
  return table;
}

constexpr std::array<OpcodeInfo, 256> opcode_table = make_opcode_table();

constexpr int highest_protocol = 5;

std::string counted(std::size_t count, std::string_view noun) {
  return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s");
}
std::string items(std::size_t count) { return counted(count, "item"); }
std::string values(std::size_t count) { return counted(count, "value"); }
constexpr std::uint64_t max_string_bytes = std::numeric_limits<std::uint32_t>::max();
constexpr std::size_t max_nodes = std::numeric_limits<std::uint32_t>::max() - 1;

std::uint64_t bits_of(double value) noexcept {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

double double_of(std::uint64_t bits) noexcept {
  double value = 0;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// ---- the memo -------------------------------------------------------------------------------

/// Pickle's memo: integer keys to node indices. Keys are dense in practice (0, 1, 2, ...), so a
/// vector holds them; a key far beyond the vector goes to a hash map instead, so that one
/// LONG_BINPUT 4294967295 cannot make us allocate 16 GiB.
class Memo {
 public:
  void put(std::uint64_t key, std::uint32_t node) {
    if (key < dense_.size() || key <= 2 * dense_.size() + dense_slack) {
      if (key >= dense_.size()) dense_.resize(static_cast<std::size_t>(key) + 1, unset);
      if (dense_[key] == unset && sparse_.erase(key) == 0) ++entries_;
      dense_[key] = node;
      return;
    }
    if (sparse_.insert_or_assign(key, node).second) ++entries_;
  }

  std::optional<std::uint32_t> get(std::uint64_t key) const {
    if (key < dense_.size() && dense_[key] != unset) return dense_[key];
    if (const auto found = sparse_.find(key); found != sparse_.end()) return found->second;
    return std::nullopt;
  }

  /// The number of keys set: where MEMOIZE stores next, as Python's `len(memo)`.
  std::uint64_t size() const noexcept { return entries_; }

 private:
  static constexpr std::uint32_t unset = ~std::uint32_t{0};
  static constexpr std::size_t dense_slack = std::size_t{1} << 16;
  std::vector<std::uint32_t> dense_;
  std::unordered_map<std::uint64_t, std::uint32_t> sparse_;
  std::uint64_t entries_ = 0;
};

// ---- text decoding for protocol 0 -----------------------------------------------------------

int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// Parses exactly `text.size()` hex digits; nullopt if any is not one.
std::optional<std::uint32_t> parse_hex(std::string_view text) noexcept {
  std::uint32_t value = 0;
  for (const char c : text) {
    const int digit = hex_digit(c);
    if (digit < 0) return std::nullopt;
    value = value * 16 + static_cast<std::uint32_t>(digit);
  }
  return value;
}

void append_utf8(std::string& out, std::uint32_t code_point) {
  // Lone surrogates are encoded like any other code point, as Python's "surrogatepass" would.
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xc0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xe0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  }
}

/// The value of a simple backslash escape (\n, \t, ...) of Python string literals, or -1.
int simple_escape(char c) noexcept {
  switch (c) {
    case '\\': return '\\';
    case '\'': return '\'';
    case '"': return '"';
    case 'a': return '\a';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'v': return '\v';
    default: return -1;
  }
}

/// Decodes the body of a protocol-0 STRING literal (Python's "string_escape" rules) onto
/// `out`; returns an error text, or nullptr on success.
const char* unescape_string(std::string_view text, std::string& out) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out += text[i];
      continue;
    }
    if (++i == text.size()) return "trailing backslash in STRING argument";
    const char c = text[i];
    if (const int simple = simple_escape(c); simple >= 0) {
      out += static_cast<char>(simple);
    } else if (c == '\n') {
      // A backslash-newline continues the literal and stands for nothing.
    } else if (c >= '0' && c <= '7') {
      unsigned value = 0;
      std::size_t digits = 0;
      for (; digits < 3 && i < text.size() && text[i] >= '0' && text[i] <= '7'; ++digits, ++i) {
        value = value * 8 + static_cast<unsigned>(text[i] - '0');
      }
      --i;
      out += static_cast<char>(value & 0xff);
    } else if (c == 'x') {
      const auto value = text.size() - i - 1 >= 2 ? parse_hex(text.substr(i + 1, 2)) : std::nullopt;
      if (!value) return "invalid \\x escape in STRING argument";
      out += static_cast<char>(*value);
      i += 2;
    } else {
      out += '\\';  // Python keeps unknown escapes as they are
      out += c;
    }
  }
  return nullptr;
}

/// Decodes a protocol-0 UNICODE argument ("raw-unicode-escape": bytes are Latin-1 code points,
/// and \uXXXX or \UXXXXXXXX after an odd number of backslashes is an escape) onto `out` as
/// UTF-8; returns an error text, or nullptr on success.
const char* unescape_unicode(std::string_view text, std::string& out) {
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '\\') {
      append_utf8(out, static_cast<unsigned char>(text[i++]));
      continue;
    }
    const std::size_t run_start = i;
    while (i < text.size() && text[i] == '\\') ++i;
    const std::size_t run = i - run_start;
    const bool escape = run % 2 == 1 && i < text.size() && (text[i] == 'u' || text[i] == 'U');
    out.append(escape ? run - 1 : run, '\\');
    if (!escape) continue;
    const std::size_t digits = text[i] == 'u' ? 4 : 8;
    if (text.size() - i - 1 < digits) return "truncated \\u escape in UNICODE argument";
    const auto code_point = parse_hex(text.substr(i + 1, digits));
    if (!code_point) return "invalid \\u escape in UNICODE argument";
    if (*code_point > 0x10ffff) return "\\U escape beyond U+10FFFF in UNICODE argument";
    append_utf8(out, *code_point);
    i += 1 + digits;
  }
  return nullptr;
}

/// Parses an optionally signed decimal integer that must fill `text`. `overflow` is set, and
/// the result is meaningless, when it does not fit in 64 bits.
std::optional<std::int64_t> parse_decimal(std::string_view text, bool* overflow) {
  *overflow = false;
  if (!text.empty() && text.front() == '+') {
    text.remove_prefix(1);
    if (!text.empty() && text.front() == '-') return std::nullopt;
  }
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range && end == text.data() + text.size()) {
    *overflow = true;
    return std::nullopt;
  }
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

/// True if a well-formed decimal number too far from 1 for a double is tiny (rather than
/// huge): a negative exponent, or no nonzero digit before the decimal point.
bool is_tiny(std::string_view number) {
  const std::size_t exponent = number.find_first_of("eE");
  if (exponent != std::string_view::npos) {
    return exponent + 1 < number.size() && number[exponent + 1] == '-';
  }
  const std::string_view whole = number.substr(0, number.find('.'));
  return whole.find_first_of("123456789") == std::string_view::npos;
}

/// Parses a decimal number (as Python's float() would, for what picklers write) as a double;
/// also used for ints too large for 64 bits. Out-of-range values become infinity or zero.
std::optional<double> parse_double(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || end != text.data() + text.size()) return std::nullopt;
  if (error == std::errc::result_out_of_range) {
    const double magnitude = is_tiny(text) ? 0.0 : HUGE_VAL;
    return text.front() == '-' ? -magnitude : magnitude;
  }
  if (error != std::errc()) return std::nullopt;
  return value;
}

// ---- the stack machine ----------------------------------------------------------------------

/// Runs a pickle's opcodes, building nodes. A container's children are written straight into
/// `children` when it receives them in one batch, or in batches with nothing written in
/// between, which is how picklers write nearly everything. A container that grows again after
/// others were written (a long list filled by APPENDS of 1000 items each, or a memoized list
/// appended to later) collects its later children as (parent, child) pairs in `late_`;
/// `finish` moves such containers to the end of `children`, so every container ends up as one
/// contiguous range in pickled order.
class Machine {
 public:
  Machine(Storage& out, const Limits& limits)
      : out_(out),
        limits_(limits),
        data_(reinterpret_cast<const unsigned char*>(out.input.data())),
        size_(out.input.size()) {
    // Snapshots hold one value per 10 to 25 bytes and one child reference per 4; reserving
    // beyond that costs only address space (untouched pages are never faulted in) and spares
    // the copies and page faults of regrowth. The caps keep each reservation near 2 GiB.
    constexpr std::size_t most_reserved = std::size_t{1} << 27;
    out_.nodes.reserve(std::min(size_ / 8, most_reserved));
    out_.children.reserve(std::min(size_ / 2, most_reserved));
    stack_.reserve(64);
  }

  /// Runs to STOP and leaves the root node index and every container's children behind.
  void run();
  /// Gives containers that grew in several places one contiguous range of children.
  void finish();

 private:
  [[noreturn]] void fail(std::string_view problem) const {
    throw InvalidArgument(fmt::format("{}: offset {}: {}", out_.name, op_offset_, problem));
  }
  const char* op_name() const noexcept { return opcode_table[op_].name; }

  void dispatch();
  [[noreturn]] void reject() const;

  // Reading arguments.
  const unsigned char* take(std::uint64_t count) {
    if (count > size_ - pos_) fail_truncated(count);
    const unsigned char* start = data_ + pos_;
    pos_ += static_cast<std::size_t>(count);
    return start;
  }
  template <std::size_t width>
  std::uint64_t read_le() {
    const unsigned char* bytes = take(width);
    std::uint64_t value = 0;
    for (std::size_t i = width; i-- > 0;) value = value << 8 | bytes[i];
    return value;
  }
  [[noreturn]] void fail_truncated(std::uint64_t count) const;
  std::string_view read_line();

  // The stack.
  std::size_t fence() const noexcept { return marks_.empty() ? 0 : marks_.back(); }
  std::size_t above_fence() const noexcept { return stack_.size() - fence(); }
  void need(std::size_t count) const {
    if (above_fence() < count) fail_underflow(count);
  }
  [[noreturn]] void fail_underflow(std::size_t count) const;
  std::uint32_t pop() {
    need(1);
    const std::uint32_t top = stack_.back();
    stack_.pop_back();
    return top;
  }
  std::uint32_t top() const {
    need(1);
    return stack_.back();
  }
  std::size_t pop_mark();
  std::uint32_t container_below(std::size_t from, Kind kind) const;

  // Building.
  std::uint32_t add_node(Kind kind, std::uint32_t count, std::uint64_t payload,
                         bool in_arena = false);
  void push_node(Kind kind, std::uint64_t payload) { stack_.push_back(add_node(kind, 0, payload)); }
  void add_children(std::uint32_t parent, std::size_t from);
  void push_input_text(Kind kind, std::uint64_t length);
  void push_arena_text(Kind kind, std::string_view decoded_from, bool unicode);
  void push_big_integer(double approximate) { push_node(Kind::big_integer, bits_of(approximate)); }
  void push_long(const unsigned char* bytes, std::uint64_t count);
  void push_decimal(std::string_view text, bool allow_bool);

  // Opcode groups.
  void op_mark();
  void op_pop();
  void op_frame();
  void op_proto();
  void op_collection(Kind kind);
  void op_tuple_n(std::uint32_t count);
  void op_add_to(Kind kind, bool to_mark);
  void op_put(std::uint64_t key) { memo_.put(key, top()); }
  void op_get(std::uint64_t key) {
    const std::optional<std::uint32_t> node = memo_.get(key);
    if (!node) fail_memo(key);
    stack_.push_back(*node);
  }
  [[noreturn]] void fail_memo(std::uint64_t key) const;
  std::uint64_t read_memo_key_line();
  void op_float_text();
  void op_string_text();
  std::uint64_t read_signed_length32();

  Storage& out_;
  const Limits& limits_;
  const unsigned char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::size_t op_offset_ = 0;
  unsigned char op_ = 0;
  bool stopped_ = false;
  std::vector<std::uint32_t> stack_;
  std::vector<std::size_t> marks_;                             ///< stack depths at each open MARK
  std::vector<std::pair<std::uint32_t, std::uint32_t>> late_;  ///< (container, child)
  Memo memo_;
};

void Machine::run() {
  while (!stopped_) {
    op_offset_ = pos_;
    if (pos_ >= size_) fail("truncated pickle: the input ends before STOP");
    op_ = data_[pos_++];
    dispatch();
  }
  // pickle.load would ignore what follows STOP; a snapshot file holds one pickle, so more
  // bytes mean a damaged or spliced file.
  if (pos_ < size_) {
    op_offset_ = pos_;
    fail(fmt::format("{} bytes of data after the pickle's STOP", size_ - pos_));
  }
}

void Machine::reject() const {
  const OpcodeInfo& info = opcode_table[op_];
  if (info.cls == OpcodeClass::forbidden) {
    fail(fmt::format("forbidden pickle opcode {} (0x{:02x}): {}; cistern reads only plain data",
                     info.name, op_, info.why));
  }
  fail(fmt::format("unknown pickle opcode 0x{:02x}: not a pickle, or a protocol newer than {}", op_,
                   highest_protocol));
}

void Machine::dispatch() {
  switch (op_) {
    case MARK: return op_mark();
    case STOP:
      out_.root = pop();
      stopped_ = true;
      return;
    case POP: return op_pop();
    case POP_MARK: stack_.resize(pop_mark()); return;
    case DUP: stack_.push_back(top()); return;
    case PROTO: return op_proto();
    case FRAME: return op_frame();
    case NONE: return push_node(Kind::none, 0);
    case NEWTRUE: return push_node(Kind::boolean, 1);
    case NEWFALSE: return push_node(Kind::boolean, 0);
    case INT: return push_decimal(read_line(), true);
    case LONG: return push_decimal(read_line(), false);
    case BININT: {
      const auto value = static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le<4>()));
      return push_node(Kind::integer, static_cast<std::uint64_t>(std::int64_t{value}));
    }
    case BININT1: return push_node(Kind::integer, read_le<1>());
    case BININT2: return push_node(Kind::integer, read_le<2>());
    case LONG1: {
      const std::uint64_t count = read_le<1>();
      return push_long(take(count), count);
    }
    case LONG4: {
      const std::uint64_t count = read_signed_length32();
      return push_long(take(count), count);
    }
    case FLOAT: return op_float_text();
    case BINFLOAT: {
      const unsigned char* bytes = take(8);
      std::uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = bits << 8 | bytes[i];  // big-endian, unlike the rest
      return push_node(Kind::real, bits);
    }
    case STRING: return op_string_text();
    case BINSTRING: return push_input_text(Kind::string, read_signed_length32());
    case SHORT_BINSTRING: return push_input_text(Kind::string, read_le<1>());
    case UNICODE: return push_arena_text(Kind::string, read_line(), true);
    case BINUNICODE: return push_input_text(Kind::string, read_le<4>());
    case SHORT_BINUNICODE: return push_input_text(Kind::string, read_le<1>());
    case BINUNICODE8: return push_input_text(Kind::string, read_le<8>());
    case BINBYTES: return push_input_text(Kind::bytes, read_le<4>());
    case SHORT_BINBYTES: return push_input_text(Kind::bytes, read_le<1>());
    case BINBYTES8: return push_input_text(Kind::bytes, read_le<8>());
    case BYTEARRAY8: return push_input_text(Kind::bytes, read_le<8>());
    case EMPTY_LIST: return push_node(Kind::list, 0);
    case EMPTY_TUPLE: return push_node(Kind::tuple, 0);
    case EMPTY_DICT: return push_node(Kind::dict, 0);
    case EMPTY_SET: return push_node(Kind::set, 0);
    case LIST: return op_collection(Kind::list);
    case TUPLE: return op_collection(Kind::tuple);
    case DICT: return op_collection(Kind::dict);
    case FROZENSET: return op_collection(Kind::frozenset);
    case TUPLE1: return op_tuple_n(1);
    case TUPLE2: return op_tuple_n(2);
    case TUPLE3: return op_tuple_n(3);
    case APPEND: return op_add_to(Kind::list, false);
    case APPENDS: return op_add_to(Kind::list, true);
    case SETITEM: return op_add_to(Kind::dict, false);
    case SETITEMS: return op_add_to(Kind::dict, true);
    case ADDITEMS: return op_add_to(Kind::set, true);
    case PUT: return op_put(read_memo_key_line());
    case BINPUT: return op_put(read_le<1>());
    case LONG_BINPUT: return op_put(read_le<4>());
    case MEMOIZE: return op_put(memo_.size());
    case GET: return op_get(read_memo_key_line());
    case BINGET: return op_get(read_le<1>());
    case LONG_BINGET: return op_get(read_le<4>());
    default: reject();
  }
}

void Machine::fail_truncated(std::uint64_t count) const {
  fail(fmt::format("truncated pickle: {} needs {} more bytes, only {} left", op_name(), count,
                   size_ - pos_));
}

std::string_view Machine::read_line() {
  const void* newline = std::memchr(data_ + pos_, '\n', size_ - pos_);
  if (newline == nullptr)
    fail(fmt::format("truncated pickle: {} argument has no end of line", op_name()));
  const auto* end = static_cast<const unsigned char*>(newline);
  const std::string_view line(reinterpret_cast<const char*>(data_ + pos_),
                              static_cast<std::size_t>(end - (data_ + pos_)));
  pos_ += line.size() + 1;
  return line;
}

std::uint64_t Machine::read_signed_length32() {
  const auto length = static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le<4>()));
  if (length < 0) fail(fmt::format("{} has a negative length {}", op_name(), length));
  return static_cast<std::uint64_t>(length);
}

void Machine::fail_underflow(std::size_t count) const {
  fail(fmt::format("stack underflow: {} needs {} on the stack{}, found {}", op_name(),
                   values(count), marks_.empty() ? "" : " above the last MARK", above_fence()));
}

std::size_t Machine::pop_mark() {
  if (marks_.empty()) fail(fmt::format("{} needs a MARK, but no MARK is open", op_name()));
  const std::size_t mark = marks_.back();
  marks_.pop_back();
  return mark;
}

/// The container just below stack depth `from`, which must be of `kind`: the list, dict or set
/// that APPEND(S), SETITEM(S) or ADDITEMS add to.
std::uint32_t Machine::container_below(std::size_t from, Kind kind) const {
  if (from <= fence()) {
    fail(fmt::format("stack underflow: {} needs a {} below its MARK, found nothing", op_name(),
                     kind_name(kind)));
  }
  const std::uint32_t container = stack_[from - 1];
  if (out_.nodes[container].kind != kind) {
    fail(fmt::format("{} needs a {} to add to, found {}", op_name(), kind_name(kind),
                     kind_name(out_.nodes[container].kind)));
  }
  return container;
}

std::uint32_t Machine::add_node(Kind kind, std::uint32_t count, std::uint64_t payload,
                                bool in_arena) {
  if (out_.nodes.size() >= max_nodes) fail("too many values: cistern's limit is 4 billion");
  out_.nodes.push_back(Node{kind, in_arena, count, payload});
  return static_cast<std::uint32_t>(out_.nodes.size() - 1);
}

/// Moves every value above stack depth `from` into `parent`, in stack order.
void Machine::add_children(std::uint32_t parent, std::size_t from) {
  Node& node = out_.nodes[parent];
  const std::size_t added = stack_.size() - from;
  if (added > std::numeric_limits<std::uint32_t>::max() - node.count) {
    fail("a container with more than 4 billion elements");
  }
  std::vector<std::uint32_t>& children = out_.children;
  if (node.count == 0) node.payload = children.size();
  if (node.payload + node.count == children.size()) {
    node.count += static_cast<std::uint32_t>(added);  // still the last range: extend in place
    children.insert(children.end(), stack_.begin() + static_cast<std::ptrdiff_t>(from),
                    stack_.end());
  } else {
    for (std::size_t i = from; i < stack_.size(); ++i) late_.emplace_back(parent, stack_[i]);
  }
  stack_.resize(from);
}

void Machine::finish() {
  // Stable, so each container's late children keep their pickled order.
  std::stable_sort(late_.begin(), late_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::uint32_t>& children = out_.children;
  std::size_t moved = late_.size();
  for (std::size_t i = 0; i < late_.size(); ++i) {
    if (i == 0 || late_[i].first != late_[i - 1].first) moved += out_.nodes[late_[i].first].count;
  }
  children.reserve(children.size() + moved);  // once, so that the copies below stay linear
  for (std::size_t group = 0; group < late_.size();) {
    Node& node = out_.nodes[late_[group].first];
    std::size_t end = group;
    while (end < late_.size() && late_[end].first == late_[group].first) ++end;
    if (end - group > std::numeric_limits<std::uint32_t>::max() - node.count) {
      throw InvalidArgument(
          fmt::format("{}: a container with more than 4 billion elements", out_.name));
    }
    const std::size_t start = children.size();
    for (std::uint32_t slot = 0; slot < node.count; ++slot) {
      const std::uint32_t child = children[node.payload + slot];  // a copy: push_back may move
      children.push_back(child);
    }
    for (std::size_t i = group; i < end; ++i) children.push_back(late_[i].second);
    node.payload = start;
    node.count += static_cast<std::uint32_t>(end - group);
    group = end;
  }
}

void Machine::push_input_text(Kind kind, std::uint64_t length) {
  const std::size_t offset = static_cast<std::size_t>(take(length) - data_);
  if (length > max_string_bytes) {
    fail(fmt::format("{} of {} bytes: cistern's limit is 4 GiB per string", op_name(), length));
  }
  stack_.push_back(add_node(kind, static_cast<std::uint32_t>(length), offset));
}

void Machine::push_arena_text(Kind kind, std::string_view decoded_from, bool unicode) {
  const std::size_t offset = out_.arena.size();
  const char* error = unicode ? unescape_unicode(decoded_from, out_.arena)
                              : unescape_string(decoded_from, out_.arena);
  if (error != nullptr) fail(error);
  const std::size_t length = out_.arena.size() - offset;
  if (length > max_string_bytes) fail(fmt::format("{}: string over 4 GiB", op_name()));
  stack_.push_back(add_node(kind, static_cast<std::uint32_t>(length), offset, true));
}

/// LONG1/LONG4: a little-endian two's-complement integer of `count` bytes.
void Machine::push_long(const unsigned char* bytes, std::uint64_t count) {
  const bool negative = count > 0 && (bytes[count - 1] & 0x80) != 0;
  const unsigned char sign_fill = negative ? 0xff : 0x00;
  std::uint64_t significant = count;  // drop redundant sign-extension bytes
  while (significant > 1 && bytes[significant - 1] == sign_fill &&
         ((bytes[significant - 2] & 0x80) != 0) == negative) {
    --significant;
  }
  if (significant <= 8) {
    std::uint64_t value = negative ? ~std::uint64_t{0} : 0;
    for (std::uint64_t i = significant; i-- > 0;) value = value << 8 | bytes[i];
    return push_node(Kind::integer, value);
  }
  // Too wide: keep the magnitude approximately (two's complement of a negative is ~x + 1).
  double magnitude = 0;
  for (std::uint64_t i = significant; i-- > 0;) {
    magnitude = magnitude * 256 + static_cast<double>(negative ? bytes[i] ^ 0xffu : bytes[i]);
  }
  push_big_integer(negative ? -(magnitude + 1) : magnitude);
}

/// INT and LONG in protocol 0: decimal text; "00" and "01" under INT are False and True.
void Machine::push_decimal(std::string_view text, bool allow_bool) {
  if (allow_bool && (text == "00" || text == "01")) return push_node(Kind::boolean, text == "01");
  if (!allow_bool && !text.empty() && text.back() == 'L') text.remove_suffix(1);
  bool overflow = false;
  if (const auto value = parse_decimal(text, &overflow)) {
    return push_node(Kind::integer, static_cast<std::uint64_t>(*value));
  }
  if (overflow) {
    if (const auto approximate = parse_double(text)) return push_big_integer(*approximate);
  }
  fail(fmt::format("{} argument '{}' is not a decimal integer", op_name(), text.substr(0, 40)));
}

void Machine::op_mark() {
  if (marks_.size() >= limits_.max_depth) {
    fail(fmt::format("more than {} MARKs open: nesting deeper than cistern's limit",
                     limits_.max_depth));
  }
  marks_.push_back(stack_.size());
}

/// POP discards the top value; with nothing above the last MARK it discards the MARK, as
/// Python's unpickler does.
void Machine::op_pop() {
  if (above_fence() > 0) {
    stack_.pop_back();
  } else if (!marks_.empty()) {
    marks_.pop_back();
  } else {
    need(1);
  }
}

void Machine::op_proto() {
  const std::uint64_t protocol = read_le<1>();
  if (protocol > highest_protocol) {
    fail(fmt::format("unsupported pickle protocol {} (cistern reads protocols 0 to {})", protocol,
                     highest_protocol));
  }
}

/// FRAME only announces how many bytes the next opcodes take (for buffered readers); the
/// input is already in memory, so it is checked and otherwise ignored.
void Machine::op_frame() {
  const std::uint64_t length = read_le<8>();
  if (length > size_ - pos_) {
    fail(fmt::format("truncated pickle: FRAME announces {} bytes, only {} left", length,
                     size_ - pos_));
  }
}

/// LIST, TUPLE, DICT, FROZENSET: a new container of everything above the last MARK.
void Machine::op_collection(Kind kind) {
  const std::size_t mark = pop_mark();
  if (kind == Kind::dict && (stack_.size() - mark) % 2 != 0) {
    fail(fmt::format("DICT needs keys and values in pairs, found {}", items(stack_.size() - mark)));
  }
  const std::uint32_t container = add_node(kind, 0, 0);
  add_children(container, mark);
  stack_.push_back(container);
}

void Machine::op_tuple_n(std::uint32_t count) {
  need(count);
  const std::uint32_t tuple = add_node(Kind::tuple, 0, 0);
  add_children(tuple, stack_.size() - count);
  stack_.push_back(tuple);
}

/// APPEND, SETITEM (one element or pair on top of the container) and APPENDS, SETITEMS,
/// ADDITEMS (everything above the last MARK into the container below it).
void Machine::op_add_to(Kind kind, bool to_mark) {
  const std::size_t per_item = kind == Kind::dict ? 2 : 1;
  std::size_t from = 0;
  if (to_mark) {
    from = pop_mark();
  } else {
    need(per_item + 1);
    from = stack_.size() - per_item;
  }
  const std::uint32_t container = container_below(from, kind);
  if ((stack_.size() - from) % per_item != 0) {
    fail(fmt::format("{} needs keys and values in pairs, found {}", op_name(),
                     items(stack_.size() - from)));
  }
  add_children(container, from);
}

void Machine::fail_memo(std::uint64_t key) const {
  fail(fmt::format("{} of memo key {}, which was never stored", op_name(), key));
}

std::uint64_t Machine::read_memo_key_line() {
  const std::string_view text = read_line();
  std::uint64_t key = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), key);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
    fail(fmt::format("{} argument '{}' is not a memo key", op_name(), text.substr(0, 40)));
  }
  return key;
}

void Machine::op_float_text() {
  const std::string_view text = read_line();
  const auto value = parse_double(text);
  if (!value) fail(fmt::format("FLOAT argument '{}' is not a number", text.substr(0, 40)));
  if (std::isinf(*value) && text.find_first_of("iI") == std::string_view::npos) {
    // Python refuses these too (OverflowError); "inf" itself is fine.
    fail(fmt::format("FLOAT argument '{}' is too large for a double", text.substr(0, 40)));
  }
  push_node(Kind::real, bits_of(*value));
}

void Machine::op_string_text() {
  const std::string_view text = read_line();
  if (text.size() < 2 || (text.front() != '\'' && text.front() != '"') ||
      text.back() != text.front()) {
    fail("STRING argument is not a quoted string literal");
  }
  push_arena_text(Kind::string, text.substr(1, text.size() - 2), false);
}

// ---- after STOP: layout and shape checks ----------------------------------------------------

/// How many values the tree may hold with shared references expanded (see Limits).
std::uint64_t expansion_limit(const Limits& limits, std::uint64_t input_bytes) {
  constexpr std::uint64_t floor = std::uint64_t{1} << 20;
  const std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  if (input_bytes != 0 && limits.max_expansion > most / input_bytes) return most;
  return std::max(floor, limits.max_expansion * input_bytes);
}

/// Walks the tree from the root without recursion to reject what would hurt a consumer that
/// walks it naively: cycles, nesting deeper than the limit, and shared references that
/// multiply the tree's size.
class ShapeCheck {
 public:
  ShapeCheck(const Storage& storage, const Limits& limits)
      : storage_(storage),
        limits_(limits),
        max_expanded_(expansion_limit(limits, storage.input.size())),
        expanded_(storage.nodes.size(), 0),
        height_(storage.nodes.size(), 0) {}

  void run();

 private:
  struct Frame {
    std::uint32_t node;
    std::uint32_t next_slot;  ///< the next child to visit
    std::uint64_t expanded;   ///< tree size so far, counting the children visited
    std::uint32_t height;     ///< nesting so far: 1 for a container of scalars
  };
  static constexpr std::uint64_t in_progress = ~std::uint64_t{0};

  bool is_container(std::uint32_t node) const noexcept {
    return storage_.nodes[node].kind >= Kind::list;
  }
  void enter(std::uint32_t node);
  void leave();
  void count_child(Frame& frame, std::uint64_t expanded, std::uint32_t height);
  [[noreturn]] void fail_depth() const;
  [[noreturn]] void fail(std::string_view problem) const;
  std::string path() const;
  std::string step(const Frame& frame) const;

  const Storage& storage_;
  const Limits& limits_;
  std::uint64_t max_expanded_;
  std::vector<std::uint64_t> expanded_;  ///< tree size with references expanded; 0: not seen
  std::vector<std::uint32_t> height_;
  std::vector<Frame> frames_;
};

void ShapeCheck::run() {
  if (!is_container(storage_.root)) return;
  enter(storage_.root);
  while (!frames_.empty()) {
    Frame& frame = frames_.back();
    const Node& node = storage_.nodes[frame.node];
    if (frame.next_slot == node.count) {
      leave();
      continue;
    }
    const std::uint32_t child = storage_.children[node.payload + frame.next_slot++];
    if (!is_container(child)) {
      count_child(frame, 1, 0);
    } else if (expanded_[child] == in_progress) {
      fail("a container contains itself (a recursive structure)");
    } else if (expanded_[child] == 0) {
      enter(child);  // invalidates `frame`
    } else {
      // Seen before through another reference: its sizes are known, only the depth at which it
      // appears here is new.
      if (frames_.size() + height_[child] > limits_.max_depth) fail_depth();
      count_child(frame, expanded_[child], height_[child]);
    }
  }
}

void ShapeCheck::enter(std::uint32_t node) {
  if (frames_.size() >= limits_.max_depth) fail_depth();
  expanded_[node] = in_progress;
  frames_.push_back({node, 0, 1, 1});
}

/// A container is finished: record its sizes and count it in its parent.
void ShapeCheck::leave() {
  const Frame done = frames_.back();
  frames_.pop_back();
  expanded_[done.node] = done.expanded;
  height_[done.node] = done.height;
  if (!frames_.empty()) count_child(frames_.back(), done.expanded, done.height);
}

void ShapeCheck::count_child(Frame& frame, std::uint64_t expanded, std::uint32_t height) {
  frame.expanded += expanded;
  frame.height = std::max(frame.height, height + 1);
  if (frame.expanded > max_expanded_) {
    fail(
        fmt::format("shared references expand this value to more than {} values, {} per "
                    "byte of pickle: refused as a likely memory bomb",
                    max_expanded_, limits_.max_expansion));
  }
}

void ShapeCheck::fail_depth() const {
  fail(fmt::format("containers nested deeper than {} levels", limits_.max_depth));
}

void ShapeCheck::fail(std::string_view problem) const {
  throw InvalidArgument(fmt::format("{}: {}, at {}", storage_.name, problem, path()));
}

/// Where the walk is, as "root[3]['frames'][0]"; long paths keep their two ends.
std::string ShapeCheck::path() const {
  constexpr std::size_t keep = 8;
  std::string text = "root";
  const std::size_t depth = frames_.size();
  for (std::size_t level = 0; level < depth; ++level) {
    if (level == keep && depth > 3 * keep) {
      text += fmt::format("...({} levels)...", depth - 2 * keep);
      level = depth - keep;
    }
    text += step(frames_[level]);
  }
  return text;
}

/// The subscript that leads from a frame's container to the child being visited.
std::string ShapeCheck::step(const Frame& frame) const {
  if (frame.next_slot == 0) return {};  // just entered: no child chosen yet
  const Node& node = storage_.nodes[frame.node];
  const std::uint32_t slot = frame.next_slot - 1;
  if (node.kind != Kind::dict) return fmt::format("[{}]", slot);
  const Node& key = storage_.nodes[storage_.children[node.payload + (slot & ~1u)]];
  if (key.kind != Kind::string) return fmt::format("[<key of pair {}>]", slot / 2);
  const std::string& base = key.in_arena ? storage_.arena : storage_.input;
  const std::string_view text = std::string_view(base).substr(key.payload, key.count);
  return fmt::format("['{}']", text.substr(0, 40));
}

}  // namespace

// ---- public entry points ----------------------------------------------------------------------

std::string_view kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::big_integer: return "int";
    case Kind::real: return "float";
    case Kind::string: return "str";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
    case Kind::set: return "set";
    case Kind::frozenset: return "frozenset";
  }
  return "unknown";
}

Document parse(std::string bytes, std::string name, const Limits& limits) {
  auto storage = std::make_unique<Storage>();
  storage->name = std::move(name);
  storage->input = std::move(bytes);
  {
    Machine machine(*storage, limits);
    machine.run();
    machine.finish();
  }
  ShapeCheck(*storage, limits).run();
  return Document(std::move(storage));
}

Document read_file(const std::string& path, const Limits& limits) {
  return parse(trace::read_file(path), path, limits);
}

Value Document::root() const& noexcept {
  return Value(storage_.get(), storage_->root, detail::no_parent, 0);
}

// ---- describing values for messages -------------------------------------------------------

namespace {

/// Renders a value Python-style into a bounded string; nesting and length are both capped,
/// so the recursion is shallow whatever the value.
class Describer {
 public:
  Describer(const Storage& storage, std::size_t max_chars)
      : storage_(storage), max_chars_(max_chars) {}

  std::string run(std::uint32_t node) && {
    write(node, 0);
    return std::move(out_);
  }

 private:
  static constexpr int max_nesting = 8;

  bool full() const noexcept { return out_.size() >= max_chars_; }
  std::string_view text_of(const Node& node) const noexcept {
    const std::string& base = node.in_arena ? storage_.arena : storage_.input;
    return std::string_view(base).substr(node.payload, node.count);
  }

  void write(std::uint32_t index, int nesting);
  void write_quoted(std::string_view text, bool as_bytes);
  void write_real(double value);
  void write_children(const Node& node, int nesting);

  const Storage& storage_;
  std::size_t max_chars_;
  std::string out_;
};

void Describer::write(std::uint32_t index, int nesting) {
  const Node& node = storage_.nodes[index];
  switch (node.kind) {
    case Kind::none: out_ += "None"; return;
    case Kind::boolean: out_ += node.payload != 0 ? "True" : "False"; return;
    case Kind::integer: out_ += fmt::format("{}", static_cast<std::int64_t>(node.payload)); return;
    case Kind::big_integer: out_ += fmt::format("~{:.6g}", double_of(node.payload)); return;
    case Kind::real: return write_real(double_of(node.payload));
    case Kind::string: return write_quoted(text_of(node), false);
    case Kind::bytes: out_ += 'b'; return write_quoted(text_of(node), true);
    case Kind::list:
      out_ += '[';
      write_children(node, nesting);
      out_ += ']';
      return;
    case Kind::tuple:
      out_ += '(';
      write_children(node, nesting);
      out_ += node.count == 1 ? ",)" : ")";
      return;
    case Kind::dict:
      out_ += '{';
      write_children(node, nesting);
      out_ += '}';
      return;
    case Kind::set:
    case Kind::frozenset:
      if (node.kind == Kind::frozenset) out_ += "frozenset(";
      out_ += node.count == 0 ? (node.kind == Kind::set ? "set(" : "") : "{";
      write_children(node, nesting);
      out_ += node.count == 0 ? ")" : (node.kind == Kind::frozenset ? "})" : "}");
      return;
  }
}

void Describer::write_children(const Node& node, int nesting) {
  const bool dict = node.kind == Kind::dict;
  for (std::uint32_t slot = 0; slot < node.count; ++slot) {
    const bool dict_value = dict && slot % 2 == 1;  // a dict is only cut between pairs
    if (slot > 0) out_ += dict_value ? ": " : ", ";
    if (!dict_value && (full() || nesting >= max_nesting)) {
      out_ += "...";
      return;
    }
    write(storage_.children[node.payload + slot], nesting + 1);
  }
}

/// The shortest text that reads back as `value`, with ".0" on whole numbers as Python writes.
void Describer::write_real(double value) {
  const std::string text = fmt::format("{}", value);
  out_ += text;
  if (text.find_first_of(".eni") == std::string::npos) out_ += ".0";  // not 1e+30, inf, nan
}

void Describer::write_quoted(std::string_view text, bool as_bytes) {
  const std::size_t room = max_chars_ > out_.size() ? max_chars_ - out_.size() : 0;
  std::size_t shown = std::min(text.size(), std::max<std::size_t>(room, 8));
  while (shown > 0 && shown < text.size() &&
         (static_cast<unsigned char>(text[shown]) & 0xc0) == 0x80) {
    --shown;  // do not cut a UTF-8 sequence in two
  }
  out_ += '\'';
  for (const char c : text.substr(0, shown)) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\'' || c == '\\') {
      out_ += '\\';
      out_ += c;
    } else if (byte < 0x20 || byte == 0x7f || (as_bytes && byte >= 0x80)) {
      out_ += fmt::format("\\x{:02x}", byte);
    } else {
      out_ += c;
    }
  }
  out_ += shown < text.size() ? "...'" : "'";
}

}  // namespace

// ---- Value ------------------------------------------------------------------------------------

bool Value::is_number() const noexcept {
  const Kind k = kind();
  return k == Kind::integer || k == Kind::big_integer || k == Kind::real;
}

bool Value::is_sequence() const noexcept {
  const Kind k = kind();
  return k == Kind::list || k == Kind::tuple || k == Kind::set || k == Kind::frozenset;
}

Value Value::child(std::uint32_t slot) const noexcept {
  return Value(storage_, storage_->children[node().payload + slot], node_, slot);
}

std::string Value::where() const {
  if (parent_ == detail::no_parent) return {};
  const Value parent(storage_, parent_, detail::no_parent, 0);
  if (!parent.is_dict()) return fmt::format(" at index {} of {}", slot_, parent.describe(60));
  if (slot_ % 2 == 0) return fmt::format(" for a key of {}", parent.describe(60));
  return fmt::format(" for key {} in {}", parent.child(slot_ - 1).describe(40),
                     parent.describe(60));
}

void Value::fail_expected(std::string_view expected) const {
  throw InvalidArgument(fmt::format("{}: expected {}{}, got {} {}", storage_->name, expected,
                                    where(), type_name(), describe(40)));
}

void Value::require(Kind wanted) const {
  if (kind() != wanted) fail_expected(kind_name(wanted));
}

bool Value::as_bool() const {
  require(Kind::boolean);
  return node().payload != 0;
}

std::int64_t Value::as_int() const {
  if (kind() == Kind::big_integer) {
    throw InvalidArgument(fmt::format("{}: int{} does not fit in 64 bits: about {:.6g}",
                                      storage_->name, where(), double_of(node().payload)));
  }
  require(Kind::integer);
  return static_cast<std::int64_t>(node().payload);
}

double Value::as_double() const {
  switch (kind()) {
    case Kind::integer: return static_cast<double>(static_cast<std::int64_t>(node().payload));
    case Kind::big_integer:
    case Kind::real: return double_of(node().payload);
    default: fail_expected("a number");
  }
}

std::string_view Value::as_string() const {
  require(Kind::string);
  return as_bytes();
}

std::string_view Value::as_bytes() const {
  if (kind() != Kind::string && kind() != Kind::bytes) fail_expected("bytes or str");
  const std::string& base = node().in_arena ? storage_->arena : storage_->input;
  return std::string_view(base).substr(node().payload, node().count);
}

std::size_t Value::size() const {
  if (is_dict()) return node().count / 2;
  if (!is_sequence()) fail_expected("a list, tuple, set or dict");
  return node().count;
}

Value Value::operator[](std::size_t index) const {
  if (!is_sequence()) fail_expected("a list, tuple or set");
  if (index >= node().count) {
    throw InvalidArgument(fmt::format("{}: index {} out of range for a {} of {}{}", storage_->name,
                                      index, type_name(), node().count, where()));
  }
  return child(static_cast<std::uint32_t>(index));
}

std::optional<Value> Value::find(std::string_view wanted) const {
  require(Kind::dict);
  for (std::uint32_t slot = node().count; slot >= 2; slot -= 2) {
    const Value candidate = child(slot - 2);
    if (candidate.is_string() && candidate.as_bytes() == wanted) return child(slot - 1);
  }
  return std::nullopt;
}

Value Value::at(std::string_view wanted) const {
  if (auto found = find(wanted)) return *found;
  throw InvalidArgument(
      fmt::format("{}: missing key '{}' in {}{}", storage_->name, wanted, describe(60), where()));
}

Value Value::key(std::size_t index) const {
  require(Kind::dict);
  if (index >= size()) {
    throw InvalidArgument(fmt::format("{}: pair {} out of range for a dict of {}{}", storage_->name,
                                      index, size(), where()));
  }
  return child(static_cast<std::uint32_t>(2 * index));
}

Value Value::value(std::size_t index) const {
  const Value found_key = key(index);
  return child(found_key.slot_ + 1);
}

Value::Iterator Value::begin() const {
  if (!is_sequence()) fail_expected("a list, tuple or set (iterate a dict with items())");
  return Iterator(*this, 0);
}

Value::Iterator Value::end() const {
  if (!is_sequence()) fail_expected("a list, tuple or set (iterate a dict with items())");
  return Iterator(*this, node().count);
}

Value::Range<Value::ItemIterator> Value::items() const {
  require(Kind::dict);
  return {ItemIterator(*this, 0), ItemIterator(*this, node().count)};
}

std::string Value::describe(std::size_t max_chars) const {
  return Describer(*storage_, max_chars).run(node_);
}

}  // namespace cistern::trace::pickle
