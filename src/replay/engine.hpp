// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The replay engine: runs a trace against an allocator policy on a simulated device and
// measures what DESIGN.md defines (peak_live, peak_reserved, overhead, min_capacity, ooms,
// device calls, host time per operation, simulated device time).
//
//   trace::Trace t = trace::read_trace("memory.pickle.gz", {});
//   replay::Policy p = replay::Policy::parse("cistern:max_split_size_mb=256");
//   replay::Result r = replay::run(t, p, {});            // one replay
//   r.min_capacity = replay::min_capacity(t, p, {});      // bisection to 2 MiB
//
// Program calls the trace records (synchronisations, PyTorch's empty_cache() bursts) are
// replayed for every policy. Blocks live before the window are allocated first, in address
// order, on an empty device (`Start::cold`), or - for policies that support it and PyTorch
// snapshots - placed in the recorded cache at their recorded addresses (`Start::warm`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cistern/allocator.hpp"
#include "cistern/config.hpp"
#include "cistern/sim_device.hpp"
#include "replay/recorded_settings.hpp"
#include "trace/trace.hpp"

namespace cistern::replay {

/// How a replay begins (see the file comment).
enum class Start { cold, warm };
const char* to_string(Start start) noexcept;

/// An allocator policy by name: "cistern", "torch", "nocache", "planned", optionally with options
/// written after a colon as `name:key=value,key=value` (keys and values as in CISTERN_ALLOC_CONF).
struct Policy {
  std::string name;   ///< "cistern", "torch", "nocache" or "planned"
  Config config;      ///< options applied on top of the policy's defaults
  std::string label;  ///< as written, e.g. "cistern:max_split_size_mb=256"
  /// The option keys written after the colon ("torch:expandable_segments=false" gives
  /// "expandable_segments").
  std::vector<std::string> given;
  /// torch: on a trace that records its allocator's settings (PyTorch snapshots), take them for
  /// the keys `given` does not name (replay/recorded_settings.hpp), so that `-p torch` replays
  /// a snapshot as it was recorded. `cistern advise` clears it: its candidates are whole settings
  /// strings, in which a key left out is PyTorch's default.
  bool take_recorded = true;

  /// Parses one policy; throws InvalidArgument naming the text on an unknown name or option.
  static Policy parse(const std::string& text);
  /// Parses a comma-separated list: "cistern,torch,nocache". A token that is an option
  /// (`key=value`) rather than a policy name continues the previous policy's options, so
  /// "cistern:max_split_size_mb=256,roundup_power2_divisions=4,torch" is two policies.
  static std::vector<Policy> parse_list(const std::string& text);
  /// The allocator this policy names, over `device` (a SimDevice, or an adaptor over one).
  std::unique_ptr<Allocator> make(Device& device) const;
  /// The policy as it runs on `trace`: torch with the recorded settings under its own options
  /// (see `take_recorded`); any other policy as it is. Throws `ConfigError` when the recorded
  /// settings make an invalid configuration.
  Policy for_trace(const trace::Trace& trace) const;
  /// The PyTorch settings torch uses on `trace`, each with where its value came from; empty for
  /// the other policies.
  std::vector<SettingUse> settings_for(const trace::Trace& trace) const;
  /// Whether the policy can start warm (implements replay::WarmStart).
  bool supports_warm_start() const;
};

/// The cost of device calls on the simulated device, for the "simulated device time" figure.
/// Documented in docs/cost-model.md with the measurement behind every figure. A call whose cost
/// grows with its size is priced as a fixed part plus a part per MiB; the access grant and the
/// unmap are priced per mapping they cover (the driver's cost follows the mappings, not the
/// calls), each mapping by its own size. All figures in ns.
struct CostModel {
  /// Which model this is, as `--cost-model` named it: "h200", "a100", or the file it was read
  /// from.
  std::string name = "h200";
  double alloc_ns = 0;          ///< cudaMalloc, fixed part
  double alloc_ns_per_mib = 0;  ///< cudaMalloc, per MiB
  double free_ns = 0;           ///< cudaFree, fixed part (the host's part: no work is modelled)
  double free_ns_per_mib = 0;
  double reserve_ns = 0;              ///< cuMemAddressReserve
  double release_reservation_ns = 0;  ///< cuMemAddressFree
  double create_ns = 0;               ///< cuMemCreate, fixed part, per handle
  double create_ns_per_mib = 0;       ///< cuMemCreate, per MiB of the handle
  double release_ns = 0;              ///< cuMemRelease, fixed part, per handle
  double release_ns_per_mib = 0;
  double map_ns = 0;             ///< cuMemMap, per mapping
  double access_ns = 0;          ///< cuMemSetAccess, per mapping the range covers
  double access_ns_per_mib = 0;  ///< cuMemSetAccess, per MiB of each mapping covered
  double unmap_ns = 0;           ///< cuMemUnmap, per mapping the range covers
  double unmap_ns_per_mib = 0;   ///< cuMemUnmap, per MiB of each mapping covered
  double event_record_ns = 0;    ///< cudaEventRecord; cudaStreamWaitEvent
  double event_query_ns = 0;     ///< cudaEventQuery; cudaMemGetInfo
  double sync_stream_ns = 0;     ///< cudaStreamSynchronize, the host's part (no work is modelled)
  double sync_event_ns = 0;      ///< cudaEventSynchronize, the host's part
  double sync_device_ns = 0;     ///< cudaDeviceSynchronize, the host's part

