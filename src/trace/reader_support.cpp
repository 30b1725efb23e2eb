// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "trace/reader_support.hpp"

#include <fmt/format.h>

#include <charconv>
#include <limits>

#include "cistern/errors.hpp"

namespace cistern::trace::detail {

bool Lines::next(std::string_view& line) noexcept {
  if (done_) return false;
  const std::size_t end = rest_.find('\n');
  if (end == std::string_view::npos) {
    done_ = true;
    if (rest_.empty()) return false;  // the text ended with a newline: no further line
    line = rest_;
    rest_ = {};
  } else {
    line = rest_.substr(0, end);
    rest_.remove_prefix(end + 1);
  }
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  ++number_;
  return true;
}

void split(std::string_view line, char separator, std::vector<std::string_view>& fields,
           std::size_t max_fields) {
  fields.clear();
  while (fields.size() <= max_fields) {
    const std::size_t at = line.find(separator);
    fields.push_back(line.substr(0, at));
    if (at == std::string_view::npos) return;
    line.remove_prefix(at + 1);
  }
}

namespace {

template <class Int>
std::optional<Int> parse_digits(std::string_view text, int base) noexcept {
  if (text.empty()) return std::nullopt;
  Int value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value, base);
  if (error != std::errc() || stop != end) return std::nullopt;
  return value;
}

}  // namespace

std::optional<std::uint64_t> parse_decimal(std::string_view text) noexcept {
  return parse_digits<std::uint64_t>(text, 10);
}

std::optional<std::int64_t> parse_signed(std::string_view text) noexcept {
  // from_chars accepts a leading '-' only, which is what we want; "-" alone fails.
  return parse_digits<std::int64_t>(text, 10);
}

std::optional<std::uint64_t> parse_hex(std::string_view text) noexcept {
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
  }
  if (!text.empty() && text[0] == '-') return std::nullopt;  // from_chars would not, but be clear
  return parse_digits<std::uint64_t>(text, 16);
}

std::string quote(std::string_view text) {
  constexpr std::size_t max_shown = 40;
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < max_shown; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x20 || byte >= 0x7f || byte == '\'' || byte == '\\') {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += static_cast<char>(byte);
    }
  }
  out += text.size() > max_shown ? "'..." : "'";
  return out;
}

void fail_at_line(const std::string& name, std::size_t line, std::string_view problem) {
  throw InvalidArgument(fmt::format("{}:{}: {}", name, line, problem));
}

void require_unscaled(const ReadOptions& options, const std::string& name, Format format) {
  if (options.scale != 1) {
    throw InvalidArgument(fmt::format(
        "{}: --scale {} applies to lifetime lists only; this is a {} trace, whose sizes are bytes",
        name, options.scale, to_string(format)));
  }
}

std::uint32_t StreamTable::index(std::uint64_t handle) {
  const auto [where, added] = index_.emplace(handle, static_cast<std::uint32_t>(handles_.size()));
  if (added) handles_.push_back(handle);
  return where->second;
}

std::vector<std::uint64_t> StreamTable::handles() const {
  if (handles_.empty()) return {0};
  return handles_;
}

}  // namespace cistern::trace::detail
