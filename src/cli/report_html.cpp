// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern replay --html`: one self-contained page. Charts are pre-rendered SVG so that the page
// reads without scripts; a small inline script adds the hover readouts. Per trace:
//
//  * the memory timeline: live requested bytes (grey area) and each policy's reserved bytes
//    over the event index, with PyTorch's recorded reserved bytes dashed, each policy's peak
//    marked, and the device's capacity when a replay ran out of memory;
//  * the results table;
//  * the segment map at each policy's peak reserved (report_segment_map.cpp);
//  * where the memory went: the largest live allocations and their call stacks at each
//    policy's peak, and a slider over the timeline (report_html_moments.cpp).
//
// The page grows with the timeline samples (Options::timeline_points) and the pixels of the
// segment maps, never with the length of the trace.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cli/report.hpp"
#include "cli/report_html_assets.hpp"
#include "cli/report_html_util.hpp"

namespace cistern::cli {
namespace {

using html::esc;
using html::format_bytes_d;
using html::px;
using html::script_json;
using html::to_double;

// --- axes -----------------------------------------------------------------------------------

/// Axis ticks at 1, 2, 2.5 or 5 times a power of ten, in a unit suited to the range.
struct Axis {
  double bottom = 0;  ///< the axis minimum (a multiple of step), in base units
  double top = 1;     ///< the axis maximum, in base units
  double step = 1;    ///< between ticks, in base units
  double unit = 1;    ///< base units per displayed unit
  std::string unit_name;
  double span() const { return top - bottom; }
};

double nice_step(double raw) {
  if (raw <= 0) return 1;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  for (double candidate : {1.0, 2.0, 2.5, 5.0})
    if (norm <= candidate + 1e-9) return candidate * magnitude;
  return 10 * magnitude;
}

/// Ticks over [min, max]: the ends rounded out to whole steps.
Axis make_axis(double min, double max, double unit, std::string unit_name, int ticks) {
  Axis axis;
  axis.unit = unit;
  axis.unit_name = std::move(unit_name);
  const double low = min / unit, high = std::max(max / unit, low + 1e-9);
  const double step = nice_step((high - low) / ticks);
  axis.step = step * unit;
  axis.bottom = std::floor(low / step + 1e-9) * step * unit;
  axis.top = std::max(axis.bottom + axis.step, std::ceil(high / step - 1e-9) * step * unit);
  return axis;
}

/// A byte axis. It starts at zero unless every value is well above it, where zero would press
/// the lines that the reader compares into a thin band at the top.
Axis byte_axis(double min, double max) {
  const double unit = max >= to_double(GiB)   ? to_double(GiB)
                      : max >= to_double(MiB) ? to_double(MiB)
                      : max >= to_double(KiB) ? to_double(KiB)
                                              : 1;
  const char* name = unit == to_double(GiB)   ? "GiB"
                     : unit == to_double(MiB) ? "MiB"
                     : unit == to_double(KiB) ? "KiB"
                                              : "bytes";
  const double low = min > 0.5 * max ? min - 0.08 * (max - min) : 0;
  return make_axis(low, std::max(max, 1.0), unit, name, 5);
}

/// An event axis over exactly [0, max]; ticks at whole steps inside it.
Axis event_axis(double max) {
  Axis axis = make_axis(0, max, 1, "event", 8);
  axis.top = std::max(max, 1.0);
  return axis;
}

std::string tick_label(double value, const Axis& axis) {
  return fmt::format("{:g}", std::round(value / axis.unit * 1000) / 1000);
}

std::string count_label(double value) {
  if (value >= 1e6) return fmt::format("{:g}M", value / 1e6);
  if (value >= 1e4) return fmt::format("{:g}k", value / 1e3);
  return fmt::format("{:g}", value);
}

// --- colours --------------------------------------------------------------------------------

constexpr const char* kLiveColor = "#9ca3af";
constexpr std::array<const char*, 6> kExtraColors = {"#059669", "#db2777", "#0891b2",
                                                     "#ca8a04", "#4f46e5", "#65a30d"};

std::string base_name(const std::string& label) { return label.substr(0, label.find(':')); }

/// A colour per result of one trace: the usual policies keep theirs across traces.
std::vector<std::string> policy_colors(const TraceResults& t) {
  std::vector<std::string> colors;
  std::set<std::string> used;
  std::size_t extra = 0;
  for (const replay::Result& r : t.results) {
    const std::string name = base_name(r.policy);
    std::string color = name == "recorded"  ? "#374151"
                        : name == "cistern" ? "#2563eb"
                        : name == "torch"   ? "#ea580c"
                        : name == "nocache" ? "#9333ea"
                                            : "";
    if (color.empty() || used.count(color) != 0)
      color = kExtraColors[extra++ % kExtraColors.size()];
    used.insert(color);
    colors.push_back(color);
  }
  return colors;
}

// --- timeline -------------------------------------------------------------------------------

struct Geometry {
  double width = 1100, height = 340, left = 64, right = 16, top = 12, bottom = 44;
  double plot_width() const { return width - left - right; }
  double plot_height() const { return height - top - bottom; }
};

struct Series {
  std::string name;
  std::string color;
  bool dashed = false;
  std::vector<double> x;
  std::vector<double> y;
  std::uint64_t peak = 0;
};

std::vector<Series> timeline_series(const TraceResults& t, const std::vector<std::string>& colors) {
  std::vector<Series> series;
  for (std::size_t i = 0; i < t.results.size(); ++i) {
    const replay::Result& r = t.results[i];
    if (r.timeline.empty()) continue;
    if (series.empty()) {  // live bytes are the same for every policy: take the first
      Series live{"live (requested)", kLiveColor, false, {}, {}, t.peak_live};
      for (const replay::TimelinePoint& p : r.timeline) {
        live.x.push_back(to_double(p.event));
        live.y.push_back(to_double(p.live));
      }
      series.push_back(std::move(live));
    }
    Series s{r.policy, colors[i], r.policy == "recorded", {}, {}, r.peak_reserved.value_or(0)};
    for (const replay::TimelinePoint& p : r.timeline) {
      s.x.push_back(to_double(p.event));
      s.y.push_back(to_double(p.reserved));
    }
    series.push_back(std::move(s));
  }
  return series;
}

/// Maps trace coordinates (event, bytes) to the chart's pixels.
struct Scale {
  const Geometry& g;
  const Axis& x;
  const Axis& y;
  double px_x(double event) const {
    return g.left + (event - x.bottom) / x.span() * g.plot_width();
  }
  double px_y(double bytes) const {
    return g.top + g.plot_height() - (bytes - y.bottom) / y.span() * g.plot_height();
  }
};

std::string polyline_points(const Series& s, const Scale& scale) {
  std::string points;
  points.reserve(s.x.size() * 14);
  for (std::size_t i = 0; i < s.x.size(); ++i)
    points += px(scale.px_x(s.x[i])) + "," + px(scale.px_y(s.y[i])) + " ";
  return points;
}

std::string axes_svg(const Scale& scale, std::uint64_t events) {
  const Geometry& g = scale.g;
  std::string out = "<g class=\"axis\">";
  const double bottom = g.top + g.plot_height();
  for (double v = scale.y.bottom; v <= scale.y.top + scale.y.step / 2; v += scale.y.step) {
    const double y = scale.px_y(v);
    out += fmt::format("<line class=\"grid\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>", px(g.left),
                       px(g.left + g.plot_width()), px(y), px(y));
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>", px(g.left - 6),
                       px(y + 4), tick_label(v, scale.y));
  }
  const double middle = g.top + g.plot_height() / 2;
  out += fmt::format(
      "<text x=\"14\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {0})\">{1}</text>",
      px(middle), scale.y.unit_name);
  for (double v = 0; v <= scale.x.top + 1e-9; v += scale.x.step) {
    const double x = scale.px_x(v);
    out += fmt::format("<line class=\"tick\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>", px(x),
                       px(x), px(bottom), px(bottom + 4));
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", px(x),
                       px(bottom + 16), count_label(v));
  }
  out += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">event (the trace's allocations and frees, "
      "in order; {} in all)</text>",
      px(g.left + g.plot_width() / 2), px(bottom + 34), events);
  out += fmt::format("<path d=\"M{},{}V{}H{}\" fill=\"none\"/>", px(g.left), px(g.top), px(bottom),
                     px(g.left + g.plot_width()));
  return out + "</g>";
}

