// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The safe pickle reader. Most pickles here are assembled opcode by opcode so that each test
// states exactly what it feeds in; the expected values were checked against Python's own
// `pickle.loads` when the tests were written. The last tests read the real PyTorch snapshots.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cistern/errors.hpp"
#include "support/trace_sizes.hpp"
#include "trace/input.hpp"
#include "trace/pickle.hpp"

namespace {

namespace pickle = cistern::trace::pickle;
using cistern::InvalidArgument;
using pickle::Kind;

// ---- building pickles -----------------------------------------------------------------------

/// Assembles pickle bytes: opcodes and their little-endian arguments.
class Bytes {
 public:
  Bytes& op(unsigned char opcode) { return raw(std::string(1, static_cast<char>(opcode))); }
  Bytes& u8(std::uint64_t value) { return le(value, 1); }
  Bytes& u16(std::uint64_t value) { return le(value, 2); }
  Bytes& u32(std::uint64_t value) { return le(value, 4); }
  Bytes& u64(std::uint64_t value) { return le(value, 8); }
  Bytes& raw(std::string_view text) {
    bytes_ += text;
    return *this;
  }
  /// A text argument of protocol 0: the text and a newline.
  Bytes& line(std::string_view text) { return raw(text).raw("\n"); }
  /// SHORT_BINUNICODE: the usual way short strings are pickled.
  Bytes& str(std::string_view text) { return op(0x8c).u8(text.size()).raw(text); }
  Bytes& small_int(std::uint64_t value) { return op(0x4b).u8(value); }  // BININT1
  Bytes& stop() { return op(0x2e); }
  const std::string& bytes() const { return bytes_; }
  operator std::string() const { return bytes_; }  // NOLINT(google-explicit-constructor)

 private:
  Bytes& le(std::uint64_t value, int width) {
    for (int i = 0; i < width; ++i) bytes_ += static_cast<char>((value >> (8 * i)) & 0xff);
    return *this;
  }
  std::string bytes_;
};

// Opcode bytes used below (CPython's pickle protocol values).
constexpr unsigned char MARK = 0x28, EMPTY_TUPLE = 0x29, STOP = 0x2e, POP = 0x30, POP_MARK = 0x31,
                        DUP = 0x32, BINBYTES = 0x42, SHORT_BINBYTES = 0x43, FLOAT = 0x46,
                        BINFLOAT = 0x47, INT = 0x49, BININT = 0x4a, BININT1 = 0x4b, LONG = 0x4c,
                        BININT2 = 0x4d, NONE = 0x4e, STRING = 0x53, BINSTRING = 0x54,
                        SHORT_BINSTRING = 0x55, UNICODE = 0x56, BINUNICODE = 0x58,
                        EMPTY_LIST = 0x5d, APPEND = 0x61, DICT = 0x64, APPENDS = 0x65, GET = 0x67,
                        BINGET = 0x68, LONG_BINGET = 0x6a, LIST = 0x6c, PUT = 0x70, BINPUT = 0x71,
                        LONG_BINPUT = 0x72, SETITEM = 0x73, TUPLE = 0x74, SETITEMS = 0x75,
                        EMPTY_DICT = 0x7d, PROTO = 0x80, TUPLE1 = 0x85, TUPLE2 = 0x86,
                        TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b,
                        SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e,
                        EMPTY_SET = 0x8f, ADDITEMS = 0x90, FROZENSET = 0x91, MEMOIZE = 0x94,
                        FRAME = 0x95, BYTEARRAY8 = 0x96;

const std::vector<unsigned char>& accepted_opcodes() {
  // clang-format off
  static const std::vector<unsigned char> opcodes = {
      MARK, EMPTY_TUPLE, STOP, POP, POP_MARK, DUP, BINBYTES, SHORT_BINBYTES, FLOAT, BINFLOAT,
      INT, BININT, BININT1, LONG, BININT2, NONE, STRING, BINSTRING, SHORT_BINSTRING, UNICODE,
      BINUNICODE, EMPTY_LIST, APPEND, DICT, APPENDS, GET, BINGET, LONG_BINGET, LIST, PUT,
      BINPUT, LONG_BINPUT, SETITEM, TUPLE, SETITEMS, EMPTY_DICT, PROTO, TUPLE1, TUPLE2, TUPLE3,
      NEWTRUE, NEWFALSE, LONG1, LONG4, SHORT_BINUNICODE, BINUNICODE8, BINBYTES8, EMPTY_SET,
      ADDITEMS, FROZENSET, MEMOIZE, FRAME, BYTEARRAY8};
  // clang-format on
  return opcodes;
}

struct Forbidden {
  const char* name;
  unsigned char byte;
  const char* why;
};

const std::vector<Forbidden>& forbidden_opcodes() {
  static const char* imports = "it would import a global";
  static const char* calls = "it would call a function";
  static const char* persistent = "it would ask the application for a persistent object";
  static const char* extension = "it would import a global from the extension registry";
  static const char* buffer = "it would read an out-of-band buffer";
  static const std::vector<Forbidden> opcodes = {
      {"GLOBAL", 0x63, imports},        {"STACK_GLOBAL", 0x93, imports},
      {"INST", 0x69, imports},          {"REDUCE", 0x52, calls},
      {"BUILD", 0x62, calls},           {"OBJ", 0x6f, calls},
      {"NEWOBJ", 0x81, calls},          {"NEWOBJ_EX", 0x92, calls},
      {"EXT1", 0x82, extension},        {"EXT2", 0x83, extension},
      {"EXT4", 0x84, extension},        {"PERSID", 0x50, persistent},
      {"BINPERSID", 0x51, persistent},  {"NEXT_BUFFER", 0x97, buffer},
      {"READONLY_BUFFER", 0x98, buffer}};
  return opcodes;
}

::testing::AssertionResult contains(const std::string& text, std::string_view part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

::testing::AssertionResult starts_with(const std::string& text, std::string_view prefix) {
  if (text.compare(0, prefix.size(), prefix) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not start with '" << prefix << "'";
}

std::string from_hex(std::string_view hex) {
  std::string bytes;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes += static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16));
  }
  return bytes;
}

pickle::Document parse(const std::string& bytes, const pickle::Limits& limits = {}) {
  return pickle::parse(bytes, "t.pickle", limits);
}

/// The message of the error that parsing `bytes` raises, or "parsed" if it parses.
std::string parse_error(const std::string& bytes, const pickle::Limits& limits = {}) {
  try {
    parse(bytes, limits);
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "parsed";
}

/// The message of the error that `action` raises, or "no error".
template <class Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "no error";
}

std::string describe(const std::string& bytes) {
  const pickle::Document document = parse(bytes);
  return document.root().describe(10000);
}

// The pickles below are written one opcode and its arguments per call, several to a line,
// as Python's pickletools would print them: the layout is the point, so it is kept by hand.
// clang-format off
// ---- every accepted opcode ------------------------------------------------------------------

