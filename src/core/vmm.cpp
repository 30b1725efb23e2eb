// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The virtual-memory engine: segments are reserved address ranges (64 MiB for the small pool,
// twice the device's size for the large one, more for a larger request) in which blocks are placed
// and cut by the same best fit as classic ones, whatever is mapped, and pack across granules, as
// in the single range per pool of PyTorch's expandable segments; physical memory is mapped into
// them as whole handles, only where a block is handed out. The driver maps a handle only whole, at
// offset 0, and unmaps only whole mappings (vmm-and-planning.md section 4), so a handle is the unit
// of everything here: created for a run of granules that blocks need, mapped there whole, unmapped
// and released whole once every granule it covers lies inside a cached free block.
//
// How large a handle is decides both costs. The driver's price is per mapping, not per byte - a
// cuMemSetAccess and a cuMemUnmap cost about 29 and 18 us for each mapping they cover, whatever
// its size - so few large handles are what make the engine cheaper than cudaMalloc. But a handle
// goes back only whole, so a large one under a small live block holds all its memory. The engine
// therefore sizes each handle by the room the device and the limit leave (plan()): far from the
// limit, as expandable segments map - the granules inside the request's block in page handles,
// and the last page, the granule shared with the next block included, mapped to its end - so
// that the next blocks cut from it need no call; nearer, the shared granule is a handle of its
// own, so that the rest can go back once the block is freed, and the extension follows the room
// on handles of its own, so that a block cut from it goes back whole (Note [The shared granule]);
// the closer to the limit, the smaller the largest handle (a 32nd of the room left), down to one
// granule, so that what a free block covers can be given back; and a block cut to end inside a
// handle made near the limit gives that handle back first, so that the rest of the free block
// is on handles of its own (Note [Fine cuts]). A handle never reaches past its page
// unless it lies inside the one block it was made for (Note [The page rule]), so a handle made
// while there was room pins, under a small live block, no more than expandable segments' page
// would.
//
// Placement never depends on what is mapped (but in the last resort, below, where the request
// would otherwise fail): a request takes the best fit, as classic segments and expandable
// segments do, and the miss path maps what it lacks. A pass that repeats an
// earlier one's requests then places every block where the earlier did, on the handles it left
// there: one large-pool range as large as twice the device holds all of a pool's blocks, so that
// a later pass does not find ranges the first had not had yet.
//
// Note [The page rule]. Whatever the sizes, the engine never holds more free memory that no
// reclaim can return than PyTorch's expandable segments would pin around the same blocks: the
// free bytes of the 2 MiB (small pool) or 20 MiB (large pool) pages, counted from a segment's
// base, that blocks in use touch. Every mapped handle
//   (a) lies inside one such page, or
//   (b) lies inside one block that is not free (allocated, pending or parked), or
//   (c) lies under free blocks only, so that a reclaim can return it whole.
// A handle under a block in use that is not (b) is (a), so the free bytes beside that block on
// it lie in a page the block touches. plan() keeps the rule for new handles: a handle reaching
// over several pages (kSpan) covers only granules lying entirely inside the request's block;
// everything else is cut at page boundaries. A freed block turns (b) into (c); before a request
// takes part of a free block that a (c) handle reaching over several pages lies in, that handle
// goes back (make_finer), so a large handle never ends up under a small block. check() verifies
// the rule for every handle, and tests/test_vmm_guarantee.cpp compares what empty_cache() and
// the out-of-memory path leave with what expandable segments' pages would hold.
//
// A cached free block keeps its handles, so a steady state makes no device calls. When a growth
// finds no room, handles lying entirely inside cached free blocks - of any pool - are unmapped
// (reclaim), once the work of their pool's stream has completed (one event per pool, queried
// first and waited for only if still running); those of a size the growth needs are mapped again
// where it needs them, the others released, and the growth is tried again. Where even the release
// of the whole cache leaves the best fit without room, the free block that lacks the fewest
// granules, the request at its start or at its end, is taken instead (last_resort()): an
// out-of-memory error means that no free stretch of the pool could be backed. Everything here
// runs under the global lock.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "backing.hpp"
#include "cistern/errors.hpp"
#include "device_call.hpp"
#include "handle_table.hpp"

namespace cistern::detail {

namespace {

constexpr std::uint64_t kNoPage = Segment::kNoPage;
constexpr std::uint64_t kSpan = Segment::kSpan;
constexpr std::uint64_t kFine = Segment::kFine;

/// The slot of the handle a mapped granule names.
std::uint32_t slot_of(std::uint64_t page) noexcept { return static_cast<std::uint32_t>(page); }

std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

/// The address space of a new expandable segment (range_size()): in the large pool twice the
/// device's size, within [kLargeRange, kLargestRange] (a segment keeps a word per granule); in the
/// small pool kSmallRange. Address space costs no memory.
constexpr std::size_t kSmallRange = 64 * MiB;
constexpr std::size_t kLargeRange = 1 * GiB;
constexpr std::size_t kLargestRange = 256 * GiB;

/// The pages of PyTorch's expandable segments (2 MiB in the small pool, 20 MiB in the large one):
/// the grid of the page rule (Note [The page rule]), from each segment's base.
constexpr std::size_t kSmallPage = 2 * MiB;
constexpr std::size_t kLargePage = 20 * MiB;

/// How handles are sized (plan()): a handle is at most the room left after it / kHandleDivisor;
/// near the limit a run goes in at most kMaxPieces handles. Chosen by replaying the shared
/// traces at their smallest capacities, at PyTorch's and at 80 GiB (docs/design.md).
constexpr std::size_t kHandleDivisor = 32;
constexpr std::size_t kMaxPieces = 6;
/// A handle is fine (Note [Fine cuts]) when made while the room the device and the limit leave is
/// less than kFineFactor times the memory the engine holds; a pool is crowded when its blocks in
/// use hold more than 1 / kCrowdedShare of what the engine can have (its memory and that room).
/// Both say "more than a third".
constexpr std::size_t kFineFactor = 2;
constexpr std::size_t kCrowdedShare = kFineFactor + 1;
/// With room, a growth extends over the free rest of its block by up to the room /
/// kExtensionDivisor and the pool's mapped memory / kGrowthDivisor (at most to the end of the page
/// it ends in).
constexpr std::size_t kExtensionDivisor = 1024;
constexpr std::size_t kGrowthDivisor = 8;
/// Far from the limit - the room left after a growth at least kFarFromLimit times the memory
/// reserved in all with it, and the pool not near the limit by its handle size - a growth maps as
/// expandable segments do: its last page to the end, the granule the next block shares with it
/// included (docs/design.md, "Far from the limit").
constexpr std::size_t kFarFromLimit = 8;

/// A run of granules [first, end) of one segment.
struct GranuleRun {
  std::size_t first;
  std::size_t end;
  std::size_t size() const noexcept { return end - first; }
  bool empty() const noexcept { return end <= first; }
};

/// A handle to create for granules [first, first + granules) of the segment being mapped; `fine`
/// when made near the limit (Note [Fine cuts]).
struct PlannedHandle {
  std::size_t first;
  std::size_t granules;
  bool fine = false;
};

/// What make_finer gave back before a cut: whether any handle went back (the request is then
/// mapped on handles of a page at most), and the end of the fine handle the request ends inside
/// (0: none), up to which the free granules after the request are mapped again.
struct Finer {
  bool gone = false;
  std::size_t refill = 0;
};

/// Granules [first, end) of one segment that a reclaim must leave mapped (those a block being
/// mapped needs).
struct Keep {
  const Segment* seg = nullptr;
  std::size_t first = 0;
  std::size_t end = 0;
};

/// A handle chosen to be unmapped and released: its slot, the pool (an index into the pool
/// table) whose segment maps it, and how long the free block over it has been cached - the
/// requests of its kind (small or large) the pool has served since (Block::gc_base).
struct Victim {
  std::size_t pool;
  std::uint32_t slot;
  std::uint64_t age;
};

class MappedHandles final : public Backing {
 public:
  explicit MappedHandles(const BackingContext& ctx) : Backing(ctx), g_(ctx.device.granularity()) {}

