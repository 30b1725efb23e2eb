// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Allocator policies by name: parsing "name:key=value,..." and making the allocator.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "cistern/device_allocator.hpp"
#include "cistern/errors.hpp"
#include "plan/planned_allocator.hpp"
#include "replay/engine.hpp"
#include "replay/torch_allocator.hpp"

namespace cistern::replay {
namespace {

/// One policy of the table.
struct PolicyKind {
  const char* name;
  bool warm_start;  ///< implements WarmStart
  Config (*defaults)();
  std::unique_ptr<Allocator> (*make)(Device& device, const Config& config);
};

Config defaults() { return Config{}; }
Config pass_through() {
  Config c;
  c.pass_through = true;
  return c;
}
// "cistern" and "nocache": the options choose the allocator (nocache is pass_through).
std::unique_ptr<Allocator> make_cistern(Device& device, const Config& config) {
  return make_allocator(device, config);
}
std::unique_ptr<Allocator> make_torch(Device& device, const Config& config) {
  return std::make_unique<TorchAllocator>(device, config);
}

/// Plan mode over cistern's online allocator with the policy's options. Replays plan with a
/// node limit, so that every run of a trace (the probes of a capacity search among them) gets
/// the same plan on every machine.
std::unique_ptr<Allocator> make_planned(Device& device, const Config& config) {
  plan::PlannedOptions options;
  options.fallback = config;
  options.time_limit_s = 10;
  options.node_limit = 2000;
  return std::make_unique<plan::PlannedAllocator>(device, options);
}

/// The policies, in the order help texts list them. "nocache" is cistern's PassThroughAllocator:
/// one device allocation per request, returned on free.
constexpr PolicyKind kPolicies[] = {
    {"cistern", false, defaults, make_cistern},
    {"torch", true, defaults, make_torch},
    {"nocache", false, pass_through, make_cistern},
    {"planned", false, defaults, make_planned},
};

const PolicyKind* find_kind(const std::string& name) {
  for (const PolicyKind& kind : kPolicies) {
    if (name == kind.name) return &kind;
  }
  return nullptr;
}

std::string policy_names() {
  std::string names;
  for (const PolicyKind& kind : kPolicies) {
    if (!names.empty()) names += ", ";
    names += kind.name;
  }
  return names;
}

const PolicyKind& kind_of(const std::string& name, const std::string& text) {
  if (const PolicyKind* kind = find_kind(name)) return *kind;
  throw InvalidArgument(fmt::format("unknown allocator policy '{}' in '{}' (policies: {})", name,
                                    text, policy_names()));
}

std::string trimmed(const std::string& text) {
  const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  const auto first = std::find_if_not(text.begin(), text.end(), space);
  const auto last = std::find_if_not(text.rbegin(), text.rend(), space).base();
  return first < last ? std::string(first, last) : std::string();
}

/// Options that only make sense for one family of policies, refused for the others so that a
/// replay never silently ignores what the user asked for.
void check_policy_options(const std::string& name, const Config& config, const std::string& text) {
  const Config plain;
  if (name == "torch" && (config.cross_stream_reuse != plain.cross_stream_reuse ||
                          config.pass_through != plain.pass_through)) {
    throw ConfigError(
        config.pass_through != plain.pass_through ? "pass_through" : "cross_stream_reuse",
        fmt::format("policy '{}': cross_stream_reuse and pass_through are cistern's "
                    "own options; the torch policy emulates PyTorch, which has "
                    "neither",
                    text));
  }
  if (name == "planned" && config.pass_through) {
    throw ConfigError("pass_through", fmt::format("policy '{}': the planned policy's fallback "
                                                  "caches; pass_through is the nocache policy",
                                                  text));
  }
  if (name == "nocache" && !config.pass_through) {
    throw ConfigError("pass_through", fmt::format("policy '{}': nocache is pass_through by "
                                                  "definition (use 'cistern' for a caching run)",
                                                  text));
  }
}

/// Splits at commas outside brackets: "a:k=[1:2,>:1],b" -> "a:k=[1:2,>:1]", "b".
std::vector<std::string> split_top_level(const std::string& text) {
  std::vector<std::string> tokens(1);
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']' && depth > 0) --depth;
    if (c == ',' && depth == 0) {
      tokens.emplace_back();
    } else {
      tokens.back() += c;
    }
  }
  return tokens;
}

