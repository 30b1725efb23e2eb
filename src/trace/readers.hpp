// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Reading any supported trace file into a `Trace`. One entry point, `read_trace`, recognises the
// format from the content (gzip is undone first, whatever the name), so that callers pass any
// file they have. Every reader validates as it goes and throws `cistern::InvalidArgument` with a
// message that names the file and the place - "<file>:<line>: ...", "<file>: offset N: ...",
// "<file>: device_traces[0][17]: ...", "<file>: traceEvents[5]: ..." - and the problem; hostile
// input is refused, never trusted (see pickle.hpp for the pickle side).
//
// What each format gives:
//
// - PyTorch memory snapshot (pickle, `_dump_snapshot`). One device's `device_traces` list. Ids by
//   address lifetime. A `free_requested` of an address the window never allocated is a block live
//   before the window (size: the event's requested size); an `active_allocated` block of the
//   final `segments` that the window did not allocate was live throughout (its
//   `requested_size`). The trace's free is `free_requested`; a `free_completed` separated from it
//   by other events goes to `recorded.deferred_frees`, and so does a `free_requested` never
//   completed whose block the final `segments` show `active_pending_free` (completing after the
//   last event); a `free_completed` whose request came before the window is dropped (the
//   program had already freed it). `recorded`: the segments
//   held when the window opened (the final ones, undoing the window's segment events backwards),
//   every segment event in place, initial and peak reserved bytes derived from them,
//   `allocator_settings` as text, `oom` events. A segment freed in the window is not in the final
//   `segments`, so its pool is inferred from its size: PyTorch's small pool only ever allocates
//   2 MiB segments (kSmallBuffer) and its large pool never does (20 MiB, or >= 10 MiB rounded to
//   2 MiB), so `size <= 2 MiB` means small. A run of `segment_free` / `segment_unmap` with no
//   allocation between is an `empty_cache` event at its place, except an unmap whose frames name
//   `kReclaimFrame` (cistern's engine unmapping on its own account, cistern/history.hpp).
// - Lifetime list (CSV `id,lower,upper,size`, lifetime `[lower, upper)`): frees before
//   allocations at equal steps, otherwise file order; `time` is the step; sizes times
//   `ReadOptions::scale`. Ids in the file may be any distinct words.
// - RMM log (CSV `Thread,Time,Action,Pointer,Size,Stream` from `logging_resource_adaptor`, columns
//   found by name): `allocate` and `free` by pointer; a free of a pointer the log never allocated
//   is a block live before the log (its Size); `allocate failure` goes to `recorded.ooms`;
//   `Time` (HH:MM:SS.ffffff) becomes microseconds since the first midnight, counting days when
//   the clock wraps; Stream is the hex `cudaStream_t`.
// - Kineto trace (Chrome JSON, PyTorch profiler with `profile_memory=True`): the CUDA
//   (`Device Type` 1) `[memory]` events of one `Device Id`, sorted by `ts`, ties by `Ev Idx` (the
//   file is not in time order; this order reproduces PyTorch's Total Allocated exactly). Sizes
//   are PyTorch's rounded block sizes. A free of an address the trace never allocated is a block
//   live before; blocks live throughout are not named by any event, so their total (Total
//   Allocated before the first event minus the named live-before blocks) becomes one
//   `live_before` block at address 0. `recorded.reserved_samples`, `initial_reserved` (the
//   figure after the first event) and `peak_reserved` come from Total Reserved.
// - cistern trace (our own text format, docs/trace-format.md; see native.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trace/trace.hpp"

namespace cistern::trace {

/// The trace file formats cistern reads.
enum class Format : std::uint8_t {
  pytorch,    ///< PyTorch memory snapshot (pickle)
  lifetimes,  ///< lifetime list CSV (id,lower,upper,size)
  rmm,        ///< RMM logging_resource_adaptor CSV
  kineto,     ///< Kineto / PyTorch profiler Chrome-trace JSON
  cistern,    ///< cistern's own text format
};

/// The format's name as `Trace::format` and the command line spell it ("pytorch", ...).
const char* to_string(Format format) noexcept;
/// The format named `name` (see `to_string`), or nothing.
std::optional<Format> format_from_string(std::string_view name) noexcept;

/// How to read a trace.
struct ReadOptions {
  /// Read the file as this format instead of recognising it.
  std::optional<Format> format;
  /// The device whose events to read. Unset: the only device with events (an error listing them
  /// when there are several). Formats of one device (lifetimes, RMM logs) record it as given.
  std::optional<int> device;
  /// Lifetime lists only: multiply every size by this (minimalloc's sets are in normalised
  /// units). Rounded to the nearest byte; must be positive. Other formats accept only 1.
  double scale = 1;
  /// The most bytes a trace file may hold after decompression (`--max-input-size`): reading
  /// stops with an error beyond it, so memory stays bounded whatever the file.
  std::uint64_t max_input_size = std::uint64_t{2} << 30;
};

/// The format of a file's content (already decompressed; its first block is enough): a pickle
/// PROTO opcode (0x80 and a protocol from 2 to 5), the line "# cistern-trace", a JSON object or
/// array, or a CSV header naming the lifetime or RMM columns; a UTF-8 byte order mark before
/// the text formats is allowed. `name` labels the error thrown when nothing matches.
Format detect_format(std::string_view bytes, const std::string& name);

/// Reads the trace file at `path` (gzipped or not) for one device. The format is recognised from
/// the file's first block before the rest is read, so that a file that is no trace is refused
/// at once. A UTF-8 byte order mark and CRLF line ends are read as their plain forms. The result
/// passes `Trace::check`. Throws `cistern::InvalidArgument` as described at the top of this header.
Trace read_trace(const std::string& path, const ReadOptions& options = {});

/// The same, from the bytes of a file already in memory (gzipped or not); `name` labels messages
/// and becomes `Trace::source`.
Trace read_trace_bytes(std::string bytes, const std::string& name, const ReadOptions& options = {});

/// Every device of the trace file at `path`, each read as its own trace, in ascending device
/// order (`list_devices`); only `options.device` when it is set. A file of one device gives one
/// trace, as `read_trace` does.
std::vector<Trace> read_trace_devices(const std::string& path, const ReadOptions& options = {});
/// The content of the trace file at `path`, decompressed, bounded by `options.max_input_size`;
/// unless `options.format` is set, a file whose first block is no trace format is refused
/// before the rest is read (see `detect_format`).
std::string read_input(const std::string& path, const ReadOptions& options = {});

/// The devices a trace file holds, ascending: those with events or, for PyTorch snapshots,
/// segments. Single-device formats give `options.device` or 0.
std::vector<int> list_devices(const std::string& path, const ReadOptions& options = {});

}  // namespace cistern::trace
