// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "history_log.hpp"

#include <chrono>

namespace cistern {

const char* to_string(HistoryEntry::Action action) noexcept {
  switch (action) {
    case HistoryEntry::Action::alloc: return "alloc";
    case HistoryEntry::Action::free_requested: return "free_requested";
    case HistoryEntry::Action::free_completed: return "free_completed";
    case HistoryEntry::Action::segment_alloc: return "segment_alloc";
    case HistoryEntry::Action::segment_free: return "segment_free";
    case HistoryEntry::Action::segment_map: return "segment_map";
    case HistoryEntry::Action::segment_unmap: return "segment_unmap";
    case HistoryEntry::Action::oom: return "oom";
  }
  return "unknown";
}

namespace detail {

void HistoryLog::add(HistoryEntry::Action action, std::uintptr_t addr, std::size_t size,
                     Stream stream, bool reclaim) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  HistoryEntry entry;
  entry.action = action;
  entry.addr = addr;
  entry.size = size;
  entry.stream = stream;
  entry.reclaim = reclaim;
  entry.time_us = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(now).count());
  std::lock_guard<std::mutex> lock(mutex_);
  entry.sequence = next_sequence_++;
  if (max_entries_ == 0) return;
  if (entries_.size() == max_entries_) {
    entries_.pop_front();
    ++dropped_;
  }
  entries_.push_back(entry);
}

std::vector<HistoryEntry> HistoryLog::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {entries_.begin(), entries_.end()};
}

std::size_t HistoryLog::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

}  // namespace detail
}  // namespace cistern
