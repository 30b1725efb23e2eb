// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The process-wide state behind the plug-in's C ABI (include/cistern/plugin.h): the backend and
// configuration read from the environment, one device and caching allocator per device ordinal
// (created on first use) with its CUDA graph pools (graph_pools.hpp), and the last error. A free is
// checked against its allocation (size, device) through the allocator's own pointer map before
// anything is changed.
//
// The state is created on first use and never destroyed at process exit: a framework may still
// free memory from its own static destructors, after ours would have run; the driver reclaims
// everything with the process. `PluginState::shutdown` destroys it explicitly (tests).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cistern/config.hpp"
#include "cistern/device.hpp"
#include "cistern/device_allocator.hpp"
#include "cistern/errors.hpp"
#include "cistern/plugin.h"
#include "cistern/sim_device.hpp"
#include "plugin/capture_guard.hpp"
#include "plugin/graph_pools.hpp"

namespace cistern::plugin {

/// The highest device ordinal + 1 the plug-in serves.
inline constexpr int kMaxDevices = 64;

/// Which devices the allocators run on.
enum class Backend : std::uint8_t { cuda, sim };

/// A free whose size or device differs from the allocation's.
class SizeMismatch : public InvalidPointer {
 public:
  using InvalidPointer::InvalidPointer;
};

/// The last error and the counters.
class ErrorLog {
 public:
  /// Records an error; prints it to stderr if it is the first error worth printing (every error
  /// but out-of-memory, which the framework reports itself).
  void record(cistern_error code, const std::string& message);
  cistern_error code() const;
  std::string message() const;
  std::uint64_t misuse_count() const noexcept { return misuses_.load(); }
  void clear();

 private:
  mutable std::mutex mutex_;
  cistern_error code_ = CISTERN_OK;
  std::string message_;
  bool printed_ = false;
  std::atomic<std::uint64_t> misuses_{0};
};

/// See the file comment.
class PluginState {
 public:
  /// The state, created on first use.
  static PluginState& get();
  /// Destroys the state (see `cistern_shutdown`).
  static void shutdown();

  /// The backend CISTERN_BACKEND names (the build's default when unset). Throws `ConfigError`.
  Backend backend();
  /// The allocator of `device`, created on first use. Throws `InvalidArgument` for an ordinal
  /// out of range, `ConfigError` for bad settings, `DeviceError` if the device cannot be opened.
  DeviceAllocator& allocator(int device);
  /// The allocator of `device` if it exists, else nullptr. Never throws.
  DeviceAllocator* existing(int device) noexcept;
  /// After an allocation on `device`: when its allocator has just fallen back from the
  /// virtual-memory engine to classic segments (the device refused the engine at its first
  /// growth), says so on stderr, once. One relaxed load otherwise.
  void note_fallback(int device) noexcept {
    Slot* slot = published_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
    if (slot != nullptr && slot->engine.load(std::memory_order_relaxed) &&
        !slot->allocator->uses_virtual_memory()) {
      report_fallback(*slot);
    }
  }
  /// The graph pools of `device` (Note [Graph pools] in graph_pools.hpp), created with its
  /// allocator. Throws as `allocator` does.
  GraphPools& pools(int device);
  /// The graph pools of `device` if its allocator exists, else nullptr. Never throws.
  GraphPools* existing_pools(int device) noexcept;
  /// Which streams of `device` are being captured. Throws as `allocator` does.
  CaptureState& capture(int device);
  /// Every allocator that exists, by ordinal.
  std::vector<DeviceAllocator*> all();
  /// The simulated device of `device` (created with its allocator). Throws `InvalidArgument`
  /// unless the backend is "sim".
  SimDevice& sim(int device);
  /// The configuration every allocator gets (CISTERN_ALLOC_CONF). Throws `ConfigError`.
  Config config();
  /// Starts or stops history recording on every allocator, present and future.
  void record_history(bool enabled, std::size_t max_entries);

  ErrorLog& errors() noexcept { return errors_; }

 private:
  // Members in the order of construction: each one's destructor may still use those above.
  struct Slot {
    std::unique_ptr<Device> device;
    SimDevice* sim = nullptr;  ///< device, when simulated
    std::unique_ptr<CaptureState> capture;
    std::unique_ptr<CaptureGuardDevice> guard;  ///< the general allocator's view of device
    std::unique_ptr<DeviceAllocator> allocator;
    std::unique_ptr<GraphPools> pools;
    /// The engine runs and has not been seen to fall back (cleared once it has been said).
    std::atomic<bool> engine{false};
  };
  static void report_fallback(Slot& slot) noexcept;
  void read_environment();                          // mutex_ held
  std::unique_ptr<Device> open_device(int device);  // mutex_ held
  static void check_ordinal(int device);

  std::mutex mutex_;  ///< guards creation and the settings
  bool environment_read_ = false;
  Backend backend_ = Backend::sim;
  Config config_;
  std::size_t sim_capacity_ = 0;
  bool history_ = false;
  std::size_t history_entries_ = 0;
  std::array<std::atomic<Slot*>, kMaxDevices> published_{};
  std::array<std::unique_ptr<Slot>, kMaxDevices> slots_;
  ErrorLog errors_;
};

}  // namespace cistern::plugin
