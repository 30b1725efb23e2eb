// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// cistern's own trace format: versioned, line-oriented text that holds everything a `Trace`
// holds, so that any trace can be converted to it and read back identically (all but `source`,
// which names the file read). docs/trace-format.md is its specification; in short:
//
//   # cistern-trace v1
//   format pytorch
//   device 0
//   stream 0x0
//   live 0 1048576 0 0x7f0000000000
//   a 1 512 0 0x7f0000200000 1700000000000
//   f 1 0 1700000000012
//   segment_alloc 0x7f0000400000 2097152 0 1700000000013
//
// Reading is `read_trace` (readers.hpp), which recognises the first line. Writing goes through
// `NativeWriter`, which also serves a recorder that produces events as they happen.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "trace/trace.hpp"

namespace cistern::trace {

/// The start of the first line of every cistern trace; the version follows (" v1").
inline constexpr std::string_view native_magic = "# cistern-trace";
/// The version this build writes and the only one it reads.
inline constexpr int native_version = 1;

/// Writes a cistern trace line by line to a stream: first the header (everything known before
/// the first event), then events and the recording allocator's in-window records in the order
/// they happened. Output is buffered; `flush` (or destruction) writes it out.
class NativeWriter {
 public:
  /// Writes the header of `trace`: format, device, streams, `live_before`, and of `recorded` the
  /// initial segments, the reserved figures and the settings. Events and in-window records of
  /// `trace` are not written (see `write_native` for a whole trace).
  NativeWriter(std::ostream& out, const Trace& trace);
  ~NativeWriter();
  NativeWriter(const NativeWriter&) = delete;
  NativeWriter& operator=(const NativeWriter&) = delete;

  /// One event.
  void event(const Event& event);
  /// A segment event, before the next event.
  void segment_event(const RecordedSegmentEvent& event);
  /// A deferred free completion, before the next event.
  void free_completed(const RecordedFreeCompletion& completion);
  /// A failed allocation of the recording allocator, before the next event.
  void oom(const RecordedOom& oom);
  /// The recorded reserved bytes after the last event written.
  void reserved(std::uint64_t bytes);
  /// The recorded peak reserved bytes, when the header did not know it (a recorder at its end).
  void peak_reserved(std::uint64_t bytes);
  /// Writes buffered text to the stream. Throws `cistern::Error` if the stream fails.
  void flush();

 private:
  void flush_if_full();

  std::ostream& out_;
  std::string buffer_;
};

/// Writes the whole `trace`. Throws `cistern::InvalidArgument` if the trace breaks an invariant
/// (`Trace::check`), `cistern::Error` if the stream fails.
void write_native(std::ostream& out, const Trace& trace);

/// Writes the whole `trace` to the file `path`, gzip-compressed when `path` ends in ".gz".
/// Throws as `write_native`, or `cistern::InvalidArgument` naming `path` and the OS reason when
/// it cannot be written.
void write_native_file(const std::string& path, const Trace& trace);

}  // namespace cistern::trace
