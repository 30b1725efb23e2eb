// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Lifetime lists: static memory-planning sets (minimalloc, MindSpore SOMAS), one buffer per line
// `id,lower,upper,size`, live in the step interval [lower, upper). The file is not in time order,
// so rows are read line by line and the events are ordered afterwards.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_set>

#include "cistern/errors.hpp"
#include "trace/reader_support.hpp"

namespace cistern::trace::detail {
namespace {

constexpr std::array<std::string_view, 4> columns{"id", "lower", "upper", "size"};

struct Row {
  std::uint64_t lower;
  std::uint64_t upper;
  std::uint64_t size;
};

/// Where each column is in a line, from the header.
struct Layout {
  std::array<std::size_t, 4> at{};
};

Layout read_header(std::string_view line, const std::string& name, std::size_t number) {
  std::vector<std::string_view> fields;
  split(line, ',', fields);
  Layout layout;
  std::array<bool, 4> found{};
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const auto column = std::find(columns.begin(), columns.end(), fields[i]);
    if (column == columns.end()) {
      fail_at_line(
          name, number,
          fmt::format("unknown column {}: a lifetime list has the header id,lower,upper,size",
                      quote(fields[i])));
    }
    const auto c = static_cast<std::size_t>(column - columns.begin());
    if (found[c]) fail_at_line(name, number, fmt::format("column '{}' appears twice", *column));
    found[c] = true;
    layout.at[c] = i;
  }
  for (std::size_t c = 0; c < columns.size(); ++c) {
    if (!found[c]) {
      fail_at_line(name, number,
                   fmt::format("the header lacks the column '{}' (expected "
                               "id,lower,upper,size)",
                               columns[c]));
    }
  }
  return layout;
}

/// Multiplies sizes by the scale, exactly for integral scales.
class Scaler {
 public:
  Scaler(double scale, const std::string& name) : scale_(scale) {
    if (!std::isfinite(scale) || scale <= 0) {
      throw InvalidArgument(fmt::format("{}: scale {} must be a positive number", name, scale));
    }
    integral_ = scale == std::floor(scale) && scale <= static_cast<double>(max_allocation_size);
  }

  double scale() const noexcept { return scale_; }

  /// The scaled size, or nothing if it is not in [1, max_allocation_size].
  std::optional<std::uint64_t> operator()(std::uint64_t size) const {
    if (integral_) {
      const auto factor = static_cast<std::uint64_t>(scale_);
      if (size > max_allocation_size / factor) return std::nullopt;
      return size * factor;
    }
    const long double scaled = std::nearbyint(static_cast<long double>(size) * scale_);
    if (scaled < 1 || scaled > static_cast<long double>(max_allocation_size)) return std::nullopt;
    return static_cast<std::uint64_t>(scaled);
  }

 private:
  double scale_;
  bool integral_ = false;
};

/// Reads one data line, or fails naming the line and the problem.
class RowReader {
 public:
  RowReader(const std::string& name, Layout layout, double scale)
      : name_(name), layout_(layout), scale_(scale, name) {}

  Row read(std::string_view line, std::size_t number) {
    split(line, ',', fields_);
    if (fields_.size() != columns.size()) {
      fail_at_line(name_, number,
                   fmt::format("expected 4 comma-separated fields "
                               "(id,lower,upper,size), found {}{}: {}",
                               fields_.size() > 64 ? "more than " : "",
                               std::min<std::size_t>(fields_.size(), 64), quote(line)));
    }
    const std::string_view id = fields_[layout_.at[0]];
    if (id.empty()) fail_at_line(name_, number, "empty id");
    if (!ids_.insert(id).second)
      fail_at_line(name_, number, fmt::format("duplicate id {}", quote(id)));
    Row row{integer(1, number), integer(2, number), integer(3, number)};
    if (row.upper <= row.lower) {
      fail_at_line(name_, number,
                   fmt::format("upper {} is not after lower {}: a lifetime [lower, "
                               "upper) must be non-empty",
                               row.upper, row.lower));
    }
    if (row.size == 0) fail_at_line(name_, number, "size 0: every buffer has at least one byte");
    const std::optional<std::uint64_t> scaled = scale_(row.size);
    if (!scaled && static_cast<double>(row.size) * scale_.scale() < 1) {
      fail_at_line(name_, number,
                   fmt::format("size {} scaled by {} rounds to 0 bytes", row.size, scale_.scale()));
    }
    if (!scaled) {
      fail_at_line(name_, number,
                   fmt::format("size {} (scaled: x{}) is absurd: the limit is {} "
                               "bytes",
                               row.size, scale_.scale(), max_allocation_size));
    }
    row.size = *scaled;
    return row;
  }

