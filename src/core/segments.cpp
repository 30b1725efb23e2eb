// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Classic segments: each one a device allocation (cudaMalloc), obtained whole when a pool misses
// and returned whole (cudaFree) when it is entirely free. The backing of vmm:False, and of any
// device without virtual memory.
#include <fmt/format.h>

#include "allocator_impl.hpp"
#include "device_call.hpp"

namespace cistern {

using detail::Block;
using detail::StreamPool;

class CachingAllocator::Impl::Segments final : public Backing {
 public:
  using Backing::Backing;

  Block* cached_fit(StreamPool& pool, std::size_t size, bool small) override {
    return pool.find(size, small);
  }

  // A new segment's single free block (indexed), or nullptr when the device (or the configured
  // limit) has no room. Other device failures throw with nothing changed.
  Block* grow(StreamPool& pool, std::size_t size, bool small) override {
    const std::size_t bytes = a_.policy_.segment_size(size);
    if (a_.exceeds_limit(bytes)) return nullptr;
    void* ptr = nullptr;
    const Status status = a_.device_.allocate(bytes, &ptr);
    if (status == Status::out_of_memory) return nullptr;
    detail::check_device(a_.device_, status, DeviceOp::allocate);
    ++a_.num_device_alloc_;
    a_.reserved_.fetch_add(bytes, std::memory_order_relaxed);
    a_.record(HistoryEntry::Action::segment_alloc, reinterpret_cast<std::uintptr_t>(ptr), bytes,
              pool.stream);
    return pool.add_new_segment(reinterpret_cast<std::uintptr_t>(ptr), bytes, !small);
  }

  // A classic segment is returned whole or not at all: nothing to take from inside one.
  Block* reclaim_and_grow(StreamPool& /*pool*/, std::size_t /*size*/, bool /*small*/) override {
    return nullptr;
  }

  bool release_segment(StreamPool& pool, Block* b) override {
    const std::uintptr_t base = b->segment->base;
    const std::size_t size = b->segment->size;
    const Status status = a_.device_.deallocate(reinterpret_cast<void*>(base));
    if (status != Status::ok) {
      a_.last_release_error_ = fmt::format("{}: {}", to_string(status), a_.device_.last_error());
      return false;
    }
    ++a_.num_device_free_;
    a_.reserved_.fetch_sub(size, std::memory_order_relaxed);
    a_.record(HistoryEntry::Action::segment_free, base, size, pool.stream);
    delete pool.remove_whole_segment(b, /*count_as_freed=*/true);
    return true;
  }

  std::size_t release_rest(bool /*asked*/) override { return 0; }

  // Reserved memory is the segments held.
  void check(const std::vector<const detail::Segment*>& /*segments*/) const override {
    std::int64_t held = 0;
    for (const auto& pool : a_.pools_.all()) {
      for (const detail::Segment* s = pool->segments(); s != nullptr; s = s->next) {
        held += static_cast<std::int64_t>(s->size);
      }
    }
    if (static_cast<std::int64_t>(a_.reserved_bytes()) != held) {
      throw InvariantViolation(fmt::format(
          "cistern::check: reserved counter {} but segments hold {}", a_.reserved_bytes(), held));
    }
  }
};

std::unique_ptr<CachingAllocator::Impl::Backing> CachingAllocator::Impl::make_segments() {
  return std::make_unique<Segments>(*this);
}

}  // namespace cistern
