// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// DeferredFrees: the program's other streams, as far as a trace shows them.
//
// A PyTorch snapshot shows when the program freed a block (`free_requested`) and when PyTorch
// could reuse it (`free_completed`). The two are apart when the block had users on other streams
// (`record_stream`, or a free on another stream): PyTorch records an event on each of those
// streams at the free and caches the block only when `process_events`, at the start of a later
// allocation, finds the events complete. The snapshot does not name the streams or their work,
// only when the completion was seen (`trace.recorded.deferred_frees`).
//
// The replay makes that free as the program made it: it gives the block a use on a stream of the
// program whose work completes exactly when PyTorch saw it complete (`Allocator::record_stream`),
// then frees it. What follows is each policy's own business: PyTorch's emulation records an event
// and caches the block at the allocation before which PyTorch logged `free_completed` (or frees it
// at once in `synchronize_and_free_events` when it runs out of memory); cistern keeps the block
// pending until its event completes.
//
// The program's time is the SimDevice's clock, moved one tick before each event of the window
// once the trace has such frees (a trace without them never touches the clock). The work of a
// use that completes before events[j], made at events[i], ends j - i ticks later. The streams are
// the replay's own, none of the trace's: a use goes to a stream whose earlier uses all complete
// no later than it, so that no use waits for another (PyTorch polls each stream's events in
// order, stopping at the first that is not ready), and a new stream is made only when none fits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "cistern/allocator.hpp"
#include "cistern/sim_device.hpp"
#include "trace/trace.hpp"

namespace cistern::replay::detail {

/// See the file comment.
class DeferredFrees {
 public:
  /// Simulated nanoseconds per event of the window.
  static constexpr std::uint64_t kTick = 1000;

  /// The deferred frees of `trace`, replayed on `device` (null: a real device, whose streams the
  /// replay does not drive; every free is then made at once, as `active()` is false).
  DeferredFrees(const trace::Trace& trace, SimDevice* device);

  /// Whether the trace has deferred frees and the replay models them.
  bool active() const noexcept { return !completion_.empty(); }
  /// The program's clock moves one tick: called before each event of the window when active.
  void tick() { device_->advance(kTick); }
  /// Frees `ptr`, allocated on `stream`, for events[event]: if the free completed later in the
  /// recording, a use of a program stream whose work lasts until then is recorded first.
  void deallocate(std::size_t event, void* ptr, Stream stream, Allocator& allocator);

 private:
  /// A program stream whose work so far is done by `done_at` (made if none is).
  Stream stream_done_by(std::uint64_t done_at);

  SimDevice* device_;
  std::unordered_map<std::size_t, std::size_t> completion_;  ///< free event -> completion event
  std::vector<Stream> streams_;                              ///< the program's streams so far
};

}  // namespace cistern::replay::detail
