// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "trace/readers.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <utility>
#include <vector>

#include "cistern/errors.hpp"
#include "trace/input.hpp"
#include "trace/native.hpp"
#include "trace/reader_support.hpp"

namespace cistern::trace {
namespace {

constexpr std::array<std::pair<Format, const char*>, 5> format_names{{
    {Format::pytorch, "pytorch"},
    {Format::lifetimes, "lifetimes"},
    {Format::rmm, "rmm"},
    {Format::kineto, "kineto"},
    {Format::cistern, "cistern"},
}};

constexpr unsigned char pickle_proto = 0x80;
/// The pickle protocols that open with PROTO (2 to 5); PyTorch writes 2 or 4.
constexpr unsigned char min_pickle_protocol = 2;
constexpr unsigned char max_pickle_protocol = 5;
constexpr std::string_view utf8_bom = "\xef\xbb\xbf";

bool is_pickle(std::string_view bytes) {
  if (bytes.size() < 2 || static_cast<unsigned char>(bytes[0]) != pickle_proto) return false;
  const auto protocol = static_cast<unsigned char>(bytes[1]);
  return protocol >= min_pickle_protocol && protocol <= max_pickle_protocol;
}

/// The first line of a text, without "\r".
std::string_view first_line(std::string_view bytes) {
  std::string_view line = bytes.substr(0, bytes.find('\n'));
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

/// True if the text after blanks opens a JSON object or array.
bool looks_like_json(std::string_view bytes) {
  const std::size_t first = bytes.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && (bytes[first] == '{' || bytes[first] == '[');
}

/// True if the CSV header `line` names all of `columns`.
bool names_columns(std::string_view line, std::initializer_list<std::string_view> columns) {
  std::vector<std::string_view> fields;
  detail::split(line, ',', fields);
  for (const std::string_view column : columns) {
    if (std::find(fields.begin(), fields.end(), column) == fields.end()) return false;
  }
  return true;
}

/// Editors on Windows start text with a UTF-8 byte order mark; the text readers never see it.
void drop_bom(std::string& bytes, Format format) {
  if (format != Format::pytorch && starts_with(bytes, utf8_bom)) bytes.erase(0, utf8_bom.size());
}

Trace read_as(Format format, std::string bytes, const std::string& name,
              const ReadOptions& options) {
  switch (format) {
    case Format::pytorch: return detail::read_pytorch_snapshot(std::move(bytes), name, options);
    case Format::lifetimes: return detail::read_lifetimes(bytes, name, options);
    case Format::rmm: return detail::read_rmm_log(bytes, name, options);
    case Format::kineto: return detail::read_kineto(std::move(bytes), name, options);
    case Format::cistern: return detail::read_native(bytes, name, options);
  }
  throw InvalidArgument(fmt::format("{}: unknown trace format {}", name, static_cast<int>(format)));
}

}  // namespace

const char* to_string(Format format) noexcept {
  for (const auto& [value, text] : format_names) {
    if (value == format) return text;
  }
  return "unknown";
}

std::optional<Format> format_from_string(std::string_view name) noexcept {
  for (const auto& [value, text] : format_names) {
    if (name == text) return value;
  }
  return std::nullopt;
}

Format detect_format(std::string_view bytes, const std::string& name) {
  if (is_pickle(bytes)) return Format::pytorch;
  if (starts_with(bytes, utf8_bom)) bytes.remove_prefix(utf8_bom.size());
  if (starts_with(bytes, native_magic)) return Format::cistern;
  if (looks_like_json(bytes)) return Format::kineto;
  const std::string_view header = first_line(bytes);
  if (names_columns(header, {"id", "lower", "upper", "size"})) return Format::lifetimes;
  if (names_columns(header, {"Action", "Pointer", "Size"})) return Format::rmm;
  throw InvalidArgument(fmt::format(
      "{}: unknown trace format (it starts with {}): expected a PyTorch snapshot pickle, a "
      "Kineto JSON trace, a lifetime CSV (id,lower,upper,size), an RMM log "
      "(Thread,Time,Action,Pointer,Size,Stream) or a cistern trace ({})",
      name, detail::quote(bytes.substr(0, 16)), native_magic));
}

Trace read_trace_bytes(std::string bytes, const std::string& name, const ReadOptions& options) {
  if (is_gzip(bytes)) bytes = gunzip(bytes, name, options.max_input_size);
  if (bytes.size() > options.max_input_size) {
    throw InvalidArgument(
        fmt::format("{}: more than {} bytes, the limit on input size "
                    "(--max-input-size)",
                    name, options.max_input_size));
  }
  const Format format = options.format ? *options.format : detect_format(bytes, name);
  drop_bom(bytes, format);
  Trace trace = read_as(format, std::move(bytes), name, options);
  trace.check();
  return trace;
}

std::string read_input(const std::string& path, const ReadOptions& options) {
  PrefixCheck check;
  if (!options.format) check = [&path](std::string_view prefix) { detect_format(prefix, path); };
  return read_file(path, options.max_input_size, check);
}

Trace read_trace(const std::string& path, const ReadOptions& options) {
  return read_trace_bytes(read_input(path, options), path, options);
}

std::vector<int> list_devices(const std::string& path, const ReadOptions& options) {
  std::string bytes = read_input(path, options);
  const Format format = options.format ? *options.format : detect_format(bytes, path);
  drop_bom(bytes, format);
  if (format == Format::pytorch) return detail::pytorch_snapshot_devices(std::move(bytes), path);
  if (format == Format::kineto) return detail::kineto_devices(std::move(bytes), path);
  if (format == Format::cistern) return {read_trace_bytes(std::move(bytes), path, options).device};
  return {options.device.value_or(0)};
}

std::vector<Trace> read_trace_devices(const std::string& path, const ReadOptions& options) {
  if (options.device) return {read_trace(path, options)};
  std::string bytes = read_file(path);
  const Format format = options.format ? *options.format : detect_format(bytes, path);
  std::vector<int> devices;
  if (format == Format::pytorch) devices = detail::pytorch_snapshot_devices(bytes, path);
  if (format == Format::kineto) devices = detail::kineto_devices(bytes, path);
  if (devices.size() <= 1) return {read_trace_bytes(std::move(bytes), path, options)};
  std::vector<Trace> traces;
  for (const int device : devices) {
    ReadOptions one = options;
    one.device = device;
    traces.push_back(read_trace_bytes(bytes, path, one));
  }
  return traces;
}

}  // namespace cistern::trace
