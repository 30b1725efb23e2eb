// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Replayer: one replay in progress - the device, the allocator under test over a metering
// adaptor, and the pointers of the allocations the trace holds. It is the one event loop of the
// project: `run`, the capacity search, the segment-map pass, the replay on a real device
// (device_replay.cpp), the recorded run for snapshots (snapshot_run.cpp) and the fidelity test
// of the PyTorch emulation all drive one. What differs between them is the device under the meter
// (a fresh SimDevice, a timing adaptor over a GPU, a recording adaptor) and `LoopHooks`. On a
// SimDevice, a free that PyTorch completed only later (other streams' uses) is made with a use of
// a program stream whose work lasts until then (deferred_frees.hpp), for every policy.
//
// The event loop is the engine's hot path (millions of events per second): per event it reads
// one 16-byte step, makes the allocator call, and samples `reserved_bytes()`; no allocation, no
// lookup beyond a vector index, no virtual call besides the allocator's own. A replay with hooks
// runs a second instantiation of the loop, so that a replay without them pays nothing for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/errors.hpp"
#include "cistern/sim_device.hpp"
#include "plan/planned_allocator.hpp"
#include "replay/deferred_frees.hpp"
#include "replay/engine.hpp"
#include "replay/metered_device.hpp"
#include "replay/plan.hpp"

namespace cistern::replay::detail {

/// What a replay has measured so far.
struct Measures {
  std::uint64_t ooms = 0;
  std::uint64_t peak_reserved = 0;
  std::size_t peak_reserved_event = kAtStart;  ///< first event after which the peak held (pass 1)
  std::size_t events_done = 0;                 ///< events of the current pass replayed
  std::uint64_t allocator_calls = 0;           ///< timed allocate/deallocate calls
  double loop_ns = 0;                          ///< host time of the timed window loop
  std::size_t pass = 0;                        ///< passes completed (`end_pass`)
  std::uint64_t pass_peak_reserved = 0;        ///< peak of the current pass
};

/// What a run adds around the loop; every hook does nothing by default. Event indices are those
/// of the trace's window; `kAtStart` for the cold start's allocations.
class LoopHooks {
 public:
  virtual ~LoopHooks() = default;
  /// Before events[event] is played; once more with event == events.size() when a pass ends.
  virtual void before_event(std::size_t event) { (void)event; }
  /// After `ptr` was allocated for `step` on `stream`.
  virtual void allocated(std::size_t event, const Step& step, void* ptr, Stream stream) {
    (void)event, (void)step, (void)ptr, (void)stream;
  }
  /// After the allocation of `step` failed for want of memory (counted by the replayer).
  virtual void out_of_memory(std::size_t event, const Step& step, const OutOfMemory& error,
                             Stream stream) {
    (void)event, (void)step, (void)error, (void)stream;
  }
  /// Before `ptr` of `step` is freed on `stream`. Returning false keeps it allocated: the hook
  /// frees it later with `Replayer::free_slot` (a free PyTorch completed only later).
  virtual bool freeing(std::size_t event, const Step& step, void* ptr, Stream stream) {
    (void)event, (void)step, (void)ptr, (void)stream;
    return true;
  }
};

/// Where a replay runs when it is not on a SimDevice of its own.
struct Rig {
  /// The device under everything: receives the trace's program calls (synchronize). A SimDevice
  /// in `sim` as well when there is one (a warm start and `device_peak_used` need it).
  Device* device = nullptr;
  SimDevice* sim = nullptr;
  /// What the meter forwards to: `device`, or an adaptor over it (timing, recording).
  Device* below_meter = nullptr;
  std::vector<Stream> streams;  ///< by trace stream index (see `map_streams`)
};

/// The streams of a replay: trace stream 0 recorded as handle 0 is the default stream; every
/// other recorded stream gets one from `create`.
std::vector<Stream> map_streams(const trace::Trace& trace, const std::function<Stream()>& create);

/// See the file comment.
class Replayer {
 public:
  /// A fresh SimDevice of `capacity` bytes and the policy's allocator over the meter over it.
  /// `plan` (compiled from `trace`, without error), `trace` and `hooks` must outlive the replayer.
  Replayer(const trace::Trace& trace, const Plan& plan, const Policy& policy,
           const Options& options, std::uint64_t capacity, LoopHooks* hooks = nullptr);
  /// The policy's allocator over the meter over `rig.below_meter`; the rig's devices must
  /// outlive the replayer.
  Replayer(const trace::Trace& trace, const Plan& plan, const Policy& policy,
           const Options& options, Rig rig, LoopHooks* hooks = nullptr);
  ~Replayer();
  Replayer(const Replayer&) = delete;
  Replayer& operator=(const Replayer&) = delete;