/// The live area first, then the policies from last to first so that the first named (usually
/// cistern) is on top, then PyTorch's recorded line, dashed, over everything.
std::vector<std::size_t> drawing_order(const std::vector<Series>& series) {
  std::vector<std::size_t> order;
  if (!series.empty()) order.push_back(0);
  for (std::size_t i = series.size(); i-- > 1;)
    if (!series[i].dashed) order.push_back(i);
  for (std::size_t i = 1; i < series.size(); ++i)
    if (series[i].dashed) order.push_back(i);
  return order;
}

std::string series_svg(const std::vector<Series>& series, const Scale& scale) {
  std::string out;
  const double bottom = scale.g.top + scale.g.plot_height();
  for (std::size_t i : drawing_order(series)) {
    const Series& s = series[i];
    if (s.x.empty()) continue;
    const std::string points = polyline_points(s, scale);
    if (i == 0) {  // live: a filled area under the line
      out += fmt::format(
          "<polygon data-series=\"0\" points=\"{},{} {}{},{}\" fill=\"#e5e7eb\" "
          "fill-opacity=\"0.8\"/>",
          px(scale.px_x(s.x.front())), px(bottom), points, px(scale.px_x(s.x.back())), px(bottom));
    }
    out += fmt::format(
        "<polyline data-series=\"{}\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
        "stroke-width=\"{}\" stroke-linejoin=\"round\"{}/>",
        i, points, s.color, i == 0 ? "1.2" : "1.6", s.dashed ? " stroke-dasharray=\"6 4\"" : "");
    if (i == 0) continue;
    const auto peak = std::max_element(s.y.begin(), s.y.end()) - s.y.begin();
    out += fmt::format(
        "<circle data-series=\"{}\" cx=\"{}\" cy=\"{}\" r=\"3.5\" fill=\"#fff\" stroke=\"{}\" "
        "stroke-width=\"1.6\"><title>{} peak reserved {} at event {}</title></circle>",
        i, px(scale.px_x(s.x[peak])), px(scale.px_y(s.y[peak])), s.color, esc(s.name),
        format_bytes_d(s.y[peak]), s.x[peak]);
  }
  return out;
}

