// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// PluginState (see plugin_state.hpp).
#include "plugin/plugin_state.hpp"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>

#include "cistern/types.hpp"
#include "plugin/graph_pools.hpp"
#ifdef CISTERN_HAS_CUDA
#include "cistern/cuda_device.hpp"
#endif

namespace cistern::plugin {
namespace {

/// The state; deliberately never deleted at exit (see the header).
std::atomic<PluginState*> g_state{nullptr};
std::mutex g_state_mutex;

std::string environment(const char* name) {
  const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read-only use
  return value != nullptr ? value : "";
}

/// Each simulated device gets addresses of its own (real devices share one address space, and
/// the pointer map is keyed by address).
SimDeviceOptions sim_options(int device, std::size_t capacity) {
  constexpr std::uintptr_t kSpacePerDevice = std::uintptr_t{1} << 40;
  SimDeviceOptions options;
  options.index = device;
  options.capacity = capacity;
  options.base_address = kSpacePerDevice * static_cast<std::uintptr_t>(device + 1);
  options.address_space = kSpacePerDevice;
  return options;
}

}  // namespace

// --- ErrorLog --------------------------------------------------------------------------------------------

void ErrorLog::record(cistern_error code, const std::string& message) {
  const bool misuse = code == CISTERN_ERROR_INVALID_POINTER ||
                      code == CISTERN_ERROR_SIZE_MISMATCH || code == CISTERN_ERROR_INVALID_ARGUMENT;
  if (misuse) ++misuses_;
  std::lock_guard<std::mutex> lock(mutex_);
  code_ = code;
  message_ = message;
  if (code == CISTERN_ERROR_OUT_OF_MEMORY || printed_) return;
  printed_ = true;
  std::fprintf(stderr,
               "%s\ncistern: (only the first error is printed; later ones are counted: "
               "cistern_last_error(), cistern.last_error() in Python)\n",
               message.c_str());
}

cistern_error ErrorLog::code() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return code_;
}

std::string ErrorLog::message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return message_;
}

void ErrorLog::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  code_ = CISTERN_OK;
  message_.clear();
}

// --- PluginState ---------------------------------------------------------------------------------------

PluginState& PluginState::get() {
  if (PluginState* state = g_state.load(std::memory_order_acquire)) return *state;
  std::lock_guard<std::mutex> lock(g_state_mutex);
  if (g_state.load() == nullptr) g_state.store(new PluginState());  // never deleted at exit
  return *g_state.load();
}

void PluginState::shutdown() {
  std::lock_guard<std::mutex> lock(g_state_mutex);
  delete g_state.exchange(nullptr);
}

void PluginState::read_environment() {
  if (environment_read_) return;
  const std::string backend = environment("CISTERN_BACKEND");
  if (backend == "sim") {
    backend_ = Backend::sim;
  } else if (backend == "cuda" || backend.empty()) {
#ifdef CISTERN_HAS_CUDA
    backend_ = Backend::cuda;
#else
    throw ConfigError("CISTERN_BACKEND",
                      "cistern: this plug-in was built without the CUDA toolkit, so it has no "
                      "CUDA backend; rebuild it where the toolkit is installed, or set "
                      "CISTERN_BACKEND=sim for the simulated device (tests only)");
#endif
  } else {
    throw ConfigError("CISTERN_BACKEND", "cistern: CISTERN_BACKEND='" + backend +
                                             "' is not a backend; use 'cuda' or 'sim'");
  }
  const std::string capacity = environment("CISTERN_SIM_CAPACITY");
  try {
    sim_capacity_ = capacity.empty() ? 80 * GiB : static_cast<std::size_t>(parse_bytes(capacity));
  } catch (const InvalidArgument& e) {
    throw ConfigError("CISTERN_SIM_CAPACITY",
                      std::string("cistern: CISTERN_SIM_CAPACITY: ") + e.what());
  }
  config_ = Config::from_env();
  environment_read_ = true;
}

Backend PluginState::backend() {
  std::lock_guard<std::mutex> lock(mutex_);
  read_environment();
  return backend_;
}

Config PluginState::config() {
  std::lock_guard<std::mutex> lock(mutex_);
  read_environment();
  return config_;
}