TEST(PickleScalars, EveryScalarOpcodeBuildsItsValue) {
  const std::string bytes = Bytes()
                                .op(PROTO).u8(5)
                                .op(MARK)
                                .op(NONE).op(NEWTRUE).op(NEWFALSE)
                                .op(INT).line("42").op(INT).line("-7").op(INT).line("00").op(INT).line("01")
                                .op(BININT).u32(0xfffffffe).op(BININT1).u8(255).op(BININT2).u16(65535)
                                .op(LONG).line("123L").op(LONG).line("-5")
                                .op(LONG1).u8(0).op(LONG1).u8(1).u8(0xff).op(LONG1).u8(2).u16(0x8000)
                                .op(LONG1).u8(8).u64(0x7fffffffffffffff).op(LONG4).u32(1).u8(0x80)
                                .op(FLOAT).line("1.5").op(FLOAT).line("-inf")
                                .op(BINFLOAT).raw(from_hex("3ff8000000000000"))
                                .op(LIST)
                                .stop();
  const pickle::Document document = parse(bytes);
  const pickle::Value list = document.root();
  ASSERT_TRUE(list.is_list());
  EXPECT_EQ(list.describe(1000),
            "[None, True, False, 42, -7, False, True, -2, 255, 65535, 123, -5, 0, -1, -32768, "
            "9223372036854775807, -128, 1.5, -inf, 1.5]");
  EXPECT_TRUE(list[0].is_none());
  EXPECT_TRUE(list[1].as_bool());
  EXPECT_FALSE(list[2].as_bool());
  EXPECT_EQ(list[3].as_int(), 42);
  EXPECT_EQ(list[5].kind(), Kind::boolean);  // INT "00" is False, as in Python
  EXPECT_EQ(list[7].as_int(), -2);
  EXPECT_EQ(list[15].as_int(), INT64_MAX);
  EXPECT_EQ(list[17].as_double(), 1.5);
  EXPECT_EQ(list[17].kind(), Kind::real);
  EXPECT_EQ(list[19].as_double(), 1.5);
  EXPECT_EQ(list[9].as_double(), 65535.0);  // ints convert to double
}

TEST(PickleScalars, FloatsReadAsPythonReadsThem) {
  const std::string bytes = Bytes()
                                .op(MARK)
                                .op(FLOAT).line("2").op(FLOAT).line("1e-400").op(FLOAT).line("-inf")
                                .op(FLOAT).line("0.000e5").op(FLOAT).line("nan").op(FLOAT).line("1e16")
                                .op(BINFLOAT).raw(from_hex("c05ec00000000000"))
                                .op(LIST)
                                .stop();
  const pickle::Document document = parse(bytes);
  EXPECT_EQ(document.root().describe(1000), "[2.0, 0.0, -inf, 0.0, nan, 1e+16, -123.0]");
  EXPECT_EQ(document.root()[6].as_double(), -123.0);
  // Like Python, a FLOAT too large for a double is refused rather than read as infinity.
  EXPECT_EQ(parse_error(Bytes().op(FLOAT).line("-1e400").stop()),
            "t.pickle: offset 0: FLOAT argument '-1e400' is too large for a double");
}

TEST(PickleScalars, IntsBeyond64BitsKeepAnApproximateValue) {
  const std::string bytes = Bytes()
                                .op(MARK)
                                .op(LONG1).u8(9).u64(0).u8(1)  // 2**64
                                .op(LONG).line("-123456789012345678901234567890L")
                                .op(LONG1).u8(9).u64(0xffffffffffffffff).u8(0xff)  // -1, sign-padded
                                .op(LIST)
                                .stop();
  const pickle::Document document = parse(bytes);
  const pickle::Value list = document.root();
  EXPECT_EQ(list[0].kind(), Kind::big_integer);
  EXPECT_EQ(list[0].type_name(), "int");
  EXPECT_FALSE(list[0].is_int());
  EXPECT_TRUE(list[0].is_number());
  EXPECT_EQ(list[0].as_double(), 18446744073709551616.0);
  EXPECT_DOUBLE_EQ(list[1].as_double(), -1.2345678901234568e29);
  EXPECT_EQ(list[2].as_int(), -1);
  EXPECT_EQ(error_of([&] { list[0].as_int(); }),
            "t.pickle: int at index 0 of [~1.84467e+19, ~-1.23457e+29, -1] does not fit in 64 "
            "bits: about 1.84467e+19");
}

TEST(PickleStrings, EveryTextAndBytesOpcodeBuildsItsValue) {
  const std::string bytes =
      Bytes()
          .op(MARK)
          .op(STRING).line(R"('a\n\x41\'b\q')")
          .op(STRING).line(R"("q")")
          .op(BINSTRING).u32(3).raw("abc")
          .op(SHORT_BINSTRING).u8(2).raw("hi")
          .op(UNICODE).line("caf\xe9\\u20ac\\U0001f600\\\\u")
          .op(BINUNICODE).u32(2).raw("\xc3\xa9")
          .op(SHORT_BINUNICODE).u8(1).raw("x")
          .op(BINUNICODE8).u64(3).raw("abc")
          .op(BINBYTES).u32(2).raw(std::string("\0\xff", 2))
          .op(SHORT_BINBYTES).u8(1).raw("z")
          .op(BINBYTES8).u64(1).raw("y")
          .op(BYTEARRAY8).u64(2).raw("ba")
          .op(LIST)
          .stop();
  const pickle::Document document = parse(bytes);
  const pickle::Value list = document.root();
  ASSERT_EQ(list.size(), 12u);
  EXPECT_EQ(list[0].as_string(), "a\nA'b\\q");
  EXPECT_EQ(list[1].as_string(), "q");
  EXPECT_EQ(list[2].as_string(), "abc");  // Python 2 str reads as text
  EXPECT_EQ(list[3].as_string(), "hi");
  EXPECT_EQ(list[4].as_string(), "caf\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\\\\u");
  EXPECT_EQ(list[5].as_string(), "\xc3\xa9");
  EXPECT_EQ(list[6].as_string(), "x");
  EXPECT_EQ(list[7].as_string(), "abc");
  EXPECT_EQ(list[8].as_bytes(), std::string_view("\0\xff", 2));
  EXPECT_EQ(list[8].kind(), Kind::bytes);
  EXPECT_EQ(list[9].as_bytes(), "z");
  EXPECT_EQ(list[10].as_bytes(), "y");
  EXPECT_EQ(list[11].as_bytes(), "ba");  // bytearray reads as bytes
  EXPECT_EQ(list[11].kind(), Kind::bytes);
  EXPECT_EQ(list[0].as_bytes(), "a\nA'b\\q");  // as_bytes accepts text too
  EXPECT_EQ(list.describe(1000),
            "['a\\x0aA\\'b\\\\q', 'q', 'abc', 'hi', 'caf\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\\\\\\\\u', "
            "'\xc3\xa9', 'x', 'abc', b'\\x00\\xff', b'z', b'y', b'ba']");
}

