// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// DeferredFrees: frees that completed later, replayed with uses on the program's streams (see
// deferred_frees.hpp).
#include "replay/deferred_frees.hpp"

#include <algorithm>

namespace cistern::replay::detail {

DeferredFrees::DeferredFrees(const trace::Trace& trace, SimDevice* device) : device_(device) {
  if (device == nullptr || trace.recorded.deferred_frees.empty()) return;
  std::unordered_map<std::uint64_t, std::size_t> completes;  // id -> completion event
  for (const trace::RecordedFreeCompletion& c : trace.recorded.deferred_frees) {
    completes.emplace(c.id, c.before_event);
  }
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const trace::Event& e = trace.events[i];
    if (e.op != trace::Op::free) continue;
    const auto found = completes.find(e.id);
    if (found != completes.end() && found->second > i) completion_.emplace(i, found->second);
  }
}

void DeferredFrees::deallocate(std::size_t event, void* ptr, Stream stream, Allocator& allocator) {
  const auto found = completion_.find(event);
  if (found != completion_.end()) {
    // Ticks are added before each event: events[j] is played (j - i) ticks after events[i].
    const std::uint64_t done_at = device_->now() + (found->second - event) * kTick;
    const Stream user = stream_done_by(done_at);
    device_->launch(user, done_at - std::max(device_->now(), device_->stream_done_at(user)));
    allocator.record_stream(ptr, user);
  }
  allocator.deallocate(ptr, stream);
}

Stream DeferredFrees::stream_done_by(std::uint64_t done_at) {
  // The stream that is done latest but in time: uses in completion order share one stream.
  const Stream* best = nullptr;
  std::uint64_t best_done = 0;
  for (const Stream& s : streams_) {
    const std::uint64_t done = device_->stream_done_at(s);
    if (done <= done_at && (best == nullptr || done > best_done)) {
      best = &s;
      best_done = done;
    }
  }
  if (best != nullptr) return *best;
  streams_.push_back(device_->create_stream());
  return streams_.back();
}

}  // namespace cistern::replay::detail
