// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The C ABI of libcistern_plugin.so (include/cistern/plugin.h). Every entry point runs its body
// inside `guarded`, which turns any exception into a recorded error code: nothing ever unwinds
// into the framework.
#include "cistern/plugin.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "cistern/errors.hpp"
#include "cistern/pytorch_snapshot.hpp"
#include "cistern/types.hpp"
#include "plugin/plugin_stacks.hpp"
#include "plugin/plugin_state.hpp"

#ifndef CISTERN_VERSION
#define CISTERN_VERSION "unknown"
#endif

namespace cistern::plugin {
namespace {

/// A `max_entries` argument of the C ABI: 0 means one million (plugin.h).
std::size_t entries_or_default(std::size_t max_entries) noexcept {
  return max_entries == 0 ? 1000000 : max_entries;
}

/// The code of the exception in flight (called from a catch block).
cistern_error classify() noexcept {
  try {
    throw;
  } catch (const OutOfMemory&) {
    return CISTERN_ERROR_OUT_OF_MEMORY;
  } catch (const SizeMismatch&) {
    return CISTERN_ERROR_SIZE_MISMATCH;
  } catch (const InvalidPointer&) {
    return CISTERN_ERROR_INVALID_POINTER;
  } catch (const ConfigError&) {
    return CISTERN_ERROR_CONFIG;
  } catch (const InvalidArgument&) {
    return CISTERN_ERROR_INVALID_ARGUMENT;
  } catch (const DeviceError&) {
    return CISTERN_ERROR_DEVICE;
  } catch (const std::bad_alloc&) {
    return CISTERN_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CISTERN_ERROR_INTERNAL;
  }
}

std::string message_of(const std::exception_ptr& error) noexcept {
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
    return "cistern: out of host memory";
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "cistern: unknown error";
  }
}

/// Runs `body`; on an exception records it and returns its code, and its message in `*message`
/// when asked (left empty if even that copy fails for want of memory).
template <class Body>
cistern_error guarded(Body&& body, std::string* message = nullptr) noexcept {
  try {
    body();
    return CISTERN_OK;
  } catch (...) {
    const cistern_error code = classify();
    const std::string text = message_of(std::current_exception());
    try {
      if (message != nullptr) *message = text;
      PluginState::get().errors().record(code, text);
    } catch (...) {  // recording needs memory too; the code still tells the caller
    }
    return code;
  }
}

/// Copies `text` like snprintf: NUL-terminated, cut to `capacity`; returns its full length.
std::size_t copy_out(const std::string& text, char* buffer, std::size_t capacity) noexcept {
  if (buffer != nullptr && capacity > 0) {
    const std::size_t n = std::min(text.size(), capacity - 1);
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return text.size();
}

std::string stats_json(const Stats& stats) {
  std::ostringstream json;
  json << '{';
  bool first = true;
  for (const auto& [key, value] : stats.flatten()) {
    json << (first ? "" : ", ") << '"' << key << "\": " << value;
    first = false;
  }
  json << '}';
  return json.str();
}

std::string hex(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "%#zx", reinterpret_cast<std::uintptr_t>(ptr));
  return text;
}

/// Refuses, as misuse (CISTERN_ERROR_INVALID_ARGUMENT, nothing done), a stream handle that the
/// simulated device never created, the same way in malloc, free and record_stream. On CUDA the
/// handle is the framework's cudaStream_t and is taken as given: only CUDA can judge it.
void require_known_stream(PluginState& state, int device, Stream stream, const char* what) {
  if (state.backend() != Backend::sim) return;
  try {
    (void)state.sim(device).stream_done_at(stream);
  } catch (const InvalidArgument&) {
    throw InvalidArgument(std::string("cistern: ") + what + " on device " + std::to_string(device) +
                          ": unknown stream handle " + hex(stream.native<void>()) +
                          " (the simulated backend knows stream 0 and the streams of "
                          "cistern_sim_create_stream); nothing was done");
  }
}

/// The out-of-memory message in plain words: what was asked for, what the device has free, and
/// where cistern's own memory is (allocated to the program, or cached for reuse).
std::string oom_message(const OutOfMemoryInfo& info) {
  std::string message = "cistern: out of memory on device " + std::to_string(info.device) +
                        ": requested " + std::to_string(info.requested) + " bytes (" +
                        format_bytes(info.requested) + "), of which the device has " +
                        format_bytes(info.device_free) + " free out of " +
                        format_bytes(info.device_total) + ". cistern has " +
                        format_bytes(info.reserved) + " reserved: " + format_bytes(info.allocated) +
                        " allocated to the program and " + format_bytes(info.cached) +
                        " cached (free blocks kept for reuse; the largest that could serve "
                        "this request is " +
                        format_bytes(info.largest_free) + ").";
  if (info.limit != 0) {
    message +=
        " It may reserve at most " + format_bytes(info.limit) + " (memory fraction or limit).";
  }
  return message;
}

/// Says what `ptr`, which is not a live allocation of `device`, is (double free, interior pointer,
/// foreign): the allocator's own message. Never frees anything, so that a racing allocation
/// that has just been given the same address cannot be freed by mistake.
[[noreturn]] void throw_not_live(PluginState& state, void* ptr, int device) {
  if (DeviceAllocator* allocator = state.existing(device)) {
    try {
      allocator->allocation_size(ptr);  // throws InvalidPointer with the precise story
    } catch (const InvalidPointer& e) {
      std::string message = e.what();
      const std::string asked = "allocation_size(";
      if (const std::size_t at = message.find(asked); at != std::string::npos) {
        message.replace(at, asked.size(), "free(");
      }
      throw InvalidPointer(message);
    }
  }
  throw InvalidPointer("cistern: free(" + hex(ptr) + ", device " + std::to_string(device) +
                       "): not allocated by cistern_malloc");
}

/// A free that names the wrong device or size: says what the allocation really is. Only misuse
/// gets here, so scanning every device's allocator is fine.
[[noreturn]] void throw_mismatch(PluginState& state, void* ptr, std::size_t size, int device) {
  for (int other = 0; other < kMaxDevices; ++other) {
    const DeviceAllocator* allocator = state.existing(other);
    std::optional<std::size_t> requested =
        allocator != nullptr ? allocator->requested_size(ptr) : std::nullopt;
    if (const GraphPools* pools = state.existing_pools(other); !requested && pools != nullptr) {
      requested = pools->requested_size(ptr);
    }
    if (!requested) continue;
    throw SizeMismatch("cistern: free(" + hex(ptr) + ", size " + std::to_string(size) +
                       ", device " + std::to_string(device) + "): the allocation has size " +
                       std::to_string(*requested) + " on device " + std::to_string(other) +
                       "; nothing was freed");
  }
  throw_not_live(state, ptr, device);
}

// The allocator's pointer map knows each live allocation's caller size (one O(1) probe), so a
// free is validated against it before anything changes.
void free_checked(void* ptr, std::size_t size, int device, Stream stream) {
  PluginState& state = PluginState::get();
  DeviceAllocator* allocator = state.existing(device);
  if (allocator != nullptr) require_known_stream(state, device, stream, "free");
  const std::optional<std::size_t> requested =
      allocator != nullptr ? allocator->requested_size(ptr) : std::nullopt;
  if (!requested) {
    // Not the general allocator's: a graph pool's, or misuse.
    GraphPools* pools = state.existing_pools(device);
    if (pools != nullptr && pools->any_live() && pools->deallocate(ptr, size, stream)) return;
  }
  if (!requested || *requested != size) throw_mismatch(state, ptr, size, device);
  allocator->deallocate(ptr, stream);
}

/// Calls `use` with the allocator holding the live allocation `ptr` (the general allocator or a
/// graph pool's), whichever device it is on.
template <class Use>
void with_allocator_of(PluginState& state, void* ptr, const char* what, Use&& use) {
  for (int device = 0; device < kMaxDevices; ++device) {
    DeviceAllocator* allocator = state.existing(device);
    if (allocator != nullptr && allocator->requested_size(ptr)) return use(*allocator);
  }
  for (int device = 0; device < kMaxDevices; ++device) {
    GraphPools* pools = state.existing_pools(device);
    if (pools != nullptr && pools->any_live() && pools->with_owner(ptr, use)) return;
  }
  throw InvalidPointer(std::string("cistern: ") + what + "(" + hex(ptr) +
                       "): not a live allocation of cistern_malloc");
}

/// One allocation of the C ABI and how it went.
struct Attempt {
  void* ptr = nullptr;
  cistern_error code = CISTERN_OK;
  std::string message;  ///< the failure's own message (also recorded as the last error)
};

/// The body of every malloc entry point: size 0 is no allocation; out of memory gets the
/// plug-in's message (what was asked, free, allocated, reserved, cached, the limit).
Attempt attempt_malloc(std::size_t size, int device, cistern_stream_t stream) noexcept {
  Attempt attempt;
  attempt.code = guarded(
      [&] {
        if (size == 0) return;
        PluginState& state = PluginState::get();
        DeviceAllocator& allocator = state.allocator(device);
        require_known_stream(state, device, Stream(stream), "malloc");
        GraphPools& pools = *state.existing_pools(device);
        MallocScope scope{Stream(stream)};
        bool pooled = false;
        try {
          if (pools.any_begun()) {
            pooled = true;  // until no begun pool's filter accepts the stream
            const std::optional<void*> ptr = pools.allocate(size, Stream(stream));
            pooled = ptr.has_value();
            if (pooled) attempt.ptr = *ptr;
          }
          if (!pooled) {
            attempt.ptr = allocator.allocate(size, Stream(stream));
            state.note_fallback(device);
          }
        } catch (const OutOfMemory& e) {
          // A size no device has is refused before the device is asked: its own message says so.
          if (e.info().device_total == 0) throw;
          std::string message = oom_message(e.info());
          if (pooled) {
            message +=
                " The request was for a CUDA graph's private pool; the figures above are "
                "that pool's.";
            if (state.capture(device).is_capturing(Stream(stream))) {
              message += GraphPools::capture_oom_note();
            }
          }
          throw OutOfMemory(e.info(), message);
        } catch (const DeviceError&) {
          if (!scope.refused_for_capture()) throw;
          throw InvalidArgument(capture_refusal_message(device, Stream(stream)));
        }
      },
      &attempt.message);
  if (attempt.code != CISTERN_OK) attempt.ptr = nullptr;
  stack_log().note(device, attempt.ptr);  // outside every lock: the hook may call back
  return attempt;
}

}  // namespace
}  // namespace cistern::plugin