TEST(PickleContainers, ListOpcodes) {
  const std::string bytes = Bytes()
                                .op(MARK)
                                .op(EMPTY_LIST)
                                .op(EMPTY_LIST).small_int(1).op(APPEND)
                                .op(EMPTY_LIST).op(MARK).small_int(2).small_int(3).op(APPENDS)
                                .op(EMPTY_LIST).op(MARK).op(APPENDS)
                                .op(MARK).small_int(4).small_int(5).op(LIST)
                                .op(LIST)
                                .stop();
  EXPECT_EQ(describe(bytes), "[[], [1], [2, 3], [], [4, 5]]");
}

TEST(PickleContainers, TupleOpcodes) {
  const std::string bytes = Bytes()
                                .op(MARK)
                                .op(EMPTY_TUPLE)
                                .small_int(1).op(TUPLE1)
                                .small_int(1).small_int(2).op(TUPLE2)
                                .small_int(1).small_int(2).small_int(3).op(TUPLE3)
                                .op(MARK).small_int(4).small_int(5).small_int(6).small_int(7).op(TUPLE)
                                .op(TUPLE)
                                .stop();
  const pickle::Document document = parse(bytes);
  const pickle::Value tuple = document.root();
  EXPECT_TRUE(tuple.is_tuple());
  EXPECT_EQ(tuple.describe(1000), "((), (1,), (1, 2), (1, 2, 3), (4, 5, 6, 7))");
  EXPECT_EQ(tuple[4][3].as_int(), 7);
}

TEST(PickleContainers, DictOpcodes) {
  const std::string bytes = Bytes()
                                .op(MARK)
                                .op(EMPTY_DICT)
                                .op(EMPTY_DICT).str("a").small_int(1).op(SETITEM)
                                .op(EMPTY_DICT).op(MARK).str("b").small_int(2).str("c").op(NONE).op(SETITEMS)
                                .op(MARK).small_int(7).op(EMPTY_TUPLE).str("d").op(NEWTRUE).op(DICT)
                                .op(LIST)
                                .stop();
  const pickle::Document document = parse(bytes);
  const pickle::Value list = document.root();
  EXPECT_EQ(list.describe(1000), "[{}, {'a': 1}, {'b': 2, 'c': None}, {7: (), 'd': True}]");
  EXPECT_EQ(list[2].size(), 2u);
  EXPECT_EQ(list[2].at("b").as_int(), 2);
  EXPECT_TRUE(list[2].at("c").is_none());
  EXPECT_EQ(list[3].key(0).as_int(), 7);  // non-string keys are kept
  EXPECT_FALSE(list[3].find("7").has_value());
  EXPECT_TRUE(list[3].at("d").as_bool());
}

TEST(PickleContainers, SetOpcodes) {
  const std::string bytes = Bytes()
                                .op(MARK)
                                .op(EMPTY_SET)
                                .op(EMPTY_SET).op(MARK).small_int(1).small_int(2).op(ADDITEMS)
                                .op(MARK).small_int(3).op(FROZENSET)
                                .op(MARK).op(FROZENSET)
                                .op(LIST)
                                .stop();
  const pickle::Document document = parse(bytes);
  const pickle::Value list = document.root();
  EXPECT_EQ(list.describe(1000), "[set(), {1, 2}, frozenset({3}), frozenset()]");
  EXPECT_EQ(list[1].kind(), Kind::set);
  EXPECT_EQ(list[2].kind(), Kind::frozenset);
  EXPECT_TRUE(list[2].is_set());
  EXPECT_EQ(list[1][1].as_int(), 2);
}

TEST(PickleStack, MarkPopPopMarkDup) {
  // POP with nothing above the last MARK discards the MARK, as Python's unpickler does.
  EXPECT_EQ(describe(Bytes().small_int(1).op(MARK).op(POP).small_int(2).op(TUPLE2).stop()), "(1, 2)");
  EXPECT_EQ(describe(Bytes().small_int(1).small_int(9).op(POP).op(TUPLE1).stop()), "(1,)");
  EXPECT_EQ(describe(Bytes().small_int(1).op(MARK).small_int(2).small_int(3).op(POP_MARK).stop()), "1");
  const pickle::Document dup = parse(Bytes().op(EMPTY_LIST).op(DUP).op(TUPLE2).stop());
  EXPECT_TRUE(dup.root()[0].same_object(dup.root()[1]));
}

TEST(PickleStack, ProtoFrameAndTrailingBytes) {
  Bytes framed;
  framed.op(PROTO).u8(4).op(FRAME).u64(2).op(NONE).stop();
  EXPECT_EQ(describe(framed), "None");
  // pickle.loads would ignore bytes after STOP; a snapshot file holds one pickle, so they are
  // refused, with the offset where they start.
  EXPECT_EQ(parse_error(Bytes().op(NONE).stop().raw("garbage")),
            "t.pickle: offset 2: 7 bytes of data after the pickle's STOP");
  EXPECT_EQ(parse_error(Bytes().op(PROTO).u8(6).op(NONE).stop()),
            "t.pickle: offset 0: unsupported pickle protocol 6 (cistern reads protocols 0 to 5)");
  EXPECT_EQ(parse_error(Bytes().op(FRAME).u64(100).op(NONE).stop()),
            "t.pickle: offset 0: truncated pickle: FRAME announces 100 bytes, only 2 left");
}

TEST(PickleMemo, PutGetInAllWidths) {
  const std::string bytes = Bytes()
                                .op(MARK)
                                .small_int(10).op(PUT).line("0")
                                .small_int(11).op(BINPUT).u8(1)
                                .small_int(12).op(LONG_BINPUT).u32(70000)       // beyond the dense table
                                .small_int(13).op(LONG_BINPUT).u32(0xffffffff)  // and far beyond
                                .op(GET).line("0").op(BINGET).u8(1)
                                .op(LONG_BINGET).u32(70000).op(LONG_BINGET).u32(0xffffffff)
                                .op(LIST)
                                .stop();
  EXPECT_EQ(describe(bytes), "[10, 11, 12, 13, 10, 11, 12, 13]");
}

TEST(PickleMemo, MemoizeStoresAtTheNumberOfEntries) {
  // BINPUT 5 makes one entry, so MEMOIZE stores at key 1 (Python: memo[len(memo)]).
  const std::string bytes = Bytes()
                                .op(PROTO).u8(4)
                                .op(MARK).small_int(10).op(BINPUT).u8(5).small_int(11).op(MEMOIZE)
                                .op(BINGET).u8(1).op(BINGET).u8(5).op(LIST)
                                .stop();
  EXPECT_EQ(describe(bytes), "[10, 11, 11, 10]");
}

TEST(PickleMemo, AMemoizedListAppendedToLaterIsOneObjectEverywhere) {
  // outer = []; inner = [1]; outer.append(inner); outer.append(inner); inner.append(2)
  const std::string bytes = Bytes()
                                .op(PROTO).u8(2)
                                .op(EMPTY_LIST).op(BINPUT).u8(0)
                                .op(EMPTY_LIST).op(BINPUT).u8(1).small_int(1).op(APPEND)
                                .op(APPEND)
                                .op(BINGET).u8(1).op(APPEND)
                                .op(BINGET).u8(1).small_int(2).op(APPEND)
                                .op(POP)
                                .stop();
  const pickle::Document document = parse(bytes);
  const pickle::Value outer = document.root();
  EXPECT_EQ(outer.describe(), "[[1, 2], [1, 2]]");
  EXPECT_TRUE(outer[0].same_object(outer[1]));
  EXPECT_FALSE(outer.same_object(outer[0]));
  EXPECT_EQ(outer[1].size(), 2u);
}