void PluginState::check_ordinal(int device) {
  if (device < 0 || device >= kMaxDevices) {
    throw InvalidArgument("cistern: device " + std::to_string(device) + " is out of range (0 to " +
                          std::to_string(kMaxDevices - 1) + ")");
  }
}

std::unique_ptr<Device> PluginState::open_device(int device) {
  if (backend_ == Backend::sim)
    return std::make_unique<SimDevice>(sim_options(device, sim_capacity_));
#ifdef CISTERN_HAS_CUDA
  CudaDeviceOptions options;
  options.device = device;
  CudaDeviceChoice choice = open_cuda_device(options);
  if (!choice.virtual_memory) {
    // Said once per device, because the page engine the user may count on is not running.
    std::fprintf(stderr,
                 "cistern: %s: no virtual memory, so cudaMalloc segments without the page "
                 "engine (%s)\n",
                 choice.device->name().c_str(), choice.without_virtual_memory.c_str());
  }
  return std::move(choice.device);
#else
  throw ConfigError("CISTERN_BACKEND", "cistern: no CUDA backend in this build");
#endif
}

DeviceAllocator& PluginState::allocator(int device) {
  check_ordinal(device);
  const std::size_t index = static_cast<std::size_t>(device);
  if (Slot* slot = published_[index].load(std::memory_order_acquire)) return *slot->allocator;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Slot* slot = published_[index].load()) return *slot->allocator;
  read_environment();
  auto slot = std::make_unique<Slot>();
  slot->device = open_device(device);
  slot->sim = dynamic_cast<SimDevice*>(slot->device.get());
  slot->capture = std::make_unique<CaptureState>(slot->sim != nullptr);
  slot->guard =
      std::make_unique<CaptureGuardDevice>(*slot->device, *slot->capture, GuardRole::general);
  slot->allocator = make_allocator(*slot->guard, config_);
  slot->pools =
      std::make_unique<GraphPools>(*slot->device, config_, *slot->capture, *slot->allocator);
  slot->engine = slot->allocator->uses_virtual_memory();
  if (history_) slot->allocator->record_history(true, history_entries_);
  slots_[index] = std::move(slot);
  published_[index].store(slots_[index].get(), std::memory_order_release);
  return *slots_[index]->allocator;
}

void PluginState::report_fallback(Slot& slot) noexcept {
  if (!slot.engine.exchange(false)) return;  // said already
  try {
    std::fprintf(stderr, "cistern: %s: %s\n", slot.device->name().c_str(),
                 slot.allocator->virtual_memory_note().c_str());
  } catch (...) {
    // Out of host memory for the message: the statistic num_vmm_fallbacks still says it.
  }
}

DeviceAllocator* PluginState::existing(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  Slot* slot = published_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
  return slot != nullptr ? slot->allocator.get() : nullptr;
}

GraphPools& PluginState::pools(int device) {
  allocator(device);
  return *published_[static_cast<std::size_t>(device)].load(std::memory_order_acquire)->pools;
}

GraphPools* PluginState::existing_pools(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  Slot* slot = published_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
  return slot != nullptr ? slot->pools.get() : nullptr;
}

CaptureState& PluginState::capture(int device) {
  allocator(device);
  return *published_[static_cast<std::size_t>(device)].load(std::memory_order_acquire)->capture;
}

std::vector<DeviceAllocator*> PluginState::all() {
  std::vector<DeviceAllocator*> allocators;
  for (int device = 0; device < kMaxDevices; ++device) {
    if (DeviceAllocator* a = existing(device)) allocators.push_back(a);
  }
  return allocators;
}

SimDevice& PluginState::sim(int device) {
  if (backend() != Backend::sim) {
    throw InvalidArgument("cistern: the simulated-device functions need CISTERN_BACKEND=sim");
  }
  allocator(device);
  return *published_[static_cast<std::size_t>(device)].load()->sim;
}

void PluginState::record_history(bool enabled, std::size_t max_entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  history_ = enabled;
  history_entries_ = max_entries;
  for (auto& slot : slots_) {
    if (slot) slot->allocator->record_history(enabled, max_entries);
  }
}

}  // namespace cistern::plugin