using cistern::Stream;
using cistern::plugin::entries_or_default;
using cistern::plugin::guarded;
using cistern::plugin::PluginState;

extern "C" {

void* cistern_malloc(size_t size, int device, cistern_stream_t stream) {
  return cistern::plugin::attempt_malloc(size, device, stream).ptr;
}

int cistern_try_malloc(size_t size, int device, cistern_stream_t stream, void** ptr, char* message,
                       size_t capacity) {
  cistern::plugin::Attempt attempt;
  if (ptr == nullptr) {
    attempt.code = guarded(
        [] { throw cistern::InvalidArgument("cistern: try_malloc needs a place for the pointer"); },
        &attempt.message);
  } else {
    attempt = cistern::plugin::attempt_malloc(size, device, stream);
    *ptr = attempt.ptr;
  }
  cistern::plugin::copy_out(attempt.message, message, capacity);
  return attempt.code;
}

// The one entry point that throws (see plugin.h): PyTorch stores whatever its allocation function
// returns, so a failure must not come back as NULL.
void* cistern_malloc_or_throw(size_t size, int device, cistern_stream_t stream) {
  cistern::plugin::Attempt attempt = cistern::plugin::attempt_malloc(size, device, stream);
  if (attempt.code == CISTERN_OK) return attempt.ptr;
  if (attempt.code == CISTERN_ERROR_OUT_OF_MEMORY) {
    throw std::runtime_error(CISTERN_FRAMEWORK_OOM_PREFIX + attempt.message);
  }
  throw std::runtime_error(attempt.message.empty() ? "cistern: malloc failed" : attempt.message);
}

void cistern_free(void* ptr, size_t size, int device, cistern_stream_t stream) {
  if (ptr == nullptr) return;
  guarded([&] { cistern::plugin::free_checked(ptr, size, device, Stream(stream)); });
}

void cistern_init(int device_count) {
  guarded([&] {
    if (device_count < 0 || device_count > cistern::plugin::kMaxDevices) {
      throw cistern::InvalidArgument("cistern: init with " + std::to_string(device_count) +
                                     " devices; the plug-in serves up to " +
                                     std::to_string(cistern::plugin::kMaxDevices));
    }
    PluginState::get().config();  // reads and checks the environment now
  });
}

void cistern_empty_cache(void) {
  guarded([&] {
    PluginState& state = PluginState::get();
    for (int device = 0; device < cistern::plugin::kMaxDevices; ++device) {
      cistern::DeviceAllocator* allocator = state.existing(device);
      if (allocator == nullptr) continue;
      allocator->empty_cache();
      state.existing_pools(device)->empty_cache();  // the pools no graph uses any more
    }
  });
}

void cistern_set_memory_fraction(double fraction, int device) {
  guarded([&] {
    if (!(fraction > 0.0 && fraction <= 1.0)) {
      throw cistern::InvalidArgument("cistern: memory fraction " + std::to_string(fraction) +
                                     " is not in (0, 1]");
    }
    PluginState::get().allocator(device).set_memory_fraction(fraction);
  });
}

void cistern_record_stream(void* ptr, cistern_stream_t stream) {
  guarded([&] {
    PluginState& state = PluginState::get();
    cistern::plugin::with_allocator_of(
        state, ptr, "record_stream", [&](cistern::DeviceAllocator& allocator) {
          cistern::plugin::require_known_stream(state, allocator.device_index(), Stream(stream),
                                                "record_stream");
          allocator.record_stream(ptr, Stream(stream));
        });
  });
}

void* cistern_base_allocation(void* ptr, size_t* size) {
  void* base = ptr;
  guarded([&] {
    PluginState& state = PluginState::get();
    cistern::plugin::with_allocator_of(
        state, ptr, "base_allocation", [&](cistern::DeviceAllocator& allocator) {
          const auto [segment, bytes] = allocator.base_allocation(ptr);
          base = segment;
          if (size != nullptr) *size = bytes;
        });
  });
  return base;
}

int cistern_begin_allocate_to_pool(int device, uint64_t pool_first, uint64_t pool_second,
                                   cistern_stream_filter filter, void* context) {
  return guarded([&] {
    cistern::plugin::StreamFilter accepts;
    if (filter != nullptr) {
      accepts = [filter, context](Stream s) {
        return filter(context, s.native<CUstream_st>()) != 0;
      };
    }
    PluginState::get().pools(device).begin({pool_first, pool_second}, std::move(accepts));
  });
}

int cistern_end_allocate_to_pool(int device, uint64_t pool_first, uint64_t pool_second) {
  return guarded([&] { PluginState::get().pools(device).end({pool_first, pool_second}); });
}

int cistern_release_pool(int device, uint64_t pool_first, uint64_t pool_second) {
  return guarded([&] { PluginState::get().pools(device).release({pool_first, pool_second}); });
}

void cistern_torch_begin_allocate_to_pool(int device,
                                          std::pair<unsigned long long, unsigned long long> pool,
                                          std::function<bool(cistern_stream_t)> filter) {
  std::string message;
  const int code = guarded(
      [&] {
        cistern::plugin::StreamFilter accepts;
        if (filter) {
          accepts = [filter = std::move(filter)](Stream s) {
            return filter(s.native<CUstream_st>());
          };
        }
        PluginState::get().pools(device).begin(pool, std::move(accepts));
      },
      &message);
  if (code != CISTERN_OK) {
    throw std::runtime_error(message.empty() ? "cistern: begin_allocate_to_pool failed" : message);
  }
}

void cistern_torch_end_allocate_to_pool(int device,
                                        std::pair<unsigned long long, unsigned long long> pool) {
  guarded([&] { PluginState::get().pools(device).end(pool); });
}

void cistern_torch_release_pool(int device,
                                std::pair<unsigned long long, unsigned long long> pool) {
  guarded([&] { PluginState::get().pools(device).release(pool); });
}

size_t cistern_memory_stats_json(int device, char* buffer, size_t capacity) {
  std::size_t length = 0;
  guarded([&] {
    if (device < 0 || device >= cistern::plugin::kMaxDevices) {
      throw cistern::InvalidArgument("cistern: memory_stats: device " + std::to_string(device) +
                                     " is out of range");
    }
    PluginState& state = PluginState::get();
    const cistern::DeviceAllocator* allocator = state.existing(device);
    cistern::Stats stats = allocator != nullptr ? allocator->stats() : cistern::Stats{};
    if (const cistern::plugin::GraphPools* pools = state.existing_pools(device)) {
      cistern::plugin::add_stats(stats, pools->stats());
    }
    length = cistern::plugin::copy_out(cistern::plugin::stats_json(stats), buffer, capacity);
  });
  return length;
}

int cistern_reset_peak_stats(int device) {
  return guarded([&] {
    PluginState::get().allocator(device).reset_peak_stats();
    PluginState::get().pools(device).reset_peak_stats();
  });
}

int cistern_reset_accumulated_stats(int device) {
  return guarded([&] {
    PluginState::get().allocator(device).reset_accumulated_stats();
    PluginState::get().pools(device).reset_accumulated_stats();
  });
}

int cistern_record_history(int enabled, size_t max_entries) {
  return guarded(
      [&] { PluginState::get().record_history(enabled != 0, entries_or_default(max_entries)); });
}

int cistern_check(int device) {
  return guarded([&] {
    if (device < 0 || device >= cistern::plugin::kMaxDevices) {
      throw cistern::InvalidArgument("cistern: check: device " + std::to_string(device) +
                                     " is out of range");
    }
    if (const cistern::DeviceAllocator* allocator = PluginState::get().existing(device)) {
      allocator->check();
      PluginState::get().existing_pools(device)->check();
    }
  });
}

int cistern_write_snapshot(const char* path) {
  return guarded([&] {
    if (path == nullptr || *path == '\0') {
      throw cistern::InvalidArgument("cistern: write_snapshot needs a file path");
    }
    PluginState& state = PluginState::get();
    std::vector<cistern::DeviceRecord> devices;
    for (cistern::DeviceAllocator* allocator : state.all()) {
      cistern::DeviceRecord record;
      record.device = allocator->device_index();
      record.snapshot = allocator->snapshot();
      state.existing_pools(record.device)->add_segments(record.snapshot);
      record.history = allocator->history();
      cistern::plugin::stack_log().attach(record);
      devices.push_back(std::move(record));
    }
    cistern::write_pytorch_snapshot(path, devices, state.config());
  });
}

int cistern_set_stack_hook(cistern_stack_hook hook, size_t max_entries) {
  return guarded(
      [&] { cistern::plugin::stack_log().set_hook(hook, entries_or_default(max_entries)); });
}

int cistern_set_native_stacks(int enabled, size_t max_entries) {
  return guarded([&] {
    cistern::plugin::stack_log().set_native(enabled != 0, entries_or_default(max_entries));
  });
}

int cistern_add_stack(size_t count, const char* const* filenames, const int64_t* lines,
                      const char* const* names, uint32_t* id) {
  return guarded([&] {
    if (id == nullptr) throw cistern::InvalidArgument("cistern: add_stack: null id");
    *id = cistern::plugin::stack_log().add_stack(count, filenames, lines, names);
  });
}

int cistern_last_error_code(void) {
  cistern_error code = CISTERN_OK;
  guarded([&] { code = PluginState::get().errors().code(); });
  return code;
}

size_t cistern_last_error(char* buffer, size_t capacity) {
  std::size_t length = 0;
  guarded([&] {
    length = cistern::plugin::copy_out(PluginState::get().errors().message(), buffer, capacity);
  });
  return length;
}

uint64_t cistern_misuse_count(void) {
  std::uint64_t count = 0;
  guarded([&] { count = PluginState::get().errors().misuse_count(); });
  return count;
}

void cistern_clear_error(void) {
  guarded([&] { PluginState::get().errors().clear(); });
}

const char* cistern_backend(void) {
  const char* name = "";
  guarded([&] {
    name = PluginState::get().backend() == cistern::plugin::Backend::sim ? "sim" : "cuda";
  });
  return name;
}

const char* cistern_version(void) { return CISTERN_VERSION; }

void cistern_shutdown(void) {
  guarded([&] { PluginState::shutdown(); });
  cistern::plugin::stack_log().clear();  // the logged addresses were the allocators'
}

cistern_stream_t cistern_sim_create_stream(int device) {
  cistern_stream_t stream = nullptr;
  guarded([&] { stream = PluginState::get().sim(device).create_stream().native<CUstream_st>(); });
  return stream;
}

int cistern_sim_launch(int device, cistern_stream_t stream, uint64_t ns) {
  return guarded([&] { PluginState::get().sim(device).launch(Stream(stream), ns); });
}

int cistern_sim_refuse_next_map(int device) {
  return guarded([&] {
    PluginState::get().sim(device).fail_nth(cistern::DeviceOp::map, 1,
                                            cistern::Status::not_supported);
  });
}

int cistern_sim_set_capturing(int device, cistern_stream_t stream, int capturing) {
  return guarded([&] {
    PluginState& state = PluginState::get();
    state.sim(device);  // refuses another backend
    cistern::plugin::require_known_stream(state, device, Stream(stream), "sim_set_capturing");
    state.capture(device).mark(Stream(stream), capturing != 0);
  });
}

int cistern_sim_synchronize(int device) {
  return guarded([&] {
    const cistern::Status status = PluginState::get().sim(device).synchronize_device();
    if (status != cistern::Status::ok) {
      throw cistern::DeviceError("synchronize_device", "cistern: simulated synchronize failed");
    }
  });
}

}  // extern "C"