TEST(PickleMemo, ContainersGrowingInManyPlacesKeepTheirOrder) {
  // Two memoized containers filled alternately, as a pickler's 1000-item APPENDS batches are.
  Bytes bytes;
  bytes.op(EMPTY_LIST).op(BINPUT).u8(0).op(EMPTY_DICT).op(BINPUT).u8(1).op(TUPLE2).op(POP);
  for (int batch = 0; batch < 3; ++batch) {
    bytes.op(BINGET).u8(0).op(MARK).small_int(2 * batch).small_int(2 * batch + 1).op(APPENDS).op(POP);
    bytes.op(BINGET).u8(1).str(std::to_string(batch)).op(EMPTY_LIST).op(SETITEM).op(POP);
  }
  bytes.op(BINGET).u8(0).op(BINGET).u8(1).op(TUPLE2).stop();
  EXPECT_EQ(describe(bytes), "([0, 1, 2, 3, 4, 5], {'0': [], '1': [], '2': []})");
}

TEST(PickleMemo, PicklesWrittenByPythonInEveryProtocolReadTheSame) {
  // v = {'a': [1, -2, 3.5, None, True, False, 70000, -129], 'b': ('café€\\u', ''),
  //      'big': 2**70, 'neg': -2**40, 'nested': {'k': [[]], 7: ()}}; v['shared'] = v['a']
  // pickle.dumps(v, protocol=p).hex() for p = 0 .. 5 (Python 3.11).
  const char* hex_by_protocol[] = {
      "286470300a56610a70310a286c70320a49310a61492d320a6146332e350a614e614930310a614930300a61493730"
      "3030300a61492d3132390a617356620a70330a2856636166e95c75323061635c7530303563750a70340a560a7035"
      "0a7470360a73566269670a70370a4c313138303539313632303731373431313330333432344c0a73566e65670a70"
      "380a4c2d313039393531313632373737364c0a73566e65737465640a70390a28647031300a566b0a7031310a286c"
      "7031320a286c7031330a617349370a28747373567368617265640a7031340a67320a732e",
      "7d71002858010000006171015d7102284b014afeffffff47400c0000000000004e4930310a4930300a4a70110100"
      "4a7fffffff65580100000062710328580a000000636166c3a9e282ac5c757104580000000071057471065803000000"
      "62696771074c313138303539313632303731373431313330333432344c0a58030000006e656771084c2d31303939"
      "3531313632373737364c0a58060000006e657374656471097d710a2858010000006b710b5d710c5d710d614b0729"
      "755806000000736861726564710e6802752e",
      "80027d71002858010000006171015d7102284b014afeffffff47400c0000000000004e88894a701101004a7fffff"
      "ff655801000000627103580a000000636166c3a9e282ac5c75710458000000007105867106580300000062696771"
      "078a0900000000000000004058030000006e656771088a060000000000ff58060000006e657374656471097d710a"
      "2858010000006b710b5d710c5d710d614b0729755806000000736861726564710e6802752e",
      "80037d71002858010000006171015d7102284b014afeffffff47400c0000000000004e88894a701101004a7fffff"
      "ff655801000000627103580a000000636166c3a9e282ac5c75710458000000007105867106580300000062696771"
      "078a0900000000000000004058030000006e656771088a060000000000ff58060000006e657374656471097d710a"
      "2858010000006b710b5d710c5d710d614b0729755806000000736861726564710e6802752e",
      "80049583000000000000007d94288c0161945d94284b014afeffffff47400c0000000000004e88894a701101004a"
      "7fffffff658c0162948c0a636166c3a9e282ac5c75948c009486948c03626967948a090000000000000000408c03"
      "6e6567948a060000000000ff8c066e6573746564947d94288c016b945d945d94614b0729758c0673686172656494"
      "6802752e",
      "80059583000000000000007d94288c0161945d94284b014afeffffff47400c0000000000004e88894a701101004a"
      "7fffffff658c0162948c0a636166c3a9e282ac5c75948c009486948c03626967948a090000000000000000408c03"
      "6e6567948a060000000000ff8c066e6573746564947d94288c016b945d945d94614b0729758c0673686172656494"
      "6802752e",
  };
  for (int protocol = 0; protocol <= 5; ++protocol) {
    SCOPED_TRACE(fmt::format("protocol {}", protocol));
    const pickle::Document document = parse(from_hex(hex_by_protocol[protocol]));
    const pickle::Value root = document.root();
    EXPECT_EQ(root.describe(1000),
              "{'a': [1, -2, 3.5, None, True, False, 70000, -129], "
              "'b': ('caf\xc3\xa9\xe2\x82\xac\\\\u', ''), 'big': ~1.18059e+21, "
              "'neg': -1099511627776, 'nested': {'k': [[]], 7: ()}, "
              "'shared': [1, -2, 3.5, None, True, False, 70000, -129]}");
    EXPECT_TRUE(root.at("a").same_object(root.at("shared")));
    EXPECT_EQ(root.at("big").as_double(), 1180591620717411303424.0);
  }
}

TEST(PickleMemo, PythonPickleOfSetsBytesAndBytearray) {
  // pickle.dumps({'bytes': b'xy\0', 'set': {1}, 'fs': frozenset({2}), 'ba': bytearray(b'q')}, 5)
  const std::string protocol5 = from_hex(
      "80059539000000000000007d94288c056279746573944303787900948c03736574948f94284b01908c02667394"
      "284b0291948c026261949601000000000000007194752e");
  EXPECT_EQ(describe(protocol5), "{'bytes': b'xy\\x00', 'set': {1}, 'fs': frozenset({2}), 'ba': b'q'}");
  // The same in protocol 4 rebuilds the bytearray by calling builtins.bytearray: refused.
  const std::string protocol4 = from_hex(
      "8004954f000000000000007d94288c056279746573944303787900948c03736574948f94284b01908c02667394"
      "284b0291948c026261948c086275696c74696e73948c096279746561727261799493944301719485945294752e");
  EXPECT_EQ(parse_error(protocol4),
            "t.pickle: offset 78: forbidden pickle opcode STACK_GLOBAL (0x93): it would import a "
            "global; cistern reads only plain data");
}

// ---- refused opcodes --------------------------------------------------------------------------

