// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// StackLog (plugin_stacks.hpp): the hook's stacks, native frames, the log per device.
#include "plugin/plugin_stacks.hpp"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>

#include "cistern/errors.hpp"

namespace cistern::plugin {
namespace {

constexpr int kMaxNativeFrames = 128;  ///< deeper stacks keep their innermost frames

/// The load address of the shared object holding `address` (nullptr if none).
const void* object_of(const void* address) noexcept {
  Dl_info info{};
  return dladdr(address, &info) != 0 ? info.dli_fbase : nullptr;
}

/// The plug-in's own object: frames inside it are cistern's, not the caller's.
const void* plugin_object() noexcept {
  static const void* const base = object_of(reinterpret_cast<const void*>(&object_of));
  return base;
}

/// Whether `path` names the Python interpreter (the python3 program, or libpython).
bool is_interpreter(const char* path) noexcept {
  if (path == nullptr) return false;
  const char* slash = std::strrchr(path, '/');
  const char* base = slash != nullptr ? slash + 1 : path;
  return std::strncmp(base, "python", 6) == 0 || std::strncmp(base, "libpython", 9) == 0;
}

/// "0x" and `offset` in hexadecimal: the name of a frame whose function has no exported symbol.
std::string fmt_offset(std::uintptr_t offset) {
  char text[2 + 2 * sizeof offset + 1];
  std::snprintf(text, sizeof text, "0x%jx", static_cast<std::uintmax_t>(offset));
  return text;
}

/// `symbol` demangled, or as it is.
std::string demangled(const char* symbol) {
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(symbol, nullptr, nullptr, &status), std::free);
  return status == 0 && name != nullptr ? std::string(name.get()) : std::string(symbol);
}

}  // namespace

void StackLog::set_hook(cistern_stack_hook hook, std::size_t max_entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  keep_newest(max_entries);
  hook_.store(hook, std::memory_order_release);
}

void StackLog::keep_newest(std::size_t max_entries) {
  max_entries_ = max_entries;
  for (auto& log : logs_) {
    while (log.size() > max_entries_) log.pop_front();
  }
}

void StackLog::set_native(bool on, std::size_t max_entries) {
  if (on) {
    // The first backtrace loads the unwinder: here, not inside an allocation.
    void* pcs[1];
    (void)backtrace(pcs, 1);
    (void)plugin_object();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  keep_newest(max_entries);
  native_.store(on, std::memory_order_relaxed);
}

void StackLog::take(int device, void* ptr, cistern_stack_hook hook, bool native) noexcept {
  void* pcs[kMaxNativeFrames];
  // Before the hook: its own frames (ctypes, the interpreter) are not the allocation's.
  const int count = native ? backtrace(pcs, kMaxNativeFrames) : 0;
  const std::uint32_t python = hook != nullptr ? hook() : 0;
  if (count <= 0) {
    log(device, ptr, python);
    return;
  }
  std::uint32_t stack = 0;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    // A hook that answers nonsense gives no Python frames; the native ones stay.
    stack = with_native(python < table_.size() ? python : 0, pcs, count);
  } catch (...) {  // out of host memory: this allocation goes without its native frames
    stack = python;
  }
  log(device, ptr, stack);
}

std::uint32_t StackLog::with_native(std::uint32_t python, void* const* pcs, int count) {
  std::string key(reinterpret_cast<const char*>(&python), sizeof python);
  key.append(reinterpret_cast<const char*>(pcs), static_cast<std::size_t>(count) * sizeof(void*));
  if (const auto found = native_stacks_.find(key); found != native_stacks_.end()) {
    return found->second;
  }
  std::vector<std::uint32_t> frames;
  // Whatever comes before the plug-in's own frames (a sanitizer's interceptor of backtrace) and
  // those frames themselves are cistern's, not the caller's.
  int i = 0;
  while (i < count && object_of(pcs[i]) != plugin_object()) ++i;
  if (i == count) i = 0;  // no frame of the plug-in: keep them all
  while (i < count && object_of(pcs[i]) == plugin_object()) ++i;
  for (; i < count; ++i) {
    if (python != 0) {
      Dl_info info{};
      if (dladdr(pcs[i], &info) != 0 && is_interpreter(info.dli_fname)) break;
    }
    frames.push_back(native_frame(reinterpret_cast<std::uintptr_t>(pcs[i])));
  }
  const std::vector<std::uint32_t>& outer = table_.stack(python);
  frames.insert(frames.end(), outer.begin(), outer.end());
  const std::uint32_t id = table_.stack_id(frames);
  native_stacks_.emplace(std::move(key), id);
  return id;
}

std::uint32_t StackLog::native_frame(std::uintptr_t pc) {
  if (const auto found = pc_frames_.find(pc); found != pc_frames_.end()) return found->second;
  // A return address follows its call: look up the byte before it, which is inside the call.
  Dl_info info{};
  std::string file = "??";
  std::string name;
  if (dladdr(reinterpret_cast<const void*>(pc - 1), &info) != 0) {
    if (info.dli_fname != nullptr && info.dli_fname[0] != '\0') file = info.dli_fname;
    if (info.dli_sname != nullptr) {
      name = demangled(info.dli_sname);
    } else {
      name = fmt_offset(pc - reinterpret_cast<std::uintptr_t>(info.dli_fbase));
    }
  } else {
    name = fmt_offset(pc);
  }
  const std::uint32_t id = table_.frame_id(file, 0, name);
  pc_frames_.emplace(pc, id);
  return id;
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
