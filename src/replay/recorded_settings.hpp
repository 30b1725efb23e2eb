// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The allocator settings a PyTorch snapshot records, and the settings a torch replay uses.
//
// PyTorch 2.x writes its allocator's settings into every snapshot (`allocator_settings`:
// `expandable_segments`, `max_split_size` in bytes or -1, `roundup_power2_divisions` as a dict
// from the start of each interval in MB, `garbage_collection_threshold`, and some that change no
// placement). A snapshot recorded under `PYTORCH_ALLOC_CONF=expandable_segments:True` is replayed
// as recorded only by an emulation with expandable segments on, so the torch policy takes these
// settings from the snapshot unless its own options give them: `-p torch` on such a snapshot runs
// with expandable segments, `-p torch:expandable_segments=false` without. A trace that records no
// settings (Kineto, lifetime lists, RMM logs) keeps PyTorch's defaults.
#pragma once

#include <string>
#include <vector>

#include "cistern/config.hpp"
#include "trace/trace.hpp"

namespace cistern::replay {

/// Where the value of a setting a replay used came from.
enum class SettingSource {
  recorded,  ///< the snapshot's `allocator_settings`
  given,     ///< the policy's options (`torch:expandable_segments=false`)
  defaults,  ///< PyTorch's default: neither says
};
/// "recorded", "given" or "default".
const char* to_string(SettingSource source) noexcept;

/// One PyTorch allocator setting of a replay: its option key, its value in the option syntax
/// ("True", "unlimited", "[256:4,>:1]") and where the value came from.
struct SettingUse {
  std::string key;
  std::string value;
  SettingSource source = SettingSource::defaults;
};

/// The option keys a snapshot's `allocator_settings` give, in the order reports list them.
const std::vector<std::string>& recorded_setting_keys();

/// The recording allocator's options, from `trace.recorded.settings` (PyTorch's
/// `allocator_settings`: `max_split_size`, `roundup_power2_divisions`,
/// `garbage_collection_threshold`, `expandable_segments`); PyTorch's defaults for whatever the
/// snapshot does not say.
Config recorded_config(const trace::Trace& trace);

/// `config` with the recorded value of every key of `recorded_setting_keys()` that `trace`
/// records and `given` (option keys the policy wrote) does not name.
Config with_recorded_settings(const trace::Trace& trace, const Config& config,
                              const std::vector<std::string>& given);

/// The values `config` has for `recorded_setting_keys()`, each with its source: given when
/// `given` names the key, recorded when `trace` records it (and `take_recorded`), else the
/// default.
std::vector<SettingUse> settings_used(const trace::Trace& trace, const Config& config,
                                      const std::vector<std::string>& given, bool take_recorded);

}  // namespace cistern::replay