TEST(PickleRefusal, EveryForbiddenOpcodeIsNamed) {
  for (const Forbidden& forbidden : forbidden_opcodes()) {
    SCOPED_TRACE(forbidden.name);
    // Arguments follow so that the opcode would have what it needs: it must be refused first.
    const std::string bytes = Bytes().op(PROTO).u8(2).op(forbidden.byte).raw("x y\n\n").op(NONE).stop();
    EXPECT_EQ(parse_error(bytes),
              fmt::format("t.pickle: offset 2: forbidden pickle opcode {} (0x{:02x}): {}; cistern "
                          "reads only plain data",
                          forbidden.name, forbidden.byte, forbidden.why));
  }
  EXPECT_EQ(parse_error(Bytes().op(NONE).op(0x52).stop()),
            "t.pickle: offset 1: forbidden pickle opcode REDUCE (0x52): it would call a function; "
            "cistern reads only plain data");
}

TEST(PickleRefusal, EveryUnknownByteIsRefused) {
  const auto& accepted = accepted_opcodes();
  int unknown = 0;
  for (int byte = 0; byte < 256; ++byte) {
    const auto opcode = static_cast<unsigned char>(byte);
    const bool known =
        std::find(accepted.begin(), accepted.end(), opcode) != accepted.end() ||
        std::any_of(forbidden_opcodes().begin(), forbidden_opcodes().end(),
                    [&](const Forbidden& forbidden) { return forbidden.byte == opcode; });
    const std::string error = parse_error(Bytes().op(NONE).op(opcode).stop());
    if (known) {
      EXPECT_FALSE(contains(error, "unknown pickle opcode")) << byte;
      continue;
    }
    ++unknown;
    EXPECT_EQ(error, fmt::format("t.pickle: offset 1: unknown pickle opcode 0x{:02x}: not a pickle, "
                                 "or a protocol newer than 5",
                                 byte));
  }
  EXPECT_EQ(unknown, 256 - 53 - 15);
}

// ---- malformed pickles ------------------------------------------------------------------------

/// A pickle that uses every accepted opcode that takes an argument, and most others.
std::string every_opcode_pickle() {
  return Bytes()
      .op(PROTO).u8(5).op(FRAME).u64(0)
      .op(MARK)
      .op(NONE).op(NEWTRUE).op(NEWFALSE).op(INT).line("42").op(BININT).u32(7).op(BININT1).u8(1)
      .op(BININT2).u16(2).op(LONG).line("5L").op(LONG1).u8(1).u8(3).op(LONG4).u32(1).u8(4)
      .op(FLOAT).line("2.5").op(BINFLOAT).raw(from_hex("3ff8000000000000"))
      .op(STRING).line("'s'").op(BINSTRING).u32(1).raw("t").op(SHORT_BINSTRING).u8(1).raw("u")
      .op(UNICODE).line("v").op(BINUNICODE).u32(1).raw("w").op(SHORT_BINUNICODE).u8(1).raw("x")
      .op(BINUNICODE8).u64(1).raw("y").op(BINBYTES).u32(1).raw("z").op(SHORT_BINBYTES).u8(1).raw("a")
      .op(BINBYTES8).u64(1).raw("b").op(BYTEARRAY8).u64(1).raw("c")
      .op(EMPTY_LIST).op(PUT).line("0").op(BINPUT).u8(1).op(LONG_BINPUT).u32(2).op(MEMOIZE).op(POP)
      .op(GET).line("0").op(EMPTY_LIST).op(DUP).op(POP).op(APPEND)
      .op(BINGET).u8(1).op(LONG_BINGET).u32(3).op(POP).op(POP)
      .op(EMPTY_DICT).str("k").op(EMPTY_TUPLE).op(SETITEM).op(MARK).str("l").op(NONE).op(SETITEMS)
      .op(EMPTY_SET).op(MARK).small_int(1).op(ADDITEMS).op(MARK).small_int(2).op(FROZENSET)
      .op(MARK).small_int(3).op(TUPLE).small_int(4).op(TUPLE1).op(TUPLE2).small_int(5).op(TUPLE3)
      .op(MARK).op(MARK).op(POP_MARK).op(DICT).op(MARK).op(LIST)
      .op(LIST)
      .stop();
}

TEST(PickleMalformed, TheEveryOpcodePickleParses) {
  EXPECT_EQ(describe(every_opcode_pickle()),
            "[None, True, False, 42, 7, 1, 2, 5, 3, 4, 2.5, 1.5, 's', 't', 'u', 'v', 'w', 'x', 'y', "
            "b'z', b'a', b'b', b'c', [[]], {'k': (), 'l': None}, {1}, (frozenset({2}), ((3,), "
            "(4,)), 5), {}, []]");
}

TEST(PickleMalformed, EveryTruncationIsACleanError) {
  std::vector<std::string> pickles = {every_opcode_pickle()};
  // The protocol 0 and protocol 4 pickles of the cross-protocol test above.
  pickles.push_back(from_hex(
      "286470300a56610a70310a286c70320a49310a61492d320a6146332e350a614e614930310a614930300a61493730"
      "3030300a61492d3132390a617356620a70330a2856636166e95c75323061635c7530303563750a70340a560a7035"
      "0a7470360a73566269670a70370a4c313138303539313632303731373431313330333432344c0a732e"));
  pickles.push_back(from_hex(
      "80049583000000000000007d94288c0161945d94284b014afeffffff47400c0000000000004e88894a701101004a"
      "7fffffff658c0162948c0a636166c3a9e282ac5c75948c009486948c03626967948a090000000000000000408c03"
      "6e6567948a060000000000ff8c066e6573746564947d94288c016b945d945d94614b0729758c0673686172656494"
      "6802752e"));
  for (const std::string& whole : pickles) {
    ASSERT_EQ(parse_error(whole), "parsed");
    for (std::size_t length = 0; length < whole.size(); ++length) {
      const std::string error = parse_error(whole.substr(0, length));
      EXPECT_TRUE(starts_with(error, "t.pickle: offset ")) << "cut at " << length;
      EXPECT_TRUE(contains(error, "truncated pickle")) << "cut at " << length;
    }
  }
  EXPECT_EQ(parse_error(""), "t.pickle: offset 0: truncated pickle: the input ends before STOP");
  EXPECT_EQ(parse_error(Bytes().op(BINUNICODE).u32(10).raw("abc")),
            "t.pickle: offset 0: truncated pickle: BINUNICODE needs 10 more bytes, only 3 left");
  EXPECT_EQ(parse_error(Bytes().op(BININT).u16(1)),
            "t.pickle: offset 0: truncated pickle: BININT needs 4 more bytes, only 2 left");
  EXPECT_EQ(parse_error(Bytes().op(INT).raw("12")),
            "t.pickle: offset 0: truncated pickle: INT argument has no end of line");
  EXPECT_EQ(parse_error(Bytes().op(BINUNICODE8).u64(~std::uint64_t{0}).raw("ab")),
            "t.pickle: offset 0: truncated pickle: BINUNICODE8 needs 18446744073709551615 more "
            "bytes, only 2 left");
}