nlohmann::json timeline_data(const std::vector<Series>& series, const Scale& scale) {
  nlohmann::json xs = nlohmann::json::array();
  std::vector<const std::vector<double>*> distinct;
  nlohmann::json list = nlohmann::json::array();
  for (const Series& s : series) {
    std::size_t xi = 0;
    while (xi < distinct.size() && *distinct[xi] != s.x) ++xi;
    if (xi == distinct.size()) {
      distinct.push_back(&s.x);
      nlohmann::json x = nlohmann::json::array();
      for (double v : s.x) x.push_back(static_cast<std::uint64_t>(v));
      xs.push_back(std::move(x));
    }
    nlohmann::json y = nlohmann::json::array();
    for (double v : s.y) y.push_back(static_cast<std::uint64_t>(v));
    list.push_back({{"name", s.name}, {"color", s.color}, {"xi", xi}, {"y", std::move(y)}});
  }
  return {{"width", scale.g.width}, {"left", scale.g.left}, {"plotWidth", scale.g.plot_width()},
          {"xmax", scale.x.top},    {"xs", std::move(xs)},  {"series", std::move(list)}};
}

std::string legend_html(const std::vector<Series>& series, std::uint64_t peak_live) {
  std::string out = "<div class=\"legend\">";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    std::string text = fmt::format("{} &middot; peak {}", esc(s.name), format_bytes(s.peak));
    if (i > 0 && peak_live > 0)
      text += fmt::format(" ({:+.2f}%)", (to_double(s.peak) / to_double(peak_live) - 1) * 100);
    out += fmt::format(
        "<span class=\"item\" data-series=\"{}\" title=\"click to hide or show\">"
        "<span class=\"swatch{}\" style=\"{}:{}\"></span>{}</span>",
        i, s.dashed ? " dash" : "", s.dashed ? "border-color" : "background", s.color, text);
  }
  return out + "</div>";
}

