// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The segment map of the HTML report: everything an allocator reserved at its peak, drawn as one
// strip that wraps like text. Every segment is a bar whose length is proportional to its size
// (segments are separated by white gaps), and every block of it a piece coloured by state.
// One scale per trace, so that the policies compare by area.
//
// Size stays bounded: a piece narrower than a pixel is merged with its neighbours until the
// group is a pixel wide, so a map never has more pieces than it has pixels. The tooltips
// (address, sizes, segment) are not in the SVG: each map carries a compact JSON list of its
// pieces, which the page's script searches by position under the mouse.
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cli/report_html_util.hpp"

namespace cistern::cli::html {
namespace {

struct MapSummary {
  std::size_t segments = 0;
  std::uint64_t reserved = 0, allocated = 0, requested = 0, pending = 0, free = 0;
  std::uint64_t largest_free = 0;
};

MapSummary summarize(const Snapshot& snapshot) {
  MapSummary m;
  m.segments = snapshot.segments.size();
  for (const SegmentInfo& s : snapshot.segments) {
    m.reserved += s.total_size;
    for (const BlockInfo& b : s.blocks) {
      if (b.state == BlockState::active_allocated) m.allocated += b.size;
      if (b.state == BlockState::active_pending_free) m.pending += b.size;
      if (b.state == BlockState::inactive) {
        m.free += b.size;
        m.largest_free = std::max<std::uint64_t>(m.largest_free, b.size);
      }
      m.requested += b.requested_size;
    }
  }
  return m;
}

/// The CSS class of a block state (colours in report_html_assets.hpp).
const char* state_class(std::size_t state) {
  constexpr std::array<const char*, 3> kClasses = {"a", "p", "f"};  // by BlockState
  return kClasses[std::min<std::size_t>(state, 2)];
}

constexpr double kWidth = 1100;  // pixels per row
constexpr double kRowHeight = 16;
constexpr double kRowGap = 5;
constexpr double kRowsOfLargest = 8;  // the policy that reserves most fills this many rows

/// Lays pieces along a strip that wraps onto further rows, and lists them for the tooltips.
class Strip {
 public:
  /// A piece from flow position `from` to `to` (pixels along the strip), split at row ends,
  /// coloured for `state`. `info` describes it for the tooltip: the list item is
  /// [from, to, info...] (see `draw`).
  void piece(double from, double to, std::size_t state, const nlohmann::json& info) {
    items_.push_back(nlohmann::json::array({round(from), round(to)}));
    for (const auto& value : info) items_.back().push_back(value);
    while (to - from > 1e-6) {
      const double row = row_of(from);
      const double end = std::min(to, (row + 1) * kWidth);
      svg_ += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" class="{}"/>)",
                          px(from - row * kWidth), row * (kRowHeight + kRowGap),
                          px(std::max(end - from, 0.6)), kRowHeight, state_class(state));
      rows_ = std::max(rows_, row + 1);
      from = end;
    }
  }
  /// A white line at flow position `at`: between segments (`wide`) or between blocks.
  void separator(double at, bool wide) {
    const double row = row_of(at);
    svg_ += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" class="{}"/>)",
                        px(at - row * kWidth), row * (kRowHeight + kRowGap), wide ? 2 : 1,
                        kRowHeight, wide ? "s" : "b");
  }
  double height() const { return std::max(1.0, rows_) * (kRowHeight + kRowGap); }
  const std::string& svg() const { return svg_; }
  const nlohmann::json& items() const { return items_; }

 private:
  static double row_of(double at) { return std::floor(at / kWidth + 1e-9); }
  static double round(double at) { return std::round(at * 10) / 10; }

  double rows_ = 0;
  std::string svg_;
  nlohmann::json items_ = nlohmann::json::array();
};

/// Blocks narrower than a pixel, gathered until together they are worth drawing.
struct Merged {
  double from = 0;
  std::size_t blocks = 0;
  std::array<std::uint64_t, 3> bytes{};  // by BlockState
  bool empty() const { return blocks == 0; }
  void flush(Strip& strip, double to) {
    if (empty()) return;
    const auto most =
        static_cast<std::size_t>(std::max_element(bytes.begin(), bytes.end()) - bytes.begin());
    strip.piece(from, to, most, {3, most, blocks, bytes[0], bytes[1], bytes[2]});
    *this = Merged{};
  }
};

struct MapDrawing {
  std::string svg;
  nlohmann::json data;
};

