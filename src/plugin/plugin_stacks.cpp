// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// StackLog (plugin_stacks.hpp) and its two C entry points.
#include "plugin/plugin_stacks.hpp"

#include <string>
#include <unordered_map>

#include "cistern/errors.hpp"

namespace cistern::plugin {

void StackLog::set_hook(cistern_stack_hook hook, std::size_t max_entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  max_entries_ = max_entries;
  for (auto& log : logs_) {
    while (log.size() > max_entries_) log.pop_front();
  }
  hook_.store(hook, std::memory_order_release);
}

void StackLog::log(int device, void* ptr, std::uint32_t stack) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device < 0 || stack >= table_.size()) return;  // a hook that answers nonsense: no stack
    const auto index = static_cast<std::size_t>(device);
    if (logs_.size() <= index) logs_.resize(index + 1);
    auto& log = logs_[index];
    log.emplace_back(reinterpret_cast<std::uintptr_t>(ptr), stack);
    if (log.size() > max_entries_) log.pop_front();
  } catch (...) {  // out of host memory: this allocation goes without its stack
  }
}

std::uint32_t StackLog::add_stack(std::size_t count, const char* const* filenames,
                                  const std::int64_t* lines, const char* const* names) {
  if (count > 0 && (filenames == nullptr || lines == nullptr || names == nullptr)) {
    throw InvalidArgument("cistern: add_stack: null frames");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::uint32_t> frames;
  frames.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const char* file = filenames[i] != nullptr ? filenames[i] : "";
    const char* name = names[i] != nullptr ? names[i] : "";
    frames.push_back(table_.frame_id(file, lines[i], name));
  }
  return table_.stack_id(frames);
}

void StackLog::attach(DeviceRecord& record) const {
  using Action = HistoryEntry::Action;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto index = static_cast<std::size_t>(record.device);
  if (record.device < 0 || index >= logs_.size() || logs_[index].empty()) return;
  // Each address's logged stacks, oldest first; the history's allocs take them newest first.
  std::unordered_map<std::uintptr_t, std::vector<std::uint32_t>> by_address;
  for (const auto& [addr, stack] : logs_[index]) by_address[addr].push_back(stack);
  for (auto entry = record.history.rbegin(); entry != record.history.rend(); ++entry) {
    if (entry->action != Action::alloc) continue;
    const auto found = by_address.find(entry->addr);
    if (found == by_address.end() || found->second.empty()) continue;
    entry->stack = found->second.back();
    found->second.pop_back();
  }
  std::unordered_map<std::uintptr_t, std::uint32_t> live;  // address -> its allocation's stack
  for (HistoryEntry& entry : record.history) {
    if (entry.action == Action::alloc) {
      live[entry.addr] = entry.stack;
    } else if (entry.action == Action::free_requested || entry.action == Action::free_completed) {
      const auto found = live.find(entry.addr);
      if (found != live.end()) entry.stack = found->second;
    }
  }
  record.stacks = table_;
}

void StackLog::clear() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  logs_.clear();
}

StackLog& stack_log() {
  static StackLog* const log = new StackLog();  // never destroyed: hooks may run at exit
  return *log;
}

}  // namespace cistern::plugin
