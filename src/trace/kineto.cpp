// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Kineto traces (PyTorch profiler, Chrome trace JSON) recorded with profile_memory=True: the
// `[memory]` instant events of one CUDA device. The file is parsed whole with simdjson (JSON
// has no line structure to stream by); only the memory events are kept.
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

#include "cistern/errors.hpp"
#include "trace/address_lifetimes.hpp"
#include "trace/reader_support.hpp"

namespace cistern::trace::detail {
namespace {

namespace od = simdjson::ondemand;

constexpr std::int64_t cuda_device_type = 1;

/// One CUDA `[memory]` event, with what is needed to order it and check it.
struct MemoryEvent {
  double ts = 0;
  std::int64_t ev_idx = -1;  ///< -1: the event has no "Ev Idx"
  std::size_t position = 0;  ///< index in traceEvents, for order and messages
  int device = 0;
  std::uint64_t addr = 0;
  std::int64_t bytes = 0;  ///< > 0 allocation, < 0 free
  std::optional<std::uint64_t> total_allocated;
  std::optional<std::uint64_t> total_reserved;
};

[[noreturn]] void fail_at(const std::string& name, std::size_t position, std::string_view problem) {
  throw InvalidArgument(fmt::format("{}: traceEvents[{}]: {}", name, position, problem));
}

[[noreturn]] void fail_json(const std::string& name, simdjson::error_code error) {
  throw InvalidArgument(fmt::format("{}: invalid JSON: {}", name, simdjson::error_message(error)));
}

/// A number read from the JSON, kept until the event is known to be a memory event: only then
/// is a malformed one an error.
struct Number {
  enum class State : std::uint8_t { absent, integer, real, malformed };
  State state = State::absent;
  std::int64_t integer = 0;
  double real = 0;

  static Number read(od::value value) {
    Number number;
    od::number parsed;
    if (value.get_number().get(parsed) != simdjson::SUCCESS) {
      number.state = State::malformed;
    } else if (parsed.is_double()) {
      number.state = State::real;
      number.real = parsed.get_double();
    } else if (parsed.is_int64()) {
      number.state = State::integer;
      number.integer = parsed.get_int64();
    } else {  // above the int64 range: addresses could be in principle
      number.state = State::integer;
      number.integer = static_cast<std::int64_t>(parsed.get_uint64());
    }
    return number;
  }
};

/// The `args` keys of a memory event.
enum Arg : std::size_t {
  device_type,
  device_id,
  addr,
  bytes,
  ev_idx,
  total_allocated,
  total_reserved,
  arg_count
};
constexpr std::string_view arg_names[arg_count] = {
    "Device Type", "Device Id", "Addr", "Bytes", "Ev Idx", "Total Allocated", "Total Reserved"};

/// The fields of one trace event that a memory event needs, gathered in one pass over its keys
/// (On-Demand JSON is read forward only, and "args" may come before "name").
struct RawEvent {
  bool is_memory = false;
  bool has_args = false;
  Number ts;
  Number args[arg_count];
};

void read_args(od::object args, RawEvent& raw, const std::string& name) {
  for (auto field : args) {
    std::string_view key;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS) fail_json(name, field.error());
    const auto known = std::find(std::begin(arg_names), std::end(arg_names), key);
    if (known != std::end(arg_names)) {
      raw.args[known - std::begin(arg_names)] = Number::read(field.value());
    }
  }
}

RawEvent read_raw(od::object event, const std::string& name) {
  RawEvent raw;
  for (auto field : event) {
    std::string_view key;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS) fail_json(name, field.error());
    if (key == "name") {
      std::string_view text;
      raw.is_memory =
          field.value().get_string().get(text) == simdjson::SUCCESS && text == "[memory]";
    } else if (key == "ts") {
      raw.ts = Number::read(field.value());
    } else if (key == "args") {
      od::object args;
      if (field.value().get_object().get(args) == simdjson::SUCCESS) {
        raw.has_args = true;
        read_args(args, raw, name);
      }
    }
  }
  return raw;
}

/// Turns a memory event's raw fields into a checked event, failing with the field named.
class EventChecker {
 public:
  EventChecker(const std::string& name, std::size_t position, const RawEvent& raw)
      : name_(name), position_(position), raw_(raw) {}

