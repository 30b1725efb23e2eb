// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Classic segments: each one a device allocation (cudaMalloc), obtained whole when a pool misses
// and returned whole (cudaFree) when it is entirely free. The backing of vmm:False, and of any
// device without virtual memory.
#include <fmt/format.h>

#include "backing.hpp"
#include "cistern/errors.hpp"
#include "device_call.hpp"

namespace cistern::detail {

namespace {

class Segments final : public Backing {
 public:
  using Backing::Backing;

  Block* cached_fit(StreamPool& pool, std::size_t size, bool small) override {
    return pool.find(size, small);
  }

  // A new segment's single free block (indexed), or nullptr when the device (or the configured
  // limit) has no room. Other device failures throw with nothing changed.
  Growth grow(StreamPool& pool, std::size_t size, bool small) override {
    const std::size_t bytes = ctx_.policy.segment_size(size);
    if (ctx_.reservation.exceeds_limit(bytes)) return {};
    void* ptr = nullptr;
    const Status status = ctx_.device.allocate(bytes, &ptr);
    if (status == Status::out_of_memory) return {};
    check_device(ctx_.device, status, DeviceOp::allocate);
    ++ctx_.counters.device_alloc;
    ctx_.reservation.add(bytes);
    const auto base = reinterpret_cast<std::uintptr_t>(ptr);
    ctx_.history.record(HistoryEntry::Action::segment_alloc, base, bytes, pool.stream);
    return {pool.add_new_segment(base, bytes, !small), {}};
  }

  // A classic segment is returned whole or not at all: nothing to take from inside one.
  Growth reclaim_and_grow(StreamPool& /*pool*/, std::size_t /*size*/, bool /*small*/) override {
    return {};
  }

  Releases release_segment(StreamPool& pool, Block* b) override {
    const std::uintptr_t base = b->segment->base;
    const std::size_t size = b->segment->size;
    const Status status = ctx_.device.deallocate(reinterpret_cast<void*>(base));
    if (status != Status::ok) {
      return Releases::failed(fmt::format("{}: {}", to_string(status), ctx_.device.last_error()));
    }
    ++ctx_.counters.device_free;
    ctx_.reservation.sub(size);
    ctx_.history.record(HistoryEntry::Action::segment_free, base, size, pool.stream);
    delete pool.remove_whole_segment(b, /*count_as_freed=*/true);
    return {};
  }

  Releases release_rest(bool /*asked*/) override { return {}; }

  // Reserved memory is the segments held.
  void check(const std::vector<const Segment*>& /*segments*/) const override {
    std::size_t held = 0;
    for (const auto& pool : ctx_.pools.all()) {
      for (const Segment* s = pool->segments(); s != nullptr; s = s->next) held += s->size;
    }
    if (ctx_.reservation.bytes() != held) {
      throw InvariantViolation(
          fmt::format("cistern::check: reserved counter {} but segments hold {}",
                      ctx_.reservation.bytes(), held));
    }
  }
};

}  // namespace

std::unique_ptr<Backing> make_segments(const BackingContext& ctx) {
  return std::make_unique<Segments>(ctx);
}

}  // namespace cistern::detail
