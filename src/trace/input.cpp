// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "trace/input.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>

#include "cistern/errors.hpp"

namespace cistern::trace {
namespace {

constexpr unsigned char gzip_magic_0 = 0x1f;
constexpr unsigned char gzip_magic_1 = 0x8b;
/// zlib counts bytes in `uInt`; larger buffers are fed to it in slices of at most this size.
constexpr std::size_t zlib_slice = std::size_t{1} << 30;
constexpr std::size_t min_output_capacity = std::size_t{64} << 10;
/// `inflateInit2` window bits: 15 (the largest window) plus 16 to accept only the gzip wrapper.
constexpr int gzip_window_bits = 15 + 16;

/// Owns a zlib inflate stream; one instance decodes every member of a multi-member file.
class Inflater {
 public:
  explicit Inflater(const std::string& name) {
    if (inflateInit2(&stream_, gzip_window_bits) != Z_OK) {
      throw InvalidArgument(fmt::format("{}: cannot start gzip decompression: {}", name,
                                        stream_.msg != nullptr ? stream_.msg : "zlib failed"));
    }
  }
  ~Inflater() { inflateEnd(&stream_); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  z_stream& stream() noexcept { return stream_; }
  const char* message() const noexcept {
    return stream_.msg != nullptr ? stream_.msg : "unknown zlib error";
  }

 private:
  z_stream stream_{};
};

/// The output buffer of one `gunzip` call: grows geometrically up to `max_bytes + 1`, the extra
/// byte being how an oversized stream is noticed.
class Output {
 public:
  Output(std::size_t initial, std::uint64_t max_bytes) : max_bytes_(max_bytes) {
    bytes_.resize(std::max(initial, min_output_capacity));
  }

  /// Makes room for more output; false when the buffer already holds more than the limit.
  bool reserve_more() {
    if (produced_ < bytes_.size()) return true;
    const std::uint64_t hard_cap = max_bytes_ + 1;
    if (produced_ >= hard_cap) return false;
    const std::uint64_t doubled = std::uint64_t{bytes_.size()} * 2;
    bytes_.resize(static_cast<std::size_t>(std::min(doubled, hard_cap)));
    return true;
  }
  char* free_begin() noexcept { return bytes_.data() + produced_; }
  std::size_t free_size() const noexcept { return bytes_.size() - produced_; }
  void commit(std::size_t count) noexcept { produced_ += count; }
  bool over_limit() const noexcept { return produced_ > max_bytes_; }

  std::string take() && {
    bytes_.resize(produced_);
    return std::move(bytes_);
  }