/// The map of `snapshot` and its list of pieces. Items are [from, to, kind, ...]. Kinds 0-2 are
/// one block in that state: [.., state, offset in its segment, size, requested size, segment
/// index]. Kind 3 is merged blocks: [.., 3, the commonest state, blocks, allocated, pending,
/// free bytes].
MapDrawing draw(const Snapshot& snapshot, double bytes_per_px) {
  Strip strip;
  std::vector<std::pair<double, bool>> separators;  // (position, between segments)
  nlohmann::json segments = nlohmann::json::array();
  double cursor = 0;
  Merged merged;
  for (std::size_t index = 0; index < snapshot.segments.size(); ++index) {
    const SegmentInfo& s = snapshot.segments[index];
    segments.push_back({s.address, s.total_size, s.is_large ? 1 : 0, s.is_expandable ? 1 : 0});
    if (cursor > 0 && to_double(s.total_size) / bytes_per_px >= 3)
      separators.emplace_back(cursor, true);
    for (std::size_t i = 0; i < s.blocks.size(); ++i) {
      const BlockInfo& b = s.blocks[i];
      const double w = to_double(b.size) / bytes_per_px;
      if (w >= 1.0) {
        merged.flush(strip, cursor);
        const auto state = static_cast<std::size_t>(b.state);
        strip.piece(cursor, cursor + w, state,
                    {state, b.address - s.address, b.size, b.requested_size, index});
        if (i > 0 && w >= 4) separators.emplace_back(cursor, false);
      } else {
        if (merged.empty()) merged.from = cursor;
        ++merged.blocks;
        merged.bytes[static_cast<std::size_t>(b.state)] += b.size;
        if (cursor + w - merged.from >= 1.0) merged.flush(strip, cursor + w);
      }
      cursor += w;
    }
  }
  merged.flush(strip, cursor);
  for (const auto& [at, wide] : separators) strip.separator(at, wide);
  const std::string svg = fmt::format(
      R"(<svg viewBox="0 0 {0} {1}" width="{0}" height="{1}" shape-rendering="crispEdges" )"
      R"(style="width:100%;height:auto" role="img" aria-label="segment map">{2})"
      R"(<rect class="hl" x="0" y="0" width="0" height="0"/></svg>)",
      kWidth, px(strip.height()), strip.svg());
  nlohmann::json data = {{"width", kWidth},
                         {"rowHeight", kRowHeight},
                         {"rowGap", kRowGap},
                         {"segments", std::move(segments)},
                         {"items", strip.items()}};
  return {svg, std::move(data)};
}

std::string keys_html(double bytes_per_px) {
  return fmt::format(
      R"(<div class="keys"><span><span class="swatch a"></span>allocated</span>)"
      R"(<span><span class="swatch p"></span>pending free</span>)"
      R"(<span><span class="swatch f"></span>free (cached)</span>)"
      "<span>white gaps separate segments &middot; one row = {} &middot; same scale for every "
      "policy &middot; hover a block for its address and sizes</span></div>",
      format_bytes_d(bytes_per_px * kWidth));
}

std::string title_html(const replay::Result& r, const std::string& color) {
  const MapSummary m = summarize(*r.segment_map);
  return fmt::format(
      R"(<div class="title"><span class="swatch" style="background:{}"></span><b>{}</b> &mdash; )"
      "{} reserved in {} segment{}: {} allocated ({} requested), {} pending free, {} free "
      "(largest free block {})</div>",
      color, esc(r.policy), format_bytes(m.reserved), m.segments, m.segments == 1 ? "" : "s",
      format_bytes(m.allocated), format_bytes(m.requested), format_bytes(m.pending),
      format_bytes(m.free), format_bytes(m.largest_free));
}

}  // namespace

std::string segment_maps_html(const TraceResults& t, const std::vector<std::string>& colors,
                              const std::string& id) {
  std::uint64_t largest = 0;
  for (const replay::Result& r : t.results)
    if (r.segment_map) largest = std::max(largest, summarize(*r.segment_map).reserved);
  if (largest == 0) return "";
  const double bytes_per_px = to_double(largest) / (kWidth * kRowsOfLargest);
  std::string out = "<h3>Segment map at peak reserved</h3>" + keys_html(bytes_per_px);
  for (std::size_t i = 0; i < t.results.size(); ++i) {
    const replay::Result& r = t.results[i];
    if (!r.segment_map) continue;
    const std::string map_id = fmt::format("{}-{}", id, i);
    const MapDrawing drawing = draw(*r.segment_map, bytes_per_px);
    out += fmt::format(R"(<div class="segmap" data-src="{}">)", map_id);
    out += title_html(r, colors[i]);
    out += R"(<div class="map">)" + drawing.svg + R"(<div class="tip"></div></div></div>)";
    out += fmt::format(R"(<script type="application/json" id="{}">{}</script>)", map_id,
                       script_json(drawing.data));
  }
  return out;
}

}  // namespace cistern::cli::html