/// The replays' capacity if one of them ran out of memory or it lies within the chart.
std::optional<std::uint64_t> capacity_to_draw(const TraceResults& t, double ymax) {
  for (const replay::Result& r : t.results) {
    if (!r.capacity || r.policy == "recorded") continue;
    if (r.ooms > 0 || to_double(*r.capacity) <= ymax * 1.25) return r.capacity;
  }
  return std::nullopt;
}

std::string capacity_svg(const Scale& scale, std::uint64_t capacity) {
  const double y = scale.px_y(to_double(capacity));
  return fmt::format(
      "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"#dc2626\" stroke-width=\"1\" "
      "stroke-dasharray=\"2 3\"/><text x=\"{1}\" y=\"{3}\" text-anchor=\"end\" fill=\"#dc2626\" "
      "font-size=\"11\">device capacity {4}</text>",
      px(scale.g.left), px(scale.g.left + scale.g.plot_width()), px(y), px(y - 4),
      format_bytes(capacity));
}

std::string timeline_html(const TraceResults& t, const std::vector<std::string>& colors,
                          std::size_t index) {
  const std::vector<Series> series = timeline_series(t, colors);
  if (series.empty()) return "<p class=\"note\">No timeline was recorded.</p>";
  double xmax = 1, ymin = -1, ymax = 1;
  for (const Series& s : series) {
    if (!s.x.empty()) xmax = std::max(xmax, s.x.back());
    for (double v : s.y) {
      ymax = std::max(ymax, v);
      ymin = ymin < 0 ? v : std::min(ymin, v);
    }
  }
  // The device's capacity, drawn when it is near enough to matter (a replay ran out of memory).
  const std::optional<std::uint64_t> capacity = capacity_to_draw(t, ymax);
  if (capacity) ymax = std::max(ymax, to_double(*capacity));
  const Geometry g;
  const Axis yaxis = byte_axis(std::max(ymin, 0.0), ymax * 1.02);
  const Axis xaxis = event_axis(xmax);
  const Scale scale{g, xaxis, yaxis};
  const std::string id = fmt::format("timeline-{}", index);
  std::string out = legend_html(series, t.peak_live);
  out += fmt::format("<div class=\"chart\" data-src=\"{}\">", id);
  out += fmt::format(
      "<svg viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" style=\"width:100%;height:auto\" "
      "role=\"img\" aria-label=\"memory timeline\">",
      g.width, g.height);
  out += axes_svg(scale, t.events);
  if (capacity) out += capacity_svg(scale, *capacity);
  out += series_svg(series, scale);
  out += fmt::format(
      "<line class=\"guide\" x1=\"0\" x2=\"0\" y1=\"{}\" y2=\"{}\" stroke=\"#111827\" "
      "stroke-width=\"0.8\" style=\"display:none\"/>",
      px(g.top), px(g.top + g.plot_height()));
  out += "</svg><div class=\"tip\"></div></div>";
  out += fmt::format("<script type=\"application/json\" id=\"{}\">{}</script>", id,
                     script_json(timeline_data(series, scale)));
  return out;
}