 private:
  std::string bytes_;
  std::size_t produced_ = 0;
  std::uint64_t max_bytes_;
};

/// A first guess at the decompressed size: the gzip trailer's ISIZE (the size modulo 2^32 of
/// the last member) when it is plausible for the input, else four times the input. Trusting an
/// implausible ISIZE would let a damaged or hostile file make us allocate gigabytes up front;
/// real traces compress 5 to 20 times.
std::size_t size_hint(std::string_view compressed, std::uint64_t max_bytes) {
  constexpr std::uint64_t plausible_ratio = 64;
  const std::uint64_t size = compressed.size();
  std::uint64_t hint = size * 4;
  if (size >= 4) {
    const auto* tail = reinterpret_cast<const unsigned char*>(compressed.data() + size - 4);
    const std::uint64_t isize = std::uint64_t{tail[0]} | std::uint64_t{tail[1]} << 8 |
                                std::uint64_t{tail[2]} << 16 | std::uint64_t{tail[3]} << 24;
    if (isize >= size && isize <= size * plausible_ratio) hint = isize;
  }
  return static_cast<std::size_t>(std::min(hint, max_bytes + 1));
}

[[noreturn]] void throw_over_limit(const std::string& name, std::uint64_t max_bytes) {
  throw InvalidArgument(fmt::format(
      "{}: gzip stream decompresses to more than {} bytes, the limit that guards against "
      "decompression bombs (--max-input-size)",
      name, max_bytes));
}

[[noreturn]] void throw_file_over_limit(const std::string& name, std::uint64_t max_bytes) {
  throw InvalidArgument(
      fmt::format("{}: the file holds more than {} bytes, the limit on input size "
                  "(--max-input-size)",
                  name, max_bytes));
}

/// Inflates one gzip member starting at `compressed[*consumed]`, advancing `*consumed` past it.
void inflate_member(Inflater& inflater, std::string_view compressed, std::size_t* consumed,
                    Output& output, const std::string& name, std::uint64_t max_bytes) {
  z_stream& stream = inflater.stream();
  if (inflateReset(&stream) != Z_OK) {
    throw InvalidArgument(fmt::format("{}: not a valid gzip stream: {}", name, inflater.message()));
  }
  for (;;) {
    if (!output.reserve_more()) throw_over_limit(name, max_bytes);
    const std::size_t in_size = std::min(compressed.size() - *consumed, zlib_slice);
    const std::size_t out_size = std::min(output.free_size(), zlib_slice);
    stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data() + *consumed));
    stream.avail_in = static_cast<uInt>(in_size);
    stream.next_out = reinterpret_cast<Bytef*>(output.free_begin());
    stream.avail_out = static_cast<uInt>(out_size);
    const int status = inflate(&stream, Z_NO_FLUSH);
    *consumed += in_size - stream.avail_in;
    output.commit(out_size - stream.avail_out);
    if (output.over_limit()) throw_over_limit(name, max_bytes);
    if (status == Z_STREAM_END) return;
    if (status == Z_MEM_ERROR) throw std::bad_alloc();
    if (status == Z_DATA_ERROR || status == Z_NEED_DICT || status == Z_STREAM_ERROR) {
      throw InvalidArgument(
          fmt::format("{}: not a valid gzip stream: {}", name, inflater.message()));
    }
    // Z_OK or Z_BUF_ERROR: zlib wants more input or more output space. Output space is
    // provided at the top of the loop; running out of input means the stream was cut short.
    if (*consumed == compressed.size() && stream.avail_out != 0) {
      throw InvalidArgument(fmt::format("{}: truncated gzip stream", name));
    }
  }
}

bool all_zero(std::string_view bytes) noexcept {
  return std::all_of(bytes.begin(), bytes.end(), [](char c) { return c == '\0'; });
}

struct FileCloser {
  void operator()(std::FILE* file) const noexcept { std::fclose(file); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

/// The start of the content of a gzip stream whose first bytes are `head`: at most
/// `input_prefix_bytes`, fewer when `head` ends sooner. Only a corrupt start is an error here;
/// an end that `head` does not reach is for the full decompression to judge.
std::string gunzip_prefix(std::string_view head, const std::string& name) {
  Inflater inflater(name);
  z_stream& stream = inflater.stream();
  std::string prefix(input_prefix_bytes, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(head.data()));
  stream.avail_in = static_cast<uInt>(head.size());
  stream.next_out = reinterpret_cast<Bytef*>(prefix.data());
  stream.avail_out = static_cast<uInt>(prefix.size());
  const int status = inflate(&stream, Z_SYNC_FLUSH);
  if (status == Z_MEM_ERROR) throw std::bad_alloc();
  if (status == Z_DATA_ERROR || status == Z_NEED_DICT || status == Z_STREAM_ERROR) {
    throw InvalidArgument(fmt::format("{}: not a valid gzip stream: {}", name, inflater.message()));
  }
  prefix.resize(prefix.size() - stream.avail_out);
  return prefix;
}

/// Appends up to `limit - bytes.size()` more bytes of `file` to `bytes`; true when the file
/// ended within the limit.
bool read_up_to(std::FILE* file, std::string& bytes, std::uint64_t limit, const std::string& path) {
  char chunk[std::size_t{1} << 16];
  while (bytes.size() < limit) {
    const std::size_t want =
        static_cast<std::size_t>(std::min<std::uint64_t>(sizeof chunk, limit - bytes.size()));
    const std::size_t count = std::fread(chunk, 1, want, file);
    bytes.append(chunk, count);
    if (count < want) {
      if (std::ferror(file) != 0) {
        throw InvalidArgument(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
      }
      return true;
    }
  }
  const int next = std::fgetc(file);  // the limit reached: is there more?
  if (next == EOF) return std::ferror(file) == 0;
  std::ungetc(next, file);
  return false;
}

/// Reserves room for the whole file when its size is known and within `max_bytes`.
void reserve_for(const std::string& path, std::string& bytes, std::uint64_t max_bytes) {
  std::error_code ignored;  // the size is only a hint; reading tells the truth
  const std::uintmax_t size = std::filesystem::file_size(path, ignored);
  if (!ignored && size <= max_bytes) bytes.reserve(static_cast<std::size_t>(size));
}

}  // namespace

bool is_gzip(std::string_view bytes) noexcept {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == gzip_magic_0 &&
         static_cast<unsigned char>(bytes[1]) == gzip_magic_1;
}

std::string gunzip(std::string_view compressed, const std::string& name, std::uint64_t max_bytes) {
  Inflater inflater(name);
  Output output(size_hint(compressed, max_bytes), max_bytes);
  std::size_t consumed = 0;
  do {
    inflate_member(inflater, compressed, &consumed, output, name, max_bytes);
  } while (is_gzip(compressed.substr(consumed)));
  if (!all_zero(compressed.substr(consumed))) {
    throw InvalidArgument(
        fmt::format("{}: unexpected data after the gzip stream, at byte {}", name, consumed));
  }
  return std::move(output).take();
}

std::string read_file(const std::string& path, std::uint64_t max_bytes, const PrefixCheck& check) {
  const File file(std::fopen(path.c_str(), "rb"));
  if (!file) {
    throw InvalidArgument(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  std::string bytes;
  // The first block decides whether the rest is worth reading.
  bool ended = read_up_to(file.get(), bytes, input_prefix_bytes, path);
  const bool gzip = is_gzip(bytes);
  if (check) check(gzip ? std::string_view(gunzip_prefix(bytes, path)) : std::string_view(bytes));
  // Compressed data hardly ever outgrows its content; the slack lets a limit below the first
  // block still read small gzip files whole.
  const std::uint64_t raw_limit = gzip ? max_bytes + input_prefix_bytes : max_bytes;
  if (!ended) {
    reserve_for(path, bytes, raw_limit);
    ended = read_up_to(file.get(), bytes, raw_limit, path);
  }
  if (!ended || bytes.size() > raw_limit) throw_file_over_limit(path, max_bytes);
  if (gzip) return gunzip(bytes, path, max_bytes);
  return bytes;
}

}  // namespace cistern::trace
