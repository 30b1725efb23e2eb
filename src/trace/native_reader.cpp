// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Reading the cistern trace format (docs/trace-format.md), line by line. Everything the trace
// invariants demand is checked here, where the line number is known, so that a hand-written or
// damaged file gets a message that points at the line.
#include <fmt/format.h>

#include <limits>
#include <unordered_map>

#include "cistern/errors.hpp"
#include "trace/native.hpp"
#include "trace/native_text.hpp"
#include "trace/reader_support.hpp"

namespace cistern::trace::detail {
namespace {

constexpr std::size_t max_tokens = 8;

/// What the reader knows of one id.
struct IdState {
  std::uint64_t size = 0;
  std::uint64_t addr = 0;
  std::uint32_t stream = 0;
  std::size_t line = 0;        ///< where it was allocated (or listed as live)
  std::size_t freed_line = 0;  ///< where it was freed (0: live)
  bool completed = false;      ///< a free_completed was read
};

class NativeReader {
 public:
  NativeReader(const std::string& name, const ReadOptions& options, Trace& trace)
      : name_(name), options_(options), trace_(trace) {}

  void run(std::string_view text);

 private:
  using Handler = void (NativeReader::*)();
  struct Keyword {
    std::string_view word;
    Handler handler;
    bool header;  ///< allowed only before the first event or record
  };
  static const Keyword keywords[];

  void read_magic(Lines& lines);
  void read_line(std::string_view line);
  void tokenize(std::string_view line);

  // ---- header lines
  void on_format();
  void on_device();
  void on_stream();
  void on_live();
  void on_segment();
  void on_initial_reserved();
  void on_peak_reserved();
  void on_setting();
  // ---- body lines
  void on_alloc();
  void on_free();
  void on_synchronize() { on_program_call(Op::synchronize); }
  void on_empty_cache() { on_program_call(Op::empty_cache); }
  void on_program_call(Op op);
  void on_segment_alloc() { on_segment_event(RecordedSegmentEvent::Kind::alloc); }
  void on_segment_free() { on_segment_event(RecordedSegmentEvent::Kind::free); }
  void on_segment_map() { on_segment_event(RecordedSegmentEvent::Kind::map); }
  void on_segment_unmap() { on_segment_event(RecordedSegmentEvent::Kind::unmap); }
  void on_segment_event(RecordedSegmentEvent::Kind kind);
  void on_free_completed();
  void on_oom();
  void on_reserved();

  // ---- fields
  [[noreturn]] void fail(std::string_view problem) const { fail_at_line(name_, line_, problem); }
  void arity(std::size_t min, std::size_t max) const;
  bool has(std::size_t i) const { return i < tokens_.size(); }
  std::uint64_t decimal(std::size_t i, std::string_view what) const;
  std::int64_t signed_decimal(std::size_t i, std::string_view what) const;
  std::uint64_t hex(std::size_t i, std::string_view what) const;
  std::uint64_t size(std::size_t i, std::string_view what) const;
  std::uint32_t stream(std::size_t i);
  std::string text(std::size_t i, std::string_view what) const;
  std::int64_t time(std::size_t i) const { return has(i) ? signed_decimal(i, "time") : 0; }
  IdState& known_id(std::uint64_t id);
  void new_id(std::uint64_t id, std::uint64_t bytes, std::uint64_t addr, std::uint32_t on);