  /// The default: every figure measured on an NVIDIA H200 (driver 580.159.04, CUDA 13.0) or,
  /// where a call was not measured, assumed from one that was (docs/cost-model.md says which).
  static CostModel h200();
  /// The published A100 figures of 2 MiB pages (cuMemAddressReserve, cuMemCreate, cuMemMap,
  /// cuMemSetAccess, cuMemUnmap); every other figure, and the parts per MiB, the H200's.
  static CostModel a100();
  /// `h200()`.
  static CostModel defaults();
  /// The model of that name ("h200", "a100"); throws InvalidArgument naming the known ones.
  static CostModel named(const std::string& name);

  /// One field of the model by name, for reading and writing models as JSON.
  struct Field {
    const char* name;
    double CostModel::*value;
  };
  /// Every field, in the order above.
  static const std::vector<Field>& fields();
  /// The field `field`; throws InvalidArgument naming the field if there is no such field.
  double get(const std::string& field) const;
  /// Sets the field `field` to `ns`; throws InvalidArgument naming the field if there is no such
  /// field or `ns` is not a finite time of 0 or more.
  void set(const std::string& field, double ns);

  /// The price of one successful call on `bytes` (a failed call costs its fixed part once).
  /// Every pricing of device calls (a policy's, the recording allocator's, a real device's
  /// simulated figure) goes through these.
  double alloc_price(std::size_t bytes) const noexcept;    ///< cudaMalloc
  double free_price(std::size_t bytes) const noexcept;     ///< cudaFree
  double create_price(std::size_t bytes) const noexcept;   ///< cuMemCreate
  double release_price(std::size_t bytes) const noexcept;  ///< cuMemRelease
  /// cuMemSetAccess's part for one mapping of `bytes` that the range covers.
  double access_price(std::size_t bytes) const noexcept;
  /// cuMemUnmap's part for one mapping of `bytes` that the range covers.
  double unmap_price(std::size_t bytes) const noexcept;
};

/// What a replay measures and how.
struct Options {
  std::size_t capacity = 80 * GiB;  ///< simulated device capacity
  Start start = Start::cold;
  /// Call the allocator's check() after every event (every policy's: cistern's, torch's, plan
  /// mode's).
  bool check_invariants = false;
  /// >0: sample live and reserved bytes at about this many points (the peaks always included).
  std::size_t timeline_points = 0;
  bool segment_map_at_peak = false;  ///< snapshot the allocator at its peak reserved
  CostModel costs = CostModel::defaults();
  /// Replays of the window in a row (`cistern replay --repeat N`): after each pass the
  /// allocations the window left live are freed and the blocks live before the window that it
  /// freed are allocated again, so that every pass starts from the same live set. Figures cover
  /// all passes; `Result::passes` has each one's. The timeline and the segment map are the first
  /// pass's; min_capacity is the smallest device on which every pass runs.
  std::size_t repeat = 1;
};

/// One point of a memory timeline.
struct TimelinePoint {
  std::size_t event = 0;       ///< index of the event after which it was taken
  std::int64_t time = 0;       ///< the event's recorded time
  std::uint64_t live = 0;      ///< live requested bytes
  std::uint64_t reserved = 0;  ///< the allocator's reserved bytes
};

/// What one pass over the window did (`Options::repeat` > 1): its own peak and device calls.
struct PassResult {
  std::uint64_t peak_reserved = 0;
  std::uint64_t device_allocs = 0;
  std::uint64_t device_frees = 0;
  std::uint64_t maps = 0;
  std::uint64_t unmaps = 0;
  /// Every metered device call of the pass, of any kind (the four above, reservations, physical
  /// handles, events and stream waits, synchronisations).
  std::uint64_t device_calls = 0;
  /// The simulated time of those calls (the cost model's price, failed calls included), in ms.
  double device_ms = 0;
  /// The planned policy (learning passes; false for every other policy and for lifetime lists,
  /// planned whole ahead): how the pass's allocations were served - recorded (by the online
  /// allocator while the step was learnt), at their planned offset, in an idle interval of the
  /// plan, or by the online allocator because they matched no plan.
  bool planned = false;
  std::uint64_t recorded = 0;
  std::uint64_t plan_hits = 0;
  std::uint64_t idle_fits = 0;
  std::uint64_t fallbacks = 0;
};

/// The device calls of a replay on a device of exactly the policy's min_capacity: what running
/// that close to the limit costs (reclaim's unmaps and synchronisations, release-and-retry).
struct AtCapacity {
  std::uint64_t device_allocs = 0;
  std::uint64_t device_frees = 0;
  std::uint64_t maps = 0;
  std::uint64_t unmaps = 0;
  std::uint64_t handle_creates = 0;
  std::uint64_t syncs = 0;
  double device_ms = 0;
};

/// The measurements of one replay (a row of `cistern replay --json`).
struct Result {
  std::string trace;  ///< source path
  int device = 0;
  std::string policy;  ///< label ("recorded" for PyTorch's own figures)
  std::string start = "cold";
  std::optional<std::uint64_t> capacity;  ///< null for "recorded"
  std::uint64_t peak_live = 0;
  std::optional<std::uint64_t> peak_reserved;
  std::optional<double> overhead;  ///< peak_reserved / peak_live - 1
  std::optional<std::uint64_t> min_capacity;
  std::optional<AtCapacity> at_min_capacity;  ///< with min_capacity
  std::uint64_t events = 0;
  std::uint64_t ooms = 0;
  // Device calls the policy's allocator made (successful ones), a cold start's allocation of the
  // blocks live before the window included, a warm start's placement of the recorded cache not.
  std::uint64_t device_allocs = 0;
  std::uint64_t device_frees = 0;
  std::uint64_t device_maps = 0;      ///< map calls (cuMemMap)
  std::uint64_t device_unmaps = 0;    ///< unmap calls (cuMemUnmap)
  std::uint64_t handle_creates = 0;   ///< physical handles created (cuMemCreate)
  std::uint64_t handle_releases = 0;  ///< physical handles released (cuMemRelease)
  /// Host waits the allocator made: stream, event and device synchronisations.
  std::uint64_t syncs = 0;
  std::vector<PassResult> passes;  ///< one per pass when Options::repeat > 1
  /// Allocator host time per alloc/free: the timed event loop over the calls made (with
  /// check_invariants, the checks are in it too).
  std::optional<double> ns_per_op;
  std::optional<double> device_ms;      ///< simulated device time of device calls (cost model)
  std::vector<TimelinePoint> timeline;  ///< when Options::timeline_points > 0
  std::optional<Snapshot> segment_map;  ///< at peak reserved, when asked
  /// torch: the PyTorch settings the replay used, and whether each was recorded in the snapshot,
  /// given in the policy's options or PyTorch's default (empty for other policies).
  std::vector<SettingUse> settings;
  std::string error;  ///< why the replay could not run (empty if it did)
  std::string note;   ///< a caveat about a figure (empty if none), e.g. a
                      ///< capacity probe that contradicted monotonicity
};

/// Replays `trace` with `policy`. Out-of-memory is counted, not thrown; a trace that cannot be
/// replayed (a free of an id that is not live, a stream index out of range, a call the allocator
/// rejects) gives a row with `error` set. Throws `InvalidArgument` only for a warm start of a
/// policy that cannot start warm.
Result run(const trace::Trace& trace, const Policy& policy, const Options& options);

/// The outcome of a capacity search.
struct CapacitySearch {
  std::uint64_t capacity = 0;  ///< the smallest capacity found to run with no out-of-memory
  std::size_t probes = 0;      ///< replays made (the unlimited run included)
  std::string note;            ///< non-empty if a probe contradicted monotonicity (see below)
};

/// The smallest capacity, to 2 MiB, at which the trace runs with no out-of-memory (bisection;
/// assumes that more capacity never causes an OOM, and says so in `note` if a probe contradicts
/// it). `options.capacity`, timeline and segment map are ignored. Throws `cistern::Error` if the
/// trace cannot be replayed or runs out of memory even on an unlimited device.
CapacitySearch search_min_capacity(const trace::Trace& trace, const Policy& policy,
                                   const Options& options);
/// `search_min_capacity(trace, policy, options).capacity`.
std::uint64_t min_capacity(const trace::Trace& trace, const Policy& policy, const Options& options);

/// PyTorch's own figures for a snapshot (policy "recorded", start "warm": its run began from its
/// real cache), if the trace has them: peak_reserved from `trace.recorded`, device calls counted
/// from its segment events and costed with `options.costs`, a timeline when asked. Capacity,
/// min_capacity and ns_per_op stay null.
std::optional<Result> recorded(const trace::Trace& trace, const Options& options = {});

/// Runs every (trace, policy) pair, in parallel on up to `threads` threads (0: hardware
/// concurrency), with `min_capacity` when `with_min_capacity`. Rows come in a fixed order
/// whatever the threads do: by trace, the trace's `recorded` row first when it has one, then the
/// policies as given; a job that fails gives a row with `error` set. `progress(done, total)` is
/// called once per finished job, always from the calling thread. Throws `InvalidArgument`
/// before running anything if a policy cannot begin with `options.start`.
std::vector<Result> run_all(const std::vector<const trace::Trace*>& traces,
                            const std::vector<Policy>& policies, const Options& options,
                            bool with_min_capacity, unsigned threads,
                            const std::function<void(std::size_t, std::size_t)>& progress = {});

}  // namespace cistern::replay
