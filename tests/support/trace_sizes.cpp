// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "support/trace_sizes.hpp"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string_view>
#include <tuple>

#include "cistern/errors.hpp"
#include "trace/input.hpp"
#include "trace/pickle.hpp"

namespace cistern::testing {
namespace {

namespace fs = std::filesystem;

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

/// The files below `<shared_dir>/traces/<folder>` whose names end in one of `suffixes`,
/// sorted, so that every run sees the same order.
std::vector<fs::path> trace_files(const std::string& shared, std::string_view folder,
                                  std::initializer_list<std::string_view> suffixes) {
  const fs::path root = fs::path(shared) / "traces" / folder;
  if (!fs::is_directory(root)) {
    throw InvalidArgument(fmt::format("{}: trace folder missing", root.string()));
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    const bool wanted = std::any_of(suffixes.begin(), suffixes.end(), [&](std::string_view suffix) {
      return ends_with(name, suffix);
    });
    if (entry.is_regular_file() && wanted) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

template <class Reader>
std::vector<TraceSizes> load_folder(const std::string& shared, std::string_view folder,
                                    std::initializer_list<std::string_view> suffixes, Reader read) {
  const fs::path traces = fs::path(shared) / "traces";
  std::vector<TraceSizes> result;
  for (const fs::path& file : trace_files(shared, folder, suffixes)) {
    result.push_back({fs::relative(file, traces).generic_string(), read(file.string())});
  }
  return result;
}

std::size_t to_size(std::int64_t value, const std::string& path, std::string_view what) {
  if (value < 0) throw InvalidArgument(fmt::format("{}: negative {} {}", path, what, value));
  return static_cast<std::size_t>(value);
}

// ---- lifetime lists ---------------------------------------------------------------------------

/// Splits one CSV line into exactly four fields; false if it has another number of fields.
bool split4(std::string_view line, std::string_view (&fields)[4]) {
  for (int i = 0; i < 3; ++i) {
    const std::size_t comma = line.find(',');
    if (comma == std::string_view::npos) return false;
    fields[i] = line.substr(0, comma);
    line.remove_prefix(comma + 1);
  }
  fields[3] = line;
  return line.find(',') == std::string_view::npos;
}

std::uint64_t parse_field(std::string_view text, const std::string& path, std::size_t line_number) {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw InvalidArgument(
        fmt::format("{}:{}: '{}' is not a non-negative integer", path, line_number, text));
  }
  return value;
}

// ---- Kineto -----------------------------------------------------------------------------------

struct MemoryEvent {
  double time;
  std::int64_t index;
  std::size_t bytes;
};

/// The CUDA allocation in a Kineto `[memory]` event's args, if it is one.
std::optional<MemoryEvent> cuda_allocation(simdjson::dom::element event, const std::string& path) {
  std::string_view name;
  if (event["name"].get(name) != simdjson::SUCCESS || name != "[memory]") return std::nullopt;
  simdjson::dom::element args;
  std::int64_t device_type = 0;
  std::int64_t bytes = 0;
  std::int64_t index = 0;
  double time = 0;
  if (event["args"].get(args) != simdjson::SUCCESS ||
      args["Device Type"].get(device_type) != simdjson::SUCCESS ||
      args["Bytes"].get(bytes) != simdjson::SUCCESS ||
      args["Ev Idx"].get(index) != simdjson::SUCCESS ||
      event["ts"].get(time) != simdjson::SUCCESS) {
    throw InvalidArgument(fmt::format(
        "{}: a [memory] event lacks args with a numeric Device Type, Bytes and Ev Idx, or a ts",
        path));
  }
  constexpr std::int64_t cuda_device_type = 1;
  if (device_type != cuda_device_type || bytes <= 0) return std::nullopt;
  return MemoryEvent{time, index, static_cast<std::size_t>(bytes)};
}

}  // namespace

std::string shared_dir() {
  if (const char* from_env = std::getenv("CISTERN_SHARED_DIR"); from_env != nullptr && *from_env) {
    return from_env;
  }
#ifdef CISTERN_SHARED_DIR
  return CISTERN_SHARED_DIR;
#else
  return "../shared";
#endif
}

bool traces_available(const std::string& shared) {
  std::error_code ignored;
  return fs::is_directory(fs::path(shared) / "traces", ignored);
}

std::vector<std::size_t> pytorch_snapshot_sizes(const std::string& path) {
  const trace::pickle::Document snapshot = trace::pickle::read_file(path);
  std::vector<std::size_t> sizes;
  for (const trace::pickle::Value device : snapshot.root().at("device_traces")) {
    for (const trace::pickle::Value event : device) {
      if (event.at("action").as_string() == "alloc") {
        sizes.push_back(to_size(event.at("size").as_int(), path, "size"));
      }
    }
  }
  return sizes;
}

std::vector<std::size_t> lifetime_csv_sizes(const std::string& path) {
  const std::string text = trace::read_file(path);
  std::vector<std::pair<std::uint64_t, std::size_t>> start_and_size;
  std::size_t line_number = 0;
  for (std::size_t begin = 0; begin < text.size();) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line_number == 1) {
      if (line != "id,lower,upper,size") {
        throw InvalidArgument(fmt::format("{}: expected the header id,lower,upper,size", path));
      }
      continue;
    }
    std::string_view fields[4];
    if (!split4(line, fields)) {
      throw InvalidArgument(
          fmt::format("{}:{}: expected 4 comma-separated fields", path, line_number));
    }
    start_and_size.emplace_back(
        parse_field(fields[1], path, line_number),
        static_cast<std::size_t>(parse_field(fields[3], path, line_number)));
  }
  std::stable_sort(start_and_size.begin(), start_and_size.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::size_t> sizes;
  sizes.reserve(start_and_size.size());
  for (const auto& entry : start_and_size) sizes.push_back(entry.second);
  return sizes;
}

std::vector<std::size_t> kineto_sizes(const std::string& path) {
  const simdjson::padded_string json(trace::read_file(path));
  simdjson::dom::parser parser;
  simdjson::dom::array events;
  if (const auto error = parser.parse(json)["traceEvents"].get(events);
      error != simdjson::SUCCESS) {
    throw InvalidArgument(fmt::format("{}: not a Kineto trace with traceEvents: {}", path,
                                      simdjson::error_message(error)));
  }
  std::vector<MemoryEvent> allocations;
  for (const simdjson::dom::element event : events) {
    if (auto allocation = cuda_allocation(event, path)) allocations.push_back(*allocation);
  }
  std::stable_sort(allocations.begin(), allocations.end(), [](const auto& a, const auto& b) {
    return std::tie(a.time, a.index) < std::tie(b.time, b.index);
  });
  std::vector<std::size_t> sizes;
  sizes.reserve(allocations.size());
  for (const MemoryEvent& allocation : allocations) sizes.push_back(allocation.bytes);
  return sizes;
}

std::vector<TraceSizes> load_pytorch_trace_sizes(const std::string& shared) {
  return load_folder(shared, "pytorch", {".pickle", ".pickle.gz"}, pytorch_snapshot_sizes);
}

std::vector<TraceSizes> load_somas_trace_sizes(const std::string& shared) {
  return load_folder(shared, "somas", {".csv", ".csv.gz"}, lifetime_csv_sizes);
}

std::vector<TraceSizes> load_minimalloc_trace_sizes(const std::string& shared) {
  return load_folder(shared, "minimalloc", {".csv", ".csv.gz"}, lifetime_csv_sizes);
}

std::vector<TraceSizes> load_kineto_trace_sizes(const std::string& shared) {
  return load_folder(shared, "kineto", {".json", ".json.gz"}, kineto_sizes);
}

std::vector<TraceSizes> load_all_trace_sizes(const std::string& shared) {
  std::vector<TraceSizes> all;
  for (auto* load : {load_pytorch_trace_sizes, load_somas_trace_sizes, load_minimalloc_trace_sizes,
                     load_kineto_trace_sizes}) {
    for (TraceSizes& trace : load(shared)) all.push_back(std::move(trace));
  }
  return all;
}

std::vector<std::size_t> load_trace_sizes(const std::string& shared) {
  std::vector<std::size_t> sizes;
  for (const TraceSizes& trace : load_all_trace_sizes(shared)) {
    sizes.insert(sizes.end(), trace.sizes.begin(), trace.sizes.end());
  }
  return sizes;
}

}  // namespace cistern::testing