  /// The CUDA memory event, or nothing for another device type (CPU memory).
  std::optional<MemoryEvent> check() const {
    if (!raw_.has_args) fail_at(name_, position_, "[memory] event without an \"args\" object");
    if (integer(device_type) != cuda_device_type) return std::nullopt;
    MemoryEvent memory;
    memory.position = position_;
    memory.ts = time();
    const std::int64_t device = integer(device_id);
    if (device < 0 || device > std::numeric_limits<int>::max()) {
      fail_at(name_, position_, fmt::format("[memory] event: CUDA \"Device Id\" {}", device));
    }
    memory.device = static_cast<int>(device);
    memory.addr = static_cast<std::uint64_t>(integer(addr));
    memory.bytes = integer(bytes);
    const auto limit = static_cast<std::int64_t>(max_allocation_size);
    if (memory.bytes > limit || memory.bytes < -limit) {
      fail_at(name_, position_,
              fmt::format("[memory] event: \"Bytes\" {} is absurd", memory.bytes));
    }
    memory.ev_idx = optional_integer(ev_idx).value_or(-1);
    memory.total_allocated = counter(total_allocated);
    memory.total_reserved = counter(total_reserved);
    return memory;
  }

 private:
  std::optional<std::int64_t> optional_integer(Arg arg) const {
    const Number& number = raw_.args[arg];
    if (number.state == Number::State::absent) return std::nullopt;
    if (number.state != Number::State::integer) {
      fail_at(name_, position_,
              fmt::format("[memory] event: \"{}\" is not an integer", arg_names[arg]));
    }
    return number.integer;
  }

  std::int64_t integer(Arg arg) const {
    const std::optional<std::int64_t> value = optional_integer(arg);
    if (!value) {
      fail_at(name_, position_,
              fmt::format("[memory] event lacks \"{}\" in its args", arg_names[arg]));
    }
    return *value;
  }

  std::optional<std::uint64_t> counter(Arg arg) const {
    const std::optional<std::int64_t> value = optional_integer(arg);
    if (value && *value < 0) {
      fail_at(name_, position_, fmt::format("[memory] event: \"{}\" is negative", arg_names[arg]));
    }
    return value ? std::optional<std::uint64_t>(static_cast<std::uint64_t>(*value)) : std::nullopt;
  }

  double time() const {
    const Number& ts = raw_.ts;
    if (ts.state != Number::State::integer && ts.state != Number::State::real) {
      fail_at(name_, position_, "[memory] event lacks a numeric \"ts\"");
    }
    const double value =
        ts.state == Number::State::real ? ts.real : static_cast<double>(ts.integer);
    constexpr double max_time = 9.0e18;  // microseconds; keeps the conversion to int64 defined
    if (!(value > -max_time && value < max_time)) {
      fail_at(name_, position_, fmt::format("[memory] event: \"ts\" {} is absurd", value));
    }
    return value;
  }

  const std::string& name_;
  std::size_t position_;
  const RawEvent& raw_;
};

/// The events array: "traceEvents" of the top object, or the top array itself.
od::array event_array(od::document& document, const std::string& name) {
  od::json_type type;
  if (const auto error = document.type().get(type)) fail_json(name, error);
  od::array events;
  if (type == od::json_type::array) {
    if (const auto error = document.get_array().get(events)) fail_json(name, error);
    return events;
  }
  const auto error = type == od::json_type::object
                         ? document.find_field_unordered("traceEvents").get_array().get(events)
                         : simdjson::INCORRECT_TYPE;
  if (error == simdjson::NO_SUCH_FIELD || error == simdjson::INCORRECT_TYPE) {
    throw InvalidArgument(
        fmt::format("{}: not a Kineto / Chrome trace: no \"traceEvents\" array", name));
  }
  if (error != simdjson::SUCCESS) fail_json(name, error);
  return events;
}

/// Every CUDA memory event of the file, in file order. Values the reader skips are checked for
/// structure only (On-Demand parsing), which is all a reader of memory events needs.
std::vector<MemoryEvent> memory_events(std::string& bytes, const std::string& name) {
  if (bytes.capacity() < bytes.size() + simdjson::SIMDJSON_PADDING) {
    bytes.reserve(bytes.size() + simdjson::SIMDJSON_PADDING);
  }
  od::parser parser;
  od::document document;
  const simdjson::padded_string_view view(bytes.data(), bytes.size(), bytes.capacity());
  if (const auto error = parser.iterate(view).get(document)) fail_json(name, error);
  std::vector<MemoryEvent> events;
  std::size_t position = 0;
  bool any_memory = false;
  for (auto element : event_array(document, name)) {
    od::object object;
    const auto error = element.get_object().get(object);
    if (error == simdjson::INCORRECT_TYPE)
      fail_at(name, position, "a trace event is not an object");
    if (error != simdjson::SUCCESS) fail_json(name, error);
    const RawEvent raw = read_raw(object, name);
    if (raw.is_memory) {
      any_memory = true;
      if (auto event = EventChecker(name, position, raw).check()) events.push_back(*event);
    }
    ++position;
  }
  if (!any_memory) {
    throw InvalidArgument(
        fmt::format("{}: no [memory] events: record the profile with "
                    "profile_memory=True",
                    name));
  }
  return events;
}

std::set<int> devices_of(const std::vector<MemoryEvent>& events) {
  std::set<int> devices;
  for (const MemoryEvent& event : events) devices.insert(event.device);
  return devices;
}

