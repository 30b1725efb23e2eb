// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// "Where the memory went", in the HTML report: at each policy's peak reserved, the largest
// allocations live at that moment with the call stack that allocated each (the trace's `frames`:
// PyTorch snapshots recorded with stacks, or cistern.torch.record_history(stacks="python")); and
// a slider that moves the moment along the timeline, showing the same at every timeline point.
//
// Which allocations are live after an event is the trace's, not the policy's: only the moment
// differs between policies. One sweep over the events keeps the live allocations ordered by size
// and takes the largest at each moment. The page carries, per moment, the largest few
// allocations by size and a reference to their stack, and each referenced stack once: it grows
// with the timeline's points and the stacks shown, not with the trace.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/report_html_util.hpp"
#include "trace/trace.hpp"

namespace cistern::cli::html {
namespace {

constexpr std::size_t kLargest = 8;      // allocations shown per moment
constexpr std::size_t kShownFrames = 3;  // frames shown before "more"

/// Whether a frame is Python code (PyTorch's C++ frames name a library or "??").
bool is_python(const StackFrame& f) {
  const std::string_view file = f.filename;
  return file.size() > 3 && file.substr(file.size() - 3) == ".py";
}

std::string frame_html(const StackFrame& f) {
  return fmt::format("<div><b>{}</b> <span class=\"note\">{}:{}</span></div>", esc(f.name),
                     esc(f.filename), f.line);
}

/// A live allocation: its requested bytes and id.
using Live = std::pair<std::uint64_t, std::uint64_t>;

struct Moment {
  std::size_t event = 0;
  std::uint64_t live = 0;     ///< live requested bytes after the event
  std::vector<Live> largest;  ///< by size, largest first
};

/// The moments: every point of the timelines, in event order.
std::vector<std::size_t> moment_events(const TraceResults& t) {
  std::set<std::size_t> events;
  for (const replay::Result& r : t.results) {
    for (const replay::TimelinePoint& p : r.timeline) events.insert(p.event);
  }
  return {events.begin(), events.end()};
}

/// The largest allocations live after each of `events` (sorted), in one sweep of the trace.
std::vector<Moment> sweep(const trace::Trace& trace, const std::vector<std::size_t>& events) {
  std::set<Live, std::greater<>> live;
  std::uint64_t bytes = 0;
  for (const trace::LiveBlock& b : trace.live_before) {
    live.emplace(b.size, b.id);
    bytes += b.size;
  }
  std::vector<Moment> moments;
  std::size_t next = 0;
  for (std::size_t i = 0; i < trace.events.size() && next < events.size(); ++i) {
    const trace::Event& e = trace.events[i];
    if (e.op == trace::Op::alloc) {
      live.emplace(e.size, e.id);
      bytes += e.size;
    } else if (e.op == trace::Op::free && live.erase({e.size, e.id}) != 0) {
      bytes -= e.size;
    }
    if (events[next] != i) continue;
    Moment m{i, bytes, {}};
    for (auto it = live.begin(); it != live.end() && m.largest.size() < kLargest; ++it) {
      m.largest.push_back(*it);
    }
    moments.push_back(std::move(m));
    ++next;
  }
  return moments;
}

/// The event of a policy's peak reserved: its timeline's first highest point.
std::optional<std::size_t> peak_event(const replay::Result& r) {
  if (r.timeline.empty()) return std::nullopt;
  const auto peak =
      std::max_element(r.timeline.begin(), r.timeline.end(),
                       [](const replay::TimelinePoint& a, const replay::TimelinePoint& b) {
                         return a.reserved < b.reserved;
                       });
  return peak->event;
}

/// A policy's reserved bytes at `event`: its last timeline point at or before it.
std::uint64_t reserved_at(const replay::Result& r, std::size_t event) {
  std::uint64_t reserved = 0;
  for (const replay::TimelinePoint& p : r.timeline) {
    if (p.event > event) break;
    reserved = p.reserved;
  }
  return reserved;
}

/// The stacks the page refers to, numbered in first use.
class ShownStacks {
 public:
  explicit ShownStacks(const trace::Trace& trace) : trace_(trace) {}

  /// The page's index of allocation `id`'s stack, or -1 when it has none.
  int index_of(std::uint64_t id) {
    const std::uint32_t stack = trace_.stack_of(id);
    if (stack == 0) return -1;
    const auto [it, added] = index_.emplace(stack, static_cast<int>(order_.size()));
    if (added) order_.push_back(stack);
    return it->second;
  }
  /// [[filename, line, name], ...] per shown stack, innermost frame first.
  nlohmann::json json() const {
    nlohmann::json stacks = nlohmann::json::array();
    for (const std::uint32_t stack : order_) {
      nlohmann::json frames = nlohmann::json::array();
      for (const std::uint32_t id : trace_.stacks.stack(stack)) {
        const StackFrame& f = trace_.stacks.frame(id);
        frames.push_back({f.filename, f.line, f.name});
      }
      stacks.push_back(std::move(frames));
    }
    return stacks;
  }
  /// The stack of allocation `id` as HTML: its innermost Python frames (the program's code;
  /// PyTorch's stacks="all" puts C++ frames of the allocator and the unwinder innermost), or its
  /// innermost frames when none is Python's, then every frame behind "all frames".
  std::string html(std::uint64_t id) const {
    const std::uint32_t stack = trace_.stack_of(id);
    if (stack == 0) return "<span class=\"note\">no frames recorded</span>";
    const std::vector<std::uint32_t>& frames = trace_.stacks.stack(stack);
    std::vector<std::uint32_t> shown;  // frame ids
    for (const bool python_only : {true, false}) {
      for (std::size_t i = 0; i < frames.size() && shown.size() < kShownFrames; ++i) {
        if (!python_only || is_python(trace_.stacks.frame(frames[i]))) shown.push_back(frames[i]);
      }
      if (!shown.empty()) break;
    }
    std::string out, all;
    for (const std::uint32_t f : shown) out += frame_html(trace_.stacks.frame(f));
    if (frames.size() <= shown.size()) return out;
    for (const std::uint32_t f : frames) all += frame_html(trace_.stacks.frame(f));
    return out +
           fmt::format("<details><summary>all {} frames</summary>{}</details>", frames.size(), all);
  }

