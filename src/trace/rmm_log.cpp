// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// RMM logs: the CSV that rmm::mr::logging_resource_adaptor writes, one line per allocate, free
// or failed allocate, in call order, read line by line. Allocations are named by pointer, so ids
// come from address lifetimes (address_lifetimes.hpp).
#include <fmt/format.h>

#include <array>
#include <limits>

#include "cistern/errors.hpp"
#include "trace/address_lifetimes.hpp"
#include "trace/reader_support.hpp"

namespace cistern::trace::detail {
namespace {

enum Column : std::size_t {
  thread_column,
  time_column,
  action_column,
  pointer_column,
  size_column,
  stream_column,
  column_count
};
constexpr std::array<std::string_view, column_count> column_names{"Thread",  "Time", "Action",
                                                                  "Pointer", "Size", "Stream"};
constexpr std::int64_t microseconds_per_day = std::int64_t{86'400} * 1'000'000;

/// Where each column is in a line (`absent` when the log has no such column).
struct Layout {
  static constexpr std::size_t absent = ~std::size_t{0};
  std::array<std::size_t, column_count> at{absent, absent, absent, absent, absent, absent};
  std::size_t fields = 0;
};

Layout read_header(std::string_view line, const std::string& name, std::size_t number) {
  std::vector<std::string_view> fields;
  split(line, ',', fields);
  Layout layout;
  layout.fields = fields.size();
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const auto known = std::find(column_names.begin(), column_names.end(), fields[i]);
    if (known == column_names.end()) {
      fail_at_line(name, number,
                   fmt::format("unknown column {}: an RMM log has the header "
                               "Thread,Time,Action,Pointer,Size,Stream",
                               quote(fields[i])));
    }
    std::size_t& slot = layout.at[static_cast<std::size_t>(known - column_names.begin())];
    if (slot != Layout::absent)
      fail_at_line(name, number, fmt::format("column '{}' twice", *known));
    slot = i;
  }
  for (const Column required : {action_column, pointer_column, size_column}) {
    if (layout.at[required] == Layout::absent) {
      fail_at_line(name, number,
                   fmt::format("the header lacks the column '{}'", column_names[required]));
    }
  }
  return layout;
}

/// "HH:MM:SS.ffffff" as microseconds since midnight; nothing if malformed.
std::optional<std::int64_t> parse_clock(std::string_view text) {
  std::vector<std::string_view> parts;
  split(text, ':', parts, 3);
  if (parts.size() != 3) return std::nullopt;
  const std::size_t dot = parts[2].find('.');
  const std::string_view seconds_text = parts[2].substr(0, dot);
  const std::string_view fraction =
      dot == std::string_view::npos ? std::string_view() : parts[2].substr(dot + 1);
  const auto hours = parse_decimal(parts[0]);
  const auto minutes = parse_decimal(parts[1]);
  const auto seconds = parse_decimal(seconds_text);
  if (!hours || !minutes || !seconds || *hours > 23 || *minutes > 59 || *seconds > 60) {
    return std::nullopt;
  }
  std::int64_t micros = 0;
  int digits = 0;
  for (const char c : fraction) {
    if (c < '0' || c > '9') return std::nullopt;
    if (digits++ < 6) micros = micros * 10 + (c - '0');
  }
  if (dot != std::string_view::npos && fraction.empty()) return std::nullopt;
  for (; digits < 6; ++digits) micros *= 10;
  return static_cast<std::int64_t>((*hours * 60 + *minutes) * 60 + *seconds) * 1'000'000 + micros;
}

/// The device a per-device log's name states (rmm's Python API adds ".dev<N>"), if any.
std::optional<int> device_from_name(const std::string& name) {
  const std::size_t slash = name.find_last_of('/');
  const std::string_view base =
      std::string_view(name).substr(slash == std::string::npos ? 0 : slash + 1);
  const std::size_t at = base.rfind(".dev");
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view rest = base.substr(at + 4);
  const std::string_view digits = rest.substr(0, rest.find('.'));
  const auto device = parse_decimal(digits);
  if (!device || *device > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
    return std::nullopt;
  }
  return static_cast<int>(*device);
}

/// Reads the data lines of one log.
class LogReader {
 public:
  LogReader(const std::string& name, const Layout& layout, Trace& trace)
      : name_(name), layout_(layout), trace_(trace), lifetimes_(trace) {}

  void read(std::string_view line, std::size_t number) {
    number_ = number;
    split(line, ',', fields_);
    if (fields_.size() != layout_.fields) {
      fail(fmt::format("expected {} comma-separated fields as in the header, found {}: {}",
                       layout_.fields, fields_.size(), quote(line)));
    }
    const std::string_view what = fields_[layout_.at[action_column]];
    if (what == "allocate") return on_allocate();
    if (what == "free") return on_free();
    if (what == "allocate failure") return on_failure();
    fail(
        fmt::format("unknown action {}: expected allocate, free or allocate failure", quote(what)));
  }