/// Whether a token of a policy list begins a new policy (see `Policy::parse_list`).
bool starts_policy(const std::string& token) {
  const std::size_t delimiter = token.find_first_of(":=");
  if (delimiter == std::string::npos) return true;  // a bare name
  if (find_kind(trimmed(token.substr(0, delimiter))) != nullptr) return true;
  // "name:key=value" with an unknown name: a policy (to be refused by name), not an option.
  return token[delimiter] == ':' && token.find('=', delimiter) != std::string::npos;
}

/// The keys of an options text ("a=1,b:[1:2,>:1]" gives "a", "b").
std::vector<std::string> option_keys(const std::string& options) {
  std::vector<std::string> keys;
  for (const std::string& token : split_top_level(options)) {
    std::string key = trimmed(token.substr(0, token.find_first_of(":=")));
    if (!key.empty()) keys.push_back(std::move(key));
  }
  return keys;
}

}  // namespace

Policy Policy::parse(const std::string& text) {
  const std::string written = trimmed(text);
  const std::size_t colon = written.find(':');
  const std::string name = trimmed(written.substr(0, colon));
  if (name.empty()) throw InvalidArgument(fmt::format("empty allocator policy in '{}'", text));
  const PolicyKind& kind = kind_of(name, written);
  Policy policy;
  policy.name = kind.name;
  policy.label = written;
  policy.config = kind.defaults();
  if (colon != std::string::npos) {
    try {
      policy.config.apply(written.substr(colon + 1));
      policy.given = option_keys(written.substr(colon + 1));
    } catch (const ConfigError& e) {
      throw ConfigError(e.key(), fmt::format("policy '{}': {}", written, e.what()));
    }
  }
  check_policy_options(policy.name, policy.config, written);
  return policy;
}

std::vector<Policy> Policy::parse_list(const std::string& text) {
  std::vector<std::string> policies;
  for (const std::string& raw : split_top_level(text)) {
    const std::string token = trimmed(raw);
    if (token.empty()) throw InvalidArgument(fmt::format("empty policy in list '{}'", text));
    if (starts_policy(token)) {
      policies.push_back(token);
    } else if (policies.empty()) {
      throw InvalidArgument(fmt::format(
          "option '{}' before any policy in '{}' (write 'cistern:{}')", token, text, token));
    } else {
      // Another option of the previous policy: "cistern:a=1,b=2" or "cistern:a:1,b:2".
      const bool has_options = policies.back().find(':') != std::string::npos;
      policies.back() += (has_options ? "," : ":") + token;
    }
  }
  std::vector<Policy> parsed;
  parsed.reserve(policies.size());
  for (const std::string& p : policies) parsed.push_back(parse(p));
  return parsed;
}

std::unique_ptr<Allocator> Policy::make(Device& device) const {
  const PolicyKind& kind = kind_of(name, label.empty() ? name : label);
  // A Policy filled in by code rather than parsed may lack what its name implies.
  Config effective = config;
  if (name == "nocache") effective.pass_through = true;
  return kind.make(device, effective);
}

Policy Policy::for_trace(const trace::Trace& trace) const {
  if (name != "torch" || !take_recorded) return *this;
  Policy policy = *this;
  policy.config = with_recorded_settings(trace, config, given);
  return policy;
}

std::vector<SettingUse> Policy::settings_for(const trace::Trace& trace) const {
  if (name != "torch") return {};
  const Policy used = for_trace(trace);
  return settings_used(trace, used.config, given, take_recorded);
}

bool Policy::supports_warm_start() const {
  const PolicyKind* kind = find_kind(name);
  return kind != nullptr && kind->warm_start;
}

}  // namespace cistern::replay
