// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "stream_pool.hpp"

#include <algorithm>

#include "cistern/device.hpp"
#include "device_call.hpp"

namespace cistern::detail {

void BlockArena::grow() {
  constexpr std::size_t kChunk = 256;
  chunks_.push_back(std::make_unique<Block[]>(kChunk));
  Block* chunk = chunks_.back().get();
  for (std::size_t i = 0; i < kChunk; ++i) {
    chunk[i].next = free_;
    free_ = &chunk[i];
  }
}

EventPool::~EventPool() {
  for (Event e : free_) (void)device_.destroy_event(e);
}

Event EventPool::acquire() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      const Event e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  Event e;
  check_device(device_, device_.create_event(&e), DeviceOp::create_event);
  return e;
}

void EventPool::release(Event event) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(event);
}

StreamPool::StreamPool(Stream s, const SizePolicy& policy, const Config& config,
                       std::atomic<SharedStats*>& shared, std::atomic<HistoryLog*>& history,
                       RegionTable& regions)
    : stream(s),
      policy_(policy),
      shared_(shared),
      history_(history),
      regions_(regions),
      park_small_blocks_(config.park_small_blocks),
      exact_peaks_(config.exact_peaks),
      park_shift_(static_cast<unsigned>(log2_floor(config.min_block_size))) {
  const std::size_t bins = (config.small_size >> park_shift_) + 1;
  parked_.assign(bins, nullptr);
  parked_count_.assign(bins, 0);
  parked_listed_.assign(bins, 0);
}

StreamPool::~StreamPool() {
  // Segments are returned to the device by the allocator; only the bookkeeping remains here.
  for (Segment* s = segments_; s != nullptr;) {
    Segment* next = s->next;
    delete s;
    s = next;
  }
}

// --- index bookkeeping ------------------------------------------------------------------------------

void StreamPool::index_block(Block* b, bool small) noexcept {
  index(small).insert(b);
  list(b, small);
}

void StreamPool::unindex(Block* b, bool small) noexcept {
  index(small).remove(b);
  unlist(b, small);
}

// Merges the free neighbour `gone` into `into` (both in the same segment, adjacent).
void StreamPool::absorb(Block* into, Block* gone, bool small) noexcept {
  unindex(gone, small);
  join(into, gone);
  arena_.recycle(gone);
}

void StreamPool::flush_parked() noexcept {
  for (const std::uint32_t bin : parked_bins_) {
    while (Block* b = parked_[bin]) {
      parked_[bin] = b->left;
      b->left = nullptr;
      uncount_split(b, true);
      b->state = BlockState::free;
      coalesce(b, true);
    }
    parked_count_[bin] = 0;
    parked_listed_[bin] = 0;
  }
  parked_bins_.clear();
  publish_stats();
}

std::size_t StreamPool::parked_count() const noexcept {
  std::size_t total = 0;
  for (const std::uint32_t bin : parked_bins_) total += parked_count_[bin];
  return total;
}

bool StreamPool::is_parked_here(const Block* b) const noexcept {
  const std::size_t bin = b->size >> park_shift_;
  if (bin >= parked_.size()) return false;
  for (const Block* p = parked_[bin]; p != nullptr; p = p->left) {
    if (p == b) return true;
  }
  return false;
}

// --- pending frees ----------------------------------------------------------------------------------

void StreamPool::make_pending(Block* b, const std::vector<Event>& events,
                              const std::vector<Stream>& streams) {
  begin_pending(b, events.size());
  for (std::size_t i = 0; i < events.size(); ++i) enqueue(b, events[i], streams[i]);
}

PendingQueue& StreamPool::add_queue(Stream user) {
  pending_.push_back(PendingQueue{user, {}});
  return pending_.back();
}

void StreamPool::process_events(Device& device) {
  for (PendingQueue& queue : pending_) {
    while (!queue.entries.empty()) {
      const PendingFree front = queue.entries.front();
      const Status status = device.query_event(front.event);
      if (status == Status::not_ready) break;  // later events of this stream are later still
      check_device(device, status, DeviceOp::query_event);
      queue.entries.pop_front();
      --pending_count_;
      keep_spare_event(front.event);
      if (--front.block->pending_events == 0) retire_pending(front.block);
    }
  }
}

void StreamPool::synchronize_events(Device& device) {
  for (PendingQueue& queue : pending_) {
    while (!queue.entries.empty()) {
      const PendingFree front = queue.entries.front();
      check_device(device, device.synchronize_event(front.event), DeviceOp::synchronize_event);
      queue.entries.pop_front();
      --pending_count_;
      keep_spare_event(front.event);
      if (--front.block->pending_events == 0) retire_pending(front.block);
    }
  }
}

// --- segments ------------------------------------------------------------------------------------------

