// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// `cistern info TRACE`: what a trace holds - format, devices, streams, events by kind, the
// blocks live before the window, peak_live, PyTorch's recorded figures and a histogram of the
// requested sizes - as text or JSON. `cistern info --engine`: whether cistern's virtual-memory
// engine runs on a device (the simulated one, or a GPU with --backend cuda): its first growth is
// made, as a program's first allocation would make it, and what happened is said.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/sim_device.hpp"
#include "cistern/types.hpp"
#include "cli/cli.hpp"
#include "cli/device_replay.hpp"
#include "cli/trace_args.hpp"
#include "trace/readers.hpp"

namespace cistern::cli {
namespace {

struct InfoArgs {
  std::string trace;
  TraceArgs input;
  bool json = false;
  bool engine = false;
  std::string backend = "sim";
  int gpu = 0;
  std::string capacity = "80GiB";
};

/// Allocation sizes by power of two: bucket k holds sizes in [2^k, 2^(k+1)) (k = 0 holds 0 too).
struct Histogram {
  std::array<std::uint64_t, 65> count{};
  std::array<std::uint64_t, 65> bytes{};
  void add(std::uint64_t size) {
    int k = 0;
    while (k < 63 && (size >> (k + 1)) != 0) ++k;
    ++count[k];
    bytes[k] += size;
  }
};

/// Everything `info` reports, gathered in one pass.
struct Summary {
  std::array<std::uint64_t, 4> ops{};  // by trace::Op
  std::uint64_t live_before_bytes = 0;
  std::uint64_t largest = 0;
  std::uint64_t allocated_bytes = 0;
  std::set<std::uint64_t> distinct_sizes;
  Histogram sizes;
  std::int64_t first_time = 0, last_time = 0;
};

Summary summarize(const trace::Trace& t) {
  Summary s;
  for (const trace::LiveBlock& b : t.live_before) s.live_before_bytes += b.size;
  for (const trace::Event& e : t.events) {
    ++s.ops[static_cast<std::size_t>(e.op)];
    if (e.op != trace::Op::alloc) continue;
    s.largest = std::max(s.largest, e.size);
    s.allocated_bytes += e.size;
    s.distinct_sizes.insert(e.size);
    s.sizes.add(e.size);
  }
  if (!t.events.empty()) {
    s.first_time = t.events.front().time;
    s.last_time = t.events.back().time;
  }
  return s;
}

std::string size_label(std::uint64_t bytes) {
  if (bytes >= GiB && bytes % GiB == 0) return fmt::format("{} GiB", bytes / GiB);
  if (bytes >= MiB && bytes % MiB == 0) return fmt::format("{} MiB", bytes / MiB);
  if (bytes >= KiB && bytes % KiB == 0) return fmt::format("{} KiB", bytes / KiB);
  return fmt::format("{} B", bytes);
}

/// "1.28 GiB (1373919236 bytes)", or "512 bytes" when that says it all.
std::string bytes_text(std::uint64_t bytes) {
  if (bytes < KiB) return format_bytes(bytes);
  return fmt::format("{} ({} bytes)", format_bytes(bytes), bytes);
}

std::string histogram_text(const Histogram& h) {
  std::uint64_t most = 1;
  for (std::uint64_t c : h.count) most = std::max(most, c);
  std::string out = "  allocation sizes, by power of two:\n";
  out += fmt::format("    {:<20}  {:>8}  {:<40}  {:>10}\n", "from .. below", "count", "", "bytes");
  for (std::size_t k = 0; k < h.count.size(); ++k) {
    if (h.count[k] == 0) continue;
    const std::uint64_t low = k == 0 ? 0 : std::uint64_t{1} << k;
    const std::string high = k >= 63 ? "" : size_label(std::uint64_t{1} << (k + 1));
    const std::size_t bar = static_cast<std::size_t>((h.count[k] * 40 + most - 1) / most);
    out += fmt::format("    {:>8} .. {:<8}  {:>8}  {:<40}  {:>10}\n", size_label(low), high,
                       h.count[k], std::string(bar, '#'), format_bytes(h.bytes[k]));
  }
  return out;
}

/// `items` joined with ", ", broken into lines of at most `width` characters, every line after
/// the first indented by `indent` spaces.
std::string wrapped_list(const std::vector<std::string>& items, std::size_t indent,
                         std::size_t width) {
  std::string out;
  std::size_t column = indent;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string item = items[i] + (i + 1 < items.size() ? "," : "");
    if (column > indent && column + 1 + item.size() > width) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
    } else if (column > indent) {
      out += ' ';
      ++column;
    }
    out += item;
    column += item.size();
  }
  return out;
}

