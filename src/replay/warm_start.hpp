// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The warm start of a replay: begin from the cache the recording allocator actually held when
// the recorded window opened, instead of from an empty device.
//
// A PyTorch snapshot records a window of a longer run. When the window opens, PyTorch already
// holds segments (`Trace::recorded.initial_segments`: the final `segments` minus those allocated
// in the window, plus those freed in it), and some of their memory is allocated to blocks that
// were live before the window (`Trace::live_before`, at their recorded addresses). Everything
// else in those segments is cached free memory, coalesced as PyTorch always coalesces it. A
// policy that can start from such a state implements `WarmStart`; `apply_warm_start` builds the
// state on a `SimDevice` through it and makes new segments take the addresses PyTorch recorded
// for them, so that an emulation of PyTorch can be checked against the recording address by
// address.
//
// The replay engine calls `apply_warm_start` for `--start warm` when the policy implements
// `WarmStart` (`dynamic_cast<WarmStart*>(allocator)`), then replays the events with the pointers
// it returns for the live blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cistern/config.hpp"
#include "cistern/sim_device.hpp"
#include "cistern/types.hpp"
#include "replay/recorded_settings.hpp"
#include "trace/trace.hpp"

namespace cistern::replay {

/// What a warm start needs from an allocator policy. Called only on a fresh allocator, before
/// any `allocate`, in this order: every `adopt_segment`, then every `place_block`.
class WarmStart {
 public:
  virtual ~WarmStart() = default;

  /// Takes a segment that has already been obtained from the allocator's device at `ptr` (with
  /// `SimDevice::allocate_at`) as cached free memory of `stream`'s pool: the large pool if
  /// `is_large`, else the small pool. From now on the allocator owns the segment as if it had
  /// allocated it itself (it counts in reserved bytes and may be returned to the device).
  virtual void adopt_segment(void* ptr, std::size_t bytes, Stream stream, bool is_large) = 0;

  /// The bytes of address space the policy reserves for one expandable segment of the large
  /// pool (`is_large`) or the small one; 0 when it uses no expandable segments (a warm start then
  /// takes a recorded expandable segment's mapped ranges as fixed segments, `adopt_segment`).
  virtual std::size_t expandable_reservation_bytes(bool is_large) = 0;

  /// Takes [base, base + bytes), already reserved on the allocator's device (with
  /// `SimDevice::reserve_at`), as an expandable segment of `stream`'s large or small pool with
  /// no pages mapped. Throws `InvalidArgument` if the policy uses no expandable segments or the
  /// size is not a whole number of its pages.
  virtual void adopt_reservation(void* base, std::size_t bytes, Stream stream, bool is_large) = 0;

  /// Maps pages over [ptr, ptr + bytes), unmapped space of an adopted reservation, as cached free
  /// memory: the recording allocator's mapped range. Its device calls are the warm start's (the
  /// replay does not count them). Throws `InvalidArgument` if the range is not whole pages of
  /// unmapped space of an adopted reservation.
  virtual void adopt_mapped(void* ptr, std::size_t bytes) = 0;

