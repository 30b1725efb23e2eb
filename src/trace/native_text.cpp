// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "trace/native_text.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>

#include "cistern/errors.hpp"

namespace cistern::trace::native {
namespace {

bool needs_escape(unsigned char byte) {
  return byte <= 0x20 || byte >= 0x7f || byte == '\\' || byte == '"';
}

std::optional<int> hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return std::nullopt;
}

}  // namespace

std::string escape(std::string_view text) {
  if (text.empty()) return "\"\"";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (needs_escape(byte)) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<std::string> unescape(std::string_view token) {
  if (token == "\"\"") return std::string();
  std::string out;
  out.reserve(token.size());
  for (std::size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '"') return std::nullopt;
    if (token[i] != '\\') {
      out += token[i];
      continue;
    }
    if (i + 3 >= token.size()) return std::nullopt;
    if (token[i + 1] != 'x') return std::nullopt;
    const auto high = hex_digit(token[i + 2]);
    const auto low = hex_digit(token[i + 3]);
    if (!high || !low) return std::nullopt;
    out += static_cast<char>(*high * 16 + *low);
    i += 3;
  }
  return out;
}

std::string gzip(std::string_view bytes, const std::string& name) {
  constexpr int gzip_window_bits = 15 + 16;  // the largest window, with the gzip wrapper
  constexpr int memory_level = 8;
  constexpr std::size_t slice = std::size_t{1} << 30;  // zlib counts in uInt
  z_stream stream{};
  if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, gzip_window_bits, memory_level,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    throw Error(fmt::format("{}: cannot start gzip compression", name));
  }
  std::string out;
  char buffer[1 << 16];
  int status = Z_OK;
  std::size_t offset = 0;
  while (status != Z_STREAM_END) {
    if (stream.avail_in == 0 && offset < bytes.size()) {
      const std::size_t count = std::min(slice, bytes.size() - offset);
      stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data() + offset));
      stream.avail_in = static_cast<uInt>(count);
      offset += count;
    }
    stream.next_out = reinterpret_cast<Bytef*>(buffer);
    stream.avail_out = sizeof buffer;
    status = deflate(&stream, offset == bytes.size() ? Z_FINISH : Z_NO_FLUSH);
    if (status == Z_STREAM_ERROR) {
      deflateEnd(&stream);
      throw Error(fmt::format("{}: gzip compression failed", name));
    }
    out.append(buffer, sizeof buffer - stream.avail_out);
  }
  deflateEnd(&stream);
  return out;
}

}  // namespace cistern::trace::native
