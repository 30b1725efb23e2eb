// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Replayer: one replay in progress - the simulated device, the allocator under test over it,
// and the pointers of the allocations the trace holds. `run`, the capacity search and the
// segment-map pass all drive one.
//
// The event loop is the engine's hot path (millions of events per second): per event it reads
// one 16-byte step, makes the allocator call, and samples `reserved_bytes()`; no allocation, no
// lookup beyond a vector index, no virtual call besides the allocator's own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cistern/caching_allocator.hpp"
#include "cistern/sim_device.hpp"
#include "replay/engine.hpp"
#include "replay/metered_device.hpp"
#include "replay/plan.hpp"

namespace cistern::replay {
class TorchAllocator;
}  // namespace cistern::replay

namespace cistern::replay::detail {

/// What a replay has measured so far.
struct Measures {
  std::uint64_t ooms = 0;
  std::uint64_t peak_reserved = 0;
  std::size_t peak_reserved_event = kAtStart;  ///< first event after which the peak held
  std::size_t events_done = 0;                 ///< window events replayed
  std::uint64_t allocator_calls = 0;           ///< timed allocate/deallocate calls
  double loop_ns = 0;                          ///< host time of the timed window loop
};

/// See the file comment.
class Replayer {
 public:
  /// A fresh device of `capacity` bytes and the policy's allocator over it. `plan` (compiled
  /// from `trace`, without error) and `trace` must outlive the replayer.
  Replayer(const trace::Trace& trace, const Plan& plan, const Policy& policy,
           const Options& options, std::uint64_t capacity);
  ~Replayer();
  Replayer(const Replayer&) = delete;
  Replayer& operator=(const Replayer&) = delete;

  /// Places the blocks live before the window: allocated in address order (cold), or the
  /// recorded cache (warm; the policy must support it). Out-of-memory is counted; with
  /// `stop_at_oom` the start stops there.
  void start(bool stop_at_oom);
  /// Replays events [events_done, end), timed. `reserved_after`, if given, receives the
  /// reserved bytes after each event (indexed by event). With `stop_at_oom`, stops after the
  /// first allocation that fails. Throws `cistern::Error` naming the event if the allocator
  /// rejects a call (or, with check_invariants, finds a broken invariant).
  void replay(std::size_t end, bool stop_at_oom, std::vector<std::uint64_t>* reserved_after);

  const Measures& measures() const noexcept { return measures_; }
  const DeviceCalls& device_calls() const noexcept { return meter_.calls(); }
  Allocator& allocator() noexcept { return *allocator_; }
  /// The device's highest use, in whole granules (what a capacity must hold for this run).
  std::uint64_t device_peak_used() const { return device_.peak_used_bytes(); }

 private:
  void start_cold(bool stop_at_oom);
  void start_warm();
  bool try_allocate(const Step& step);
  bool play(const Step& step);
  std::uint64_t sample(std::size_t event);

  const trace::Trace& trace_;
  const Plan& plan_;
  SimDevice device_;
  MeteredDevice meter_;
  std::unique_ptr<Allocator> allocator_;       // destroyed before the devices
  const CachingAllocator* checked_ = nullptr;  // check() after every event, when asked
  const TorchAllocator* checked_torch_ = nullptr;
  std::vector<Stream> streams_;  // by trace stream index
  std::vector<void*> pointers_;  // by slot; nullptr: not allocated (or failed)
  bool warm_ = false;
  Measures measures_;
};

}  // namespace cistern::replay::detail