// Global lock held (RegionTable writes); the table learns of the segment before any block of it
// can be handed out.
void StreamPool::link_segment(Segment* s) {
  regions_.add(*s, this);
  s->owner = this;
  s->prev = nullptr;
  s->next = segments_;
  if (segments_ != nullptr) segments_->prev = s;
  segments_ = s;
  ++segment_count_;
}

void StreamPool::unlink_segment(Segment* s) noexcept {
  if (s->prev != nullptr) s->prev->next = s->next;
  else segments_ = s->next;
  if (s->next != nullptr) s->next->prev = s->prev;
  s->prev = s->next = nullptr;
  s->owner = nullptr;
  regions_.remove(*s, this);
  --segment_count_;
}

Block* StreamPool::add_new_segment(std::uintptr_t base, std::size_t size, bool large,
                                   std::size_t page_size) {
  auto segment = std::make_unique<Segment>();
  Block* b = arena_.make();
  segment->base = base;
  segment->size = size;
  segment->large = large;
  if (page_size != 0) {  // an expandable segment: address space only, no page mapped yet
    segment->expandable = true;
    segment->page_size = page_size;
    segment->pages.assign(size / page_size, Segment::kNoPage);
    segment->mapped_bits.assign((segment->pages.size() + 63) / 64, 0);
    segment->unmapped_pages = segment->pages.size();
    while ((std::size_t{1} << segment->page_shift) < page_size) ++segment->page_shift;
    segment->mapped_end = base;
  } else {
    segment->mapped_end = base + size;
  }
  segment->head = b;
  b->addr = base;
  b->size = size;
  link_segment(segment.get());  // may throw; the segment is still owned here then
  b->segment = segment.release();
  const bool small = !large;
  stats_.inc(StatKind::segment, small, 1);
  stats_.inc(StatKind::reserved_bytes, small,
             static_cast<std::int64_t>(b->segment->mapped_bytes()));
  if (policy_.is_oversize(size)) stats_.add_oversize_segments(1);
  index_block(b, small);
  publish_stats();  // segment changes are rare: keep allocator-wide reserved peaks exact
  return b;
}

Segment* StreamPool::remove_whole_segment(Block* b, bool count_as_freed) {
  Segment* segment = b->segment;
  const bool small = !segment->large;
  const auto size = static_cast<std::int64_t>(segment->mapped_bytes());
  unindex(b, small);
  unlink_segment(segment);
  if (count_as_freed) {
    stats_.dec(StatKind::segment, small, 1);
    stats_.dec(StatKind::reserved_bytes, small, size);
    if (policy_.is_oversize(segment->size)) stats_.add_oversize_segments(-1);
    segment->head = nullptr;
    arena_.recycle(b);
  } else {
    stats_.transfer(StatKind::segment, small, -1);
    stats_.transfer(StatKind::reserved_bytes, small, -size);
    if (policy_.is_oversize(segment->size)) stats_.transfer_oversize_segments(-1);
  }
  publish_stats();  // before the adopting pool publishes its gain, so no false peak appears
  return segment;
}

void StreamPool::adopt_segment(Segment* segment) {
  const bool small = !segment->large;
  link_segment(segment);
  stats_.transfer(StatKind::segment, small, 1);
  stats_.transfer(StatKind::reserved_bytes, small,
                  static_cast<std::int64_t>(segment->mapped_bytes()));
  if (policy_.is_oversize(segment->size)) stats_.transfer_oversize_segments(1);
  index_block(segment->head, small);
  publish_stats();
}

namespace {

/// The longest stretch of a free block that lies on mapped pages: what a request could have of
/// it without new physical memory (the whole block, in a classic segment).
std::size_t backed_stretch(const Block* b) {
  const Segment& seg = *b->segment;
  if (seg.unmapped_pages == 0) return b->size;
  const std::uintptr_t end = b->addr + b->size;
  std::size_t longest = 0;
  std::uintptr_t run = 0;  // start of the current mapped stretch, 0: none
  for (std::uintptr_t at = b->addr; at < end;) {
    const std::size_t page = (at - seg.base) / seg.page_size;
    const std::uintptr_t next =
        std::min<std::uintptr_t>(end, seg.base + (page + 1) * seg.page_size);
    if (seg.pages[page] == Segment::kNoPage) {
      run = 0;
    } else {
      if (run == 0) run = at;
      longest = std::max<std::size_t>(longest, next - run);
    }
    at = next;
  }
  return longest;
}

}  // namespace

std::size_t StreamPool::largest_free(bool small) const noexcept {
  std::size_t largest = 0;
  index(small).for_each([&](const Block* b) { largest = std::max(largest, backed_stretch(b)); });
  return largest;
}

}  // namespace cistern::detail