// --- tables ---------------------------------------------------------------------------------

std::optional<double> ratio(const replay::Result& r) {
  if (!r.min_capacity || r.peak_live == 0) return std::nullopt;
  return to_double(*r.min_capacity) / to_double(r.peak_live);
}

std::string results_table_html(const TraceResults& t, const std::vector<std::string>& colors) {
  std::optional<double> best_overhead, best_ratio;
  for (const replay::Result& r : t.results) {
    if (r.policy == "recorded" || !r.error.empty() || r.ooms > 0) continue;
    if (r.overhead) best_overhead = std::min(best_overhead.value_or(*r.overhead), *r.overhead);
    if (auto q = ratio(r)) best_ratio = std::min(best_ratio.value_or(*q), *q);
  }
  std::string out =
      "<table><tr><th>policy</th><th>peak reserved</th><th>overhead</th><th>min capacity</th>"
      "<th>min cap / live</th><th>OOMs</th><th>device allocs / frees</th><th>ns / op</th>"
      "<th>device time</th></tr>";
  for (std::size_t i = 0; i < t.results.size(); ++i) {
    const replay::Result& r = t.results[i];
    const bool recorded = r.policy == "recorded";
    const std::string settings = format_settings(r);
    out +=
        fmt::format("<tr{}><td><span class=\"swatch\" style=\"background:{}\"></span>{}{}</td>",
                    recorded ? " class=\"recorded\"" : "", colors[i], esc(r.policy),
                    settings.empty() ? "" : "<br><small>settings: " + esc(settings) + "</small>");
    if (!r.error.empty()) {
      out += fmt::format("<td colspan=\"8\" class=\"err\">{}</td></tr>", esc(r.error));
      continue;
    }
    const bool ranked = !recorded && r.ooms == 0;
    const bool low_overhead =
        ranked && r.overhead && best_overhead && *r.overhead == *best_overhead;
    const bool low_ratio = ranked && ratio(r) && best_ratio && *ratio(r) == *best_ratio;
    out += fmt::format("<td>{}</td>", r.peak_reserved ? format_bytes(*r.peak_reserved) : "-");
    out += fmt::format("<td{}>{}</td>", low_overhead ? " class=\"best\"" : "",
                       format_percent(r.overhead));
    out += fmt::format("<td>{}</td>", r.min_capacity ? format_bytes(*r.min_capacity) : "-");
    out += fmt::format("<td{}>{}</td>", low_ratio ? " class=\"best\"" : "",
                       format_ratio(r.min_capacity, r.peak_live));
    out += fmt::format("<td{}>{}</td><td>{} / {}</td>", r.ooms > 0 ? " class=\"err\"" : "", r.ooms,
                       r.device_allocs, r.device_frees);
    out += fmt::format("<td>{}</td>", r.ns_per_op ? fmt::format("{:.1f}", *r.ns_per_op) : "-");
    out +=
        fmt::format("<td>{}</td></tr>", r.device_ms ? fmt::format("{:.1f} ms", *r.device_ms) : "-");
  }
  return out + "</table>";
}

/// Every policy label in first-seen order, across traces.
std::vector<std::string> all_policies(const std::vector<TraceResults>& traces) {
  std::vector<std::string> labels;
  for (const TraceResults& t : traces)
    for (const replay::Result& r : t.results)
      if (std::find(labels.begin(), labels.end(), r.policy) == labels.end())
        labels.push_back(r.policy);
  return labels;
}

