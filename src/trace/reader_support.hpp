// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Small pieces the trace readers share: the per-format entry points that `read_trace` dispatches
// to, line splitting and strict number parsing for the text formats, quoting of hostile text in
// messages, and the table that turns recorded stream handles into stream indices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "trace/readers.hpp"
#include "trace/trace.hpp"

namespace cistern::trace::detail {

// ---- one reader per format (bytes already decompressed; `name` labels messages) ----------------

Trace read_pytorch_snapshot(std::string bytes, const std::string& name, const ReadOptions& options);
std::vector<int> pytorch_snapshot_devices(std::string bytes, const std::string& name);
Trace read_lifetimes(std::string_view text, const std::string& name, const ReadOptions& options);
Trace read_rmm_log(std::string_view text, const std::string& name, const ReadOptions& options);
Trace read_kineto(std::string bytes, const std::string& name, const ReadOptions& options);
std::vector<int> kineto_devices(std::string bytes, const std::string& name);
Trace read_native(std::string_view text, const std::string& name, const ReadOptions& options);

// ---- text --------------------------------------------------------------------------------------

/// The lines of a text, numbered from 1. A final line without a newline counts; a trailing "\r"
/// (CRLF files) is dropped.
class Lines {
 public:
  explicit Lines(std::string_view text) noexcept : rest_(text) {}
  /// Moves to the next line; false at the end of the text.
  bool next(std::string_view& line) noexcept;
  /// The number of the line `next` returned last.
  std::size_t number() const noexcept { return number_; }

 private:
  std::string_view rest_;
  std::size_t number_ = 0;
  bool done_ = false;
};

/// Splits `line` at every `separator` into `fields` (cleared first); an empty line gives one
/// empty field. Stops after `max_fields` + 1 fields so that a hostile line cannot make it build
/// a huge vector; callers compare the count with what they expect.
void split(std::string_view line, char separator, std::vector<std::string_view>& fields,
           std::size_t max_fields = 64);

/// A decimal integer of digits only ("12"; not "+1", " 1", "1.0" or "0x1"); nothing on overflow.
std::optional<std::uint64_t> parse_decimal(std::string_view text) noexcept;
/// A decimal integer with an optional leading '-'.
std::optional<std::int64_t> parse_signed(std::string_view text) noexcept;
/// A hexadecimal integer, with or without "0x"/"0X".
std::optional<std::uint64_t> parse_hex(std::string_view text) noexcept;

/// `text` in single quotes for a message, cut to about 40 characters, with control and non-ASCII
/// bytes written as \xNN, so that garbage input cannot garble the message.
std::string quote(std::string_view text);

/// Throws `InvalidArgument` "<name>:<line>: <problem>".
[[noreturn]] void fail_at_line(const std::string& name, std::size_t line, std::string_view problem);

/// Throws unless `options.scale` is 1: only lifetime lists are scaled.
void require_unscaled(const ReadOptions& options, const std::string& name, Format format);

// ---- streams -----------------------------------------------------------------------------------

/// Numbers recorded stream handles in order of first appearance.
class StreamTable {
 public:
  /// The index of `handle`, adding it if new.
  std::uint32_t index(std::uint64_t handle);
  /// The handles by index; {0} if none was seen (a trace has at least one stream).
  std::vector<std::uint64_t> handles() const;

 private:
  std::unordered_map<std::uint64_t, std::uint32_t> index_;
  std::vector<std::uint64_t> handles_;
};

}  // namespace cistern::trace::detail
