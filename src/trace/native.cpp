// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Writing the cistern trace format (the reader is native_reader.cpp). The writer emits the
// shortest form the grammar allows: trailing fields equal to their defaults are left out.
#include "trace/native.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <iterator>
#include <sstream>

#include "cistern/errors.hpp"
#include "snapshot/file_output.hpp"
#include "trace/native_text.hpp"

namespace cistern::trace {
namespace {

constexpr std::size_t flush_threshold = std::size_t{1} << 20;

using Fields = std::initializer_list<std::uint64_t>;

/// Appends " <hex>" for an address.
void append_hex(std::string& out, std::uint64_t value) {
  fmt::format_to(std::back_inserter(out), " {:#x}", value);
}

const char* segment_keyword(RecordedSegmentEvent::Kind kind) {
  using Kind = RecordedSegmentEvent::Kind;
  switch (kind) {
    case Kind::alloc: return "segment_alloc";
    case Kind::free: return "segment_free";
    case Kind::map: return "segment_map";
    case Kind::unmap: return "segment_unmap";
  }
  return "segment_unknown";
}

void write_header(std::string& out, const Trace& trace) {
  fmt::format_to(std::back_inserter(out), "{} v{}\n", native_magic, native_version);
  if (!trace.source.empty()) {
    fmt::format_to(std::back_inserter(out), "# converted from {}\n", native::escape(trace.source));
  }
  fmt::format_to(std::back_inserter(out), "format {}\ndevice {}\n", native::escape(trace.format),
                 trace.device);
  for (const std::uint64_t handle : trace.streams) {
    out += "stream";
    append_hex(out, handle);
    out += '\n';
  }
  for (const LiveBlock& block : trace.live_before) {
    fmt::format_to(std::back_inserter(out), "live {} {}", block.id, block.size);
    if (block.stream != 0 || block.addr != 0)
      fmt::format_to(std::back_inserter(out), " {}", block.stream);
    if (block.addr != 0) append_hex(out, block.addr);
    out += '\n';
  }
  const Recorded& recorded = trace.recorded;
  for (const RecordedSegment& segment : recorded.initial_segments) {
    out += "segment";
    append_hex(out, segment.addr);
    fmt::format_to(std::back_inserter(out), " {} {} {}{}\n", segment.size, segment.stream,
                   segment.is_large ? "large" : "small",
                   segment.is_expandable ? " expandable" : "");
  }
  if (recorded.initial_reserved) {
    fmt::format_to(std::back_inserter(out), "initial_reserved {}\n", *recorded.initial_reserved);
  }
  if (recorded.peak_reserved) {
    fmt::format_to(std::back_inserter(out), "peak_reserved {}\n", *recorded.peak_reserved);
  }
  for (const auto& [key, value] : recorded.settings) {
    fmt::format_to(std::back_inserter(out), "setting {} {}\n", native::escape(key),
                   native::escape(value));
  }
}

/// Appends " <time>" unless it is 0 and nothing follows.
void append_time(std::string& out, std::int64_t time) {
  if (time != 0) fmt::format_to(std::back_inserter(out), " {}", time);
}

void write_event(std::string& out, const Event& event) {
  switch (event.op) {
    case Op::alloc:
      fmt::format_to(std::back_inserter(out), "a {} {}", event.id, event.size);
      if (event.stream != 0 || event.addr != 0 || event.time != 0) {
        fmt::format_to(std::back_inserter(out), " {}", event.stream);
      }
      if (event.addr != 0 || event.time != 0) append_hex(out, event.addr);
      append_time(out, event.time);
      break;
    case Op::free:
      // Size and address are the allocation's (an invariant), so the reader restores them.
      fmt::format_to(std::back_inserter(out), "f {}", event.id);
      if (event.stream != 0 || event.time != 0)
        fmt::format_to(std::back_inserter(out), " {}", event.stream);
      append_time(out, event.time);
      break;
    case Op::synchronize:
    case Op::empty_cache:
      out += event.op == Op::synchronize ? 's' : 'e';
      if (event.stream != 0 || event.time != 0)
        fmt::format_to(std::back_inserter(out), " {}", event.stream);
      append_time(out, event.time);
      break;
  }
  out += '\n';
}

}  // namespace

NativeWriter::NativeWriter(std::ostream& out, const Trace& trace) : out_(out) {
  write_header(buffer_, trace);
}

NativeWriter::~NativeWriter() {
  try {
    flush();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; flush() reports
  }
}

void NativeWriter::flush_if_full() {
  if (buffer_.size() >= flush_threshold) flush();
}

void NativeWriter::flush() {
  out_.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
  buffer_.clear();
  if (!out_) throw Error("cistern trace: the output stream failed while writing");
}

void NativeWriter::event(const Event& event) {
  write_event(buffer_, event);
  flush_if_full();
}

void NativeWriter::segment_event(const RecordedSegmentEvent& event) {
  buffer_ += segment_keyword(event.kind);
  append_hex(buffer_, event.addr);
  fmt::format_to(std::back_inserter(buffer_), " {} {}", event.size, event.stream);
  append_time(buffer_, event.time);
  buffer_ += '\n';
}

void NativeWriter::free_completed(const RecordedFreeCompletion& completion) {
  fmt::format_to(std::back_inserter(buffer_), "free_completed {}", completion.id);
  append_time(buffer_, completion.time);
  buffer_ += '\n';
}

void NativeWriter::oom(const RecordedOom& oom) {
  fmt::format_to(std::back_inserter(buffer_), "oom {} {} {}", oom.size, oom.device_free,
                 oom.stream);
  append_time(buffer_, oom.time);
  buffer_ += '\n';
}

void NativeWriter::reserved(std::uint64_t bytes) {
  fmt::format_to(std::back_inserter(buffer_), "reserved {}\n", bytes);
}

void NativeWriter::peak_reserved(std::uint64_t bytes) {
  fmt::format_to(std::back_inserter(buffer_), "peak_reserved {}\n", bytes);
}

void write_native(std::ostream& out, const Trace& trace) {
  trace.check();
  NativeWriter writer(out, trace);
  const Recorded& recorded = trace.recorded;
  std::size_t segment = 0, completion = 0, oom = 0, sample = 0;
  for (std::size_t position = 0; position <= trace.events.size(); ++position) {
    // Records placed "before events[position]" come first; check() ensured they are in order.
    for (; segment < recorded.segment_events.size() &&
           recorded.segment_events[segment].before_event == position;
         ++segment) {
      writer.segment_event(recorded.segment_events[segment]);
    }
    for (; completion < recorded.deferred_frees.size() &&
           recorded.deferred_frees[completion].before_event == position;
         ++completion) {
      writer.free_completed(recorded.deferred_frees[completion]);
    }
    for (; oom < recorded.ooms.size() && recorded.ooms[oom].before_event == position; ++oom) {
      writer.oom(recorded.ooms[oom]);
    }
    if (position == trace.events.size()) break;
    writer.event(trace.events[position]);
    if (sample < recorded.reserved_samples.size() &&
        recorded.reserved_samples[sample].first == position) {
      writer.reserved(recorded.reserved_samples[sample++].second);
    }
  }
  writer.flush();
}

void write_native_file(const std::string& path, const Trace& trace) {
  std::ostringstream text;
  write_native(text, trace);
  std::string bytes = text.str();
  const bool gzip = path.size() >= 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  if (gzip) bytes = native::gzip(bytes, path);
  cistern::detail::write_whole_file(path, bytes, "trace");
}

}  // namespace cistern::trace
