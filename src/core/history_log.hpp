// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// HistoryLog: the bounded, ordered record behind CachingAllocator::record_history.
#pragma once

#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

#include "cistern/history.hpp"

namespace cistern::detail {

class HistoryLog {
 public:
  explicit HistoryLog(std::size_t max_entries) : max_entries_(max_entries) {}

  /// Appends one entry, dropping the oldest beyond the limit (a ring buffer, as PyTorch's).
  /// `reclaim`: see HistoryEntry::reclaim.
  void add(HistoryEntry::Action action, std::uintptr_t addr, std::size_t size, Stream stream,
           bool reclaim = false);
  /// The entries, oldest first.
  std::vector<HistoryEntry> entries() const;
  /// How many entries were dropped because of the limit.
  std::size_t dropped() const;

 private:
  const std::size_t max_entries_;
  mutable std::mutex mutex_;
  std::deque<HistoryEntry> entries_;
  std::uint64_t next_sequence_ = 0;
  std::size_t dropped_ = 0;
};

}  // namespace cistern::detail
