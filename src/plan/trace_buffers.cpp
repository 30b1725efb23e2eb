// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Traces as buffers to plan, and plans as text (see trace_buffers.hpp).
#include "plan/trace_buffers.hpp"

#include <fmt/format.h>

#include <unordered_map>

namespace cistern::plan {

TraceBuffers buffers_of(const trace::Trace& trace) {
  TraceBuffers out;
  const std::size_t n = trace.live_before.size() + trace.allocations();
  out.buffers.reserve(n);
  out.ids.reserve(n);
  out.streams.reserve(n);
  out.lower_time.reserve(n);
  out.upper_time.reserve(n);
  const std::int64_t first_time = trace.events.empty() ? 0 : trace.events.front().time;
  const std::uint64_t end = trace.events.size() + 1;
  const std::int64_t end_time = trace.events.empty() ? 1 : trace.events.back().time + 1;
  std::unordered_map<std::uint64_t, std::size_t> index;  // id -> buffer, while live
  const auto add = [&](std::uint64_t id, std::uint64_t size, std::uint32_t stream,
                       std::uint64_t lower, std::int64_t time) {
    index[id] = out.buffers.size();
    out.buffers.push_back(Buffer{lower, end, size});
    out.ids.push_back(id);
    out.streams.push_back(stream);
    out.lower_time.push_back(time);
    out.upper_time.push_back(end_time);
  };
  for (const trace::LiveBlock& b : trace.live_before) add(b.id, b.size, b.stream, 0, first_time);
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const trace::Event& e = trace.events[i];
    if (e.op == trace::Op::alloc) {
      add(e.id, e.size, e.stream, i + 1, e.time);
    } else if (e.op == trace::Op::free) {
      const auto it = index.find(e.id);
      if (it == index.end()) continue;  // check() rules this out; nothing to end
      out.buffers[it->second].upper = i + 1;
      out.upper_time[it->second] = e.time;
      index.erase(it);
    }
  }
  return out;
}

std::string format_plan(const TraceBuffers& buffers, const Placement& placement,
                        const std::string& source, std::uint64_t alignment) {
  std::string text = "# cistern-plan 1\n";
  text += fmt::format("# trace {}\n", source);
  text += fmt::format("# buffers {} arena {} peak_live {} alignment {}{}\n", buffers.buffers.size(),
                      placement.arena, placement.peak_live, alignment,
                      placement.optimal ? " optimal" : "");
  text += "id,lower,upper,size,offset\n";
  for (std::size_t i = 0; i < buffers.buffers.size(); ++i) {
    text += fmt::format("{},{},{},{},{}\n", buffers.ids[i], buffers.lower_time[i],
                        buffers.upper_time[i], buffers.buffers[i].size, placement.offsets[i]);
  }
  return text;
}

}  // namespace cistern::plan