  const std::string& name_;
  const ReadOptions& options_;
  Trace& trace_;
  std::vector<std::string_view> tokens_;
  std::size_t line_ = 0;
  bool in_body_ = false;
  bool streams_fixed_ = false;  ///< a line used a stream index: no more `stream` lines
  bool seen_format_ = false, seen_device_ = false;
  std::unordered_map<std::uint64_t, IdState> ids_;
};

const NativeReader::Keyword NativeReader::keywords[] = {
    {"a", &NativeReader::on_alloc, false},
    {"f", &NativeReader::on_free, false},
    {"s", &NativeReader::on_synchronize, false},
    {"e", &NativeReader::on_empty_cache, false},
    {"segment_alloc", &NativeReader::on_segment_alloc, false},
    {"segment_free", &NativeReader::on_segment_free, false},
    {"segment_map", &NativeReader::on_segment_map, false},
    {"segment_unmap", &NativeReader::on_segment_unmap, false},
    {"free_completed", &NativeReader::on_free_completed, false},
    {"oom", &NativeReader::on_oom, false},
    {"reserved", &NativeReader::on_reserved, false},
    {"peak_reserved", &NativeReader::on_peak_reserved, false},
    {"format", &NativeReader::on_format, true},
    {"device", &NativeReader::on_device, true},
    {"stream", &NativeReader::on_stream, true},
    {"live", &NativeReader::on_live, true},
    {"segment", &NativeReader::on_segment, true},
    {"initial_reserved", &NativeReader::on_initial_reserved, true},
    {"setting", &NativeReader::on_setting, true},
};

void NativeReader::run(std::string_view text) {
  Lines lines(text);
  read_magic(lines);
  std::string_view line;
  while (lines.next(line)) {
    line_ = lines.number();
    read_line(line);
  }
  if (!streams_fixed_ && trace_.streams.empty()) trace_.streams = {0};
  if (!seen_format_) trace_.format = to_string(Format::cistern);
  if (options_.device && *options_.device != trace_.device) {
    throw InvalidArgument(fmt::format("{}: the trace is of device {}, not device {}", name_,
                                      trace_.device, *options_.device));
  }
}

void NativeReader::read_magic(Lines& lines) {
  std::string_view line;
  if (!lines.next(line) || line.substr(0, native_magic.size()) != native_magic) {
    fail_at_line(name_, 1,
                 fmt::format("not a cistern trace: the first line must be '{} v{}'", native_magic,
                             native_version));
  }
  const std::string_view version = line.substr(native_magic.size());
  if (version != fmt::format(" v{}", native_version)) {
    fail_at_line(name_, 1,
                 fmt::format("unsupported cistern trace version {}: this cistern reads "
                             "v{}",
                             quote(version), native_version));
  }
  trace_.streams.clear();
}

void NativeReader::tokenize(std::string_view line) {
  tokens_.clear();
  std::size_t at = 0;
  while (true) {
    at = line.find_first_not_of(" \t", at);
    if (at == std::string_view::npos) return;
    const std::size_t end = std::min(line.find_first_of(" \t", at), line.size());
    if (tokens_.size() == max_tokens) fail("too many fields");
    tokens_.push_back(line.substr(at, end - at));
    at = end;
  }
}

void NativeReader::read_line(std::string_view line) {
  tokenize(line);
  if (tokens_.empty() || tokens_[0][0] == '#') return;  // blank line or comment
  for (const Keyword& keyword : keywords) {
    if (keyword.word != tokens_[0]) continue;
    if (keyword.header && in_body_) {
      fail(fmt::format("'{}' belongs to the header, before the first event", keyword.word));
    }
    if (!keyword.header && keyword.handler != &NativeReader::on_peak_reserved) in_body_ = true;
    return (this->*keyword.handler)();
  }
  fail(fmt::format("unknown line kind {}", quote(tokens_[0])));
}

// ---- fields ----------------------------------------------------------------------------------

void NativeReader::arity(std::size_t min, std::size_t max) const {
  const std::size_t fields = tokens_.size() - 1;
  if (fields < min || fields > max) {
    fail(min == max
             ? fmt::format("'{}' takes {} fields, found {}", tokens_[0], min, fields)
             : fmt::format("'{}' takes {} to {} fields, found {}", tokens_[0], min, max, fields));
  }
}

std::uint64_t NativeReader::decimal(std::size_t i, std::string_view what) const {
  const auto value = parse_decimal(tokens_[i]);
  if (!value) {
    const bool negative = tokens_[i][0] == '-';
    fail(fmt::format("{} {} is {}", what, quote(tokens_[i]),
                     negative ? "negative" : "not a non-negative integer"));
  }
  return *value;
}

std::int64_t NativeReader::signed_decimal(std::size_t i, std::string_view what) const {
  const auto value = parse_signed(tokens_[i]);
  if (!value) fail(fmt::format("{} {} is not an integer", what, quote(tokens_[i])));
  return *value;
}

std::uint64_t NativeReader::hex(std::size_t i, std::string_view what) const {
  const auto value = parse_hex(tokens_[i]);
  if (!value) fail(fmt::format("{} {} is not a hexadecimal number", what, quote(tokens_[i])));
  return *value;
}

std::uint64_t NativeReader::size(std::size_t i, std::string_view what) const {
  const std::uint64_t value = decimal(i, what);
  if (value > max_allocation_size) {
    fail(fmt::format("{} {} is absurd: the limit is {} bytes", what, value, max_allocation_size));
  }
  return value;
}

std::uint32_t NativeReader::stream(std::size_t i) {
  if (!streams_fixed_) {
    streams_fixed_ = true;
    if (trace_.streams.empty()) trace_.streams = {0};
  }
  if (!has(i)) return 0;
  const std::uint64_t index = decimal(i, "stream index");
  if (index >= trace_.streams.size()) {
    fail(fmt::format("stream index {}, but the header lists {} streams", index,
                     trace_.streams.size()));
  }
  return static_cast<std::uint32_t>(index);
}

std::string NativeReader::text(std::size_t i, std::string_view what) const {
  std::optional<std::string> value = native::unescape(tokens_[i]);
  if (!value)
    fail(fmt::format("{} {} has a malformed escape (use \\xNN)", what, quote(tokens_[i])));
  return std::move(*value);
}

IdState& NativeReader::known_id(std::uint64_t id) {
  const auto found = ids_.find(id);
  if (found == ids_.end()) fail(fmt::format("id {} was never allocated", id));
  return found->second;
}

void NativeReader::new_id(std::uint64_t id, std::uint64_t bytes, std::uint64_t addr,
                          std::uint32_t on) {
  const auto [where, added] = ids_.try_emplace(id, IdState{bytes, addr, on, line_, 0, false});
  if (!added) fail(fmt::format("id {} is already used (line {})", id, where->second.line));
}

// ---- header ----------------------------------------------------------------------------------

void NativeReader::on_format() {
  arity(1, 1);
  if (seen_format_) fail("a second 'format' line");
  seen_format_ = true;
  trace_.format = text(1, "format");
}

void NativeReader::on_device() {
  arity(1, 1);
  if (seen_device_) fail("a second 'device' line");
  seen_device_ = true;
  const std::uint64_t device = decimal(1, "device");
  if (device > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
    fail(fmt::format("device {} is out of range", device));
  }
  trace_.device = static_cast<int>(device);
}

void NativeReader::on_stream() {
  arity(1, 1);
  if (streams_fixed_) fail("'stream' lines must come before any line that uses a stream index");
  if (trace_.streams.size() == std::numeric_limits<std::uint32_t>::max()) fail("too many streams");
  trace_.streams.push_back(hex(1, "stream handle"));
}

void NativeReader::on_live() {
  arity(2, 4);
  LiveBlock block;
  block.id = decimal(1, "id");
  block.size = size(2, "size");
  block.stream = stream(3);
  block.addr = has(4) ? hex(4, "address") : 0;
  if (!trace_.live_before.empty() && block.addr < trace_.live_before.back().addr) {
    fail("live blocks must be listed in address order");
  }
  new_id(block.id, block.size, block.addr, block.stream);
  trace_.live_before.push_back(block);
}

void NativeReader::on_segment() {
  arity(4, 5);
  RecordedSegment segment;
  segment.addr = hex(1, "address");
  segment.size = size(2, "size");
  segment.stream = stream(3);
  if (tokens_[4] != "large" && tokens_[4] != "small") {
    fail(fmt::format("pool {} is neither 'large' nor 'small'", quote(tokens_[4])));
  }
  segment.is_large = tokens_[4] == "large";
  if (has(5) && tokens_[5] != "expandable") {
    fail(fmt::format("{} after the pool: only 'expandable' may follow", quote(tokens_[5])));
  }
  segment.is_expandable = has(5);
  trace_.recorded.initial_segments.push_back(segment);
}

void NativeReader::on_initial_reserved() {
  arity(1, 1);
  if (trace_.recorded.initial_reserved) fail("a second 'initial_reserved' line");
  trace_.recorded.initial_reserved = decimal(1, "initial_reserved");
}

void NativeReader::on_peak_reserved() {
  arity(1, 1);
  if (trace_.recorded.peak_reserved) fail("a second 'peak_reserved' line");
  trace_.recorded.peak_reserved = decimal(1, "peak_reserved");
}

void NativeReader::on_setting() {
  arity(2, 2);
  trace_.recorded.settings.emplace_back(text(1, "setting name"), text(2, "setting value"));
}

// ---- body ------------------------------------------------------------------------------------

void NativeReader::on_alloc() {
  arity(2, 5);
  Event event;
  event.op = Op::alloc;
  event.id = decimal(1, "id");
  event.size = size(2, "size");
  event.stream = stream(3);
  event.addr = has(4) ? hex(4, "address") : 0;
  event.time = time(5);
  new_id(event.id, event.size, event.addr, event.stream);
  trace_.events.push_back(event);
}

void NativeReader::on_free() {
  arity(1, 3);
  Event event;
  event.op = Op::free;
  event.id = decimal(1, "id");
  event.stream = stream(2);
  event.time = time(3);
  IdState& state = known_id(event.id);
  if (state.freed_line != 0) {
    fail(fmt::format("free of id {}, already freed on line {}", event.id, state.freed_line));
  }
  state.freed_line = line_;
  event.size = state.size;  // a free carries its allocation's size and address
  event.addr = state.addr;
  trace_.events.push_back(event);
}

void NativeReader::on_program_call(Op op) {
  arity(0, 2);
  Event event;
  event.op = op;
  event.stream = stream(1);
  event.time = time(2);
  trace_.events.push_back(event);
}

void NativeReader::on_segment_event(RecordedSegmentEvent::Kind kind) {
  arity(2, 4);
  RecordedSegmentEvent event;
  event.kind = kind;
  event.before_event = trace_.events.size();
  event.addr = hex(1, "address");
  event.size = size(2, "size");
  event.stream = stream(3);
  event.time = time(4);
  trace_.recorded.segment_events.push_back(event);
}

void NativeReader::on_free_completed() {
  arity(1, 2);
  RecordedFreeCompletion completion;
  completion.id = decimal(1, "id");
  completion.before_event = trace_.events.size();
  completion.time = time(2);
  IdState& state = known_id(completion.id);
  if (state.freed_line == 0)
    fail(fmt::format("free_completed of id {}, which is not freed", completion.id));
  if (state.completed) fail(fmt::format("a second free_completed of id {}", completion.id));
  state.completed = true;
  trace_.recorded.deferred_frees.push_back(completion);
}

void NativeReader::on_oom() {
  arity(1, 4);
  RecordedOom oom;
  oom.before_event = trace_.events.size();
  oom.size = size(1, "size");
  oom.device_free = has(2) ? decimal(2, "device_free") : 0;
  oom.stream = stream(3);
  oom.time = time(4);
  trace_.recorded.ooms.push_back(oom);
}

void NativeReader::on_reserved() {
  arity(1, 1);
  auto& samples = trace_.recorded.reserved_samples;
  if (trace_.events.empty()) fail("'reserved' before the first event");
  const std::size_t after = trace_.events.size() - 1;
  if (!samples.empty() && samples.back().first == after)
    fail("a second 'reserved' after one event");
  samples.emplace_back(after, decimal(1, "reserved"));
}

}  // namespace

Trace read_native(std::string_view text, const std::string& name, const ReadOptions& options) {
  require_unscaled(options, name, Format::cistern);
  Trace trace;
  trace.source = name;
  NativeReader(name, options, trace).run(text);
  return trace;
}

}  // namespace cistern::trace::detail