  void finish() {
    lifetimes_.finish();
    trace_.streams = streams_.handles();
  }

 private:
  [[noreturn]] void fail(std::string_view problem) const { fail_at_line(name_, number_, problem); }

  std::string_view field(Column column) const { return fields_[layout_.at[column]]; }

  /// `%p` of the pointer: hex, or "(nil)" for a null pointer (0).
  std::uint64_t pointer_field() const {
    const std::string_view text = field(pointer_column);
    if (text == "(nil)") return 0;
    const auto value = parse_hex(text);
    if (!value) fail(fmt::format("Pointer {} is not a hexadecimal address", quote(text)));
    return *value;
  }

  std::uint64_t size_field() const {
    const std::string_view text = field(size_column);
    const auto value = parse_decimal(text);
    if (!value) {
      const bool negative = !text.empty() && text[0] == '-';
      fail(fmt::format("Size {} is {}", quote(text), negative ? "negative" : "not an integer"));
    }
    if (*value > max_allocation_size) {
      fail(fmt::format("Size {} is absurd: the limit is {} bytes", *value, max_allocation_size));
    }
    return *value;
  }

  std::uint32_t stream_field() {
    if (layout_.at[stream_column] == Layout::absent) return streams_.index(0);
    const std::string_view text = field(stream_column);
    const auto value = parse_hex(text);
    if (!value) fail(fmt::format("Stream {} is not a hexadecimal cudaStream_t", quote(text)));
    return streams_.index(*value);
  }

  /// Microseconds since the first midnight of the log; days are counted when the clock wraps.
  std::int64_t time_field() {
    if (layout_.at[time_column] == Layout::absent)
      return static_cast<std::int64_t>(trace_.events.size());
    const std::string_view text = field(time_column);
    const auto clock = parse_clock(text);
    if (!clock) fail(fmt::format("Time {} is not HH:MM:SS.ffffff", quote(text)));
    if (last_clock_ && *clock + microseconds_per_day / 2 < *last_clock_) ++days_;
    last_clock_ = *clock;
    return days_ * microseconds_per_day + *clock;
  }

  void on_allocate() {
    const std::uint64_t addr = pointer_field();
    const std::uint64_t bytes = size_field();
    const std::uint32_t on = stream_field();
    const std::int64_t when = time_field();
    if (addr == 0) {
      if (bytes == 0) return;  // allocate(0) may return nullptr: nothing was handed out
      fail(fmt::format("allocate of {} bytes returned (nil)", bytes));
    }
    if (lifetimes_.live_at(addr)) {
      fail(fmt::format("allocate at {:#x}, which is already allocated and not freed", addr));
    }
    lifetimes_.alloc(addr, bytes, on, when);
  }

  void on_free() {
    const std::uint64_t addr = pointer_field();
    const std::uint64_t bytes = size_field();
    const std::uint32_t on = stream_field();
    const std::int64_t when = time_field();
    if (addr == 0) return;  // deallocate(nullptr) is a no-op
    if (lifetimes_.freed_at(addr)) fail(fmt::format("free of {:#x}, which is already freed", addr));
    const AddressLifetimes::Freed freed = lifetimes_.free(addr, bytes, on, when);
    if (freed.size != bytes) {
      fail(fmt::format("free of {:#x} with Size {}, but it was allocated with Size {}", addr, bytes,
                       freed.size));
    }
  }

  void on_failure() {
    RecordedOom oom;
    oom.before_event = trace_.events.size();
    oom.size = size_field();
    oom.stream = stream_field();
    oom.time = time_field();
    trace_.recorded.ooms.push_back(oom);
  }

  const std::string& name_;
  const Layout& layout_;
  Trace& trace_;
  AddressLifetimes lifetimes_;
  StreamTable streams_;
  std::vector<std::string_view> fields_;
  std::size_t number_ = 0;
  std::optional<std::int64_t> last_clock_;
  std::int64_t days_ = 0;
};

}  // namespace

Trace read_rmm_log(std::string_view text, const std::string& name, const ReadOptions& options) {
  require_unscaled(options, name, Format::rmm);
  Lines lines(text);
  std::string_view line;
  while (lines.next(line) && line.empty()) {
  }
  if (line.empty()) {
    throw InvalidArgument(
        fmt::format("{}: empty file: an RMM log starts with the header "
                    "Thread,Time,Action,Pointer,Size,Stream",
                    name));
  }
  const Layout layout = read_header(line, name, lines.number());
  Trace trace;
  trace.source = name;
  trace.format = to_string(Format::rmm);
  trace.device = options.device ? *options.device : device_from_name(name).value_or(0);
  LogReader reader(name, layout, trace);
  while (lines.next(line)) {
    if (!line.empty()) reader.read(line, lines.number());
  }
  reader.finish();
  return trace;
}

}  // namespace cistern::trace::detail