TEST(PickleMalformed, StackUnderflow) {
  EXPECT_EQ(parse_error(Bytes().op(APPEND).stop()),
            "t.pickle: offset 0: stack underflow: APPEND needs 2 values on the stack, found 0");
  // A MARK hides what is below it.
  EXPECT_EQ(parse_error(Bytes().op(EMPTY_LIST).op(MARK).small_int(1).op(APPEND).stop()),
            "t.pickle: offset 4: stack underflow: APPEND needs 2 values on the stack above the "
            "last MARK, found 1");
  EXPECT_EQ(parse_error(Bytes().stop()),
            "t.pickle: offset 0: stack underflow: STOP needs 1 value on the stack, found 0");
  EXPECT_EQ(parse_error(Bytes().op(POP).stop()),
            "t.pickle: offset 0: stack underflow: POP needs 1 value on the stack, found 0");
  EXPECT_EQ(parse_error(Bytes().op(DUP).stop()),
            "t.pickle: offset 0: stack underflow: DUP needs 1 value on the stack, found 0");
  EXPECT_EQ(parse_error(Bytes().op(BINPUT).u8(0).stop()),
            "t.pickle: offset 0: stack underflow: BINPUT needs 1 value on the stack, found 0");
  EXPECT_EQ(parse_error(Bytes().small_int(1).op(TUPLE2).stop()),
            "t.pickle: offset 2: stack underflow: TUPLE2 needs 2 values on the stack, found 1");
  EXPECT_EQ(parse_error(Bytes().op(MARK).small_int(1).op(APPENDS).stop()),
            "t.pickle: offset 3: stack underflow: APPENDS needs a list below its MARK, found nothing");
  EXPECT_EQ(parse_error(Bytes().op(MARK).op(SETITEM).stop()),
            "t.pickle: offset 1: stack underflow: SETITEM needs 3 values on the stack above the "
            "last MARK, found 0");
}

TEST(PickleMalformed, MissingMark) {
  for (const auto& [opcode, name] : std::vector<std::pair<unsigned char, std::string>>{
           {APPENDS, "APPENDS"}, {SETITEMS, "SETITEMS"}, {ADDITEMS, "ADDITEMS"}, {LIST, "LIST"},
           {TUPLE, "TUPLE"}, {DICT, "DICT"}, {FROZENSET, "FROZENSET"}, {POP_MARK, "POP_MARK"}}) {
    EXPECT_EQ(parse_error(Bytes().op(EMPTY_LIST).op(opcode).stop()),
              fmt::format("t.pickle: offset 1: {} needs a MARK, but no MARK is open", name));
  }
}

TEST(PickleMalformed, WrongContainerAndOddPairs) {
  EXPECT_EQ(parse_error(Bytes().op(EMPTY_DICT).small_int(1).op(APPEND).stop()),
            "t.pickle: offset 3: APPEND needs a list to add to, found dict");
  EXPECT_EQ(parse_error(Bytes().op(EMPTY_LIST).op(MARK).small_int(1).small_int(2).op(SETITEMS).stop()),
            "t.pickle: offset 6: SETITEMS needs a dict to add to, found list");
  EXPECT_EQ(parse_error(Bytes().op(MARK).small_int(1).op(FROZENSET).op(MARK).small_int(2).op(ADDITEMS).stop()),
            "t.pickle: offset 7: ADDITEMS needs a set to add to, found frozenset");
  EXPECT_EQ(parse_error(Bytes().op(EMPTY_TUPLE).small_int(1).op(APPEND).stop()),
            "t.pickle: offset 3: APPEND needs a list to add to, found tuple");
  EXPECT_EQ(parse_error(Bytes().op(MARK).small_int(1).op(DICT).stop()),
            "t.pickle: offset 3: DICT needs keys and values in pairs, found 1 item");
  EXPECT_EQ(parse_error(Bytes().op(EMPTY_DICT).op(MARK).small_int(1).small_int(2).small_int(3).op(SETITEMS).stop()),
            "t.pickle: offset 8: SETITEMS needs keys and values in pairs, found 3 items");
}

TEST(PickleMalformed, BadArguments) {
  EXPECT_EQ(parse_error(Bytes().op(BINGET).u8(5).stop()),
            "t.pickle: offset 0: BINGET of memo key 5, which was never stored");
  EXPECT_EQ(parse_error(Bytes().op(GET).line("x1").stop()),
            "t.pickle: offset 0: GET argument 'x1' is not a memo key");
  EXPECT_EQ(parse_error(Bytes().op(NONE).op(PUT).line("-1").stop()),
            "t.pickle: offset 1: PUT argument '-1' is not a memo key");
  EXPECT_EQ(parse_error(Bytes().op(INT).line("abc").stop()),
            "t.pickle: offset 0: INT argument 'abc' is not a decimal integer");
  EXPECT_EQ(parse_error(Bytes().op(LONG).line("+-5L").stop()),
            "t.pickle: offset 0: LONG argument '+-5' is not a decimal integer");
  EXPECT_EQ(parse_error(Bytes().op(FLOAT).line("x").stop()),
            "t.pickle: offset 0: FLOAT argument 'x' is not a number");
  EXPECT_EQ(parse_error(Bytes().op(STRING).line("abc").stop()),
            "t.pickle: offset 0: STRING argument is not a quoted string literal");
  EXPECT_EQ(parse_error(Bytes().op(STRING).line("'a\\x4'").stop()),
            "t.pickle: offset 0: invalid \\x escape in STRING argument");
  EXPECT_EQ(parse_error(Bytes().op(UNICODE).line("a\\u12").stop()),
            "t.pickle: offset 0: truncated \\u escape in UNICODE argument");
  EXPECT_EQ(parse_error(Bytes().op(UNICODE).line("\\U00110000").stop()),
            "t.pickle: offset 0: \\U escape beyond U+10FFFF in UNICODE argument");
  EXPECT_EQ(parse_error(Bytes().op(BINSTRING).u32(0xffffffff).stop()),
            "t.pickle: offset 0: BINSTRING has a negative length -1");
  EXPECT_EQ(parse_error(Bytes().op(LONG4).u32(0x80000000).stop()),
            "t.pickle: offset 0: LONG4 has a negative length -2147483648");
}

// ---- limits -----------------------------------------------------------------------------------

/// `depth` lists, each inside the next: [[[...]]].
std::string nested_lists(int depth) {
  Bytes bytes;
  for (int i = 0; i < depth; ++i) bytes.op(EMPTY_LIST);
  for (int i = 1; i < depth; ++i) bytes.op(APPEND);
  return bytes.stop();
}

TEST(PickleLimits, NestingDeeperThanTheLimitIsRefused) {
  EXPECT_EQ(parse_error(nested_lists(1000)), "parsed");
  EXPECT_EQ(parse_error(nested_lists(1001)),
            "t.pickle: containers nested deeper than 1000 levels, at "
            "root[0][0][0][0][0][0][0][0]...(984 levels)...[0][0][0][0][0][0][0][0]");
  pickle::Limits shallow;
  shallow.max_depth = 3;
  EXPECT_EQ(parse_error(nested_lists(3), shallow), "parsed");
  EXPECT_EQ(parse_error(nested_lists(4), shallow),
            "t.pickle: containers nested deeper than 3 levels, at root[0][0][0]");
  // A shared container counts at every depth it is reached from: here a first appears at
  // depth 2 (fine), then again at depth 4.
  const std::string shared = Bytes()
                                 .op(EMPTY_LIST).op(EMPTY_LIST).op(APPEND).op(BINPUT).u8(0)  // a = [[]]
                                 .op(BINGET).u8(0).op(TUPLE1).op(TUPLE1)                    // ((a,),)
                                 .op(TUPLE2)                                                // (a, ((a,),))
                                 .stop();
  EXPECT_EQ(parse_error(shared, shallow),
            "t.pickle: containers nested deeper than 3 levels, at root[1][0][0]");
}

