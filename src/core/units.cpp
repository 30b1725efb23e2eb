// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Byte-size helpers: PyTorch-style formatting and a strict parser for sizes written by people.
#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "cistern/errors.hpp"
#include "cistern/types.hpp"

namespace cistern {

std::string format_bytes(std::uint64_t bytes) {
  const auto scaled = [bytes](std::size_t unit) {
    return static_cast<double>(bytes) / static_cast<double>(unit);
  };
  if (bytes < KiB) return fmt::format("{} bytes", bytes);
  if (bytes < MiB) return fmt::format("{:.2f} KiB", scaled(KiB));
  if (bytes < GiB) return fmt::format("{:.2f} MiB", scaled(MiB));
  return fmt::format("{:.2f} GiB", scaled(GiB));
}

namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

/// A size written as `<integer>[.<fraction>] [unit]`, split but not yet scaled.
struct SizeText {
  std::string integer;   // at least one digit
  std::string fraction;  // digits after the point; may be empty
  std::string unit;      // lower-cased; may be empty
};

[[noreturn]] void throw_malformed(const std::string& text) {
  throw InvalidArgument("Invalid byte size '" + text +
                        "': expected a non-negative number with an optional unit "
                        "(bytes, KiB, MiB, GiB, TiB, K, M, G, T, kB, MB, GB, TB)");
}

[[noreturn]] void throw_too_large(const std::string& text) {
  throw InvalidArgument("Byte size '" + text + "' does not fit in 64 bits");
}

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }
bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }

std::string take_while(const std::string& text, std::size_t& pos, bool (*accept)(char)) {
  const std::size_t start = pos;
  while (pos < text.size() && accept(text[pos])) ++pos;
  return text.substr(start, pos - start);
}

/// Splits `text` into number and unit; throws on anything else (signs, exponents, junk).
SizeText split_size(const std::string& text) {
  SizeText parts;
  std::size_t pos = 0;
  take_while(text, pos, is_space);
  parts.integer = take_while(text, pos, is_digit);
  if (parts.integer.empty()) throw_malformed(text);
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    parts.fraction = take_while(text, pos, is_digit);
    if (parts.fraction.empty()) throw_malformed(text);
  }
  take_while(text, pos, is_space);
  parts.unit = take_while(text, pos, is_alpha);
  take_while(text, pos, is_space);
  if (pos != text.size()) throw_malformed(text);
  for (char& c : parts.unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return parts;
}

/// Bytes per unit. Single letters and the IEC names are binary; "kb", "mb", ... are decimal,
/// as disk and network vendors write them. Returns 0 for an unknown unit.
std::uint64_t unit_scale(const std::string& unit) {
  struct Unit {
    const char* name;
    std::uint64_t scale;
  };
  static const Unit kUnits[] = {
      {"", 1},          {"b", 1},          {"byte", 1},        {"bytes", 1},
      {"k", KiB},       {"ki", KiB},       {"kib", KiB},       {"kb", 1000},
      {"m", MiB},       {"mi", MiB},       {"mib", MiB},       {"mb", 1000000},
      {"g", GiB},       {"gi", GiB},       {"gib", GiB},       {"gb", 1000000000},
      {"t", GiB * KiB}, {"ti", GiB * KiB}, {"tib", GiB * KiB}, {"tb", 1000000000000},
  };
  for (const Unit& u : kUnits) {
    if (unit == u.name) return u.scale;
  }
  return 0;
}

/// The decimal digits as an integer; false on overflow.
bool digits_to_u64(const std::string& digits, std::uint64_t& value) {
  value = 0;
  for (char c : digits) {
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (value > (kMax - digit) / 10) return false;
    value = value * 10 + digit;
  }
  return true;
}

/// `0.<fraction>` times `scale`, rounded to the nearest byte. Digits are read by hand, not by
/// `strtod`, so that a program's locale (a decimal comma) cannot change the result. Digits past
/// the 18th change the product by less than 10^-6 bytes and are ignored.
std::uint64_t scaled_fraction(const std::string& fraction, std::uint64_t scale) {
  long double numerator = 0;
  long double denominator = 1;
  for (std::size_t i = 0; i < fraction.size() && i < 18; ++i) {
    numerator = numerator * 10 + static_cast<long double>(fraction[i] - '0');
    denominator *= 10;
  }
  const long double bytes = numerator / denominator * static_cast<long double>(scale);
  return static_cast<std::uint64_t>(std::llround(bytes));
}

}  // namespace

std::uint64_t parse_bytes(const std::string& text) {
  const SizeText parts = split_size(text);
  const std::uint64_t scale = unit_scale(parts.unit);
  if (scale == 0) throw_malformed(text);
  std::uint64_t whole = 0;
  if (!digits_to_u64(parts.integer, whole) || whole > kMax / scale) throw_too_large(text);
  const std::uint64_t bytes = whole * scale;
  const std::uint64_t extra = scaled_fraction(parts.fraction, scale);
  if (extra > kMax - bytes) throw_too_large(text);
  return bytes + extra;
}

}  // namespace cistern
