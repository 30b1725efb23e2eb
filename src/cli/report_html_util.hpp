// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Small helpers shared by the parts of the HTML report (report_html.cpp, the segment map in
// report_segment_map.cpp).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cistern/stats.hpp"
#include "cistern/types.hpp"
#include "cli/report.hpp"

namespace cistern::cli::html {

/// `text` with the five HTML-special characters escaped.
inline std::string esc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

/// JSON that may sit inside a <script> element: "</" would end the element early.
inline std::string script_json(const nlohmann::json& value) {
  const std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '<' && i + 1 < text.size() && text[i + 1] == '/') out += "<\\";
    else out += text[i];
  }
  return out;
}

/// A pixel coordinate, to a tenth.
inline std::string px(double value) { return fmt::format("{:.1f}", value); }

inline double to_double(std::uint64_t value) { return static_cast<double>(value); }

inline std::string format_bytes_d(double bytes) {
  return format_bytes(static_cast<std::uint64_t>(std::max(0.0, bytes)));
}

/// The segment maps at peak reserved of every policy of `t` that has one, on one scale; ""
/// when none has. `colors[i]` is the colour of `t.results[i]`. Map ids start with `id`.
std::string segment_maps_html(const TraceResults& t, const std::vector<std::string>& colors,
                              const std::string& id);

/// "Where the memory went" (report_html_moments.cpp): the largest live allocations and their
/// stacks at each policy's peak, and a slider over the timeline `timeline_id`'s points; "" when
/// the rows carry no trace or no timeline.
std::string moments_html(const TraceResults& t, const std::vector<std::string>& colors,
                         const std::string& id, const std::string& timeline_id);

}  // namespace cistern::cli::html