  /// Allocates, at exactly `ptr`, a block of `block_size` bytes serving a request of
  /// `requested` bytes on `stream`, carved out of the free memory of an adopted segment. The
  /// free block around it is split into the free block before it, the block, and the free
  /// block after it, as the recording allocator's block list looked. `block_size` is the size
  /// the recording allocator gave the block (at least its rounding of `requested`: PyTorch
  /// leaves a remainder of 1 MiB or less in a large block); 0 means the policy's own rounding.
  /// Returns the pointer to pass to `deallocate` (== ptr). Throws `InvalidArgument` if the
  /// range is not inside one free block of a segment of `stream`'s matching pool.
  virtual void* place_block(void* ptr, std::size_t requested, std::size_t block_size,
                            Stream stream) = 0;
};

/// The outcome of `apply_warm_start`.
struct WarmStartResult {
  /// (live-before id, pointer), in `Trace::live_before` order: the engine frees the pointer when
  /// the trace frees the id.
  std::vector<std::pair<std::uint64_t, void*>> live;
  /// Block sizes given to `place_block`, in the same order (see `infer_live_block_sizes`).
  std::vector<std::size_t> block_sizes;
  std::size_t segments = 0;          ///< segments adopted
  std::uint64_t reserved_bytes = 0;  ///< bytes of the adopted segments
  /// Why the start differs from the recording allocator's, if it does (empty otherwise): the
  /// trace shows expandable segments and the policy maps no pages.
  std::string note;
};

/// The block size the recording allocator held for each block of `trace.live_before` (same
/// order), under the recording allocator's size policy `recorded` (PyTorch's defaults unless
/// the snapshot's settings say otherwise).
///
/// The window shows only requested sizes. A small-pool block is exactly the rounded request
/// (PyTorch splits off any remainder of 512 bytes or more, and rounded sizes are multiples of
/// 512). A large-pool block is the rounded request plus a remainder of at most 1 MiB that was
/// not split off. Because every block of a large segment, free or not, is larger than 1 MiB,
/// the remainder is known in two cases: (1) the space up to the next live block or the end of
/// the segment is at most 1 MiB, so it cannot be a free block and belongs to this one; (2) an
/// allocation of the window lands at `x` with `round_end <= x <= round_end + 1 MiB` while this
/// block is still live: a free block starts at `x`, so this block ends there. Otherwise the
/// block is taken as its rounded request; the remaining uncertainty (up to 1 MiB at the end of
/// a block that is followed by free space and freed before anything is allocated there) is
/// the only ambiguity a window leaves about the earlier state on a single stream.
std::vector<std::size_t> infer_live_block_sizes(const trace::Trace& trace,
                                                const Config& recorded = Config{});

/// One address reservation of an expandable segment, as a warm start infers it.
struct InferredReservation {
  std::uint32_t stream = 0;  ///< trace stream index
  bool is_large = true;
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;
  /// Indices into `trace.recorded.initial_segments`: the mapped ranges inside it.
  std::vector<std::size_t> mapped;
};

/// Where the recording allocator's expandable segments lie, which a snapshot does not record.
struct ReservationLayout {
  std::vector<InferredReservation> initial;  ///< held when the window opens, by base
  /// Bases of the reservations the window makes, in order: the first page each maps is at its
  /// base (PyTorch maps the lowest hole first, and a new reservation is all hole).
  std::vector<std::uint64_t> window_bases;
};

/// PyTorch's layout of expandable segments, inferred from a snapshot: one reservation per
/// (stream, pool) of `bytes_of(is_large)` bytes (the policy's size: PyTorch's is 1.125 x the
/// device's memory). A reservation begins at the lowest address mapped in it, before or during
/// the window: the pages below were never mapped, so PyTorch's choices never depended on them.
/// A map event's pool is its reservation's, or for a new reservation its size's (the small pool
/// maps one 2 MiB page at a time). A reservation is cut short where the next recorded range
/// begins (the replay's device may be larger than the recording one), and is taken to be
/// released when the window unmaps its last page (PyTorch then returns the address range).
ReservationLayout infer_reservations(const trace::Trace& trace,
                                     const std::function<std::uint64_t(bool)>& bytes_of);

/// Builds the warm start of `trace` on `device` through `policy`, which must be a fresh
/// allocator over `device`:
///  1. every `trace.recorded.initial_segments` is taken at its recorded address with
///     `device.allocate_at` and given to `policy.adopt_segment`; when the policy uses
///     expandable segments, the expandable ones are instead mapped into the reservations of
///     `infer_reservations` (`device.reserve_at`, `policy.adopt_reservation`,
///     `policy.adopt_mapped`), and `device.set_reservation_plan` gives the window's new
///     reservations their recorded bases;
///  2. every `trace.live_before` block is placed at its recorded address with the size from
///     `infer_live_block_sizes` (`policy.place_block`);
///  3. `device.set_address_plan` makes the k-th new segment of a given size take the address
///     of the k-th recorded `segment_alloc` of that size (segments beyond the recorded ones,
///     or whose recorded range is taken, go to the lowest free address as usual).
/// `streams[i]` is the device stream of trace stream `i`; when empty, trace stream `i` is
/// `Stream{i}` (the default stream, then the streams `SimDevice::create_stream` hands out in
/// order). Throws `InvalidArgument` when the trace has no recorded state to start from, or a
/// live block has no recorded address or does not fit the recorded segments.
WarmStartResult apply_warm_start(const trace::Trace& trace, WarmStart& policy, SimDevice& device,
                                 const std::vector<Stream>& streams = {});

}  // namespace cistern::replay