std::string devices_text(const std::vector<int>& devices, int chosen) {
  std::string out;
  for (int d : devices) {
    if (!out.empty()) out += ", ";
    out += d == chosen ? fmt::format("{} (shown)", d) : std::to_string(d);
  }
  return out;
}

std::string streams_text(const std::vector<std::uint64_t>& streams) {
  std::string out = std::to_string(streams.size()) + ":";
  for (std::size_t i = 0; i < streams.size() && i < 8; ++i)
    out += fmt::format(" 0x{:x}", streams[i]);
  if (streams.size() > 8) out += " ...";
  return out;
}

/// The frees that completed later than requested (other streams' uses), and how many of them
/// were still pending when the window ended.
std::string deferred_text(const trace::Trace& t) {
  const auto& frees = t.recorded.deferred_frees;
  if (frees.empty()) return "";
  const auto pending = std::count_if(
      frees.begin(), frees.end(), [&](const auto& f) { return f.before_event == t.events.size(); });
  return fmt::format(
      "  frees completed later     {} (other streams' uses), {} of them pending at the end\n",
      frees.size(), pending);
}

std::string recorded_text(const trace::Trace& t) {
  const trace::Recorded& r = t.recorded;
  if (!r.peak_reserved && r.segment_events.empty() && r.initial_segments.empty()) return "";
  std::string out;
  if (r.initial_reserved)
    out += fmt::format("  reserved at window start  {}\n", bytes_text(*r.initial_reserved));
  if (r.peak_reserved)
    out += fmt::format("  recorded peak reserved    {}\n", bytes_text(*r.peak_reserved));
  out += fmt::format("  recorded segments         {} at window start, {} segment events\n",
                     r.initial_segments.size(), r.segment_events.size());
  if (!r.ooms.empty()) out += fmt::format("  recorded OOMs             {}\n", r.ooms.size());
  out += deferred_text(t);
  if (!r.settings.empty()) {
    std::vector<std::string> settings;
    settings.reserve(r.settings.size());
    for (const auto& [key, value] : r.settings)
      settings.push_back(fmt::format("{}={}", key, value));
    out += "  allocator settings        " + wrapped_list(settings, 28, 100) + "\n";
  }
  for (const std::string& note : r.notes) out += "  not reproducible exactly: " + note + "\n";
  return out;
}

/// The number of allocations (live before the window and in it) whose call stack is known.
std::size_t with_stacks(const trace::Trace& t) {
  std::size_t count = 0;
  for (const std::uint32_t stack : t.alloc_stacks) count += stack != 0 ? 1 : 0;
  return count;
}

/// Whether the snapshot carries call stacks (`frames`), and where they show.
std::string stacks_text(const trace::Trace& t) {
  if (t.alloc_stacks.empty()) {
    return "  call stacks               none: record them with "
           "torch.cuda.memory._record_memory_history(stacks=\"python\")\n";
  }
  return fmt::format(
      "  call stacks               {} distinct, for {} of {} allocations (shown by replay --html, "
      "kept by replay --snapshot)\n",
      t.stacks.size() - 1, with_stacks(t), t.live_before.size() + t.allocations());
}