int choose_device(const std::vector<MemoryEvent>& events, const std::string& name,
                  const ReadOptions& options) {
  const std::set<int> devices = devices_of(events);
  if (devices.empty()) {
    throw InvalidArgument(fmt::format("{}: no CUDA [memory] events (only CPU memory)", name));
  }
  if (options.device && devices.count(*options.device) == 0) {
    throw InvalidArgument(
        fmt::format("{}: no CUDA [memory] events of device {}; the trace holds "
                    "devices [{}]",
                    name, *options.device, fmt::join(devices, ", ")));
  }
  if (!options.device && devices.size() > 1) {
    throw InvalidArgument(
        fmt::format("{}: the trace has CUDA memory events of devices [{}]: "
                    "choose one (--device N) or replay each",
                    name, fmt::join(devices, ", ")));
  }
  return options.device.value_or(*devices.begin());
}

/// Builds the trace from one device's events, already in time order.
class TraceBuilder {
 public:
  TraceBuilder(const std::string& name, Trace& trace)
      : name_(name), trace_(trace), lifetimes_(trace) {}

  void add(const MemoryEvent& event) {
    if (event.bytes == 0) return;  // nothing changed hands
    if (!first_allocated_ && event.total_allocated) {
      // The counter includes this event, so before it PyTorch had this much allocated.
      first_allocated_ = static_cast<std::int64_t>(*event.total_allocated) - event.bytes;
    }
    const auto time = static_cast<std::int64_t>(event.ts);
    if (event.bytes > 0) {
      if (lifetimes_.live_at(event.addr)) {
        fail_at(name_, event.position,
                fmt::format("allocation at {:#x}, which is already allocated", event.addr));
      }
      lifetimes_.alloc(event.addr, static_cast<std::uint64_t>(event.bytes), 0, time);
    } else {
      const auto size = static_cast<std::uint64_t>(-event.bytes);
      if (lifetimes_.freed_at(event.addr)) {
        fail_at(name_, event.position,
                fmt::format("free of {:#x}, which is already freed", event.addr));
      }
      const AddressLifetimes::Freed freed = lifetimes_.free(event.addr, size, 0, time);
      if (freed.before) freed_before_ += size;
      if (freed.size != size) {
        fail_at(name_, event.position,
                fmt::format("free of {} bytes at {:#x}, allocated with {} bytes", size, event.addr,
                            freed.size));
      }
    }
    if (event.total_reserved) sample_reserved(*event.total_reserved);
  }

  void finish() {
    // Blocks allocated before the trace and never freed in it appear in no event; only their
    // total is known, from PyTorch's counter. A negative rest means inconsistent counters: the
    // events are then all there is.
    if (first_allocated_ && *first_allocated_ > static_cast<std::int64_t>(freed_before_)) {
      lifetimes_.live_throughout(0, static_cast<std::uint64_t>(*first_allocated_) - freed_before_,
                                 0);
    }
    lifetimes_.finish();
  }

 private:
  void sample_reserved(std::uint64_t reserved) {
    Recorded& recorded = trace_.recorded;
    if (!recorded.initial_reserved) recorded.initial_reserved = reserved;
    recorded.peak_reserved = std::max(recorded.peak_reserved.value_or(0), reserved);
    if (recorded.reserved_samples.empty() || recorded.reserved_samples.back().second != reserved) {
      recorded.reserved_samples.emplace_back(trace_.events.size() - 1, reserved);
    }
  }

  const std::string& name_;
  Trace& trace_;
  AddressLifetimes lifetimes_;
  std::optional<std::int64_t> first_allocated_;
  std::uint64_t freed_before_ = 0;
};

}  // namespace

Trace read_kineto(std::string bytes, const std::string& name, const ReadOptions& options) {
  require_unscaled(options, name, Format::kineto);
  std::vector<MemoryEvent> events = memory_events(bytes, name);
  const int device = choose_device(events, name, options);
  events.erase(std::remove_if(events.begin(), events.end(),
                              [&](const MemoryEvent& event) { return event.device != device; }),
               events.end());
  // The file is not in time order; Ev Idx orders events of one timestamp as PyTorch made them.
  std::sort(events.begin(), events.end(), [](const MemoryEvent& a, const MemoryEvent& b) {
    return std::tie(a.ts, a.ev_idx, a.position) < std::tie(b.ts, b.ev_idx, b.position);
  });
  Trace trace;
  trace.source = name;
  trace.format = to_string(Format::kineto);
  trace.device = device;
  TraceBuilder builder(name, trace);
  for (const MemoryEvent& event : events) builder.add(event);
  builder.finish();
  return trace;
}

std::vector<int> kineto_devices(std::string bytes, const std::string& name) {
  const std::set<int> devices = devices_of(memory_events(bytes, name));
  return {devices.begin(), devices.end()};
}

}  // namespace cistern::trace::detail
