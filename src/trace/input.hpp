// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Reading a trace file into memory. Trace files come as their authors wrote them or gzipped;
// callers never need to know which, because gzip is recognised by its magic bytes, not its name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cistern::trace {

/// The most bytes a gzip stream may decompress to unless the caller says otherwise. Generous
/// (the largest real traces are tens of MB) but finite, so that a small "decompression bomb"
/// cannot exhaust memory.
inline constexpr std::uint64_t default_max_decompressed_bytes = std::uint64_t{8} << 30;

/// True if `bytes` starts with the gzip magic number 1f 8b.
bool is_gzip(std::string_view bytes) noexcept;

/// Decompresses a whole gzip file held in `compressed`. Several concatenated gzip members (as
/// `cat a.gz b.gz` makes) decompress to the concatenation of their contents; zero bytes after
/// the last member (tape padding) are ignored. `name` only labels error messages.
/// Throws `cistern::InvalidArgument` naming `name` on a corrupt or truncated stream, on other
/// data after the last member, or when the output would exceed `max_bytes`.
std::string gunzip(std::string_view compressed, const std::string& name,
                   std::uint64_t max_bytes = default_max_decompressed_bytes);

/// Reads the whole file at `path`, decompressing it if it is gzip (see `gunzip`).
/// Throws `cistern::InvalidArgument` naming `path` when the file cannot be opened or read, or
/// when its gzip content is invalid.
std::string read_file(const std::string& path,
                      std::uint64_t max_bytes = default_max_decompressed_bytes);

}  // namespace cistern::trace