std::string info_text(const trace::Trace& t, const std::vector<int>& devices) {
  const Summary s = summarize(t);
  std::string out = t.source + "\n";
  out += fmt::format("  format                    {}\n", t.format);
  out += fmt::format("  devices                   {}\n", devices_text(devices, t.device));
  out += fmt::format("  streams                   {}\n", streams_text(t.streams));
  out += fmt::format(
      "  events                    {}: {} alloc, {} free, {} synchronize, {} "
      "empty_cache\n",
      t.events.size(), s.ops[0], s.ops[1], s.ops[2], s.ops[3]);
  if (!t.recorded.has_history) {
    out +=
        "  history                   none: dumped without "
        "torch.cuda.memory._record_memory_history() (replay, advise and plan refuse it)\n";
  }
  if (!t.events.empty() && t.format == "lifetimes")
    out += fmt::format("  time                      steps {} .. {}\n", s.first_time, s.last_time);
  else if (!t.events.empty())
    out += fmt::format("  time                      {} .. {} us ({:.3f} s)\n", s.first_time,
                       s.last_time, static_cast<double>(s.last_time - s.first_time) / 1e6);
  out += fmt::format("  live before the window    {} blocks, {}\n", t.live_before.size(),
                     bytes_text(s.live_before_bytes));
  out += fmt::format("  peak_live                 {}\n", bytes_text(t.peak_live()));
  out += fmt::format("  allocations               {} ({} distinct sizes, largest {}, {} in all)\n",
                     s.ops[0], s.distinct_sizes.size(), format_bytes(s.largest),
                     format_bytes(s.allocated_bytes));
  if (t.format == "pytorch") out += stacks_text(t);
  out += recorded_text(t);
  return out + histogram_text(s.sizes);
}

nlohmann::ordered_json info_json(const trace::Trace& t, const std::vector<int>& devices) {
  const Summary s = summarize(t);
  nlohmann::ordered_json j;
  j["trace"] = t.source;
  j["format"] = t.format;
  j["device"] = t.device;
  j["devices"] = devices;
  j["streams"] = t.streams;
  j["events"] = t.events.size();
  j["has_history"] = t.recorded.has_history;
  j["stacks"] = t.stacks.size() - 1;
  j["allocations_with_stacks"] = with_stacks(t);
  j["allocs"] = s.ops[0];
  j["frees"] = s.ops[1];
  j["synchronizes"] = s.ops[2];
  j["empty_caches"] = s.ops[3];
  j["live_before_blocks"] = t.live_before.size();
  j["live_before_bytes"] = s.live_before_bytes;
  j["peak_live"] = t.peak_live();
  j["distinct_sizes"] = s.distinct_sizes.size();
  j["largest_allocation"] = s.largest;
  const auto& r = t.recorded;
  j["recorded_initial_reserved"] = r.initial_reserved ? nlohmann::ordered_json(*r.initial_reserved)
                                                      : nlohmann::ordered_json(nullptr);
  j["recorded_peak_reserved"] =
      r.peak_reserved ? nlohmann::ordered_json(*r.peak_reserved) : nlohmann::ordered_json(nullptr);
  j["recorded_segment_events"] = r.segment_events.size();
  j["recorded_ooms"] = r.ooms.size();
  j["recorded_deferred_frees"] = r.deferred_frees.size();
  j["notes"] = r.notes;
  nlohmann::ordered_json histogram = nlohmann::ordered_json::array();
  for (std::size_t k = 0; k < s.sizes.count.size(); ++k) {
    if (s.sizes.count[k] == 0) continue;
    histogram.push_back({{"from", k == 0 ? 0 : std::uint64_t{1} << k},
                         {"count", s.sizes.count[k]},
                         {"bytes", s.sizes.bytes[k]}});
  }
  j["size_histogram"] = std::move(histogram);
  return j;
}

/// What `cistern info --engine` finds: the device, whether it offers virtual memory, and whether
/// cistern's engine runs there with CISTERN_ALLOC_CONF's options after a first growth.
nlohmann::ordered_json device_info(Device& device, const std::string& device_note) {
  nlohmann::ordered_json j;
  j["device"] = device.name();
  MemoryInfo memory;
  if (device.memory_info(&memory) == Status::ok) {
    j["total_memory"] = memory.total;
    j["free_memory"] = memory.free;
  }
  j["granularity"] = device.granularity();
  j["virtual_memory"] = device.supports_virtual_memory();
  j["device_note"] = device_note;
  const Config config = Config::from_env();
  CachingAllocator allocator(device, config);
  // The first growth is where a device that lists virtual memory may still refuse it (MIG,
  // vGPU): a 2 MiB request, freed and given back at once.
  void* probe = allocator.allocate(2 * MiB, default_stream);
  allocator.deallocate(probe, default_stream);
  const Stats stats = allocator.stats();
  allocator.empty_cache();
  j["engine"] = allocator.uses_virtual_memory();
  j["engine_note"] = allocator.virtual_memory_note();
  j["num_vmm_fallbacks"] = stats.num_vmm_fallbacks;
  j["first_growth"] = {{"handles_created", stats.num_handles_created},
                       {"granules_mapped", stats.num_pages_mapped},
                       {"segments_allocated", stats.num_device_alloc - stats.num_handles_created}};
  return j;
}