 private:
  std::uint64_t integer(std::size_t column, std::size_t number) const {
    const std::string_view text = fields_[layout_.at[column]];
    const std::optional<std::uint64_t> value = parse_decimal(text);
    if (!value) {
      const bool negative = !text.empty() && text[0] == '-' && parse_decimal(text.substr(1));
      fail_at_line(name_, number,
                   fmt::format("{} {} is {}", columns[column], quote(text),
                               negative ? "negative" : "not a non-negative integer"));
    }
    if (*value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail_at_line(name_, number, fmt::format("{} {} is absurdly large", columns[column], *value));
    }
    return *value;
  }

  const std::string& name_;
  Layout layout_;
  Scaler scale_;
  std::vector<std::string_view> fields_;
  std::unordered_set<std::string_view> ids_;
};

/// Turns rows into events: by step, frees before allocations at equal steps, else file order.
void build_events(const std::vector<Row>& rows, Trace& trace) {
  std::vector<std::uint32_t> by_lower(rows.size());
  std::iota(by_lower.begin(), by_lower.end(), 0U);
  std::vector<std::uint32_t> by_upper = by_lower;
  std::stable_sort(by_lower.begin(), by_lower.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return rows[a].lower < rows[b].lower; });
  std::stable_sort(by_upper.begin(), by_upper.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return rows[a].upper < rows[b].upper; });
  std::vector<std::uint64_t> id(rows.size());  // ids in allocation order
  for (std::size_t i = 0; i < by_lower.size(); ++i) id[by_lower[i]] = i;

  trace.events.reserve(2 * rows.size());
  std::size_t next_free = 0;
  const auto emit_free = [&] {
    const Row& row = rows[by_upper[next_free]];
    trace.events.push_back(Event{Op::free, 0, id[by_upper[next_free++]], row.size, 0,
                                 static_cast<std::int64_t>(row.upper)});
  };
  for (const std::uint32_t r : by_lower) {
    while (rows[by_upper[next_free]].upper <= rows[r].lower) emit_free();
    trace.events.push_back(
        Event{Op::alloc, 0, id[r], rows[r].size, 0, static_cast<std::int64_t>(rows[r].lower)});
  }
  while (next_free < by_upper.size()) emit_free();
}

}  // namespace

Trace read_lifetimes(std::string_view text, const std::string& name, const ReadOptions& options) {
  Lines lines(text);
  std::string_view line;
  while (lines.next(line) && line.empty()) {
  }
  if (lines.number() == 0 || line.empty()) {
    throw InvalidArgument(
        fmt::format("{}: empty file: a lifetime list starts with the header "
                    "id,lower,upper,size",
                    name));
  }
  RowReader reader(name, read_header(line, name, lines.number()), options.scale);
  std::vector<Row> rows;
  while (lines.next(line)) {
    if (!line.empty()) rows.push_back(reader.read(line, lines.number()));
  }
  if (rows.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw InvalidArgument(fmt::format("{}: more than 4 billion buffers", name));
  }
  Trace trace;
  trace.source = name;
  trace.format = to_string(Format::lifetimes);
  trace.device = options.device.value_or(0);
  build_events(rows, trace);
  return trace;
}

}  // namespace cistern::trace::detail
