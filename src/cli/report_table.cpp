// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The text table of `cistern replay`: one block per trace, one row per policy.
//
//   pytorch/DeComFL/memory.pickle.gz
//     device 0, cold start, 7946 allocations, peak_live 1.66 GiB (1783664516 bytes)
//     policy                 peak_reserved  overhead  min_cap/live  ooms  dev allocs/frees  ns/op
//     recorded                    1.77 GiB     6.41%             -     -                 -      -
//     cistern                     1.70 GiB     2.10%         1.021     0            41 / 0   61.3
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cli/report.hpp"

namespace cistern::cli {
namespace {

constexpr std::size_t kPolicyWidth = 22;
constexpr const char* kIndent = "  ";

std::string format_count(std::uint64_t value) { return fmt::format("{}", value); }

std::string format_device_calls(const replay::Result& r) {
  std::string text = fmt::format("{} / {}", r.device_allocs, r.device_frees);
  if (r.device_maps != 0 || r.device_unmaps != 0)
    text += fmt::format(" +{}m/{}u", r.device_maps, r.device_unmaps);
  return text;
}

/// With several passes: each pass's peak reserved and device calls of every kind.
std::string format_pass_peaks(const replay::Result& r) {
  std::string peaks;
  std::string calls;
  for (const replay::PassResult& p : r.passes) {
    peaks += fmt::format("{}{}", peaks.empty() ? "" : ", ", format_bytes(p.peak_reserved));
    calls += fmt::format("{}{}", calls.empty() ? "" : ", ", p.device_calls);
  }
  return fmt::format("{}{:<{}} per pass: peak reserved {}; device calls of any kind {}\n", kIndent,
                     "", kPolicyWidth, peaks, calls);
}

/// The planned policy learning passes: how each pass's allocations were served.
std::string format_plan_use(const replay::Result& r) {
  std::string passes;
  for (std::size_t i = 0; i < r.passes.size(); ++i) {
    const replay::PassResult& p = r.passes[i];
    if (!p.planned) return "";
    const std::uint64_t served = p.recorded + p.plan_hits + p.idle_fits + p.fallbacks;
    passes += fmt::format("{}pass {}: ", i == 0 ? "" : "; ", i + 1);
    passes += p.recorded != 0 ? fmt::format("{} recorded", p.recorded) : "";
    if (p.plan_hits + p.idle_fits + p.fallbacks != 0 || p.recorded == 0) {
      passes += fmt::format(
          "{}{} hits ({}), {} idle fits, {} fallbacks", p.recorded != 0 ? ", " : "", p.plan_hits,
          format_percent(served == 0
                             ? std::optional<double>()
                             : static_cast<double>(p.plan_hits) / static_cast<double>(served)),
          p.idle_fits, p.fallbacks);
    }
  }
  return fmt::format("{}{:<{}} plan: {}\n", kIndent, "", kPolicyWidth, passes);
}

/// With several passes: the device calls of the first pass and of the later ones together.
std::string format_passes(const replay::Result& r) {
  if (r.passes.empty()) return "";
  replay::PassResult later;
  for (std::size_t i = 1; i < r.passes.size(); ++i) {
    later.device_allocs += r.passes[i].device_allocs;
    later.device_frees += r.passes[i].device_frees;
    later.maps += r.passes[i].maps;
    later.unmaps += r.passes[i].unmaps;
  }
  const replay::PassResult& first = r.passes[0];
  const std::string others =
      r.passes.size() == 2 ? std::string("pass 2") : fmt::format("passes 2-{}", r.passes.size());
  return fmt::format(
             "{}{:<{}} pass 1: {} / {} +{}m/{}u; {}: {} / {} +{}m/{}u (allocs / frees, maps / "
             "unmaps)\n",
             kIndent, "", kPolicyWidth, first.device_allocs, first.device_frees, first.maps,
             first.unmaps, others, later.device_allocs, later.device_frees, later.maps,
             later.unmaps) +
         format_pass_peaks(r) + format_plan_use(r);
}

/// A line under a torch row that did not run plain PyTorch defaults: its settings.
std::string format_settings_line(const replay::Result& r) {
  const std::string settings = format_settings(r);
  if (settings.empty()) return "";
  return fmt::format("{}{:<{}} settings: {}\n", kIndent, "", kPolicyWidth, settings);
}

std::string format_ns(const std::optional<double>& ns) {
  if (!ns) return "-";
  return *ns < 100 ? fmt::format("{:.1f}", *ns) : fmt::format("{:.0f}", *ns);
}

std::string row_line(const std::string& policy, const std::string& reserved,
                     const std::string& overhead, const std::string& ratio, const std::string& ooms,
                     const std::string& calls, const std::string& ns) {
  return fmt::format("{}{:<{}} {:>14} {:>9} {:>13} {:>5} {:>17} {:>7}\n", kIndent, policy,
                     kPolicyWidth, reserved, overhead, ratio, ooms, calls, ns);
}

std::string format_row(const replay::Result& r, std::uint64_t peak_live) {
  std::string out;
  std::string label = r.policy;
  if (label.size() > kPolicyWidth) {  // a long option list: its own line, then the figures
    out += fmt::format("{}{}\n", kIndent, label);
    label.clear();
  }
  if (!r.error.empty()) {
    return out + fmt::format("{}{:<{}} error: {}\n", kIndent, label, kPolicyWidth, r.error) +
           format_settings_line(r);
  }
  return out +
         row_line(label, r.peak_reserved ? format_bytes(*r.peak_reserved) : "-",
                  format_percent(r.overhead), format_ratio(r.min_capacity, peak_live),
                  format_count(r.ooms), format_device_calls(r), format_ns(r.ns_per_op)) +
         format_settings_line(r) + format_passes(r);
}

std::string format_block(const TraceResults& t) {
  std::string out = t.trace + "\n";
  out += fmt::format("{}device {}, {} start, {} allocations, peak_live {} ({} bytes)", kIndent,
                     t.device, t.start, t.allocations, format_bytes(t.peak_live), t.peak_live);
  if (t.live_before != 0) out += fmt::format(", {} live before", format_bytes(t.live_before));
  out += "\n";
  out += row_line("policy", "peak_reserved", "overhead", "min_cap/live", "ooms", "dev allocs/frees",
                  "ns/op");
  for (const replay::Result& r : t.results) out += format_row(r, t.peak_live);
  return out;
}

}  // namespace

std::string format_settings(const replay::Result& r) {
  std::vector<std::string> items;
  for (const replay::SettingUse& use : r.settings) {
    const auto info = std::find_if(options().begin(), options().end(),
                                   [&](const OptionInfo& o) { return o.name == use.key; });
    const bool is_default = info != options().end() && info->default_value == use.value;
    if (is_default && use.source != replay::SettingSource::given) continue;
    items.push_back(fmt::format("{}:{} ({})", use.key, use.value, replay::to_string(use.source)));
  }
  return fmt::format("{}", fmt::join(items, ", "));
}

std::string format_percent(const std::optional<double>& fraction) {
  if (!fraction) return "-";
  return fmt::format("{:.2f}%", *fraction * 100.0);
}

std::string format_ratio(const std::optional<std::uint64_t>& min_capacity,
                         std::uint64_t peak_live) {
  if (!min_capacity || *min_capacity == 0 || peak_live == 0) return "-";
  return fmt::format("{:.3f}", static_cast<double>(*min_capacity) / static_cast<double>(peak_live));
}

std::string format_table(const std::vector<TraceResults>& traces, std::uint64_t capacity) {
  std::string out;
  for (const TraceResults& t : traces) {
    if (!out.empty()) out += "\n";
    out += format_block(t);
  }
  if (!traces.empty()) {
    out += fmt::format(
        "\ncapacity {}; overhead = peak_reserved / peak_live - 1; min_cap/live = the smallest "
        "capacity\nwith no out-of-memory (to 2 MiB) / peak_live; ns/op = allocator host time "
        "per alloc/free.\n",
        format_bytes(capacity));
  }
  return out;
}

}  // namespace cistern::cli