  // The best fit when the part the request takes is mapped and no handle under it must go back
  // first; else none, and the miss path maps what the best fit lacks (back()). Which block serves a
  // request never depends on what is mapped: a pass that repeats an earlier one's requests places
  // its blocks where the earlier did, on the handles it left there, and calls the device no more
  // (docs/design.md, "Placement").
  Block* cached_fit(StreamPool& pool, std::size_t size, bool small) override {
    Block* b = pool.find(size, small);
    if (b == nullptr || !mapped(*b, size, small)) return nullptr;
    return needs_finer(pool, *b, size, small) ? nullptr : b;
  }

  Growth grow(StreamPool& pool, std::size_t size, bool small) override {
    return back(pool, size, small, /*reclaim=*/false);
  }

  Growth reclaim_and_grow(StreamPool& pool, std::size_t size, bool small) override {
    return back(pool, size, small, /*reclaim=*/true);
  }

  Releases release_segment(StreamPool& pool, Block* b) override;
  Releases release_rest(bool asked) override;
  void trim() override;
  std::size_t collect(std::size_t bytes) override {
    return reclaim_locked(bytes, Keep{}, nullptr, Unmap::release);
  }
  Block* last_resort(StreamPool& pool, std::size_t size, bool small) override;
  void check(const std::vector<const Segment*>& segments) const override;

 private:
  void check_page_rule(const Segment& s) const;
  Growth back(StreamPool& pool, std::size_t size, bool small, bool reclaim);
  bool possible(std::size_t size) const noexcept;
  std::size_t used_part(const Block& b, std::size_t size, bool small) const noexcept {
    return ctx_.policy.should_split(b.size, size, small, b.segment->expandable) ? size : b.size;
  }
  bool mapped(const Block& b, std::size_t size, bool small) const noexcept {
    return b.segment->pages_mapped(b.addr, b.addr + used_part(b, size, small));
  }
  // The granule arithmetic: the granules of `seg` that bytes [lo, hi) touch, and those lying
  // entirely inside them.
  GranuleRun touched(const Segment& seg, std::uintptr_t lo, std::uintptr_t hi) const noexcept {
    return {(lo - seg.base) / g_, (hi - seg.base + g_ - 1) / g_};
  }
  GranuleRun inside(const Segment& seg, std::uintptr_t lo, std::uintptr_t hi) const noexcept {
    return {(lo - seg.base + g_ - 1) / g_, (hi - seg.base) / g_};
  }
  /// How many of the granules bytes [lo, hi) of `seg` touch are not mapped, counted up to
  /// `enough` at most.
  std::size_t missing(const Segment& seg, std::uintptr_t lo, std::uintptr_t hi,
                      std::size_t enough) const noexcept {
    const GranuleRun run = touched(seg, lo, hi);
    std::size_t n = 0;
    for (std::size_t i = run.first; i < run.end && n < enough; ++i) {
      n += seg.pages[i] == kNoPage ? 1 : 0;
    }
    return n;
  }
  /// The granules of one page of the page rule's grid in a pool, and in `seg`.
  std::size_t page_of(bool small) const noexcept {
    return std::max<std::size_t>(1, (small ? kSmallPage : kLargePage) / g_);
  }
  std::size_t page_granules(const Segment& seg) const noexcept { return page_of(!seg.large); }
  /// Whether granules [first, first + granules) of `seg` reach over more than one page.
  bool spans_pages(const Segment& seg, std::size_t first, std::size_t granules) const noexcept {
    const std::size_t page = page_granules(seg);
    return first / page != (first + granules - 1) / page;
  }
  std::vector<std::uint32_t> finer_under(const Block& b, std::uintptr_t hi) const;
  std::optional<std::uint32_t> fine_under(const Block& b, std::uintptr_t hi, bool any_handle) const;
  bool needs_finer(const StreamPool& pool, const Block& b, std::size_t size, bool small) const;
  Finer make_finer(StreamPool& pool, Block& b, std::uintptr_t hi);
  Block* new_segment(StreamPool& pool, std::size_t size, bool small);
  std::size_t range_size(std::size_t size, bool small) const noexcept;
  bool map_for(StreamPool& pool, Block& b, std::size_t size, bool small, bool reclaim);
  std::vector<PlannedHandle> plan(const Segment& seg, GranuleRun request, GranuleRun whole,
                                  std::size_t limit, bool small, std::size_t held, Finer finer);
  void cut(const Segment& seg, GranuleRun part, std::size_t piece,
           std::vector<PlannedHandle>& planned) const;
  std::size_t headroom();
  void set_crowded_from_room(std::size_t room);
  void set_crowded_from(std::size_t bytes);
  std::size_t unit_granules(bool small) const noexcept;
  std::size_t cap_granules(bool small) const noexcept;
  bool create(const std::vector<PlannedHandle>& planned, std::vector<std::uint32_t>& slots,
              StreamPool& pool, Keep keep, bool reclaim);
  bool create_or_reuse(const std::vector<PlannedHandle>& planned, std::vector<std::uint32_t>& slots,
                       StreamPool& pool, Keep keep, bool reclaim);
  bool map_planned(StreamPool& pool, Segment& seg, const std::vector<PlannedHandle>& planned,
                   const std::vector<std::uint32_t>& slots);
  void drop_unmapped_segments(const StreamPool* held);
  void discard(const std::vector<std::uint32_t>& slots);
  bool refused(Status status, DeviceOp op);

  // Reclaim: handles lying entirely inside cached free blocks.
  enum class Unmap : bool { release, reclaim };  // why: to give memory back, or to make room
  std::size_t reclaim(const StreamPool* held, std::size_t want, Keep keep);
  std::size_t reclaim_locked(std::size_t want, Keep keep, std::size_t* failures,
                             Unmap why = Unmap::reclaim);
  std::vector<Victim> free_handles(Keep keep) const;
  std::size_t unmap_and_release(StreamPool& pool, Segment& seg,
                                const std::vector<std::uint32_t>& slots, Unmap why);
  std::size_t release_slot(std::uint32_t slot);
  std::optional<std::uint32_t> take_spare(std::size_t granules);
  void release_spares();
  std::size_t release_unplaced();

