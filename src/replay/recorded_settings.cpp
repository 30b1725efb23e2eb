// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The recorded allocator settings of a snapshot and the settings a torch replay uses (see
// recorded_settings.hpp).
#include "replay/recorded_settings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>

#include "cistern/errors.hpp"
#include "core/size_policy.hpp"

namespace cistern::replay {
namespace {

/// The integers of a text such as "{'1': 0, '2': 4}" or "-1", in order.
std::vector<long long> integers_in(const std::string& text) {
  std::vector<long long> out;
  const char* p = text.c_str();
  while (*p != '\0') {
    const bool starts_number = std::isdigit(static_cast<unsigned char>(*p)) != 0 ||
                               (*p == '-' && std::isdigit(static_cast<unsigned char>(p[1])) != 0);
    if (!starts_number) {
      ++p;
      continue;
    }
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    p = end;
    if (*p == '.') {  // a float: skip its fraction
      ++p;
      while (std::isdigit(static_cast<unsigned char>(*p)) != 0) ++p;
    }
  }
  return out;
}

/// PyTorch's `roundup_power2_divisions` setting as its snapshot writes it: a dict from the start
/// of each interval in MB ("1", "2", ... "32768") to its divisions.
void apply_divisions(const std::string& text, Config& config) {
  const std::vector<long long> numbers = integers_in(text);
  if (numbers.size() == 1) {
    config.roundup_power2_divisions.fill(static_cast<std::uint32_t>(std::max(0LL, numbers[0])));
    return;
  }
  for (std::size_t i = 0; i + 1 < numbers.size(); i += 2) {
    const long long mb = numbers[i];
    if (mb <= 0 || (mb & (mb - 1)) != 0) continue;
    const int index = detail::log2_floor(static_cast<std::uint64_t>(mb));
    if (index >= kRoundupIntervals) continue;
    config.roundup_power2_divisions[static_cast<std::size_t>(index)] =
        static_cast<std::uint32_t>(std::max(0LL, numbers[i + 1]));
  }
}

/// One setting a snapshot records: its option key, its key in `allocator_settings`, and how to
/// copy its value from one configuration into another.
struct RecordedKey {
  const char* option;
  const char* recorded;
  void (*copy)(const Config& from, Config& to);
};

const RecordedKey kRecordedKeys[] = {
    {"expandable_segments", "expandable_segments",
     [](const Config& from, Config& to) { to.expandable_segments = from.expandable_segments; }},
    {"max_split_size_mb", "max_split_size",
     [](const Config& from, Config& to) { to.max_split_size = from.max_split_size; }},
    {"roundup_power2_divisions", "roundup_power2_divisions",
     [](const Config& from, Config& to) {
       to.roundup_power2_divisions = from.roundup_power2_divisions;
     }},
    {"garbage_collection_threshold", "garbage_collection_threshold",
     [](const Config& from, Config& to) {
       to.garbage_collection_threshold = from.garbage_collection_threshold;
     }},
};

bool records(const trace::Trace& trace, const RecordedKey& key) {
  const auto& settings = trace.recorded.settings;
  return std::any_of(settings.begin(), settings.end(),
                     [&](const auto& setting) { return setting.first == key.recorded; });
}

bool names(const std::vector<std::string>& given, const RecordedKey& key) {
  return std::find(given.begin(), given.end(), key.option) != given.end();
}

/// The value of `key` in `config`, as the option syntax writes it.
std::string value_text(const RecordedKey& key, const Config& config) {
  Config alone;  // the defaults but this key, so that to_string lists it alone (or nothing)
  key.copy(config, alone);
  const std::string text = alone.to_string();
  if (!text.empty()) return text.substr(std::string(key.option).size() + 1);
  for (const OptionInfo& info : options()) {
    if (info.name == key.option) return info.default_value;
  }
  return {};
}

}  // namespace

const char* to_string(SettingSource source) noexcept {
  switch (source) {
    case SettingSource::recorded: return "recorded";
    case SettingSource::given: return "given";
    case SettingSource::defaults: return "default";
  }
  return "?";
}

const std::vector<std::string>& recorded_setting_keys() {
  static const std::vector<std::string> kKeys = [] {
    std::vector<std::string> keys;
    for (const RecordedKey& key : kRecordedKeys) keys.emplace_back(key.option);
    return keys;
  }();
  return kKeys;
}

Config recorded_config(const trace::Trace& trace) {
  Config config;
  for (const auto& [key, value] : trace.recorded.settings) {
    const std::vector<long long> numbers = integers_in(value);
    if (key == "max_split_size" && numbers.size() == 1 && numbers[0] > 0) {
      config.max_split_size = static_cast<std::size_t>(numbers[0]);
    } else if (key == "roundup_power2_divisions") {
      apply_divisions(value, config);
    } else if (key == "garbage_collection_threshold") {
      config.garbage_collection_threshold = std::strtod(value.c_str(), nullptr);
    } else if (key == "expandable_segments") {
      config.expandable_segments = value == "True";
    }
  }
  return config;
}

Config with_recorded_settings(const trace::Trace& trace, const Config& config,
                              const std::vector<std::string>& given) {
  const Config recorded = recorded_config(trace);
  Config out = config;
  for (const RecordedKey& key : kRecordedKeys) {
    if (records(trace, key) && !names(given, key)) key.copy(recorded, out);
  }
  try {
    out.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(e.key(), fmt::format("{}: with the snapshot's recorded allocator_settings: "
                                           "{} (give the option to override the recorded value)",
                                           trace.source, e.what()));
  }
  return out;
}

std::vector<SettingUse> settings_used(const trace::Trace& trace, const Config& config,
                                      const std::vector<std::string>& given, bool take_recorded) {
  std::vector<SettingUse> out;
  for (const RecordedKey& key : kRecordedKeys) {
    SettingUse use;
    use.key = key.option;
    use.value = value_text(key, config);
    if (names(given, key)) {
      use.source = SettingSource::given;
    } else if (take_recorded && records(trace, key)) {
      use.source = SettingSource::recorded;
    }
    out.push_back(std::move(use));
  }
  return out;
}

}  // namespace cistern::replay