TEST(PickleLimits, TooManyOpenMarksAreRefused) {
  std::string marks(1001, static_cast<char>(MARK));
  EXPECT_EQ(parse_error(marks),
            "t.pickle: offset 1000: more than 1000 MARKs open: nesting deeper than cistern's limit");
}

TEST(PickleLimits, RecursiveStructuresAreRefused) {
  // a = []; a.append(a)
  EXPECT_EQ(parse_error(Bytes().op(EMPTY_LIST).op(BINPUT).u8(0).op(BINGET).u8(0).op(APPEND).stop()),
            "t.pickle: a container contains itself (a recursive structure), at root[0]");
  // d = {'x': [d]}
  EXPECT_EQ(parse_error(Bytes()
                            .op(EMPTY_DICT).op(BINPUT).u8(0).str("x").op(EMPTY_LIST)
                            .op(BINGET).u8(0).op(APPEND).op(SETITEM)
                            .stop()),
            "t.pickle: a container contains itself (a recursive structure), at root['x'][0]");
}

/// level 0 is [], level k is [level k-1, level k-1]: 2^(levels+1) - 1 values when expanded.
std::string doubling_lists(int levels) {
  Bytes bytes;
  bytes.op(EMPTY_LIST).op(BINPUT).u8(0);
  for (int level = 1; level <= levels; ++level) {
    bytes.op(POP).op(MARK).op(BINGET).u8(level - 1).op(BINGET).u8(level - 1).op(LIST).op(BINPUT).u8(level);
  }
  return bytes.stop();
}

TEST(PickleLimits, SharedReferencesThatExplodeAreRefused) {
  EXPECT_EQ(parse_error(doubling_lists(15)), "parsed");
  EXPECT_TRUE(starts_with(parse_error(doubling_lists(40)),
                          "t.pickle: shared references expand this value to more than 1048576 "
                          "values, 64 per byte of pickle: refused as a likely memory bomb, at root"));
}

// ---- the Value API ----------------------------------------------------------------------------

std::string event_pickle() {
  // {'size': '12', 'n': 5, 'list': [1, 2], 'n': 6}: the repeated key yields its last value
  return Bytes()
      .op(EMPTY_DICT).op(MARK)
      .str("size").str("12").str("n").small_int(5).str("list").op(MARK).small_int(1).small_int(2).op(LIST)
      .str("n").small_int(6)
      .op(SETITEMS)
      .stop();
}

TEST(PickleValue, LookupsAndIteration) {
  const pickle::Document document = parse(event_pickle());
  const pickle::Value event = document.root();
  EXPECT_TRUE(event.is_dict());
  EXPECT_EQ(event.size(), 4u);
  EXPECT_EQ(event.at("n").as_int(), 6);
  EXPECT_FALSE(event.find("absent").has_value());
  EXPECT_EQ(event.key(2).as_string(), "list");
  EXPECT_EQ(event.value(1).as_int(), 5);
  std::vector<std::string> keys;
  for (const auto& [key, value] : event.items()) keys.emplace_back(key.as_string());
  EXPECT_EQ(keys, (std::vector<std::string>{"size", "n", "list", "n"}));
  std::int64_t sum = 0;
  for (const pickle::Value element : event.at("list")) sum += element.as_int();
  EXPECT_EQ(sum, 3);
  EXPECT_EQ(document.name(), "t.pickle");
  EXPECT_EQ(document.node_count(), 11u);
}

TEST(PickleValue, WrongKindsAreReportedWithTheirPlace) {
  const pickle::Document document = parse(event_pickle());
  const pickle::Value event = document.root();
  EXPECT_EQ(error_of([&] { event.at("size").as_int(); }),
            "t.pickle: expected int for key 'size' in {'size': '12', 'n': 5, 'list': [1, 2], "
            "'n': 6}, got str '12'");
  EXPECT_EQ(error_of([&] { event.at("list")[1].as_string(); }),
            "t.pickle: expected str at index 1 of [1, 2], got int 2");
  EXPECT_EQ(error_of([&] { event.at("list")[2]; }),
            "t.pickle: index 2 out of range for a list of 2 for key 'list' in {'size': '12', 'n': "
            "5, 'list': [1, 2], 'n': 6}");
  EXPECT_EQ(error_of([&] { event.at("absent"); }),
            "t.pickle: missing key 'absent' in {'size': '12', 'n': 5, 'list': [1, 2], 'n': 6}");
  EXPECT_EQ(error_of([&] { event.begin(); }),
            "t.pickle: expected a list, tuple or set (iterate a dict with items()), got dict "
            "{'size': '12', 'n': 5, 'list': [1, 2], 'n': 6}");
  EXPECT_EQ(error_of([&] { event.at("n").as_bool(); }),
            "t.pickle: expected bool for key 'n' in {'size': '12', 'n': 5, 'list': [1, 2], 'n': "
            "6}, got int 6");
  EXPECT_EQ(error_of([&] { event.at("n").size(); }),
            "t.pickle: expected a list, tuple, set or dict for key 'n' in {'size': '12', 'n': 5, "
            "'list': [1, 2], 'n': 6}, got int 6");
  EXPECT_EQ(error_of([&] { event.at("size").as_double(); }),
            "t.pickle: expected a number for key 'size' in {'size': '12', 'n': 5, 'list': [1, 2], "
            "'n': 6}, got str '12'");
  EXPECT_EQ(error_of([&] { event.key(4); }),
            "t.pickle: pair 4 out of range for a dict of 4");
  EXPECT_EQ(error_of([&] { event.at("list").find("x"); }),
            "t.pickle: expected dict for key 'list' in {'size': '12', 'n': 5, 'list': [1, 2], 'n': "
            "6}, got list [1, 2]");
}

TEST(PickleValue, DescribeIsCutToLength) {
  Bytes bytes;
  bytes.op(MARK);
  for (int i = 0; i < 100; ++i) bytes.str(std::string(10, 'a'));
  bytes.op(LIST).stop();
  const pickle::Document document = parse(bytes);
  EXPECT_EQ(document.root().describe(30), "['aaaaaaaaaa', 'aaaaaaaaaa', 'aaaaaaaa...', ...]");
  EXPECT_EQ(document.root()[0].describe(3), "'aaaaaaaa...'");
}

TEST(PickleValue, HandlesSurviveMovingTheDocument) {
  pickle::Document document = parse(event_pickle());
  const pickle::Value list = document.root().at("list");
  const pickle::Document moved = std::move(document);
  EXPECT_EQ(list[1].as_int(), 2);
  EXPECT_TRUE(moved.root().at("list").same_object(list));
}