  const std::size_t g_;          // the device's granularity: every handle is a multiple of it
  std::size_t reserved_va_ = 0;  // address space of the expandable segments
  HandleTable handles_;
  bool grown_ = false;  // a first growth succeeded: a refusal from now on is an error, no fallback
  // During one growth that reclaims: the granule counts of the handles it plans (a reclaimed
  // handle of one of these sizes is kept, unmapped, in spares_ to be mapped again instead of
  // released and created anew), and those kept handles. Both empty between requests.
  std::vector<std::size_t>* reuse_ = nullptr;
  std::vector<std::uint32_t> spares_;
  std::size_t failed_releases_ = 0;  // releases the device refused (their handles stay)
  std::string last_error_;           // why the most recent release failed
  std::string
      refusal_;  // how the device refused the engine at its first growth (back() returns it)
};

}  // namespace

std::unique_ptr<Backing> make_mapped_handles(const BackingContext& ctx) {
  return std::make_unique<MappedHandles>(ctx);
}

// --- choosing and backing a block -------------------------------------------------------------------

// Whether the device or the limit could ever back `size` (a request past them skips the search for
// memory - reserving address space, scanning every pool - and goes to the release and the error).
bool MappedHandles::possible(std::size_t size) const noexcept {
  const std::size_t bytes = round_up(size, g_);
  return (ctx_.reservation.device_total == 0 || bytes <= ctx_.reservation.device_total) &&
         bytes <= ctx_.reservation.allowed;
}

// The best fit (or a new segment) with handles mapped under the part the request takes; no block
// when the device or the limit has no room for them (with `reclaim`: even after giving back the
// handles under cached free blocks), or when the device refused the engine at its first growth
// (the refusal returned; every expandable segment released, so that classic segments take over).
Growth MappedHandles::back(StreamPool& pool, std::size_t size, bool small, bool reclaim) {
  if (!possible(size)) return {};
  Block* b = pool.find(size, small);
  if (b == nullptr) b = new_segment(pool, size, small);
  if (b == nullptr || !map_for(pool, *b, size, small, reclaim)) {
    if (refusal_.empty()) return {};
    drop_unmapped_segments(&pool);
    set_crowded_from(SIZE_MAX);  // classic segments from now on
    return {nullptr, std::exchange(refusal_, {})};
  }
  grown_ = true;
  return {b, {}};
}

// Before a fallback to classic segments: releases every expandable segment (none has a mapped
// granule, since no growth succeeded), so that no block of one is ever handed out unmapped.
void MappedHandles::drop_unmapped_segments(const StreamPool* held) {
  AllPoolsLock locks(ctx_.pools, held);
  for (const auto& pool : ctx_.pools.all()) {
    for (Segment* s = pool->segments(); s != nullptr;) {
      Segment* next = s->next;
      if (s->expandable && s->head->is_whole_segment() && s->head->is_free()) {
        (void)ctx_.device.release_reservation(reinterpret_cast<void*>(s->base), s->size);
        reserved_va_ -= s->size;
        delete pool->remove_whole_segment(s->head, /*count_as_freed=*/true);
      }
      s = next;
    }
  }
}

// The last resort (Backing::last_resort). The best fit is the smallest free block that holds the
// request, whatever is mapped there; once the whole cache has gone back, what stays mapped under
// free blocks lies at their ends, on handles that blocks in use share (as expandable segments'
// pages do). So a larger free block can need fewer new granules than the best fit: the request
// is placed at the start or at the end of the free block where the fewest are missing, and
// mapped there. Every free block of the pool that may serve it is looked at - a scan, paid only
// where an out-of-memory error was due.
Block* MappedHandles::last_resort(StreamPool& pool, std::size_t size, bool small) {
  if (!possible(size)) return nullptr;
  Block* best = nullptr;
  bool at_end = false;
  std::size_t fewest = SIZE_MAX;
  const auto consider = [&](Block* b, std::uintptr_t lo, std::size_t used, bool end) {
    const std::size_t n = missing(*b->segment, lo, lo + used, fewest);
    if (n < fewest) std::tie(fewest, best, at_end) = std::make_tuple(n, b, end);
  };
  std::as_const(pool).index(small).find_from(size, [&](Block* b) {
    if (b->size < size || !b->segment->expandable || !ctx_.policy.may_serve(b->size, size)) {
      return false;
    }
    const std::size_t used = used_part(*b, size, small);
    consider(b, b->addr, used, false);
    if (used < b->size) consider(b, b->addr + b->size - used, used, true);
    return fewest == 0;
  });
  if (best == nullptr) return nullptr;
  Block* b = at_end ? pool.split_top(best, size, small) : best;
  bool mapped = false;
  try {
    mapped = map_for(pool, *b, size, small, /*reclaim=*/true);
  } catch (...) {
    if (at_end) pool.rejoin(b, small);
    throw;
  }
  if (!mapped) {
    if (at_end) pool.rejoin(b, small);
    return nullptr;
  }
  ++ctx_.counters.oom_rescues;
  return b;
}

// --- giving a handle back before a block takes part of it ------------------------------------------------

// Note [Fine cuts]. The page rule bounds what a handle pins under a small live block by what
// expandable segments' page would; near the limit the engine does better. When a block is cut
// from a free block so that it ends inside a handle that goes on past the granule the block ends
// in and lies under that free block only, the handle goes back first (make_finer) if
//  * it is fine (kFine): made while the room left was less than kFineFactor times what the
//    engine held; or
//  * the pool is crowded: its blocks in use hold more than a third (1 / kCrowdedShare) of what
//    the engine can have - what it holds and the room the device and the limit leave, as of its
//    last growth (Reservation::crowded_from, StreamPool::crowded).
// The block's granules, and the rest of the handle after them, are mapped again on handles of
// their own (plan(): the block's last granule alone, then the rest), so that once the rest is free
// it can go back whatever the block does. Without this, a handle made for an earlier block and cut
// by a later one pins the free granules after the later one's end for as long as it lives: at the
// out-of-memory error of a training step on PyTorch's own min_capacity, 972 MiB of holes between
// live blocks stayed mapped that way; on random lifetimes, handles made early, with room, and cut
// later kept min_capacity up to 4% of peak_live higher (docs/design.md). Neither test reads the
// cache at the cut: fineness is fixed when a handle is made and kept with it, and the blocks in
// use at a request are the same from pass to pass. So a pass that repeats an earlier one, cutting
// where the earlier did on the handles the earlier left, chooses as the earlier did and makes no
// call there. Deciding from the room at the cut, a training step's second pass under pressure,
// which holds the first one's cache, cut the handles the first had made with room and paid calls
// at every such cut. The rest is mapped again at once, rather than left unmapped, so that the
// blocks the next pass cuts there find it mapped. With room - no handle made near the limit, and
// less than a third of the device in use - nothing is given back: a cold pass of the shared traces
// at 80 GiB makes the calls it made without fine cuts.

// The handles under the part [b.addr, hi) of the free block `b` that a request would take which
// must go back first (the page rule): those reaching over several pages (kSpan) that the part
// would not hold whole. Lying under free blocks only, such a handle lies inside `b`.
std::vector<std::uint32_t> MappedHandles::finer_under(const Block& b, std::uintptr_t hi) const {
  std::vector<std::uint32_t> found;
  const Segment& seg = *b.segment;
  const GranuleRun part = touched(seg, b.addr, hi);
  const GranuleRun whole_part = inside(seg, b.addr, hi);
  for (std::size_t i = seg.next_mapped(part.first, part.end); i < part.end;
       i = seg.next_mapped(i, part.end)) {
    const std::uint64_t page = seg.pages[i];
    const HandleSlot& h = handles_[slot_of(page)];
    const std::size_t h_end = h.first + h.granules;
    if ((page & kSpan) != 0 && (h.first < whole_part.first || h_end > whole_part.end)) {
      found.push_back(slot_of(page));
    }
    i = h_end;
  }
  return found;
}

// The fine handle (kFine; any handle with `any_handle`, the pool crowded) that a block cut from the
// free block `b` to end at `hi` would end inside, when it goes on past the granule `hi` ends in and
// lies under `b` only, so that it can go back (Note [Fine cuts]).
std::optional<std::uint32_t> MappedHandles::fine_under(const Block& b, std::uintptr_t hi,
                                                       bool any_handle) const {
  const Segment& seg = *b.segment;
  const std::size_t i = touched(seg, b.addr, hi).end - 1;
  const std::uint64_t page = seg.pages[i];
  if (page == kNoPage || ((page & kFine) == 0 && !any_handle)) return std::nullopt;
  const HandleSlot& h = handles_[slot_of(page)];
  const GranuleRun under = inside(seg, b.addr, b.addr + b.size);
  if (h.first + h.granules <= i + 1 || h.first < under.first || h.first + h.granules > under.end) {
    return std::nullopt;
  }
  return slot_of(page);
}

// Whether serving `size` from the mapped free block `b` needs a handle under it given back first
// (finer_under, fine_under): the hot path's test (Segment::cut_needs_backing), on the granule the
// part ends in.
bool MappedHandles::needs_finer(const StreamPool& pool, const Block& b, std::size_t size,
                                bool small) const {
  const Segment& seg = *b.segment;
  const std::uintptr_t hi = b.addr + used_part(b, size, small);
  return seg.split_needs_backing(b.addr, hi, b.addr + b.size, pool.crowded());
}

// Before the part [b.addr, hi) of the free block `b` is handed out: unmaps and releases the
// handles finer_under and fine_under name (after the work of the pool's stream), so that the
// request gets handles of its own. This is what keeps the page rule when a block is cut from a
// free one that a handle reaching over several pages lies under, and what a fine cut gives back
// (Note [Fine cuts]). Returns whether one went back: the request is then mapped on handles of a
// page at most (plan()), as expandable segments would map it, so that memory once cut up stays in
// pages and a large handle costs at most one creation and one release more than expandable
// segments' pages over its life; and the end of the fine handle, up to which the granules after
// the request are mapped again.
Finer MappedHandles::make_finer(StreamPool& pool, Block& b, std::uintptr_t hi) {
  std::vector<std::uint32_t> gone = finer_under(b, hi);
  Finer finer;
  if (!gone.empty()) ++ctx_.counters.handle_splits;
  if (const std::optional<std::uint32_t> fine = fine_under(b, hi, pool.crowded())) {
    finer.refill = handles_[*fine].first + handles_[*fine].granules;
    // The handle the part ends inside lies after every other one under the part.
    if (gone.empty() || gone.back() != *fine) gone.push_back(*fine);
    ++ctx_.counters.fine_cuts;
  }
  if (gone.empty()) return finer;
  wait_for_stream(ctx_, pool.stream);
  unmap_and_release(pool, *b.segment, gone, Unmap::reclaim);
  finer.gone = true;
  return finer;
}

// The address space a new expandable segment for `size` reserves. In the large pool, one range
// holds every block of the pool and the unmapped holes between them, as the single range of
// PyTorch's expandable segments (9/8 of the device) does: best fit packs them all together, and a
// pass that repeats an earlier one places its blocks where that one did, on the handles it left
// there. With 1 GiB ranges a later pass found ranges the first had not had yet, placed its blocks
// there and had to map them anew; with ranges of the device's size or 9/8 of it, near the limit
// the blocks and the unmapped holes between them did not fit one range either (docs/design.md,
// "Placement", has the device calls of each). A request larger than the range gets one of its
// own.
std::size_t MappedHandles::range_size(std::size_t size, bool small) const noexcept {
  const std::size_t least = ctx_.policy.segment_size(size);
  if (small) return round_up(std::max(least, kSmallRange), g_);
  const std::size_t range =
      std::clamp(2 * ctx_.reservation.device_total, kLargeRange, kLargestRange);
  return round_up(std::max(least, range), g_);
}

// A new expandable segment (address space only): range_size(), or, while the device has not that
// much address space left, half as much, down to the request's own segment size; nullptr when it
// has not even that or refused the engine at its first growth.
Block* MappedHandles::new_segment(StreamPool& pool, std::size_t size, bool small) {
  const std::size_t least = round_up(ctx_.policy.segment_size(size), g_);
  std::size_t bytes = range_size(size, small);
  void* va = nullptr;
  Status status = ctx_.device.reserve(bytes, 0, &va);
  while (status == Status::out_of_memory && bytes > least) {
    bytes = std::max(least, round_up(bytes / 2, g_));
    status = ctx_.device.reserve(bytes, 0, &va);
  }
  if (status == Status::out_of_memory || refused(status, DeviceOp::reserve)) return nullptr;
  check_device(ctx_.device, status, DeviceOp::reserve);
  reserved_va_ += bytes;
  return pool.add_new_segment(reinterpret_cast<std::uintptr_t>(va), bytes, !small, g_);
}

// Before the engine's first successful growth, a call the device does not support (`not_supported`:
// CUDA_ERROR_NOT_SUPPORTED from cuMemCreate or cuMemMap under MIG, vGPU or an old driver) means it
// cannot run the engine: back() reports that to the allocator, which falls back to classic
// segments once. Any other failure, and any failure after a first growth, is an error of the
// request.
bool MappedHandles::refused(Status status, DeviceOp op) {
  if (grown_ || status != Status::not_supported) return false;
  refusal_ =
      fmt::format("{} failed: {}: {}", to_string(op), to_string(status), ctx_.device.last_error());
  return true;
}

// `b` free and indexed. First gives back the handles under the part of `b` the request takes
// that the page rule wants gone (make_finer); then maps handles under every
// unmapped granule of that part - and, with room to spare, over the free rest of its last page
// (plan()), so that the next blocks cut from it make no call. False (nothing mapped) when no
// room can be had, or when the device refused the engine at its first growth; a failing map
// undoes this call's handles and throws.
bool MappedHandles::map_for(StreamPool& pool, Block& b, std::size_t size, bool small,
                            bool reclaim) {
  Segment& seg = *b.segment;
  const std::uintptr_t hi = b.addr + used_part(b, size, small);
  const Finer finer = make_finer(pool, b, hi);
  if (seg.unmapped_pages == 0) return true;
  const std::size_t limit = touched(seg, b.addr, b.addr + b.size).end;
  const auto held = static_cast<std::size_t>(pool.stats().current(
      StatKind::reserved_bytes, small ? StatPool::small_pool : StatPool::large_pool));
  const GranuleRun request = touched(seg, b.addr, hi);
  const std::vector<PlannedHandle> planned =
      plan(seg, request, inside(seg, b.addr, hi), limit, small, held, finer);
  if (planned.empty()) return true;
  std::vector<std::uint32_t> slots;
  if (!create(planned, slots, pool, Keep{&seg, request.first, request.end}, reclaim)) return false;
  return map_planned(pool, seg, planned, slots);
}

// Note [The shared granule]. A handle that two blocks share holds the memory of the one freed
// first for as long as the other lives: reclaim returns only handles lying under free blocks. Far
// from the limit a growth maps as expandable segments do, its last page to the end, so that the
// next blocks cut after it need no call; nearer, the engine keeps what a block shares with the
// next one cut after it to the one granule both touch. The block's other granules, that granule,
// and the extension mapped after it for the next blocks are separate handles. With the extension
// on the same handle as the block's end (as before this note), a block cut from the extension and
// freed while this block lived stayed mapped up to the end of the page: on a training step's
// optimizer state, cut from freed activations, that made min_capacity 0.4% of peak_live larger
// than PyTorch's own segments need (docs/design.md). The price is one handle more per growth near
// the limit, and none in a steady state, whose blocks are cut where the handles already are.

// The handles that back the unmapped granules of `request` in `seg` - the granules the part of a
// free block a request takes touches, `whole` those lying entirely inside it, `limit` the end of
// the block - sized by the room the device and the limit leave after them (`after`):
//  * the page rule (Note [The page rule]): granules of `whole` may share one handle whatever
//    pages it reaches over (it lies inside the request's block); every other handle lies inside
//    one page of the grid - as do all of them when max_handle_size is at most a page, or when
//    `pages_only` (the request is cut from where make_finer gave such a handle back);
//  * a handle is at most after / kHandleDivisor (one granule at least, max_handle_size at most),
//    so that the closer the engine is to the limit, the closer its handles follow the blocks, and
//    whatever a block leaves free can go back;
//  * near the limit a run is cut into at most kMaxPieces handles (of at most max_handle_size), so
//    that a block does not cost a mapping per granule;
//  * far from the limit (`after` at least kFarFromLimit times the memory reserved in all once
//    the request is mapped, and the pool not near the limit by its handle size), the last run
//    extends over the unmapped granules of the block to the end of the page it ends in, as
//    expandable segments map whole pages: the next blocks cut from the block need no call, and no
//    handle reaches past its page;
//  * nearer, the last granule of a request that ends inside it, which the next block cut from
//    the rest will share, is a handle of its own, so that when this block is freed its other
//    handles can go back; and with room the last run extends over the unmapped granules of the
//    block that follow it, up to the smaller of after / kExtensionDivisor and `held` (the pool's
//    mapped memory) / kGrowthDivisor, never past the end of its page, in handles of their own
//    (Note [The shared granule]): a pool's growths get larger as it does. A request that ends on
//    a handle of its own is not extended there: the next growth maps that page.
std::vector<PlannedHandle> MappedHandles::plan(const Segment& seg, GranuleRun request,
                                               GranuleRun whole, std::size_t limit, bool small,
                                               std::size_t held, Finer finer) {
  std::vector<GranuleRun> runs;
  std::size_t need = 0;
  for (std::size_t i = request.first; i < request.end;) {
    if (seg.pages[i] != kNoPage) {
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    while (j < request.end && seg.pages[j] == kNoPage) ++j;
    runs.push_back({i, j});
    need += j - i;
    i = j;
  }
  std::vector<PlannedHandle> planned;
  if (runs.empty()) return planned;
  const std::size_t unit = unit_granules(small);
  const std::size_t room = headroom();
  set_crowded_from_room(room);
  const std::size_t after = room > need * g_ ? room - need * g_ : 0;
  const std::size_t largest =
      std::min(cap_granules(small), std::max<std::size_t>(1, after / (kHandleDivisor * g_)));
  const bool far = largest >= unit && after / kFarFromLimit >= ctx_.reservation.bytes() + need * g_;
  const std::size_t page = page_granules(seg);
  const bool whole_spans = cap_granules(small) > page && !finer.gone;
  const auto inner = [&](const GranuleRun& r) {  // the part of a run that may be one handle
    const GranuleRun in{std::max(r.first, whole.first), std::min(r.end, whole.end)};
    const bool spans = !in.empty() && whole_spans && spans_pages(seg, in.first, in.size());
    return spans ? in : GranuleRun{r.end, r.end};
  };
  // The extension; nearer the limit, not past a request that ends on a handle of its own: the
  // next block's growth will map that page whole. Far from it, to the end of the page.
  GranuleRun& tail = runs.back();
  const GranuleRun tail_inner = inner(tail);
  const bool ends_on_own_handle = !tail_inner.empty() && tail_inner.end == request.end;
  if (largest >= unit && tail.end == request.end && (far || !ends_on_own_handle)) {
    const std::size_t spread = std::clamp<std::size_t>(
        std::min(after / kExtensionDivisor, held / kGrowthDivisor) / g_, 1, page);
    const std::size_t page_end = ((request.end - 1) / page + 1) * page;
    const std::size_t reach =
        far ? page_end : tail.first + std::max(std::min(spread, largest), tail.size());
    while (tail.end < std::min({limit, page_end, reach}) && seg.pages[tail.end] == kNoPage) {
      ++tail.end;
    }
  }
  // A fine cut gave back the handle the request ends inside: the granules of it after the request
  // are mapped again, on handles of their own (Note [Fine cuts]).
  if (finer.refill > tail.end) {
    while (tail.end < std::min(limit, finer.refill) && seg.pages[tail.end] == kNoPage) ++tail.end;
  }
  // Nearer the limit, the last granule of a request that ends inside it goes in a handle of its
  // own, and the extension after it in handles of their own: the next block cut from the rest of
  // the block shares that granule, and a handle that reached over it would stay whole under that
  // block after this one is freed - or, holding the extension, under this one after that block is
  // freed (Note [The shared granule]).
  const bool alone_last = !far && whole.end < request.end;
  for (const GranuleRun& r : runs) {
    const std::size_t piece =
        std::min(cap_granules(small), std::max(largest, (r.size() + kMaxPieces - 1) / kMaxPieces));
    std::size_t i = r.first;
    if (const GranuleRun in = inner(r); !in.empty()) {
      cut(seg, {i, in.first}, piece, planned);
      for (i = in.first; i < in.end; i += std::min(cap_granules(small), in.end - i)) {
        planned.push_back({i, std::min(cap_granules(small), in.end - i)});
      }
    }
    if (!far && r.first < request.end && request.end <= r.end) {  // the run the request ends in
      if (alone_last && request.end - 1 > i) {
        cut(seg, {i, request.end - 1}, piece, planned);
        i = request.end - 1;
      }
      cut(seg, {i, request.end}, piece, planned);
      i = request.end;  // the extension, if any, after it
    }
    cut(seg, {i, r.end}, piece, planned);
  }
  if (room < kFineFactor * ctx_.reservation.bytes()) {
    for (PlannedHandle& p : planned) p.fine = true;
  }
  return planned;
}

// Appends handles for `part` to `planned`: cut at the page rule's page boundaries, each piece
// into handles of at most `piece` granules.
void MappedHandles::cut(const Segment& seg, GranuleRun part, std::size_t piece,
                        std::vector<PlannedHandle>& planned) const {
  const std::size_t page = page_granules(seg);
  for (std::size_t i = part.first; i < part.end;) {
    const std::size_t page_end = std::min(part.end, (i / page + 1) * page);
    const std::size_t n = std::min(piece, page_end - i);
    planned.push_back({i, n});
    i += n;
  }
}

// The pool's handle size in granules: the least a growth with room maps (small_handle_size,
// large_handle_size).
std::size_t MappedHandles::unit_granules(bool small) const noexcept {
  const std::size_t bytes = small ? ctx_.config.small_handle_size : ctx_.config.large_handle_size;
  return std::max<std::size_t>(1, round_up(bytes, g_) / g_);
}

// The largest handle the options allow, in granules: max_handle_size, or with a release
// threshold the pool's handle size (memory goes back in those steps), else a page of the page
// rule's grid (docs/design.md, "Why pages": larger handles inside blocks cost calls in later
// passes, where blocks are cut differently).
std::size_t MappedHandles::cap_granules(bool small) const noexcept {
  if (ctx_.config.max_handle_size != 0) {
    return std::max<std::size_t>(1, round_up(ctx_.config.max_handle_size, g_) / g_);
  }
  if (ctx_.config.release_threshold != SIZE_MAX) return unit_granules(small);
  return page_of(small);
}

// What the device and the limit have left for new handles (cudaMemGetInfo's free memory, which
// other processes' use lowers too).
std::size_t MappedHandles::headroom() {
  std::size_t room = SIZE_MAX;
  if (ctx_.reservation.allowed != SIZE_MAX) {
    room = ctx_.reservation.allowed > ctx_.reservation.bytes()
               ? ctx_.reservation.allowed - ctx_.reservation.bytes()
               : 0;
  }
  MemoryInfo info;
  if (ctx_.device.memory_info(&info) == Status::ok) room = std::min(room, info.free);
  return room;
}

// At a growth, from the `room` it found (headroom()): a pool is crowded once its blocks in use
// hold more than 1 / kCrowdedShare of what the engine can have - what it holds and that room.
void MappedHandles::set_crowded_from_room(std::size_t room) {
  const std::size_t can_have =
      room == SIZE_MAX ? SIZE_MAX : room + std::min(ctx_.reservation.bytes(), SIZE_MAX - room);
  set_crowded_from(can_have / kCrowdedShare);
}

// Sets the pools' crowding threshold (Reservation::crowded_from) where it changed. Global lock
// held.
void MappedHandles::set_crowded_from(std::size_t bytes) {
  if (bytes == ctx_.reservation.crowded_from.load(std::memory_order_relaxed)) return;
  ctx_.reservation.crowded_from.store(bytes, std::memory_order_relaxed);
  for (const auto& pool : ctx_.pools.all()) pool->set_crowded_from(bytes);
}

// Creates the planned handles (slots in `slots`, in order, not yet mapped). When the device or
// the limit has no room for them and `reclaim` is set, handles under cached free blocks of any
// pool are unmapped first (never those under `keep`, the granules the request needs) - those of
// a planned size to be mapped again here, the others released - and all of them once more if a
// creation still fails. False, with every handle of this call released, when there is no room.
bool MappedHandles::create(const std::vector<PlannedHandle>& planned,
                           std::vector<std::uint32_t>& slots, StreamPool& pool, Keep keep,
                           bool reclaim) {
  std::size_t total = 0;
  std::vector<std::size_t> sizes;
  for (const PlannedHandle& p : planned) {
    total += p.granules * g_;
    sizes.push_back(p.granules);
  }
  const std::size_t room = headroom();
  if (room < total) {
    // A creation the device would refuse costs as much as one it grants: ask it first.
    if (!reclaim) return false;
    reuse_ = &sizes;  // handles of the planned sizes are kept to be mapped again
    try {
      this->reclaim(&pool, total - room, keep);
    } catch (...) {
      reuse_ = nullptr;
      release_spares();
      throw;
    }
    reuse_ = nullptr;
  }
  bool ok = false;
  try {
    ok = create_or_reuse(planned, slots, pool, keep, reclaim);
  } catch (...) {
    release_spares();
    throw;
  }
  release_spares();
  return ok;
}

// create's loop: each planned handle from the handles this growth's reclaim kept, else created.
bool MappedHandles::create_or_reuse(const std::vector<PlannedHandle>& planned,
                                    std::vector<std::uint32_t>& slots, StreamPool& pool, Keep keep,
                                    bool reclaim) {
  bool reclaimed_all = !reclaim;
  for (const PlannedHandle& p : planned) {
    if (const std::optional<std::uint32_t> spare = take_spare(p.granules)) {
      slots.push_back(*spare);
      continue;
    }
    const std::size_t bytes = p.granules * g_;
    for (;;) {
      Status status = Status::out_of_memory;
      PhysicalHandle handle;
      if (!ctx_.reservation.exceeds_limit(bytes))
        status = ctx_.device.create_physical(bytes, &handle);
      if (status == Status::ok) {
        slots.push_back(handles_.add(handle, p.granules));
        ctx_.reservation.add(bytes);
        ++ctx_.counters.handles_created;
        ++ctx_.counters.device_alloc;
        break;
      }
      if (status == Status::out_of_memory && !spares_.empty()) {
        release_spares();  // kept for sizes that turned out not to come: room instead
        continue;
      }
      if (status == Status::out_of_memory && !reclaimed_all) {
        reclaimed_all = true;
        if (this->reclaim(&pool, SIZE_MAX, keep) != 0) continue;
      }
      const std::string what = ctx_.device.last_error();
      discard(slots);
      if (status == Status::out_of_memory || refused(status, DeviceOp::create_physical)) {
        return false;
      }
      throw DeviceError(
          to_string(DeviceOp::create_physical),
          fmt::format("cistern: device {}: create_physical({}): {}: {}", ctx_.device.index(),
                      format_bytes(bytes), to_string(status), what));
    }
  }
  return true;
}

// Releases handles created by this call and never mapped.
void MappedHandles::discard(const std::vector<std::uint32_t>& slots) {
  for (const std::uint32_t slot : slots) release_slot(slot);
}

// Maps the created handles, each run of adjacent ones in one map_run (a cuMemMap per handle, one
// cuMemSetAccess over the run), recorded as one segment_map of the run as PyTorch records the
// growth of an expandable segment. On a failure the runs this call mapped are unmapped and every
// handle it created is released; then a refusal of the engine at its first growth returns false
// (refusal_ says why) and any other failure throws DeviceError.
bool MappedHandles::map_planned(StreamPool& pool, Segment& seg,
                                const std::vector<PlannedHandle>& planned,
                                const std::vector<std::uint32_t>& slots) {
  std::vector<PhysicalHandle> run;
  for (std::size_t i = 0; i < planned.size();) {
    std::size_t j = i + 1;
    while (j < planned.size() &&
           planned[j].first == planned[j - 1].first + planned[j - 1].granules) {
      ++j;
    }
    run.clear();
    for (std::size_t k = i; k < j; ++k) run.push_back(handles_[slots[k]].handle);
    const std::size_t start = planned[i].first;
    const std::size_t end = planned[j - 1].first + planned[j - 1].granules;
    const std::uintptr_t va = seg.base + start * g_;
    const Status status = ctx_.device.map_run(reinterpret_cast<void*>(va), run.data(), run.size());
    if (status != Status::ok) {
      const std::string what = ctx_.device.last_error();
      // The runs mapped before this one were never handed out: nothing ran on them.
      const std::vector<std::uint32_t> placed(slots.begin(), slots.begin() + static_cast<long>(i));
      if (!placed.empty()) unmap_and_release(pool, seg, placed, Unmap::reclaim);
      discard({slots.begin() + static_cast<long>(i), slots.end()});
      if (refused(status, DeviceOp::map)) return false;
      throw DeviceError(to_string(DeviceOp::map),
                        fmt::format("cistern: device {}: map_run({:#x}, {} handles): {}: {}",
                                    ctx_.device.index(), va, run.size(), to_string(status), what));
    }
    for (std::size_t k = i; k < j; ++k) {
      handles_.place(slots[k], &seg, planned[k].first);
      const bool span = spans_pages(seg, planned[k].first, planned[k].granules);
      seg.spans += span ? 1 : 0;
      seg.fines += planned[k].fine ? 1 : 0;
      const std::uint64_t page = slots[k] | (span ? kSpan : 0) | (planned[k].fine ? kFine : 0);
      for (std::size_t p = planned[k].first; p < planned[k].first + planned[k].granules; ++p) {
        seg.set_page(p, page);
      }
    }
    seg.unmapped_pages -= end - start;
    seg.update_mapped_end();
    const std::size_t bytes = (end - start) * g_;
    pool.count_mapped(!seg.large, static_cast<std::int64_t>(bytes));
    ctx_.counters.pages_mapped += static_cast<std::int64_t>(end - start);
    ctx_.history.record(HistoryEntry::Action::segment_map, va, bytes, pool.stream);
    i = j;
  }
  return true;
}

// --- reclaim: handles under cached free blocks ---------------------------------------------------------

// Every handle lying entirely inside a cached free block, of any pool, except those over `keep`.
// All pool locks held.
std::vector<Victim> MappedHandles::free_handles(Keep keep) const {
  std::vector<Victim> found;
  const auto& pools = ctx_.pools.all();
  for (std::size_t p = 0; p < pools.size(); ++p) {
    for (const Segment* seg = pools[p]->segments(); seg != nullptr; seg = seg->next) {
      if (!seg->expandable || seg->unmapped_pages == seg->pages.size()) continue;
      for (const Block* b = seg->head; b != nullptr; b = b->next) {
        if (!b->is_free()) continue;
        const auto [first, end] = inside(*seg, b->addr, b->addr + b->size);
        for (std::size_t i = seg->next_mapped(first, end); i < end; i = seg->next_mapped(i, end)) {
          const std::uint32_t slot = slot_of(seg->pages[i]);
          const HandleSlot& h = handles_[slot];
          const bool kept =
              seg == keep.seg && h.first < keep.end && keep.first < h.first + h.granules;
          if (h.first >= first && h.first + h.granules <= end && !kept) {
            found.push_back({p, slot, pools[p]->lookups(!seg->large) - b->gc_base});
          }
          i = h.first + h.granules;
        }
      }
    }
  }
  return found;
}

// Unmaps and releases handles under cached free blocks until `want` bytes have gone back (all
// of them for SIZE_MAX), never those over `keep`; returns the bytes released. `held`: the pool
// whose lock the caller holds (nullptr: none).
std::size_t MappedHandles::reclaim(const StreamPool* held, std::size_t want, Keep keep) {
  AllPoolsLock locks(ctx_.pools, held);
  for (const auto& pool : ctx_.pools.all()) {
    if (pool.get() != held) pool->flush_parked();  // the held pool's were flushed by its caller
  }
  return reclaim_locked(want, keep, nullptr);
}

// reclaim with every pool lock held. Which handles go: the smallest one that covers `want` alone,
// else the largest first until they do - the fewest calls, and the large cached blocks (which
// serve only the rarer large requests) before the small ones; among handles of one size, the one
// whose free block has been cached longest first (least recently used, as a cache evicts: in a
// training step the blocks the backward pass frees first are those the next forward pass asks
// for last), and of one free block its top first (a request is cut from a free block's start;
// docs/design.md, "Which handles a reclaim takes"). Each pool whose handles go has its stream's
// work waited for first (once); adjacent handles of one segment go in one unmap.
// `failures`: where to count releases the device refused (their handles stay, unplaced, and count
// as reserved until a later release succeeds); nullptr: not counted.
std::size_t MappedHandles::reclaim_locked(std::size_t want, Keep keep, std::size_t* failures,
                                          Unmap why) {
  std::vector<Victim> victims = free_handles(keep);
  const auto bytes_of = [&](const Victim& v) { return handles_[v.slot].granules * g_; };
  const auto top_of = [&](const Victim& v) {
    const HandleSlot& h = handles_[v.slot];
    return h.segment->base + (h.first + h.granules) * g_;
  };
  if (want != SIZE_MAX) {
    std::sort(victims.begin(), victims.end(), [&](const Victim& x, const Victim& y) {
      if (bytes_of(x) != bytes_of(y)) return bytes_of(x) > bytes_of(y);
      if (x.age != y.age) return x.age > y.age;
      return top_of(x) > top_of(y);
    });
    // The smallest size that covers `want` alone, and of that size the longest cached handle.
    const auto smallest = std::find_if(victims.rbegin(), victims.rend(),
                                       [&](const Victim& v) { return bytes_of(v) >= want; });
    if (smallest != victims.rend()) {
      const std::size_t size = bytes_of(*smallest);
      victims = {*std::find_if(victims.begin(), victims.end(),
                               [&](const Victim& v) { return bytes_of(v) == size; })};
    } else {
      std::size_t total = 0;
      std::size_t n = 0;
      while (n < victims.size() && total < want) total += bytes_of(victims[n++]);
      victims.resize(n);
    }
  }
  // Grouped by pool (one wait each), then by segment and address (adjacent handles, one unmap).
  std::sort(victims.begin(), victims.end(), [&](const Victim& x, const Victim& y) {
    const HandleSlot& hx = handles_[x.slot];
    const HandleSlot& hy = handles_[y.slot];
    if (x.pool != y.pool) return x.pool < y.pool;
    if (hx.segment != hy.segment) return hx.segment->base < hy.segment->base;
    return hx.first < hy.first;
  });
  std::size_t released = 0;
  const std::size_t failed_before = failed_releases_;
  for (std::size_t i = 0; i < victims.size();) {
    StreamPool& pool = *ctx_.pools.all()[victims[i].pool];
    wait_for_stream(ctx_, pool.stream);
    std::size_t j = i;
    while (j < victims.size() && victims[j].pool == victims[i].pool) {
      Segment& seg = *handles_[victims[j].slot].segment;
      std::vector<std::uint32_t> group;
      while (j < victims.size() && victims[j].pool == victims[i].pool &&
             handles_[victims[j].slot].segment == &seg) {
        group.push_back(victims[j++].slot);
      }
      released += unmap_and_release(pool, seg, group, why);
    }
    i = j;
  }
  if (failures != nullptr) *failures += failed_releases_ - failed_before;
  ctx_.counters.pages_reclaimed += static_cast<std::int64_t>(released / g_);
  return released;
}

// Lock of `pool` held; `slots` are handles mapped in `seg`, in address order, whose users' work
// has completed. Unmaps each run of adjacent ones in one call (a cuMemUnmap may cover several
// whole mappings) - recorded as one segment_unmap, as PyTorch records the unmap of several pages
// of an expandable segment - and releases them. Returns the bytes released; a release the device
// refuses leaves its handle unplaced (still reserved) for a later try. An unmap that fails throws
// DeviceError with that run still mapped.
std::size_t MappedHandles::unmap_and_release(StreamPool& pool, Segment& seg,
                                             const std::vector<std::uint32_t>& slots, Unmap why) {
  std::size_t released = 0;
  for (std::size_t i = 0; i < slots.size();) {
    std::size_t j = i + 1;
    while (j < slots.size() && handles_[slots[j]].first ==
                                   handles_[slots[j - 1]].first + handles_[slots[j - 1]].granules) {
      ++j;
    }
    const std::size_t start = handles_[slots[i]].first;
    const std::size_t end = handles_[slots[j - 1]].first + handles_[slots[j - 1]].granules;
    const std::uintptr_t va = seg.base + start * g_;
    const std::size_t bytes = (end - start) * g_;
    check_device(ctx_.device, ctx_.device.unmap(reinterpret_cast<void*>(va), bytes),
                 DeviceOp::unmap);
    for (std::size_t k = i; k < j; ++k) {
      seg.fines -= (seg.pages[handles_[slots[k]].first] & kFine) != 0 ? 1 : 0;
    }
    for (std::size_t p = start; p < end; ++p) seg.set_page(p, kNoPage);
    seg.unmapped_pages += end - start;
    seg.mapped_end = std::min(seg.mapped_end, va);
    pool.count_mapped(!seg.large, -static_cast<std::int64_t>(bytes));
    ctx_.counters.pages_unmapped += static_cast<std::int64_t>(end - start);
    ctx_.history.record(HistoryEntry::Action::segment_unmap, va, bytes, pool.stream,
                        why == Unmap::reclaim);
    for (std::size_t k = i; k < j; ++k) {
      seg.spans -= spans_pages(seg, handles_[slots[k]].first, handles_[slots[k]].granules) ? 1 : 0;
      handles_.unplace(slots[k]);
      const std::size_t granules = handles_[slots[k]].granules;
      const auto wanted = reuse_ == nullptr ? std::vector<std::size_t>::iterator{}
                                            : std::find(reuse_->begin(), reuse_->end(), granules);
      if (reuse_ != nullptr && wanted != reuse_->end()) {
        reuse_->erase(wanted);
        spares_.push_back(slots[k]);  // mapped again by the growth that reclaimed it
        released += granules * g_;
        continue;
      }
      released += release_slot(slots[k]);
    }
    i = j;
  }
  return released;
}

// A handle of exactly `granules` kept by this growth's reclaim, or none.
std::optional<std::uint32_t> MappedHandles::take_spare(std::size_t granules) {
  for (auto it = spares_.begin(); it != spares_.end(); ++it) {
    if (handles_[*it].granules != granules) continue;
    const std::uint32_t slot = *it;
    spares_.erase(it);
    return slot;
  }
  return std::nullopt;
}

// Releases the handles this growth's reclaim kept and did not map again.
void MappedHandles::release_spares() {
  for (const std::uint32_t slot : spares_) release_slot(slot);
  spares_.clear();
}

// Releases an unmapped handle; returns its bytes, or 0 when the device refused (the handle stays,
// unplaced, and the reason is kept in last_error_).
std::size_t MappedHandles::release_slot(std::uint32_t slot) {
  const HandleSlot& h = handles_[slot];
  const std::size_t bytes = h.granules * g_;
  const Status status = ctx_.device.release_physical(h.handle);
  if (status != Status::ok) {
    last_error_ = fmt::format("{}: {}", to_string(status), ctx_.device.last_error());
    ++failed_releases_;
    return 0;
  }
  handles_.remove(slot);
  ctx_.reservation.sub(bytes);
  ++ctx_.counters.handles_released;
  ++ctx_.counters.device_free;
  return bytes;
}

// Retries the release of every handle whose release failed before; returns how many still fail.
std::size_t MappedHandles::release_unplaced() {
  std::size_t failures = 0;
  for (std::uint32_t slot = 0; slot < handles_.slots().size(); ++slot) {
    const HandleSlot& h = handles_[slot];
    if (h.live && h.segment == nullptr && release_slot(slot) == 0) ++failures;
  }
  return failures;
}

// --- giving memory back -----------------------------------------------------------------------------------

// Lock of `pool` held; `b` a whole free expandable segment. Unmaps and releases its handles (after
// its stream's work) and releases the address range; on a failure the segment stays. A handle
// whose release the device refuses stays unplaced (still reserved) for release_rest to retry.
Releases MappedHandles::release_segment(StreamPool& pool, Block* b) {
  Segment& seg = *b->segment;
  try {
    if (seg.unmapped_pages != seg.pages.size()) {
      wait_for_stream(ctx_, pool.stream);
      std::vector<std::uint32_t> slots;
      for (std::size_t i = seg.next_mapped(0, seg.pages.size()); i < seg.pages.size();
           i = seg.next_mapped(i, seg.pages.size())) {
        slots.push_back(slot_of(seg.pages[i]));
        i = handles_[slots.back()].first + handles_[slots.back()].granules;
      }
      unmap_and_release(pool, seg, slots, Unmap::release);
    }
  } catch (const DeviceError& e) {
    return Releases::failed(e.what());
  }
  const Status status =
      ctx_.device.release_reservation(reinterpret_cast<void*>(seg.base), seg.size);
  if (status != Status::ok) {
    return Releases::failed(fmt::format("{}: {}", to_string(status), ctx_.device.last_error()));
  }
  reserved_va_ -= seg.size;
  delete pool.remove_whole_segment(b, /*count_as_freed=*/true);
  return {};
}

// All pool locks held (release_cache): every handle under a cached free block of the segments
// that stay, then every handle left unplaced by an earlier failed release.
Releases MappedHandles::release_rest(bool asked) {
  Releases result;
  try {
    reclaim_locked(SIZE_MAX, Keep{}, nullptr, asked ? Unmap::release : Unmap::reclaim);
  } catch (const DeviceError& e) {
    last_error_ = e.what();
    ++result.failures;
  }
  // A release the device refused left its handle unplaced: counted once, if the retry fails too.
  result.failures += release_unplaced();
  if (!result.ok()) result.last_error = last_error_;
  return result;
}

// Global lock held, no pool lock. With a release threshold: when the memory held under cached free
// blocks may exceed it, give handles back until it does not. It runs after a free has freed its
// block, so it never throws DeviceError: a device that fails the unmap (or the wait before it)
// leaves those handles mapped under their free blocks, where the next trim, reclaim or
// empty_cache() tries again; the reason is kept in last_error_.
void MappedHandles::trim() {
  std::size_t allocated = 0;
  for (const auto& pool : ctx_.pools.all()) {
    allocated += static_cast<std::size_t>(pool->allocated_bytes_relaxed());
  }
  // Unused memory is at most reserved - allocated: under the threshold, nothing to look at.
  const std::size_t threshold = ctx_.config.release_threshold;
  if (ctx_.reservation.bytes() <= allocated + threshold) return;
  release_unplaced();
  AllPoolsLock locks(ctx_.pools, nullptr);
  for (const auto& pool : ctx_.pools.all()) pool->flush_parked();
  std::size_t unused = 0;
  for (const Victim& v : free_handles(Keep{})) unused += handles_[v.slot].granules * g_;
  if (unused <= threshold) return;
  try {
    reclaim_locked(unused - threshold, Keep{}, nullptr, Unmap::release);
  } catch (const DeviceError& e) {
    last_error_ = e.what();
  }
}

// --- the invariants ---------------------------------------------------------------------------------------

// The page rule (Note [The page rule]): a handle reaching over several pages lies inside one block
// that is not free, or under free blocks only; spans counts them.
void MappedHandles::check_page_rule(const Segment& s) const {
  std::size_t spans = 0;
  std::size_t fines = 0;
  for (std::size_t i = 0; i < s.pages.size();) {
    if (s.pages[i] == kNoPage) {
      ++i;
      continue;
    }
    const HandleSlot& h = handles_[slot_of(s.pages[i])];
    i = h.first + h.granules;
    fines += (s.pages[h.first] & kFine) != 0 ? 1 : 0;
    if ((s.pages[h.first] & kSpan) == 0) continue;
    ++spans;
    const std::uintptr_t lo = s.base + h.first * g_;
    const std::uintptr_t hi = s.base + i * g_;
    for (const Block* b = s.head; b != nullptr; b = b->next) {
      const bool overlaps = b->addr < hi && lo < b->addr + b->size;
      if (!overlaps || b->is_free() || (b->addr <= lo && hi <= b->addr + b->size)) continue;
      throw InvariantViolation(fmt::format(
          "cistern::check: virtual-memory engine: the handle at granules [{}, {}) of segment "
          "{:#x} reaches over several pages but the block {:#x} ({} bytes) in use holds only part "
          "of it (the page rule)",
          h.first, i, s.base, b->addr, b->size));
    }
  }
  if (spans != s.spans) {
    throw InvariantViolation(
        fmt::format("cistern::check: virtual-memory engine: segment {:#x}: {} handles reach over "
                    "several pages but the counter says {}",
                    s.base, spans, s.spans));
  }
  if (fines != s.fines) {
    throw InvariantViolation(
        fmt::format("cistern::check: virtual-memory engine: segment {:#x}: {} handles were made "
                    "near the limit but the counter says {}",
                    s.base, fines, s.fines));
  }
}

// Every granule of an allocated, pending or parked block is mapped; every mapped granule names a
// live handle placed in its segment over it, and a handle's granules all name it; handles are
// multiples of the granularity; the reserved counter is the handles held, the address-space
// counter the segments.
void MappedHandles::check(const std::vector<const Segment*>& segments) const {
  const auto fail = [](const std::string& what) {
    throw InvariantViolation("cistern::check: virtual-memory engine: " + what);
  };
  std::size_t va = 0;
  std::size_t placed = 0;
  for (const Segment* s : segments) {
    va += s->size;
    if (s->page_size != g_ || s->pages.size() * g_ != s->size) {
      fail(fmt::format("segment {:#x}: {} granules of {} bytes for {} bytes", s->base,
                       s->pages.size(), s->page_size, s->size));
    }
    const auto unmapped =
        static_cast<std::size_t>(std::count(s->pages.begin(), s->pages.end(), kNoPage));
    for (std::size_t i = 0; i < s->pages.size(); ++i) {
      const bool mapped = (s->mapped_bits[i >> 6] >> (i & 63) & 1) != 0;
      if (mapped != (s->pages[i] != kNoPage)) {
        fail(fmt::format("segment {:#x}: the bit of granule {} disagrees with its page", s->base,
                         i));
      }
    }
    const std::uintptr_t mapped_end = s->mapped_end;
    const_cast<Segment*>(s)->update_mapped_end();
    if (mapped_end != s->mapped_end) {
      fail(fmt::format("segment {:#x}: mapped_end {:#x} but the granules say {:#x}", s->base,
                       mapped_end, s->mapped_end));
    }
    if (unmapped != s->unmapped_pages) {
      fail(fmt::format("segment {:#x}: {} granules unmapped but counted {}", s->base, unmapped,
                       s->unmapped_pages));
    }
    for (std::size_t i = 0; i < s->pages.size();) {
      if (s->pages[i] == kNoPage) {
        ++i;
        continue;
      }
      const std::uint64_t page = s->pages[i];
      const std::uint32_t slot = slot_of(page);
      if (slot >= handles_.slots().size() || !handles_[slot].live) {
        fail(fmt::format("segment {:#x} granule {} names no live handle ({})", s->base, i, slot));
      }
      const HandleSlot& h = handles_[slot];
      if (h.segment != s || h.first != i || h.first + h.granules > s->pages.size() ||
          h.handle.bytes != h.granules * g_ ||
          ((page & kSpan) != 0) != spans_pages(*s, h.first, h.granules) ||
          (page & ~(kSpan | kFine)) != slot) {
        fail(fmt::format("handle {} is not placed whole at granule {} of segment {:#x}", slot, i,
                         s->base));
      }
      for (std::size_t k = i; k < i + h.granules; ++k) {
        if (s->pages[k] != page) {
          fail(fmt::format("segment {:#x} granule {} lies under handle {} but names {}", s->base, k,
                           slot, s->pages[k]));
        }
      }
      ++placed;
      i += h.granules;
    }
    check_page_rule(*s);
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      if (b->is_free()) continue;
      if (!s->pages_mapped(b->addr, b->addr + b->size)) {
        fail(fmt::format("the {} block {:#x} lies on an unmapped granule",
                         b->state == BlockState::allocated ? "allocated" : "pending or parked",
                         b->addr));
      }
    }
  }
  if (va != reserved_va_) {
    fail(fmt::format("the segments span {} bytes but the counter says {}", va, reserved_va_));
  }
  std::size_t held = 0;
  std::size_t placed_live = 0;
  for (const HandleSlot& h : handles_.slots()) {
    if (!h.live) continue;
    held += h.granules * g_;
    placed_live += h.segment != nullptr ? 1 : 0;
  }
  if (placed_live != placed) {
    fail(fmt::format("{} handles are placed but the segments show {}", placed_live, placed));
  }
  if (held != ctx_.reservation.bytes()) {
    fail(
        fmt::format("reserved counter {} but the handles hold {}", ctx_.reservation.bytes(), held));
  }
}

}  // namespace cistern::detail