  /// Places the blocks live before the window: allocated in address order (cold), or the
  /// recorded cache (warm; the policy must support it, the rig must have a SimDevice).
  /// Out-of-memory is counted; with `stop_at_oom` the start stops there.
  void start(bool stop_at_oom);
  /// Replays events [events_done, end) of the current pass, timed. `reserved_after`, if given,
  /// receives the reserved bytes after each event (indexed by event). With `stop_at_oom`, stops
  /// after the first allocation that fails. Throws `cistern::Error` naming the event if the
  /// allocator rejects a call (or, with check_invariants, finds a broken invariant).
  void replay(std::size_t end, bool stop_at_oom, std::vector<std::uint64_t>* reserved_after);
  /// Ends a pass over the window (all events replayed): frees what the window left allocated and
  /// allocates again, in address order, the blocks live before the window that it freed, so that
  /// the next pass starts from the same live set. Untimed; out-of-memory is counted.
  /// The planned policy over a trace it does not know ahead learns whole passes instead: every
  /// allocation is freed, the allocator's step ends (the first one is planned there), and all
  /// the blocks live before the window are allocated again as the next step's first requests -
  /// so each pass is one step of the same requests, and no block crosses a step boundary.
  void end_pass(bool stop_at_oom);
  /// Frees every allocation the replay holds and empties the cache (a device run's clean-up).
  void release_all();
  /// Frees the allocation in `slot` now, if it holds one (for hooks that deferred a free).
  void free_slot(std::uint32_t slot, Stream stream);

  const Measures& measures() const noexcept { return measures_; }
  /// The planned policy learning passes (see end_pass), else nullptr.
  const plan::PlannedAllocator* learning() const noexcept { return learning_; }
  /// With `learning()`: its counters when the current pass's step began (else all zero).
  const plan::PlannedCounters& plan_counters_at_pass_start() const noexcept {
    return pass_start_counters_;
  }
  /// Why the warm start differs from the recording (empty if it does not, or the start is cold).
  const std::string& start_note() const noexcept { return start_note_; }
  const DeviceCalls& device_calls() const noexcept { return meter_.calls(); }
  Allocator& allocator() noexcept { return *allocator_; }
  const std::vector<Stream>& streams() const noexcept { return rig_.streams; }
  /// The pointer in `slot` (nullptr: not allocated, or failed).
  void* pointer(std::uint32_t slot) const noexcept { return pointers_[slot]; }
  /// The device's highest use, in whole granules (what a capacity must hold for this run).
  /// Requires a SimDevice.
  std::uint64_t device_peak_used() const { return rig_.sim->peak_used_bytes(); }

 private:
  void start_cold(bool stop_at_oom);
  void start_warm();
  template <bool kHooks>
  bool try_allocate(std::size_t event, const Step& step);
  template <bool kHooks>
  bool play(std::size_t event, const Step& step);
  template <bool kHooks>
  void loop(std::size_t& i, std::size_t end, bool stop_at_oom,
            std::vector<std::uint64_t>* reserved_after);
  std::uint64_t sample(std::size_t event);
  Replayer(const trace::Trace& trace, const Plan& plan, const Policy& policy,
           const Options& options, Rig rig, LoopHooks* hooks, std::unique_ptr<SimDevice> own);
  /// The stream each slot was allocated on (for frees outside the window's own).
  std::vector<std::uint16_t> allocation_streams() const;
  void free_all(bool keep_start);

  const trace::Trace& trace_;
  const Plan& plan_;
  std::unique_ptr<SimDevice> own_device_;  // the simulated run's device
  Rig rig_;
  MeteredDevice meter_;
  LoopHooks* hooks_;
  std::unique_ptr<Allocator> allocator_;        // destroyed before the devices
  const Allocator* checked_ = nullptr;          // check() after every event, when asked
  plan::PlannedAllocator* learning_ = nullptr;  // the planned policy learning passes
  plan::PlannedCounters pass_start_counters_;
  std::vector<void*> pointers_;  // by slot; nullptr: not allocated (or failed)
  DeferredFrees deferred_;       // frees PyTorch completed later (other streams' uses)
  bool warm_ = false;
  Measures measures_;
  std::string start_note_;
};

}  // namespace cistern::replay::detail
