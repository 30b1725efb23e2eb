// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// format_bytes and parse_bytes: PyTorch's message format, and every accepted and rejected form.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "cistern/errors.hpp"
#include "cistern/types.hpp"

namespace cistern {
namespace {

TEST(FormatBytes, BytesBelowOneKiB) {
  EXPECT_EQ(format_bytes(0), "0 bytes");
  EXPECT_EQ(format_bytes(1), "1 bytes");
  EXPECT_EQ(format_bytes(512), "512 bytes");
  EXPECT_EQ(format_bytes(1023), "1023 bytes");
}

TEST(FormatBytes, KiBBelowOneMiB) {
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(512 * KiB), "512.00 KiB");
  EXPECT_EQ(format_bytes(MiB - KiB), "1023.00 KiB");
}

TEST(FormatBytes, MiBBelowOneGiB) {
  EXPECT_EQ(format_bytes(MiB), "1.00 MiB");
  EXPECT_EQ(format_bytes(20 * MiB), "20.00 MiB");
  EXPECT_EQ(format_bytes(MiB + MiB / 4), "1.25 MiB");
  EXPECT_EQ(format_bytes(GiB - MiB), "1023.00 MiB");
}

TEST(FormatBytes, GiBFromOneGiB) {
  EXPECT_EQ(format_bytes(GiB), "1.00 GiB");
  EXPECT_EQ(format_bytes(3 * GiB), "3.00 GiB");
  EXPECT_EQ(format_bytes(80 * GiB), "80.00 GiB");
  EXPECT_EQ(format_bytes(2048 * GiB), "2048.00 GiB");
}

TEST(ParseBytes, PlainNumbersAreBytes) {
  EXPECT_EQ(parse_bytes("0"), 0u);
  EXPECT_EQ(parse_bytes("512"), 512u);
  EXPECT_EQ(parse_bytes("  512  "), 512u);
  EXPECT_EQ(parse_bytes("512B"), 512u);
  EXPECT_EQ(parse_bytes("512 bytes"), 512u);
  EXPECT_EQ(parse_bytes("18446744073709551615"), std::numeric_limits<std::uint64_t>::max());
}

TEST(ParseBytes, BinaryUnits) {
  EXPECT_EQ(parse_bytes("64KiB"), 64 * KiB);
  EXPECT_EQ(parse_bytes("64K"), 64 * KiB);
  EXPECT_EQ(parse_bytes("64k"), 64 * KiB);
  EXPECT_EQ(parse_bytes("2MiB"), 2 * MiB);
  EXPECT_EQ(parse_bytes("2m"), 2 * MiB);
  EXPECT_EQ(parse_bytes("2 mib"), 2 * MiB);
  EXPECT_EQ(parse_bytes("80GiB"), 80 * GiB);
  EXPECT_EQ(parse_bytes("80G"), 80 * GiB);
  EXPECT_EQ(parse_bytes("1TiB"), 1024 * GiB);
  EXPECT_EQ(parse_bytes("1T"), 1024 * GiB);
}

TEST(ParseBytes, DecimalUnits) {
  EXPECT_EQ(parse_bytes("1kB"), 1000u);
  EXPECT_EQ(parse_bytes("1KB"), 1000u);
  EXPECT_EQ(parse_bytes("3MB"), 3000000u);
  EXPECT_EQ(parse_bytes("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_bytes("2TB"), 2000000000000u);
}

TEST(ParseBytes, FractionsRoundToTheNearestByte) {
  EXPECT_EQ(parse_bytes("1.5GiB"), 3 * GiB / 2);
  EXPECT_EQ(parse_bytes("0.5 KiB"), 512u);
  EXPECT_EQ(parse_bytes("1.00 KiB"), 1024u);  // format_bytes output reads back
  EXPECT_EQ(parse_bytes("0.0001KiB"), 0u);    // 0.1024 bytes
  EXPECT_EQ(parse_bytes("0.0009KiB"), 1u);    // 0.9216 bytes
  EXPECT_EQ(parse_bytes("2.5"), 3u);          // half a byte rounds up
}

TEST(ParseBytes, RejectsMalformedText) {
  for (const char* text :
       {"", "   ", "-1", "-1KiB", "+1", "abc", "KiB", "1 2", "1KiBx", "1e3", "1.", ".5", "1..5",
        "1.5.5", "1 KiB B", "1PiB", "1Kb!", "0x10", "1,5GB"}) {
    EXPECT_THROW(parse_bytes(text), InvalidArgument) << "'" << text << "'";
  }
}

TEST(ParseBytes, RejectsOverflow) {
  EXPECT_THROW(parse_bytes("18446744073709551616"), InvalidArgument);
  EXPECT_THROW(parse_bytes("99999999999999999999999"), InvalidArgument);
  EXPECT_THROW(parse_bytes("16777216TiB"), InvalidArgument);                // 2^64 bytes
  EXPECT_THROW(parse_bytes("16777215.9999999999999TiB"), InvalidArgument);  // rounds to 2^64
  EXPECT_EQ(parse_bytes("16777215TiB"), (std::uint64_t{16777215} << 40));
}

TEST(ParseBytes, ErrorNamesTheText) {
  try {
    parse_bytes("12 parsecs");
    FAIL() << "no exception";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("'12 parsecs'"), std::string::npos) << error.what();
  }
}

TEST(ParseBytes, ReadsBackFormattedWholeUnits) {
  for (std::uint64_t bytes : {std::uint64_t{1}, std::uint64_t{1023}, std::uint64_t{KiB},
                              std::uint64_t{7 * MiB}, std::uint64_t{3 * GiB}}) {
    EXPECT_EQ(parse_bytes(format_bytes(bytes)), bytes) << format_bytes(bytes);
  }
}

}  // namespace
}  // namespace cistern