std::string summary_html(const std::vector<TraceResults>& traces) {
  const std::vector<std::string> labels = all_policies(traces);
  std::string out =
      "<nav><h3>Summary</h3><p class=\"note\">Overhead of peak reserved over peak_live, and, "
      "where computed, the smallest capacity that runs with no out-of-memory over peak_live."
      "</p><table><tr><th>trace</th><th>peak_live</th>";
  for (const std::string& label : labels) out += "<th>" + esc(label) + "</th>";
  out += "</tr>";
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const TraceResults& t = traces[i];
    out += fmt::format("<tr><td><a href=\"#trace-{}\">{}</a></td><td>{}</td>", i, esc(t.trace),
                       format_bytes(t.peak_live));
    for (const std::string& label : labels) {
      const auto it = std::find_if(t.results.begin(), t.results.end(),
                                   [&](const replay::Result& r) { return r.policy == label; });
      std::string cell = "-";
      if (it != t.results.end()) {
        cell = format_percent(it->overhead);
        if (it->min_capacity) cell += " &middot; " + format_ratio(it->min_capacity, t.peak_live);
      }
      out += "<td>" + cell + "</td>";
    }
    out += "</tr>";
  }
  return out + "</table></nav>";
}

std::string trace_section(const TraceResults& t, std::size_t index) {
  const std::vector<std::string> colors = policy_colors(t);
  std::string out = fmt::format("<section id=\"trace-{}\"><h2>{}</h2>", index, esc(t.trace));
  out += fmt::format(
      "<p class=\"meta\">{} trace, device {}, {} start &middot; {} events, {} allocations "
      "&middot; peak_live <b>{}</b> ({} bytes)",
      esc(t.format), t.device, esc(t.start), t.events, t.allocations, format_bytes(t.peak_live),
      t.peak_live);
  if (t.live_before != 0)
    out += fmt::format(" &middot; {} live before the window", format_bytes(t.live_before));
  out += "</p>";
  out += timeline_html(t, colors, index);
  out += results_table_html(t, colors);
  out += html::segment_maps_html(t, colors, fmt::format("map-{}", index));
  out += html::moments_html(t, colors, fmt::format("where-{}", index),
                            fmt::format("timeline-{}", index));
  return out + "</section>";
}

constexpr const char* kHowToRead =
    "<h3>How to read this</h3><p class=\"note\"><b>peak_live</b> is the most memory the "
    "program's live allocations ever needed at once (their requested sizes): no allocator can "
    "do with less. <b>Reserved</b> is what an allocator held from the device; its <b>overhead"
    "</b> is peak reserved / peak_live &minus; 1 &mdash; rounding, fragmentation and cached "
    "free memory. <b>Min capacity</b> is the smallest device (to 2 MiB) on which the whole "
    "trace runs without an out-of-memory error; divided by peak_live it says how close to the "
    "physical bound the policy can run. <i>recorded</i> is what PyTorch's own allocator held "
    "when the trace was captured; <i>torch</i> is cistern's emulation of it; <i>nocache</i> "
    "makes one device allocation per request: its reserved bytes are the sizes it asked for, "
    "and the device's rounding of each to 2 MiB pages shows in its min capacity instead. In "
    "the segment maps each bar is a segment and each coloured piece a block; free (pink) "
    "pieces at the peak are memory the policy held but could not use.</p>";

}  // namespace

std::string format_html(const std::vector<TraceResults>& traces, const ReportInfo& info) {
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>cistern replay report</title><style>";
  out += html_assets::kStyle;
  out += "</style></head><body><main><h1>cistern replay report</h1>";
  out += fmt::format(
      "<p class=\"meta\">{} trace{} &middot; capacity {} &middot; cistern {} &middot; {}</p>",
      traces.size(), traces.size() == 1 ? "" : "s", format_bytes(info.capacity), esc(info.version),
      esc(info.generated));
  if (!info.command_line.empty())
    out += "<p class=\"meta\"><code>" + esc(info.command_line) + "</code></p>";
  if (traces.size() > 1) out += summary_html(traces);
  for (std::size_t i = 0; i < traces.size(); ++i) out += trace_section(traces[i], i);
  out += kHowToRead;
  out += "</main><script>";
  out += html_assets::kScript;
  out += "</script></body></html>\n";
  return out;
}

}  // namespace cistern::cli