// ---- the real PyTorch snapshots ---------------------------------------------------------------

struct SnapshotFacts {
  const char* file;           ///< below traces/pytorch
  std::size_t pickle_bytes;   ///< decompressed size
  std::size_t events;         ///< len(device_traces[0])
  std::size_t allocs;         ///< events with action 'alloc'
  std::int64_t alloc_bytes;   ///< the sum of their sizes
  std::int64_t first_alloc;   ///< the size of the first
  std::size_t segments;       ///< len(segments)
};

// Counted with Python's pickle module from the same files.
const SnapshotFacts snapshot_facts[] = {
    {"DeComFL/memory.pickle.gz", 2067498, 23105, 7946, 15329073320, 154435584, 61},
    {"cs336_MAGMA27/memory_snapshot.pickle.gz", 495064, 5163, 1721, 58890300607, 25165824, 216},
    {"cs336_Wedsonlin/medium_ctx1024_inference.pickle.gz", 1204861, 3840, 1280, 56655331424, 16777216, 108},
    {"cs336_Wedsonlin/medium_ctx1024_training.pickle.gz", 3672875, 22331, 7591, 166521770119, 16777216, 234},
    {"cs336_Wedsonlin/medium_ctx128_inference.pickle.gz", 1203466, 3840, 1280, 2851305568, 2097152, 98},
    {"cs336_Wedsonlin/medium_ctx128_training.pickle.gz", 3145433, 19136, 6526, 34448091337, 2097152, 377},
    {"cs336_Wedsonlin/medium_ctx256_inference.pickle.gz", 1204164, 3840, 1280, 6911357024, 4194304, 101},
    {"cs336_Wedsonlin/medium_ctx256_training.pickle.gz", 3269814, 19430, 6624, 45687989993, 4194304, 495},
    {"cs336_Wedsonlin/medium_ctx512_inference.pickle.gz", 1624625, 4998, 1666, 16525910064, 8388608, 101},
    {"cs336_Wedsonlin/medium_ctx512_training.pickle.gz", 3867125, 22332, 7591, 72637134473, 8388608, 400},
};

std::string pytorch_dir() { return cistern::testing::shared_dir() + "/traces/pytorch"; }

#define SKIP_WITHOUT_TRACES()                                                              \
  if (!std::filesystem::is_directory(pytorch_dir())) {                                     \
    GTEST_SKIP() << "the shared traces are missing: " << pytorch_dir()                     \
                 << " (set CISTERN_SHARED_DIR to the folder that holds traces/)";          \
  }

class PickleRealSnapshot : public ::testing::TestWithParam<SnapshotFacts> {};

TEST_P(PickleRealSnapshot, ReadsExactlyWhatPythonReads) {
  SKIP_WITHOUT_TRACES();
  const SnapshotFacts& facts = GetParam();
  const std::string path = pytorch_dir() + "/" + facts.file;
  std::string bytes = cistern::trace::read_file(path);
  EXPECT_EQ(bytes.size(), facts.pickle_bytes);
  const pickle::Document snapshot = pickle::parse(std::move(bytes), path);
  const pickle::Value root = snapshot.root();
  ASSERT_EQ(root.size(), 4u);
  EXPECT_EQ(root.key(0).as_string(), "segments");
  EXPECT_EQ(root.key(1).as_string(), "device_traces");
  EXPECT_EQ(root.key(2).as_string(), "allocator_settings");
  EXPECT_EQ(root.key(3).as_string(), "external_annotations");
  EXPECT_EQ(root.at("allocator_settings").at("max_split_size").as_int(), -1);
  EXPECT_FALSE(root.at("allocator_settings").at("expandable_segments").as_bool());
  EXPECT_EQ(root.at("segments").size(), facts.segments);
  const pickle::Value traces = root.at("device_traces");
  ASSERT_EQ(traces.size(), 1u);
  EXPECT_EQ(traces[0].size(), facts.events);
  std::size_t allocs = 0;
  std::int64_t alloc_bytes = 0;
  std::int64_t first_alloc = -1;
  for (const pickle::Value event : traces[0]) {
    if (event.at("action").as_string() != "alloc") continue;
    const std::int64_t size = event.at("size").as_int();
    if (first_alloc < 0) first_alloc = size;
    ++allocs;
    alloc_bytes += size;
  }
  EXPECT_EQ(allocs, facts.allocs);
  EXPECT_EQ(alloc_bytes, facts.alloc_bytes);
  EXPECT_EQ(first_alloc, facts.first_alloc);
}

INSTANTIATE_TEST_SUITE_P(AllShared, PickleRealSnapshot, ::testing::ValuesIn(snapshot_facts),
                         [](const ::testing::TestParamInfo<SnapshotFacts>& param_info) {
                           std::string name = param_info.param.file;
                           name = name.substr(0, name.find('.'));
                           std::replace_if(name.begin(), name.end(),
                                           [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
                           return name;
                         });

TEST(PickleRealSnapshots, EveryTruncationOfARealSnapshotIsACleanError) {
  SKIP_WITHOUT_TRACES();
  const std::string whole = cistern::trace::read_file(pytorch_dir() + "/cs336_MAGMA27/memory_snapshot.pickle.gz");
  // Every byte of the first 2 KiB (all kinds of opcodes), then positions spread over the rest.
  for (std::size_t length = 0; length < whole.size(); length += length < 2048 ? 1 : whole.size() / 64) {
    EXPECT_TRUE(contains(parse_error(whole.substr(0, length)), "truncated pickle")) << length;
  }
}

/// Not a timed test: prints the parse throughput on the largest shared snapshot.
TEST(PickleRealSnapshots, ReportsParseThroughput) {
  SKIP_WITHOUT_TRACES();
  std::string largest_path;
  std::string largest;
  for (const SnapshotFacts& facts : snapshot_facts) {
    if (facts.pickle_bytes <= largest.size()) continue;
    largest_path = pytorch_dir() + "/" + facts.file;
    largest = cistern::trace::read_file(largest_path);
  }
  using Clock = std::chrono::steady_clock;
  double best_seconds = 1e9;
  double total_seconds = 0;
  int runs = 0;
  while (runs < 5 || (total_seconds < 1.0 && runs < 200)) {
    std::string copy = largest;  // parse takes ownership; copying stays outside the timing
    const Clock::time_point start = Clock::now();
    const pickle::Document document = pickle::parse(std::move(copy), largest_path);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best_seconds = std::min(best_seconds, seconds);
    total_seconds += seconds;
    ++runs;
  }
  const double megabytes = static_cast<double>(largest.size()) / 1e6;
  std::cout << fmt::format("[ throughput ] {} ({:.2f} MB of pickle): best {:.0f} MB/s, mean {:.0f} "
                           "MB/s over {} parses\n",
                           largest_path, megabytes, megabytes / best_seconds,
                           megabytes * runs / total_seconds, runs);
  RecordProperty("parse_mb_per_s_best", static_cast<int>(megabytes / best_seconds));
}

}  // namespace
// clang-format on