std::string device_info_text(const nlohmann::ordered_json& j) {
  std::string out = fmt::format("{}\n", j["device"].get<std::string>());
  if (j.contains("total_memory")) {
    out += fmt::format("  memory                    {} free of {}\n",
                       format_bytes(j["free_memory"].get<std::uint64_t>()),
                       format_bytes(j["total_memory"].get<std::uint64_t>()));
  }
  out += fmt::format("  granularity               {}\n",
                     format_bytes(j["granularity"].get<std::uint64_t>()));
  const std::string note = j["device_note"].get<std::string>();
  const std::string vmm =
      j["virtual_memory"].get<bool>() ? "yes" : "no" + (note.empty() ? "" : ": " + note);
  out += fmt::format("  virtual memory            {}\n", vmm);
  const std::string engine_note = j["engine_note"].get<std::string>();
  if (j["engine"].get<bool>()) {
    out += fmt::format(
        "  cistern's engine          on: its first growth created {} handle(s) "
        "and mapped {} granule(s)\n",
        j["first_growth"]["handles_created"].get<std::int64_t>(),
        j["first_growth"]["granules_mapped"].get<std::int64_t>());
  } else {
    const std::string why = engine_note.empty() ? "vmm:False (CISTERN_ALLOC_CONF)" : engine_note;
    out += fmt::format("  cistern's engine          off: {}\n", why);
  }
  out +=
      fmt::format("  num_vmm_fallbacks         {}\n", j["num_vmm_fallbacks"].get<std::int64_t>());
  return out;
}

int run_device_info(const InfoArgs& args) {
  std::unique_ptr<Device> device;
  std::string note;
  if (args.backend == "cuda") {
    try {
      DeviceBackend backend = open_cuda_backend(args.gpu, false);
      device = std::move(backend.device);
      note = backend.note;
    } catch (const DeviceError& e) {
      std::cerr << e.what() << "\n";  // the message names cistern already
      return kExitNoDevice;
    }
  } else {
    SimDeviceOptions options;
    options.capacity = parse_bytes(args.capacity);
    device = std::make_unique<SimDevice>(options);
  }
  const nlohmann::ordered_json j = device_info(*device, note);
  if (args.json) {
    std::cout << j.dump(2) << '\n';
  } else {
    std::cout << device_info_text(j);
  }
  return kExitOk;
}

int run_info(const InfoArgs& args) {
  if (args.engine) return run_device_info(args);
  if (args.trace.empty()) {
    throw UsageError("info: give a trace, or --engine to describe a device");
  }
  const trace::ReadOptions options = read_options(args.input);
  const trace::Trace t = trace::read_trace(args.trace, options);
  trace::ReadOptions listing = options;
  listing.device.reset();
  const std::vector<int> devices = trace::list_devices(args.trace, listing);
  if (args.json)
    std::cout << info_json(t, devices).dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
  else std::cout << info_text(t, devices);
  return kExitOk;
}

}  // namespace

Command add_info_command(CLI::App& parent) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* app = parent.add_subcommand(
      "info",
      "Describe a trace: format, devices, streams, events, blocks live before the window, "
      "peak_live, PyTorch's recorded reserved memory, and a histogram of allocation sizes");
  app->add_option("trace", args->trace, "The trace file");
  app->add_flag("--engine", args->engine,
                "Describe a device instead of a trace: its memory, whether it offers virtual "
                "memory, and whether cistern's engine runs there with CISTERN_ALLOC_CONF's "
                "options (its first growth is made and said)");
  app->add_option("--backend", args->backend, "--engine: sim (the simulated device) or cuda")
      ->check(CLI::IsMember({"sim", "cuda"}));
  app->add_option("--gpu", args->gpu, "--engine --backend cuda: the CUDA device ordinal")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--capacity", args->capacity, "--engine --backend sim: the simulated capacity");
  add_trace_options(*app, args->input);
  app->add_flag("--json", args->json, "Print JSON instead of text");
  app->footer(kExitCodesHelp);
  return {app, [args](const std::string&) { return run_info(*args); }};
}

}  // namespace cistern::cli
