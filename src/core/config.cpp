// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The options table and everything derived from it: `Config::set`, the settings-string parser,
// `to_string`, `operator==`, `validate`, `options()` and the Markdown table.
//
// Each option is one row of `kOptions`: its key, a setter (text -> Config field, per-value
// checks) and a getter (Config field -> canonical text). Getters are exact, so comparing their
// texts compares the fields, and feeding a getter's text to the setter restores the field.
#include "cistern/config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <locale>
#include <sstream>
#include <string>
#include <vector>

#include "cistern/errors.hpp"
#include "cistern/types.hpp"

namespace cistern {
namespace {

constexpr char kConfigVariable[] = "CISTERN_ALLOC_CONF";
constexpr char kNoCachingVariable[] = "CISTERN_NO_CACHING";
// The one key that other rows' rules refer to.
constexpr char kLargeSegmentKey[] = "large_segment_size_mb";

/// A value rejected by a setter. `Config::set` turns it into a `ConfigError` that adds the key
/// and the offending text to `why`.
struct BadValue {
  std::string why;
};

// --- small helpers -------------------------------------------------------------------------------

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string trimmed(const std::string& text) {
  std::size_t begin = 0;
  std::size_t end = text.size();
  while (begin < end && is_space(text[begin])) ++begin;
  while (end > begin && is_space(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

bool is_power_of_two(std::uint64_t value) { return value != 0 && (value & (value - 1)) == 0; }

int log2_floor(std::uint64_t value) {
  int log = 0;
  while (value >>= 1) ++log;
  return log;
}

/// Splits on `separator`, keeping empty pieces (so that "a,,b" can be rejected).
std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> pieces(1);
  for (char c : text) {
    if (c == separator) {
      pieces.emplace_back();
    } else {
      pieces.back() += c;
    }
  }
  return pieces;
}

// --- value parsers and printers (text <-> field) -------------------------------------------------

bool parse_bool(const std::string& text) {
  // PyTorch accepts exactly True/False; the lower-case and numeric spellings are a convenience.
  if (text == "True" || text == "true" || text == "1") return true;
  if (text == "False" || text == "false" || text == "0") return false;
  throw BadValue{"expected True or False"};
}

std::string bool_text(bool value) { return value ? "True" : "False"; }

Config::Vmm parse_vmm(const std::string& text) {
  if (text == "auto") return Config::Vmm::automatic;
  try {
    return parse_bool(text) ? Config::Vmm::on : Config::Vmm::off;
  } catch (const BadValue&) {
    throw BadValue{"expected auto, True or False"};
  }
}

std::string vmm_text(Config::Vmm vmm) {
  switch (vmm) {
    case Config::Vmm::on: return "True";
    case Config::Vmm::off: return "False";
    case Config::Vmm::automatic: break;
  }
  return "auto";
}

std::string positive_size(std::size_t bytes) {
  return bytes > 0 ? std::string() : std::string("must be more than 0");
}

std::uint64_t parse_whole_number(const std::string& text, const char* expected) {
  const bool all_digits = !text.empty() && std::all_of(text.begin(), text.end(),
                                                       [](char c) { return c >= '0' && c <= '9'; });
  if (!all_digits) throw BadValue{expected};
  try {
    return parse_bytes(text);  // a plain decimal integer with overflow checking
  } catch (const InvalidArgument&) {
    throw BadValue{expected};
  }
}

/// A size in MiB, as a byte count. Fractions are accepted (rounded to the nearest byte) so that
/// any byte count set in code survives `to_string` and `parse`.
std::size_t parse_mib(const std::string& text) {
  const char* expected = "expected a number of MiB";
  if (text.empty() || text.find_first_not_of("0123456789.") != std::string::npos) {
    throw BadValue{expected};
  }
  try {
    return static_cast<std::size_t>(parse_bytes(text + " MiB"));
  } catch (const InvalidArgument&) {
    throw BadValue{expected};
  }
}

/// `bytes` in MiB, exactly: "20", or "0.5" for 512 KiB. Every byte count has a finite decimal
/// expansion in MiB (at most 20 digits after the point), written out digit by digit.
std::string mib_text(std::size_t bytes) {
  std::string text = fmt::format("{}", bytes / MiB);
  std::size_t remainder = bytes % MiB;
  if (remainder != 0) text += '.';
  while (remainder != 0) {
    remainder *= 10;
    text += static_cast<char>('0' + remainder / MiB);
    remainder %= MiB;
  }
  return text;
}

/// A real number, read in the classic locale whatever the program's locale is.
double parse_real(const std::string& text, const char* expected) {
  std::istringstream in(text);
  in.imbue(std::locale::classic());
  double value = 0;
  in >> value;
  if (text.empty() || !in || in.peek() != std::char_traits<char>::eof()) throw BadValue{expected};
  return value;
}

/// Shortest text that reads back as the same double (fmt never uses the locale by default).
std::string real_text(double value) { return fmt::format("{}", value); }

// --- roundup_power2_divisions --------------------------------------------------------------------

using Divisions = std::array<std::uint32_t, kRoundupIntervals>;

constexpr char kDivisionsRange[] = "expected divisions of 0 or a power of two";

std::uint32_t parse_division(const std::string& text) {
  const char* expected = kDivisionsRange;
  const std::uint64_t value = parse_whole_number(trimmed(text), expected);
  if (value > UINT32_MAX || (value != 0 && !is_power_of_two(value))) throw BadValue{expected};
  return static_cast<std::uint32_t>(value);
}

/// The entry of a list key K (MB): interval [K, 2K) MB is entry log2(K); larger keys share the
/// last entry, as every size of 2^15 MB and more does.
int interval_index(const std::string& text) {
  const char* expected = "expected list keys that are powers of two (MB) or '>'";
  const std::uint64_t key_mb = parse_whole_number(trimmed(text), expected);
  if (!is_power_of_two(key_mb)) throw BadValue{expected};
  return std::min(log2_floor(key_mb), kRoundupIntervals - 1);
}

/// PyTorch's newest list semantics: each key sets its own entry; the first key's value also
/// fills every lower entry; `>` fills every entry after the last explicit key (all entries when
/// there is none); entries skipped between keys stay 0.
Divisions parse_division_list(const std::string& list) {
  const char* expected = "expected a list such as [64:8,256:4,>:1]";
  if (list.size() < 2 || list.back() != ']') throw BadValue{expected};
  Divisions divisions{};
  int last_index = -1;
  bool has_rest = false;
  std::uint32_t rest = 0;
  for (const std::string& item : split(list.substr(1, list.size() - 2), ',')) {
    const std::vector<std::string> key_value = split(item, ':');
    if (key_value.size() != 2) throw BadValue{expected};
    if (trimmed(key_value[0]) == ">") {
      has_rest = true;
      rest = parse_division(key_value[1]);
      continue;
    }
    const int index = interval_index(key_value[0]);
    const std::uint32_t value = parse_division(key_value[1]);
    if (last_index < 0) std::fill(divisions.begin(), divisions.begin() + index, value);
    divisions[index] = value;
    last_index = index;
  }
  if (has_rest) std::fill(divisions.begin() + (last_index + 1), divisions.end(), rest);
  return divisions;
}

Divisions parse_divisions(const std::string& text) {
  if (!text.empty() && text.front() == '[') return parse_division_list(text);
  Divisions divisions{};
  divisions.fill(parse_division(text));
  return divisions;
}

/// The shortest list the parser maps back to `divisions`: a single value when all entries agree;
/// otherwise the run from entry 0 as the first key, the differing middle entries, and the final
/// run as `>` (announced by an explicit entry just before it, since `>` starts after the last key).
std::string divisions_text(const Divisions& divisions) {
  const auto key = [](int index) { return std::uint64_t{1} << index; };
  const int last = kRoundupIntervals - 1;
  int lead_end = 0;  // last entry of the run that starts at entry 0
  while (lead_end < last && divisions[lead_end + 1] == divisions[0]) ++lead_end;
  if (lead_end == last) return fmt::format("{}", divisions[0]);
  int tail_begin = last;  // first entry of the run that ends at the last entry
  while (divisions[tail_begin - 1] == divisions[last]) --tail_begin;
  std::vector<std::string> items{fmt::format("{}:{}", key(lead_end), divisions[0])};
  for (int i = lead_end + 1; i < tail_begin; ++i) {
    const bool needed = divisions[i] != 0 || (i == tail_begin - 1 && divisions[last] != 0);
    if (needed) items.push_back(fmt::format("{}:{}", key(i), divisions[i]));
  }
  if (divisions[last] != 0) items.push_back(fmt::format(">:{}", divisions[last]));
  return fmt::format("[{}]", fmt::join(items, ","));
}

const Config& defaults() {
  static const Config kDefaults;
  return kDefaults;
}

// --- the options table ---------------------------------------------------------------------------

/// One option: how to read it, print it, and check it against the rest of the configuration.
struct Option {
  const char* name;
  const char* type;
  const char* help;
  /// Parses the (trimmed) text into the Config; throws BadValue.
  void (*set)(Config& config, const std::string& text);
  /// The canonical, exact text of the current value.
  std::string (*get)(const Config& config);
  /// The cross-option rule for `validate()`: "" when it holds, else what is wrong. May be null.
  std::string (*check)(const Config& config);
};

/// A no-op option's getter: the value never changes, so it never shows in `to_string`.
template <const char* kText>
std::string constant_text(const Config&) {
  return kText;
}
constexpr char kFalseText[] = "False";
constexpr char kOneText[] = "1";
constexpr char kNativeText[] = "native";

void check_pinned_threads(const std::string& text) {
  const char* expected = "expected a power of two no larger than 128";
  const std::uint64_t threads = parse_whole_number(text, expected);
  if (!is_power_of_two(threads) || threads > 128) throw BadValue{expected};
}

void check_backend(const std::string& text) {
  if (text == "native") return;
  if (text == "cudaMallocAsync") {
    throw BadValue{
        "cistern replaces the cudaMallocAsync backend (cistern is the allocator); remove this "
        "setting, or use backend:native"};
  }
  throw BadValue{"expected native"};
}

/// The rule of the size options that must not be smaller than a large segment.
std::string at_least(std::size_t bytes, std::size_t floor) {
  if (bytes >= floor) return "";
  return fmt::format("must be at least {} MiB; got {} MiB (see {})", mib_text(floor),
                     mib_text(bytes), kLargeSegmentKey);
}

constexpr char kThresholdRange[] = "expected a fraction of at least 0 (off) and below 1";
bool is_threshold(double value) { return value >= 0.0 && value < 1.0; }

constexpr char kFractionRange[] = "expected a fraction above 0 and at most 1";
bool is_fraction(double value) { return value > 0.0 && value <= 1.0; }

constexpr Option kOptions[] = {
    {"max_split_size_mb", "MiB or unlimited",
     "Blocks of at least this size are never split and smaller requests never use them, "
     "which limits fragmentation at the cost of more segments; at least large_segment_size_mb. "
     "Classic segments only: the engine ignores it (what a large free block does not use goes "
     "back handle by handle) and its statistic still reports the value.",
     [](Config& c, const std::string& text) {
       c.max_split_size = text == "unlimited" ? SIZE_MAX : parse_mib(text);
     },
     [](const Config& c) {
       return c.max_split_size == SIZE_MAX ? std::string("unlimited") : mib_text(c.max_split_size);
     },
     [](const Config& c) {
       if (c.max_split_size == SIZE_MAX) return std::string();
       return at_least(c.max_split_size, c.large_segment_size);
     }},
    {"max_non_split_rounding_mb", "MiB",
     "How much larger than a request of at least max_split_size_mb a cached unsplittable block "
     "may be and still serve it; when set, at least large_segment_size_mb.",
     [](Config& c, const std::string& text) { c.max_non_split_rounding = parse_mib(text); },
     [](const Config& c) { return mib_text(c.max_non_split_rounding); },
     [](const Config& c) {
       // PyTorch checks this key only when it is written, against the large segment size of
       // that moment, so raising large_segment_size_mb alone is accepted: the default is exempt.
       if (c.max_non_split_rounding == defaults().max_non_split_rounding) return std::string();
       return at_least(c.max_non_split_rounding, c.large_segment_size);
     }},
    {"roundup_power2_divisions", "power of 2, or list [MB:n,...,>:n]",
     "Rounds request sizes up to one of n equal steps per power of two so that cached blocks fit "
     "more requests: one value applies to all sizes; a list key K (MB) sets sizes in [K, 2K), "
     "the first key also covers smaller sizes and > covers sizes above the last key; 0 or 1: off.",
     [](Config& c, const std::string& text) { c.roundup_power2_divisions = parse_divisions(text); },
     [](const Config& c) { return divisions_text(c.roundup_power2_divisions); },
     [](const Config& c) {
       for (std::uint32_t d : c.roundup_power2_divisions) {
         if (d != 0 && !is_power_of_two(d)) return fmt::format("{}; got {}", kDivisionsRange, d);
       }
       return std::string();
     }},
    {kLargeSegmentKey, "MiB, > 10",
     "Segment size for requests between 1 MiB and 10 MiB (PyTorch's 20 MiB large buffer); "
     "must be more than 10. Classic segments; the engine places such requests in its address "
     "ranges.",
     [](Config& c, const std::string& text) { c.large_segment_size = parse_mib(text); },
     [](const Config& c) { return mib_text(c.large_segment_size); },
     [](const Config& c) {
       if (c.large_segment_size > c.min_large_alloc) return std::string();
       return fmt::format("must be more than {} MiB (min_large_alloc); got {} MiB",
                          mib_text(c.min_large_alloc), mib_text(c.large_segment_size));
     }},
    {"garbage_collection_threshold", "fraction in [0, 1)",
     "Frees cached blocks, oldest first, once reserved memory passes this fraction of the allowed "
     "maximum (set by per_process_memory_fraction or memory_limit_mb); 0: off. With the engine, "
     "also the handles under cached free blocks, largest first.",
     [](Config& c, const std::string& text) {
       // PyTorch rejects 0; cistern reads it as "off" so that the default can be written.
       const double threshold = parse_real(text, kThresholdRange);
       if (!is_threshold(threshold)) throw BadValue{kThresholdRange};
       c.garbage_collection_threshold = threshold;
     },
     [](const Config& c) { return real_text(c.garbage_collection_threshold); },
     [](const Config& c) {
       if (is_threshold(c.garbage_collection_threshold)) return std::string();
       return fmt::format("{}; got {}", kThresholdRange, c.garbage_collection_threshold);
     }},
    {"expandable_segments", "bool",
     "PyTorch's expandable segments: True turns the virtual-memory engine on (as vmm:true, where "
     "the device supports virtual memory).",
     [](Config& c, const std::string& text) { c.expandable_segments = parse_bool(text); },
     [](const Config& c) { return bool_text(c.expandable_segments); }, nullptr},
    {"vmm", "auto, True or False",
     "The virtual-memory engine: physical memory in whole handles mapped only where blocks need "
     "them, sized by the room left, reclaimed from cached free blocks before running out of "
     "memory; auto: on where the device supports virtual memory (SimDevice, CudaVmmDevice), with "
     "classic segments instead if the device refuses it at the first growth; True: required; "
     "False: classic segments.",
     [](Config& c, const std::string& text) { c.vmm = parse_vmm(text); },
     [](const Config& c) { return vmm_text(c.vmm); }, nullptr},
    {"release_threshold_mb", "MiB or unlimited",
     "With the engine: unused physical memory (handles inside cached free blocks) kept after a "
     "free; above it, whole handles go back to the device. Classic segments: no effect.",
     [](Config& c, const std::string& text) {
       c.release_threshold = text == "unlimited" ? SIZE_MAX : parse_mib(text);
     },
     [](const Config& c) {
       return c.release_threshold == SIZE_MAX ? std::string("unlimited")
                                              : mib_text(c.release_threshold);
     },
     nullptr},
    {"small_handle_size_mb", "MiB, > 0",
     "With the engine: the small pool is near the limit when a 32nd of the room left is less "
     "than this: growths are no longer extended over the rest of their page. With "
     "release_threshold_mb, also the largest handle.",
     [](Config& c, const std::string& text) { c.small_handle_size = parse_mib(text); },
     [](const Config& c) { return mib_text(c.small_handle_size); },
     [](const Config& c) { return positive_size(c.small_handle_size); }},
    {"large_handle_size_mb", "MiB, > 0",
     "With the engine: the large pool is near the limit when a 32nd of the room left is less "
     "than this: growths are no longer extended over the rest of their page. With "
     "release_threshold_mb, also the largest handle.",
     [](Config& c, const std::string& text) { c.large_handle_size = parse_mib(text); },
     [](const Config& c) { return mib_text(c.large_handle_size); },
     [](const Config& c) { return positive_size(c.large_handle_size); }},
    {"max_handle_size_mb", "MiB or auto",
     "With the engine: the largest physical handle created; auto: one page of PyTorch's "
     "expandable segments (2 MiB small, 20 MiB large), at most a 32nd of the room the device "
     "and the limit leave after it, 6 per run near the limit. Above a page, the granules inside "
     "one block may share a handle, given back before a smaller block takes part of it.",
     [](Config& c, const std::string& text) {
       if (text == "auto") {
         c.max_handle_size = 0;
         return;
       }
       c.max_handle_size = parse_mib(text);
       if (c.max_handle_size == 0) throw BadValue{"expected auto or MiB > 0"};
     },
     [](const Config& c) {
       return c.max_handle_size == 0 ? std::string("auto") : mib_text(c.max_handle_size);
     },
     nullptr},
    {"per_process_memory_fraction", "fraction in (0, 1]",
     "Fraction of the device's memory that this allocator may reserve.",
     [](Config& c, const std::string& text) {
       const double fraction = parse_real(text, kFractionRange);
       if (!is_fraction(fraction)) throw BadValue{kFractionRange};
       c.memory_fraction = fraction;
     },
     [](const Config& c) { return real_text(c.memory_fraction); },
     [](const Config& c) {
       if (is_fraction(c.memory_fraction)) return std::string();
       return fmt::format("{}; got {}", kFractionRange, c.memory_fraction);
     }},
    {"memory_limit_mb", "MiB (0: none)", "Hard limit on reserved memory; 0: no limit.",
     [](Config& c, const std::string& text) { c.memory_limit = parse_mib(text); },
     [](const Config& c) { return mib_text(c.memory_limit); }, nullptr},
    {"cross_stream_reuse", "bool",
     "When the device (or the limit) has no room for a request, lets its stream take over a whole "
     "cached segment of another stream, ordered after that stream's work by an event, before the "
     "cache is given back; while there is room each stream keeps its own cache.",
     [](Config& c, const std::string& text) { c.cross_stream_reuse = parse_bool(text); },
     [](const Config& c) { return bool_text(c.cross_stream_reuse); }, nullptr},
    {"park_small_blocks", "bool",
     "Parks a freed small block for the next request of exactly its size and coalesces it only "
     "before the allocator would grow: faster on mixed small sizes, but placements drift from "
     "best fit and the small pool may need a segment more; False: coalesce at once and place "
     "every block by best fit, as PyTorch does.",
     [](Config& c, const std::string& text) { c.park_small_blocks = parse_bool(text); },
     [](const Config& c) { return bool_text(c.park_small_blocks); }, nullptr},
    {"exact_peaks", "bool",
     "With several streams, publishes every statistics change at once so that allocator-wide "
     "peaks are exact; False: in batches, which keeps threads on different streams from writing "
     "shared memory on every operation (peaks then within 256 blocks and the reserved bytes of "
     "each "
     "other stream).",
     [](Config& c, const std::string& text) { c.exact_peaks = parse_bool(text); },
     [](const Config& c) { return bool_text(c.exact_peaks); }, nullptr},
    {"pass_through", "bool",
     "No caching: one device allocation per request, returned on free, so that tools such as "
     "compute-sanitizer see every allocation (also set by CISTERN_NO_CACHING=1).",
     [](Config& c, const std::string& text) { c.pass_through = parse_bool(text); },
     [](const Config& c) { return bool_text(c.pass_through); }, nullptr},
    {"release_lock_on_cudamalloc", "bool",
     "PyTorch's option to drop the allocator lock around cudaMalloc (accepted for "
     "compatibility; no effect).",
     [](Config& c, const std::string& text) { c.release_lock_on_cudamalloc = parse_bool(text); },
     [](const Config& c) { return bool_text(c.release_lock_on_cudamalloc); }, nullptr},
    {"pinned_use_cuda_host_register", "bool",
     "PyTorch's pinned host-memory option (accepted for compatibility; no effect).",
     [](Config&, const std::string& text) { parse_bool(text); }, constant_text<kFalseText>,
     nullptr},
    {"pinned_num_register_threads", "power of 2, <= 128",
     "PyTorch's pinned host-memory option (accepted for compatibility; no effect).",
     [](Config&, const std::string& text) { check_pinned_threads(text); }, constant_text<kOneText>,
     nullptr},
    {"pinned_use_background_threads", "bool",
     "PyTorch's pinned host-memory option (accepted for compatibility; no effect).",
     [](Config&, const std::string& text) { parse_bool(text); }, constant_text<kFalseText>,
     nullptr},
    {"graph_capture_record_stream_reuse", "bool",
     "PyTorch's CUDA-graph capture option (accepted for compatibility; no effect).",
     [](Config&, const std::string& text) { parse_bool(text); }, constant_text<kFalseText>,
     nullptr},
    {"backend", "native",
     "PyTorch's allocator backend: only native is accepted, as cistern replaces cudaMallocAsync "
     "(accepted for compatibility; no effect).",
     [](Config&, const std::string& text) { check_backend(text); }, constant_text<kNativeText>,
     nullptr},
};

/// Rules for the fields that have no key (set in code only); `validate()` applies them too.
struct FieldRule {
  const char* field;
  const char* requirement;
  bool (*holds)(const Config& config);
};

constexpr FieldRule kCodeOnlyRules[] = {
    {"min_block_size", "must be a power of two",
     [](const Config& c) { return is_power_of_two(c.min_block_size); }},
    {"small_size", "must be at least min_block_size and at most small_segment_size",
     [](const Config& c) {
       return c.small_size >= c.min_block_size && c.small_size <= c.small_segment_size;
     }},
    {"min_large_alloc", "must be larger than small_size",
     [](const Config& c) { return c.min_large_alloc > c.small_size; }},
    {"round_large", "must be a non-zero multiple of min_block_size",
     [](const Config& c) {
       return c.round_large != 0 && c.min_block_size != 0 && c.round_large % c.min_block_size == 0;
     }},
};

/// Fields compared by `operator==` beyond the table's getters.
constexpr std::size_t Config::*kCodeOnlyFields[] = {
    &Config::min_block_size,  &Config::small_size,  &Config::small_segment_size,
    &Config::min_large_alloc, &Config::round_large,
};

const Option* find_option(const std::string& key) {
  for (const Option& option : kOptions) {
    if (key == option.name) return &option;
  }
  return nullptr;
}

std::string known_keys() {
  std::vector<const char*> names;
  for (const Option& option : kOptions) names.push_back(option.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

// --- the settings string -------------------------------------------------------------------------

struct Setting {
  std::string key;
  std::string value;
};

/// Splits `key:value,key2:[a:b,c:d]` into settings. Whitespace around tokens is ignored;
/// `key=value` is accepted at the top level; an empty item (",,", a trailing ",") is skipped.
class SettingsReader {
 public:
  explicit SettingsReader(const std::string& text) : text_(text) {}

  std::vector<Setting> read_all() {
    std::vector<Setting> settings;
    for (skip_space(); !at_end(); skip_space()) {
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      settings.push_back(read_setting());
    }
    return settings;
  }

 private:
  static bool is_delimiter(char c) {
    return c == ',' || c == ':' || c == '=' || c == '[' || c == ']';
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }
  void skip_space() {
    while (!at_end() && is_space(peek())) ++pos_;
  }

  Setting read_setting() {
    Setting setting;
    setting.key = read_key();
    skip_space();
    if (at_end() || (peek() != ':' && peek() != '=')) {
      fail(setting.key,
           fmt::format("missing value for key '{}'; write {}:<value>", setting.key, setting.key));
    }
    ++pos_;
    setting.value = read_value(setting.key);
    skip_space();
    if (!at_end() && peek() != ',') {
      fail(setting.key,
           fmt::format("unexpected '{}' after the value of '{}'", text_.substr(pos_), setting.key));
    }
    return setting;
  }

  std::string read_key() {
    const std::size_t begin = pos_;
    while (!at_end() && !is_delimiter(peek())) ++pos_;
    std::string key = trimmed(text_.substr(begin, pos_ - begin));
    if (key.empty()) {
      fail("", fmt::format("expected a key at offset {}, found '{}'", begin, text_.substr(begin)));
    }
    return key;
  }

  std::string read_value(const std::string& key) {
    skip_space();
    if (!at_end() && peek() == '[') return read_list(key);
    const std::size_t begin = pos_;
    while (!at_end() && !is_delimiter(peek())) ++pos_;
    std::string value = trimmed(text_.substr(begin, pos_ - begin));
    if (value.empty()) fail(key, fmt::format("missing value for key '{}'", key));
    return value;
  }

  std::string read_list(const std::string& key) {
    const std::size_t begin = pos_++;
    while (!at_end() && peek() != ']') {
      if (peek() == '[') fail(key, fmt::format("nested '[' in the value of '{}'", key));
      ++pos_;
    }
    if (at_end()) fail(key, fmt::format("unbalanced '[' in the value of '{}': missing ']'", key));
    ++pos_;
    return text_.substr(begin, pos_ - begin);
  }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(key,
                      fmt::format("Cannot read cistern allocator config '{}': {}", text_, what));
  }

  const std::string& text_;
  std::size_t pos_ = 0;
};

std::string markdown_cell(const std::string& text) {
  std::string cell;
  for (char c : text) {
    if (c == '|') cell += '\\';
    cell += c;
  }
  return cell;
}

}  // namespace

// --- Config --------------------------------------------------------------------------------------

Config& Config::set(const std::string& key, const std::string& value) {
  const std::string name = trimmed(key);
  const Option* option = find_option(name);
  if (option == nullptr) {
    throw ConfigError(name, fmt::format("Unrecognized key '{}' in cistern allocator config ({}); "
                                        "known keys: {}",
                                        name, kConfigVariable, known_keys()));
  }
  const std::string text = trimmed(value);
  try {
    option->set(*this, text);
  } catch (const BadValue& bad) {
    throw ConfigError(name, fmt::format("Bad value '{}' for '{}' in cistern allocator config: {}",
                                        text, name, bad.why));
  }
  return *this;
}

Config& Config::apply(const std::string& text) {
  // Work on a copy so that a bad string leaves this configuration untouched.
  Config updated = *this;
  for (const Setting& setting : SettingsReader(text).read_all()) {
    updated.set(setting.key, setting.value);
  }
  updated.validate();
  *this = updated;
  return *this;
}

Config Config::parse(const std::string& text) { return Config().apply(text); }

Config Config::from_env() {
  Config config;
  if (const char* text = std::getenv(kConfigVariable)) {
    try {
      config.apply(text);
    } catch (const ConfigError& error) {
      throw ConfigError(error.key(),
                        fmt::format("{}='{}': {}", kConfigVariable, text, error.what()));
    }
  }
  if (const char* flag = std::getenv(kNoCachingVariable)) {
    try {
      if (!trimmed(flag).empty() && parse_bool(trimmed(flag))) config.pass_through = true;
    } catch (const BadValue&) {
      throw ConfigError(kNoCachingVariable,
                        fmt::format("{}='{}': expected 1 or 0", kNoCachingVariable, flag));
    }
  }
  return config;
}

std::string Config::to_string() const {
  std::vector<std::string> items;
  for (const Option& option : kOptions) {
    const std::string value = option.get(*this);
    if (value != option.get(defaults())) items.push_back(fmt::format("{}:{}", option.name, value));
  }
  return fmt::format("{}", fmt::join(items, ","));
}

void Config::validate() const {
  for (const Option& option : kOptions) {
    const std::string problem = option.check ? option.check(*this) : std::string();
    if (!problem.empty()) {
      throw ConfigError(option.name, fmt::format("Invalid cistern allocator config: {}: {}",
                                                 option.name, problem));
    }
  }
  for (const FieldRule& rule : kCodeOnlyRules) {
    if (!rule.holds(*this)) {
      throw ConfigError(rule.field, fmt::format("Invalid cistern allocator config: Config::{}: {}",
                                                rule.field, rule.requirement));
    }
  }
}

bool operator==(const Config& a, const Config& b) {
  for (const Option& option : kOptions) {
    if (option.get(a) != option.get(b)) return false;
  }
  for (std::size_t Config::*field : kCodeOnlyFields) {
    if (a.*field != b.*field) return false;
  }
  return true;
}

const std::vector<OptionInfo>& options() {
  static const std::vector<OptionInfo> kInfos = [] {
    std::vector<OptionInfo> infos;
    for (const Option& option : kOptions) {
      infos.push_back({option.name, option.type, option.get(defaults()), option.help});
    }
    return infos;
  }();
  return kInfos;
}

std::string options_markdown() {
  std::string table = "| option | values | default | meaning |\n|---|---|---|---|\n";
  for (const OptionInfo& info : options()) {
    table += fmt::format("| `{}` | {} | `{}` | {} |\n", info.name, markdown_cell(info.type),
                         markdown_cell(info.default_value), markdown_cell(info.help));
  }
  return table;
}

}  // namespace cistern
