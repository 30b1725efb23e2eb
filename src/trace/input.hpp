// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Reading a trace file into memory. Trace files come as their authors wrote them or gzipped;
// callers never need to know which, because gzip is recognised by its magic bytes, not its name.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace cistern::trace {

/// The most bytes an input may hold (after decompression) unless the caller says otherwise
/// (`cistern --max-input-size`). Generous (the largest real traces are tens of MB) but finite,
/// so that a small "decompression bomb" or an endless device file cannot exhaust memory.
inline constexpr std::uint64_t default_max_input_bytes = std::uint64_t{2} << 30;

/// How many bytes of content (after decompression) `read_file` shows its prefix check.
inline constexpr std::size_t input_prefix_bytes = std::size_t{64} << 10;

/// A look at the first bytes of a file's content (up to `input_prefix_bytes`, decompressed when
/// the file is gzip) before the rest is read; throws `cistern::InvalidArgument` to refuse the
/// file, so that a non-trace (/dev/zero, random bytes) costs one block, not the whole file.
using PrefixCheck = std::function<void(std::string_view prefix)>;

/// True if `bytes` starts with the gzip magic number 1f 8b.
bool is_gzip(std::string_view bytes) noexcept;

/// Decompresses a whole gzip file held in `compressed`. Several concatenated gzip members (as
/// `cat a.gz b.gz` makes) decompress to the concatenation of their contents; zero bytes after
/// the last member (tape padding) are ignored. `name` only labels error messages.
/// Throws `cistern::InvalidArgument` naming `name` on a corrupt or truncated stream, on other
/// data after the last member, or when the output would exceed `max_bytes`.
/// The output never grows past `max_bytes + 1` bytes.
std::string gunzip(std::string_view compressed, const std::string& name,
                   std::uint64_t max_bytes = default_max_input_bytes);

/// Reads the whole file at `path`, decompressing it if it is gzip (see `gunzip`). Its first
/// block (decompressed) goes through `check` first, when given. Throws
/// `cistern::InvalidArgument` naming `path` when the file cannot be opened or read, when its
/// gzip content is invalid, when `check` refuses it, or when it holds (or decompresses to) more
/// than `max_bytes`; memory stays within about twice `max_bytes` whatever the file.
std::string read_file(const std::string& path, std::uint64_t max_bytes = default_max_input_bytes,
                      const PrefixCheck& check = {});

}  // namespace cistern::trace