 private:
  const trace::Trace& trace_;
  std::map<std::uint32_t, int> index_;
  std::vector<std::uint32_t> order_;
};

std::string largest_table(const Moment& m, const ShownStacks& stacks) {
  std::string out =
      "<table class=\"largest\"><tr><th>size</th><th>allocation</th><th>where (innermost "
      "frame first)</th></tr>";
  for (const auto& [size, id] : m.largest) {
    out += fmt::format("<tr><td>{}</td><td>#{}</td><td class=\"frames\">{}</td></tr>",
                       format_bytes(size), id, stacks.html(id));
  }
  return out + "</table>";
}

/// Each policy's peak, with its largest live allocations and their stacks (no script needed).
std::string peaks_html(const TraceResults& t, const std::vector<std::string>& colors,
                       const std::vector<Moment>& moments, ShownStacks& stacks) {
  std::string out;
  for (std::size_t i = 0; i < t.results.size(); ++i) {
    const replay::Result& r = t.results[i];
    const std::optional<std::size_t> peak = peak_event(r);
    if (!peak) continue;
    const auto m = std::find_if(moments.begin(), moments.end(),
                                [&](const Moment& x) { return x.event == *peak; });
    if (m == moments.end()) continue;
    out += fmt::format(
        "<div class=\"peak\"><div class=\"title\"><span class=\"swatch\" style=\"background:{}\">"
        "</span><b>{}</b> &mdash; peak reserved {} after event {}, {} live; the largest live "
        "allocations:</div>",
        colors[i], esc(r.policy), format_bytes(reserved_at(r, *peak)), *peak,
        format_bytes(m->live));
    out += largest_table(*m, stacks) + "</div>";
  }
  return out;
}

nlohmann::json moments_json(const TraceResults& t, const std::vector<std::string>& colors,
                            const std::vector<Moment>& moments, ShownStacks& stacks) {
  nlohmann::json list = nlohmann::json::array();
  for (const Moment& m : moments) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [size, id] : m.largest) top.push_back({size, id, stacks.index_of(id)});
    list.push_back({{"event", m.event}, {"live", m.live}, {"largest", std::move(top)}});
  }
  nlohmann::json policies = nlohmann::json::array();
  for (std::size_t i = 0; i < t.results.size(); ++i) {
    const replay::Result& r = t.results[i];
    if (r.timeline.empty()) continue;
    nlohmann::json reserved = nlohmann::json::array();
    for (const Moment& m : moments) reserved.push_back(reserved_at(r, m.event));
    const std::optional<std::size_t> peak = peak_event(r);
    policies.push_back({{"name", r.policy},
                        {"color", colors[i]},
                        {"peakEvent", peak ? nlohmann::json(*peak) : nlohmann::json()},
                        {"reserved", std::move(reserved)}});
  }
  return {
      {"moments", std::move(list)}, {"policies", std::move(policies)}, {"stacks", stacks.json()}};
}

}  // namespace

std::string moments_html(const TraceResults& t, const std::vector<std::string>& colors,
                         const std::string& id, const std::string& timeline_id) {
  if (t.source == nullptr) return "";
  const std::vector<Moment> moments = sweep(*t.source, moment_events(t));
  if (moments.empty()) return "";
  ShownStacks stacks(*t.source);
  std::string out = "<h3>Where the memory went</h3>";
  if (t.source->alloc_stacks.empty()) {
    out +=
        "<p class=\"note\">This trace has no call stacks: record them with "
        "torch.cuda.memory._record_memory_history(stacks=\"python\") or "
        "cistern.torch.record_history(stacks=\"python\").</p>";
  }
  out += peaks_html(t, colors, moments, stacks);
  const nlohmann::json data = moments_json(t, colors, moments, stacks);
  std::size_t start = 0;  // the slider opens at the first policy's peak
  if (!data["policies"].empty() && !data["policies"][0]["peakEvent"].is_null()) {
    const auto peak = data["policies"][0]["peakEvent"].get<std::size_t>();
    while (start + 1 < moments.size() && moments[start].event < peak) ++start;
  }
  out += fmt::format(
      "<div class=\"moment\" data-src=\"{0}\" data-timeline=\"{1}\"><label>Move the moment along "
      "the timeline: <input type=\"range\" min=\"0\" max=\"{2}\" value=\"{3}\" step=\"1\" "
      "aria-label=\"moment\"></label><div class=\"readout\"></div><div class=\"list\"></div>"
      "</div><script type=\"application/json\" id=\"{0}\">{4}</script>",
      id, timeline_id, moments.size() - 1, start, script_json(data));
  return out;
}

}  // namespace cistern::cli::html
