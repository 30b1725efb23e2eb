// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// SimDevice: the device contract on a simulated GPU (see include/cistern/sim_device.hpp).
//
// Memory state lives in `SimDevice::State` behind one mutex; the virtual clock, streams and
// events live in a `SimClock` that needs no lock to record, query or wait, so that threads driving
// their own streams and events (an allocator's cross-stream frees) do not serialise on the
// device. Every contract call goes through `State::call` (under the mutex) or
// `State::call_unlocked` (stream and event calls other than creation and destruction), which
// count it, apply fault injection, run the operation and count a failure; the operations
// themselves validate everything before they change anything, so that a failed call leaves the
// device exactly as it was.
#include "cistern/sim_device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <unordered_map>

#include "cistern/errors.hpp"
#include "sim/call_counters.hpp"
#include "sim/sim_clock.hpp"

namespace cistern {
namespace {

/// The most recent failure on this thread and the device that reported it. Devices are told apart
/// by a serial number, never reused (an address could be), so one device never shows another's
/// error.
struct LastError {
  std::uint64_t device = 0;
  std::string detail;
};
thread_local LastError t_last_error;

std::atomic<std::uint64_t> g_next_device_serial{1};

bool is_power_of_two(std::size_t value) { return value != 0 && (value & (value - 1)) == 0; }

/// Whether a status is an error (`not_ready` is an answer, not an error).
bool is_failure(Status status) { return status != Status::ok && status != Status::not_ready; }

std::uintptr_t address_of(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

void* pointer_to(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

/// A live range of the simulated address space, [start, end), keyed by start in an ordered map.
struct AddressRange {
  enum class Kind { segment, reservation, page };
  std::uintptr_t end = 0;
  Kind kind = Kind::segment;
  std::size_t charged = 0;  ///< capacity held: whole granules for a segment or page, 0 for a
                            ///< reservation
};

/// A granule shared by small allocations (SimDeviceOptions::pack_small_allocations), as the
/// driver packs small cudaMalloc requests: each is 512-byte aligned, the granule is charged once
/// and returned when its last allocation is freed.
struct Page {
  std::map<std::uintptr_t, std::size_t> blocks;  ///< start -> size (512-byte multiples)
  std::size_t used = 0;
};

/// Alignment and size unit of packed small allocations.
constexpr std::size_t kPackUnit = 512;

/// One `map` call: [start, end) of a reservation backed by the whole of a physical handle.
struct Mapping {
  std::uintptr_t end = 0;
  std::uint64_t handle = 0;
};

/// Physical memory from `create_physical`. It exists (and is charged) until it is released and
/// its last mapping is gone, as with `cuMemRelease`.
struct PhysicalMemory {
  std::size_t bytes = 0;
  std::size_t mappings = 0;  ///< live mappings of it (a handle may be mapped at several addresses)
  bool released = false;
};

/// The faults armed for one operation. A later `fail_nth` replaces an earlier one.
struct Fault {
  std::uint64_t countdown = 0;  ///< calls until the injected failure (1: the next); 0: none armed
  Status nth_status = Status::out_of_memory;
  double probability = 0.0;
  Status random_status = Status::out_of_memory;
};

/// Whether [start, end) overlaps any range of `ranges`, a map from start to a value with `end`.
/// Invariant relied on: the ranges are disjoint, so only the neighbours of `start` can overlap.
template <class Ranges>
bool overlaps(const Ranges& ranges, std::uintptr_t start, std::uintptr_t end) {
  const auto next = ranges.upper_bound(start);
  if (next != ranges.end() && next->first < end) return true;
  return next != ranges.begin() && std::prev(next)->second.end > start;
}

/// The range of `ranges` that contains `address`, or `ranges.end()`.
template <class Ranges>
auto find_containing(Ranges& ranges, std::uintptr_t address) {
  auto next = ranges.upper_bound(address);
  if (next == ranges.begin()) return ranges.end();
  auto candidate = std::prev(next);
  return candidate->second.end > address ? candidate : ranges.end();
}

/// The lowest address of [lo, hi) aligned to `alignment` (a power of two) with room for `bytes`.
std::optional<std::uintptr_t> fit_in_gap(std::uintptr_t lo, std::uintptr_t hi, std::size_t bytes,
                                         std::size_t alignment) {
  if (lo >= hi) return std::nullopt;
  const std::uintptr_t candidate = (lo + alignment - 1) & ~(std::uintptr_t{alignment} - 1);
  if (candidate < lo || candidate > hi || hi - candidate < bytes) return std::nullopt;
  return candidate;
}

void validate(const SimDeviceOptions& options) {
  const std::size_t unit = options.granularity;
  if (!is_power_of_two(unit) || unit < 512) {
    throw InvalidArgument(
        fmt::format("SimDevice: granularity must be a power of two >= 512, got {}", unit));
  }
  if (options.base_address == 0 || options.base_address % unit != 0) {
    throw InvalidArgument(
        fmt::format("SimDevice: base_address {:#x} must be non-zero and granule aligned",
                    options.base_address));
  }
  if (options.address_space == 0 || options.address_space % unit != 0 ||
      options.base_address > std::numeric_limits<std::uintptr_t>::max() - options.address_space) {
    throw InvalidArgument(fmt::format(
        "SimDevice: address_space {:#x} must be a positive multiple of the granularity that fits "
        "above base_address",
        options.address_space));
  }
}

}  // namespace

static_assert(kDeviceOpCount <= 32, "State::armed has a bit per operation");

struct SimDevice::State {
  explicit State(const SimDeviceOptions& opts)
      : options(opts), serial(g_next_device_serial.fetch_add(1)), rng(opts.seed) {}

  const SimDeviceOptions options;
  const std::uint64_t serial;
  mutable std::mutex mutex;

  // --- memory. Invariants: `ranges` are disjoint and granule aligned (segments and reservations
  // share one map so that neither is ever given the other's addresses); `mappings` are disjoint
  // and each lies inside one reservation; used == segment charges + bytes of existing physical
  // memory <= capacity.
  std::map<std::uintptr_t, AddressRange> ranges;
  std::map<std::uintptr_t, Mapping> mappings;
  std::unordered_map<std::uint64_t, PhysicalMemory> physical;
  std::uint64_t next_physical = 1;
  std::size_t segments = 0;
  std::size_t reservations = 0;
  std::size_t used = 0;
  std::size_t peak = 0;
  std::function<std::uintptr_t(std::size_t)> address_plan;      // preferred segment addresses
  std::function<std::uintptr_t(std::size_t)> reservation_plan;  // preferred reservation bases
  std::map<std::uintptr_t, Page> pages;  // shared granules of packed small allocations

  // --- the virtual clock, streams and events: lock-free, but creation and destruction are made
  // under the mutex.
  detail::SimClock clock;

  // --- fault injection (under the mutex) and counters (lock-free). Bit `op` of `armed` is set
  // while `faults[op]` may fail a call, so that a lock-free call looks at `faults` (under the
  // mutex) only then.
  std::array<Fault, kDeviceOpCount> faults{};
  std::atomic<std::uint32_t> armed{0};
  std::mt19937_64 rng;
  detail::CallCounters counters;

  // --- the call wrapper --------------------------------------------------------------------------

  /// Runs one contract call under the lock: counts it, injects a fault or runs `body`, and counts
  /// a failure. Never throws: an exception (out of host memory) becomes `device_error`.
  template <class Body>
  Status call(DeviceOp op, Body&& body) noexcept {
    counters.count_call(op);
    std::lock_guard<std::mutex> lock(mutex);
    const Status status = run(op, body, /*locked=*/true);
    if (is_failure(status)) counters.count_failure(op);
    return status;
  }

  /// As `call`, for a body that needs no lock: the mutex is taken only to inject a fault.
  template <class Body>
  Status call_unlocked(DeviceOp op, Body&& body) noexcept {
    counters.count_call(op);
    const Status status = run(op, body, /*locked=*/false);
    if (is_failure(status)) counters.count_failure(op);
    return status;
  }

  template <class Body>
  Status run(DeviceOp op, Body& body, bool locked) noexcept {
    if ((armed.load(std::memory_order_acquire) & op_bit(op)) != 0) {
      if (const auto injected = inject_fault(op, locked)) return *injected;
    }
    try {
      return body();
    } catch (const std::exception& error) {
      return fail_without_throwing(op, error.what());
    }
  }

  /// The injected failure of this call of `op` (reported as such), if one is due; takes the
  /// mutex for it unless `locked` (the caller holds it). Out of line: the calls without a fault
  /// stay short.
  [[gnu::noinline]] std::optional<Status> inject_fault(DeviceOp op, bool locked) noexcept {
    try {
      std::unique_lock<std::mutex> lock(mutex, std::defer_lock);
      if (!locked) lock.lock();
      const std::optional<Status> injected = take_injected_fault(op);
      if (!injected) return std::nullopt;
      return fail(*injected,
                  fmt::format("{}: injected fault ({})", to_string(op), to_string(*injected)));
    } catch (const std::exception& error) {
      return fail_without_throwing(op, error.what());
    }
  }

  static std::uint32_t op_bit(DeviceOp op) { return std::uint32_t{1} << static_cast<int>(op); }

  /// Mutex held. The injected failure of this call of `op`, if one is due. Draws from the
  /// generator only when a probability is set, so that unrelated calls do not change a seeded
  /// sequence.
  std::optional<Status> take_injected_fault(DeviceOp op) {
    Fault& fault = faults[static_cast<std::size_t>(op)];
    std::optional<Status> injected;
    if (fault.countdown > 0 && --fault.countdown == 0) {
      injected = fault.nth_status;
    } else if (fault.probability > 0.0 &&
               std::uniform_real_distribution<double>(0.0, 1.0)(rng) < fault.probability) {
      injected = fault.random_status;
    }
    update_armed(op);
    return injected;
  }

  /// Mutex held: sets or clears `op`'s bit of `armed` after its fault changed.
  void update_armed(DeviceOp op) {
    const Fault& fault = faults[static_cast<std::size_t>(op)];
    if (fault.countdown > 0 || fault.probability > 0.0) {
      armed.fetch_or(op_bit(op), std::memory_order_release);
    } else {
      armed.fetch_and(~op_bit(op), std::memory_order_release);
    }
  }

  Status fail(Status status, const std::string& detail) {
    t_last_error.detail = fmt::format("sim:{} {}", options.index, detail);
    t_last_error.device = serial;
    return status;
  }

  Status invalid(const std::string& detail) { return fail(Status::invalid_argument, detail); }

  Status fail_without_throwing(DeviceOp op, const char* what) noexcept {
    try {
      fail(Status::device_error, fmt::format("{}: {}", to_string(op), what));
    } catch (...) {
      t_last_error.detail.clear();  // no memory for a message: better empty than stale
      t_last_error.device = serial;
    }
    return Status::device_error;
  }

  Status unsupported(DeviceOp op) {
    return fail(Status::not_supported,
                fmt::format("{}: virtual memory is not supported by this device "
                            "(SimDeviceOptions::virtual_memory is false)",
                            to_string(op)));
  }

  // --- capacity and address space ----------------------------------------------------------------

  std::size_t free_bytes() const { return options.capacity - used; }

  bool granule_aligned(std::uintptr_t value) const { return value % options.granularity == 0; }

  /// `bytes` rounded up to whole granules; saturates instead of wrapping, so a huge request still
  /// compares as larger than any capacity.
  std::size_t charge_for(std::size_t bytes) const {
    const std::size_t unit = options.granularity;
    if (bytes > std::numeric_limits<std::size_t>::max() - (unit - 1)) {
      return std::numeric_limits<std::size_t>::max();
    }
    return (bytes + unit - 1) / unit * unit;
  }

  void charge(std::size_t bytes) {
    used += bytes;
    peak = std::max(peak, used);
  }

  /// Lowest-address first fit over the gaps between live ranges, as a driver reuses freed virtual
  /// addresses. Ranges adopted outside [base, base + space) are stepped over.
  std::optional<std::uintptr_t> find_free_address(std::size_t bytes, std::size_t alignment) const {
    const std::uintptr_t limit = options.base_address + options.address_space;
    std::uintptr_t gap_start = options.base_address;
    for (const auto& [start, range] : ranges) {
      if (range.end <= gap_start) continue;
      if (start >= limit) break;
      if (const auto fit = fit_in_gap(gap_start, start, bytes, alignment)) return fit;
      gap_start = range.end;
    }
    return fit_in_gap(gap_start, limit, bytes, alignment);
  }

  /// Takes [address, address + charged) as a segment. The caller has checked room and capacity.
  void add_segment(std::uintptr_t address, std::size_t charged) {
    ranges.emplace(address, AddressRange{address + charged, AddressRange::Kind::segment, charged});
    ++segments;
    charge(charged);
  }

  // --- segments ----------------------------------------------------------------------------------

  Status allocate(std::size_t bytes, void** ptr) {
    if (ptr == nullptr) return invalid("allocate: the result pointer is null");
    if (bytes == 0) return invalid("allocate(0 bytes): the size must be positive");
    if (options.pack_small_allocations && bytes <= options.granularity / 2) {
      return allocate_packed(bytes, ptr);
    }
    const std::size_t charged = charge_for(bytes);
    if (charged > free_bytes()) {
      return fail(Status::out_of_memory,
                  fmt::format("allocate({}): out of memory: {} free of {}", format_bytes(bytes),
                              format_bytes(free_bytes()), format_bytes(options.capacity)));
    }
    auto address = planned_address(charged);
    if (!address) address = find_free_address(charged, options.granularity);
    if (!address) {
      return fail(Status::out_of_memory,
                  fmt::format("allocate({}): out of address space", format_bytes(bytes)));
    }
    add_segment(*address, charged);
    *ptr = pointer_to(*address);
    return Status::ok;
  }

  // The address the plan prefers for a segment, if it has one and it is usable.
  std::optional<std::uintptr_t> planned_address(std::size_t charged) const {
    if (!address_plan) return std::nullopt;
    const std::uintptr_t address = address_plan(charged);
    if (address == 0 || !granule_aligned(address) ||
        charged > std::numeric_limits<std::uintptr_t>::max() - address ||
        overlaps(ranges, address, address + charged)) {
      return std::nullopt;
    }
    return address;
  }

  Status allocate_at(void* ptr, std::size_t bytes) {
    const std::uintptr_t address = address_of(ptr);
    if (bytes == 0) return invalid("allocate_at: the size must be positive");
    if (address == 0 || !granule_aligned(address)) {
      return invalid(
          fmt::format("allocate_at({:#x}): the address must be non-null and aligned to "
                      "the granularity ({})",
                      address, format_bytes(options.granularity)));
    }
    const std::size_t charged = charge_for(bytes);
    if (charged > std::numeric_limits<std::uintptr_t>::max() - address) {
      return invalid(fmt::format("allocate_at({:#x}, {}): the range wraps around", address,
                                 format_bytes(bytes)));
    }
    if (overlaps(ranges, address, address + charged)) {
      return invalid(
          fmt::format("allocate_at({:#x}, {}): the range overlaps a live segment or "
                      "reservation",
                      address, format_bytes(bytes)));
    }
    if (charged > free_bytes()) {
      return fail(Status::out_of_memory,
                  fmt::format("allocate_at({:#x}, {}): out of memory: {} free of {}", address,
                              format_bytes(bytes), format_bytes(free_bytes()),
                              format_bytes(options.capacity)));
    }
    add_segment(address, charged);
    return Status::ok;
  }

  // A small allocation placed in the first page (by address) with a gap for it, or a new page.
  Status allocate_packed(std::size_t bytes, void** ptr) {
    const std::size_t size = (bytes + kPackUnit - 1) / kPackUnit * kPackUnit;
    for (auto& [base, page] : pages) {
      if (options.granularity - page.used < size) continue;
      if (const auto at = gap_in_page(base, page, size)) {
        place_packed(page, *at, size, ptr);
        return Status::ok;
      }
    }
    if (options.granularity > free_bytes()) {
      return fail(Status::out_of_memory,
                  fmt::format("allocate({}): out of memory: {} free of {}", format_bytes(bytes),
                              format_bytes(free_bytes()), format_bytes(options.capacity)));
    }
    const auto address = find_free_address(options.granularity, options.granularity);
    if (!address) {
      return fail(Status::out_of_memory,
                  fmt::format("allocate({}): out of address space", format_bytes(bytes)));
    }
    ranges.emplace(*address, AddressRange{*address + options.granularity, AddressRange::Kind::page,
                                          options.granularity});
    charge(options.granularity);
    place_packed(pages[*address], *address, size, ptr);
    return Status::ok;
  }

  // The lowest start in `page` with `size` free bytes after it.
  std::optional<std::uintptr_t> gap_in_page(std::uintptr_t base, const Page& page,
                                            std::size_t size) const {
    std::uintptr_t cursor = base;
    for (const auto& [start, block_size] : page.blocks) {
      if (start - cursor >= size) return cursor;
      cursor = start + block_size;
    }
    if (base + options.granularity - cursor >= size) return cursor;
    return std::nullopt;
  }

  void place_packed(Page& page, std::uintptr_t at, std::size_t size, void** ptr) {
    page.blocks.emplace(at, size);
    page.used += size;
    ++segments;
    *ptr = pointer_to(at);
  }

  // Frees a packed allocation; the page goes back to the device with its last allocation.
  Status deallocate_packed(std::uintptr_t address,
                           std::map<std::uintptr_t, AddressRange>::iterator holder) {
    Page& page = pages.at(holder->first);
    const auto block = page.blocks.find(address);
    if (block == page.blocks.end()) {
      return invalid(
          fmt::format("deallocate({:#x}): not the start of an allocation in the shared "
                      "page at {:#x}",
                      address, holder->first));
    }
    clock.synchronize_all();  // like cudaFree
    page.used -= block->second;
    page.blocks.erase(block);
    --segments;
    if (page.blocks.empty()) {
      used -= holder->second.charged;
      pages.erase(holder->first);
      ranges.erase(holder);
    }
    return Status::ok;
  }

  Status deallocate(void* ptr) {
    const std::uintptr_t address = address_of(ptr);
    const auto holder = find_containing(ranges, address);
    if (holder != ranges.end() && holder->second.kind == AddressRange::Kind::page) {
      return deallocate_packed(address, holder);
    }
    const auto found = ranges.find(address);
    if (found == ranges.end() || found->second.kind != AddressRange::Kind::segment) {
      return invalid(fmt::format("deallocate({:#x}): {}", address, describe_bad_segment(address)));
    }
    clock.synchronize_all();  // like cudaFree: all work on all streams completes first
    used -= found->second.charged;
    --segments;
    ranges.erase(found);
    return Status::ok;
  }

  /// Why `address` cannot be deallocated, for the error message.
  std::string describe_bad_segment(std::uintptr_t address) const {
    const auto holder = find_containing(ranges, address);
    if (holder == ranges.end()) return "not a live segment from allocate";
    if (holder->second.kind == AddressRange::Kind::reservation) {
      return fmt::format("inside the reservation at {:#x} (use release_reservation)",
                         holder->first);
    }
    return fmt::format("inside the segment at {:#x}, not its base", holder->first);
  }

  // --- virtual memory ----------------------------------------------------------------------------

  Status reserve(std::size_t bytes, std::size_t alignment, void** va) {
    if (!options.virtual_memory) return unsupported(DeviceOp::reserve);
    if (va == nullptr) return invalid("reserve: the result pointer is null");
    if (alignment == 0) alignment = options.granularity;
    if (bytes == 0 || !granule_aligned(bytes)) {
      return invalid(
          fmt::format("reserve({}): the size must be a positive multiple of the "
                      "granularity ({})",
                      format_bytes(bytes), format_bytes(options.granularity)));
    }
    if (!is_power_of_two(alignment) || alignment < options.granularity) {
      return invalid(
          fmt::format("reserve: alignment {} must be a power of two multiple of the "
                      "granularity ({})",
                      alignment, format_bytes(options.granularity)));
    }
    auto address = planned_reservation(bytes, alignment);
    if (!address) address = find_free_address(bytes, alignment);
    if (!address) {
      return fail(Status::out_of_memory,
                  fmt::format("reserve({}): out of address space", format_bytes(bytes)));
    }
    add_reservation(*address, bytes);
    *va = pointer_to(*address);
    return Status::ok;
  }

  // The address the reservation plan prefers for a range, if it has one and it is usable.
  std::optional<std::uintptr_t> planned_reservation(std::size_t bytes,
                                                    std::size_t alignment) const {
    if (!reservation_plan) return std::nullopt;
    const std::uintptr_t address = reservation_plan(bytes);
    if (address == 0 || address % alignment != 0 ||
        bytes > std::numeric_limits<std::uintptr_t>::max() - address ||
        overlaps(ranges, address, address + bytes)) {
      return std::nullopt;
    }
    return address;
  }

  void add_reservation(std::uintptr_t address, std::size_t bytes) {
    ranges.emplace(address, AddressRange{address + bytes, AddressRange::Kind::reservation, 0});
    ++reservations;
  }

  Status reserve_at(void* ptr, std::size_t bytes) {
    if (!options.virtual_memory) return unsupported(DeviceOp::reserve);
    const std::uintptr_t address = address_of(ptr);
    if (address == 0 || !granule_aligned(address) || bytes == 0 || !granule_aligned(bytes)) {
      return invalid(
          fmt::format("reserve_at({:#x}, {}): the address and size must be non-zero multiples "
                      "of the granularity ({})",
                      address, format_bytes(bytes), format_bytes(options.granularity)));
    }
    if (bytes > std::numeric_limits<std::uintptr_t>::max() - address) {
      return invalid(fmt::format("reserve_at({:#x}, {}): the range wraps around", address,
                                 format_bytes(bytes)));
    }
    if (overlaps(ranges, address, address + bytes)) {
      return invalid(
          fmt::format("reserve_at({:#x}, {}): the range overlaps a live segment or reservation",
                      address, format_bytes(bytes)));
    }
    add_reservation(address, bytes);
    return Status::ok;
  }

  Status release_reservation(void* va, std::size_t bytes) {
    if (!options.virtual_memory) return unsupported(DeviceOp::release_reservation);
    const std::uintptr_t start = address_of(va);
    const auto found = ranges.find(start);
    if (found == ranges.end() || found->second.kind != AddressRange::Kind::reservation ||
        found->second.end - start != bytes) {
      return invalid(
          fmt::format("release_reservation({:#x}, {}): not a live reservation of that "
                      "address and size",
                      start, format_bytes(bytes)));
    }
    if (overlaps(mappings, start, found->second.end)) {
      return invalid(
          fmt::format("release_reservation({:#x}): the reservation still has mappings; "
                      "unmap them first",
                      start));
    }
    ranges.erase(found);
    --reservations;
    return Status::ok;
  }

  Status create_physical(std::size_t bytes, PhysicalHandle* handle) {
    if (!options.virtual_memory) return unsupported(DeviceOp::create_physical);
    if (handle == nullptr) return invalid("create_physical: the result handle is null");
    if (bytes == 0 || !granule_aligned(bytes)) {
      return invalid(
          fmt::format("create_physical({}): the size must be a positive multiple of the "
                      "granularity ({})",
                      format_bytes(bytes), format_bytes(options.granularity)));
    }
    if (bytes > free_bytes()) {
      return fail(
          Status::out_of_memory,
          fmt::format("create_physical({}): out of memory: {} free of {}", format_bytes(bytes),
                      format_bytes(free_bytes()), format_bytes(options.capacity)));
    }
    physical.emplace(next_physical, PhysicalMemory{bytes, 0, false});
    charge(bytes);
    handle->handle = next_physical++;
    handle->bytes = bytes;
    return Status::ok;
  }

  Status release_physical(PhysicalHandle handle) {
    if (!options.virtual_memory) return unsupported(DeviceOp::release_physical);
    const auto found = physical.find(handle.handle);
    if (found == physical.end() || found->second.released) {
      return invalid(
          fmt::format("release_physical: unknown or already released handle {:#x}", handle.handle));
    }
    found->second.released = true;
    free_physical_if_unused(found);
    return Status::ok;
  }

  /// Returns a physical allocation's memory once it is released and no mapping uses it.
  void free_physical_if_unused(std::unordered_map<std::uint64_t, PhysicalMemory>::iterator it) {
    if (!it->second.released || it->second.mappings > 0) return;
    used -= it->second.bytes;
    physical.erase(it);
  }

  Status map(void* va, PhysicalHandle handle) {
    if (!options.virtual_memory) return unsupported(DeviceOp::map);
    const std::uintptr_t start = address_of(va);
    const auto phys = physical.find(handle.handle);
    if (phys == physical.end() || phys->second.released) {
      return invalid(fmt::format("map: unknown or released physical handle {:#x}", handle.handle));
    }
    const std::size_t bytes = phys->second.bytes;
    if (handle.bytes < bytes) {
      // The driver maps a handle only whole: cuMemMap of part of one is CUDA_ERROR_NOT_SUPPORTED.
      return fail(
          Status::not_supported,
          fmt::format("map({:#x}, handle {:#x} of {}): {} is part of the handle; a handle "
                      "is mapped only whole, from its offset 0",
                      start, handle.handle, format_bytes(bytes), format_bytes(handle.bytes)));
    }
    if (handle.bytes > bytes) {
      return invalid(fmt::format("map({:#x}, handle {:#x}): {} is more than the handle's {}", start,
                                 handle.handle, format_bytes(handle.bytes), format_bytes(bytes)));
    }
    if (!granule_aligned(start)) {
      return invalid(
          fmt::format("map({:#x}, {}): the address must be a multiple of the "
                      "granularity ({})",
                      start, format_bytes(bytes), format_bytes(options.granularity)));
    }
    const auto reservation = find_containing(ranges, start);
    if (reservation == ranges.end() ||
        reservation->second.kind != AddressRange::Kind::reservation ||
        reservation->second.end - start < bytes) {
      return invalid(fmt::format("map({:#x}, {}): the range is not inside one reservation", start,
                                 format_bytes(bytes)));
    }
    if (overlaps(mappings, start, start + bytes)) {
      return invalid(fmt::format("map({:#x}, {}): part of the range is already mapped", start,
                                 format_bytes(bytes)));
    }
    mappings.emplace(start, Mapping{start + bytes, handle.handle});
    ++phys->second.mappings;
    return Status::ok;
  }

  /// Why a run of `count` handles from `va` must be refused as a whole, if it must: none to map,
  /// or a run that does not lie inside one reservation (its access is granted in one step over
  /// the run, as one cuMemSetAccess). Each handle is checked by its own `map` after this.
  std::optional<Status> refuse_run(void* va, const PhysicalHandle* handles, std::size_t count) {
    if (!options.virtual_memory) return unsupported(DeviceOp::map);
    const std::uintptr_t start = address_of(va);
    if (count == 0 || handles == nullptr) {
      return invalid(fmt::format("map_run({:#x}): no handle to map", start));
    }
    std::size_t total = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (handles[i].bytes > std::numeric_limits<std::uintptr_t>::max() - start - total) {
        return invalid(
            fmt::format("map_run({:#x}, {} handles): the run wraps around", start, count));
      }
      total += handles[i].bytes;
    }
    const auto reservation = find_containing(ranges, start);
    if (reservation != ranges.end() &&
        reservation->second.kind == AddressRange::Kind::reservation &&
        reservation->second.end - start < total) {
      return invalid(
          fmt::format("map_run({:#x}, {} in {} handles): the run is not inside one "
                      "reservation",
                      start, format_bytes(total), count));
    }
    return std::nullopt;  // the rest is each map's to check
  }

  Status unmap(void* va, std::size_t bytes) {
    if (!options.virtual_memory) return unsupported(DeviceOp::unmap);
    const std::uintptr_t start = address_of(va);
    if (bytes == 0 || !granule_aligned(start) || !granule_aligned(bytes) ||
        start > std::numeric_limits<std::uintptr_t>::max() - bytes) {
      return invalid(
          fmt::format("unmap({:#x}, {}): address and size must be multiples of the "
                      "granularity and the size positive",
                      start, bytes));
    }
    const std::uintptr_t end = start + bytes;
    // Check the whole range before removing anything, so that a failure changes nothing.
    const auto first = mappings.find(start);
    auto last = first;
    for (std::uintptr_t cursor = start; cursor < end; cursor = (last++)->second.end) {
      if (last == mappings.end() || last->first != cursor) {
        return invalid(fmt::format("unmap({:#x}, {}): {:#x} is not the start of a mapping", start,
                                   format_bytes(bytes), cursor));
      }
      if (last->second.end > end) {
        return invalid(
            fmt::format("unmap({:#x}, {}): would unmap part of the mapping "
                        "[{:#x}, {:#x})",
                        start, format_bytes(bytes), last->first, last->second.end));
      }
    }
    for (auto it = first; it != last; it = mappings.erase(it)) drop_mapping(it->second.handle);
    return Status::ok;
  }

  void drop_mapping(std::uint64_t handle) {
    const auto phys = physical.find(handle);
    --phys->second.mappings;  // exists: memory outlives its mappings
    free_physical_if_unused(phys);
  }

  // --- streams and events ------------------------------------------------------------------------

  /// The stream's completion time, for the simulation methods, which may throw.
  std::uint64_t require_stream(Stream stream, const char* method) const {
    std::uint64_t done_at = 0;
    if (!clock.stream_done_at(stream, &done_at)) throw unknown_stream_error(stream, method);
    return done_at;
  }

  static InvalidArgument unknown_stream_error(Stream stream, const char* method) {
    return InvalidArgument(
        fmt::format("SimDevice::{}: unknown stream {:#x} (streams other than "
                    "0 come from create_stream)",
                    method, stream.handle));
  }

  /// The status of a clock operation's answer, with the message of an unknown handle.
  Status answer(DeviceOp op, detail::ClockAnswer answer, Event event, Stream stream) {
    if (answer == detail::ClockAnswer::ok) return Status::ok;
    if (answer == detail::ClockAnswer::not_ready) return Status::not_ready;
    return unknown_handle(op, answer, event, stream);
  }

  Status unknown_handle(DeviceOp op, detail::ClockAnswer answer, Event event, Stream stream) {
    if (answer == detail::ClockAnswer::unknown_event) {
      return invalid(fmt::format("{}: unknown event {:#x}", to_string(op), event.handle));
    }
    return invalid(fmt::format("{}: unknown stream {:#x}", to_string(op), stream.handle));
  }

  Status create_event(Event* event) {
    if (event == nullptr) return invalid("create_event: the result event is null");
    *event = clock.create_event();
    return Status::ok;
  }

  Status destroy_event(Event event) {
    if (!clock.destroy_event(event)) {
      return answer(DeviceOp::destroy_event, detail::ClockAnswer::unknown_event, event, {});
    }
    return Status::ok;
  }

  Status memory_info(MemoryInfo* info) {
    if (info == nullptr) return invalid("memory_info: the result is null");
    info->total = options.capacity;
    info->free = free_bytes();
    return Status::ok;
  }
};

// --- SimDevice -----------------------------------------------------------------------------------

namespace {
const SimDeviceOptions& validated(const SimDeviceOptions& options) {
  validate(options);
  return options;
}
}  // namespace

SimDevice::SimDevice(SimDeviceOptions options)
    : state_(std::make_unique<State>(validated(options))) {}

SimDevice::~SimDevice() = default;

int SimDevice::index() const noexcept { return state_->options.index; }

std::string SimDevice::name() const {
  return fmt::format("sim:{} ({})", state_->options.index, format_bytes(state_->options.capacity));
}

std::size_t SimDevice::granularity() const noexcept { return state_->options.granularity; }

std::size_t SimDevice::capacity() const noexcept { return state_->options.capacity; }

bool SimDevice::supports_virtual_memory() const noexcept { return state_->options.virtual_memory; }

std::string SimDevice::last_error() const {
  return t_last_error.device == state_->serial ? t_last_error.detail : std::string();
}

Status SimDevice::memory_info(MemoryInfo* info) noexcept {
  return state_->call(DeviceOp::memory_info, [&] { return state_->memory_info(info); });
}

Status SimDevice::allocate(std::size_t bytes, void** ptr) noexcept {
  return state_->call(DeviceOp::allocate, [&] { return state_->allocate(bytes, ptr); });
}

Status SimDevice::deallocate(void* ptr) noexcept {
  return state_->call(DeviceOp::deallocate, [&] { return state_->deallocate(ptr); });
}

Status SimDevice::reserve(std::size_t bytes, std::size_t alignment, void** va) noexcept {
  return state_->call(DeviceOp::reserve, [&] { return state_->reserve(bytes, alignment, va); });
}

Status SimDevice::release_reservation(void* va, std::size_t bytes) noexcept {
  return state_->call(DeviceOp::release_reservation,
                      [&] { return state_->release_reservation(va, bytes); });
}

Status SimDevice::create_physical(std::size_t bytes, PhysicalHandle* handle) noexcept {
  return state_->call(DeviceOp::create_physical,
                      [&] { return state_->create_physical(bytes, handle); });
}

Status SimDevice::release_physical(PhysicalHandle handle) noexcept {
  return state_->call(DeviceOp::release_physical, [&] { return state_->release_physical(handle); });
}

Status SimDevice::map(void* va, PhysicalHandle handle) noexcept {
  return state_->call(DeviceOp::map, [&] { return state_->map(va, handle); });
}

// The contract's default maps handle by handle (each a counted `map` call, as before); the run as
// a whole is checked first, so that a run crossing the end of its reservation is refused as the
// driver's one cuMemSetAccess over it would be, before anything is mapped.
Status SimDevice::map_run(void* va, const PhysicalHandle* handles, std::size_t count) noexcept {
  std::optional<Status> refused;
  try {
    std::lock_guard<std::mutex> lock(state_->mutex);
    refused = state_->refuse_run(va, handles, count);
  } catch (const std::exception& error) {
    refused = state_->fail_without_throwing(DeviceOp::map, error.what());
  }
  if (refused) {
    state_->counters.count_call(DeviceOp::map);
    state_->counters.count_failure(DeviceOp::map);
    return *refused;
  }
  return Device::map_run(va, handles, count);
}

Status SimDevice::unmap(void* va, std::size_t bytes) noexcept {
  return state_->call(DeviceOp::unmap, [&] { return state_->unmap(va, bytes); });
}

Status SimDevice::create_event(Event* event) noexcept {
  return state_->call(DeviceOp::create_event, [&] { return state_->create_event(event); });
}

Status SimDevice::destroy_event(Event event) noexcept {
  return state_->call(DeviceOp::destroy_event, [&] { return state_->destroy_event(event); });
}

// The stream and event calls below take no lock (see SimClock).

Status SimDevice::record_event(Event event, Stream stream) noexcept {
  constexpr DeviceOp op = DeviceOp::record_event;
  return state_->call_unlocked(
      op, [&] { return state_->answer(op, state_->clock.record(event, stream), event, stream); });
}

Status SimDevice::query_event(Event event) noexcept {
  constexpr DeviceOp op = DeviceOp::query_event;
  return state_->call_unlocked(
      op, [&] { return state_->answer(op, state_->clock.query(event), event, {}); });
}

Status SimDevice::synchronize_event(Event event) noexcept {
  constexpr DeviceOp op = DeviceOp::synchronize_event;
  return state_->call_unlocked(
      op, [&] { return state_->answer(op, state_->clock.synchronize_event(event), event, {}); });
}

Status SimDevice::stream_wait_event(Stream stream, Event event) noexcept {
  constexpr DeviceOp op = DeviceOp::stream_wait_event;
  return state_->call_unlocked(op, [&] {
    return state_->answer(op, state_->clock.stream_wait(stream, event), event, stream);
  });
}

Status SimDevice::synchronize_stream(Stream stream) noexcept {
  constexpr DeviceOp op = DeviceOp::synchronize_stream;
  return state_->call_unlocked(
      op, [&] { return state_->answer(op, state_->clock.synchronize_stream(stream), {}, stream); });
}

Status SimDevice::synchronize_device() noexcept {
  return state_->call_unlocked(DeviceOp::synchronize_device, [&] {
    state_->clock.synchronize_all();
    return Status::ok;
  });
}

// --- simulation ----------------------------------------------------------------------------------

void SimDevice::set_address_plan(std::function<std::uintptr_t(std::size_t bytes)> plan) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->address_plan = std::move(plan);
}

void SimDevice::set_reservation_plan(std::function<std::uintptr_t(std::size_t bytes)> plan) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->reservation_plan = std::move(plan);
}

Status SimDevice::reserve_at(void* address, std::size_t bytes) noexcept {
  // Not a contract call, as allocate_at.
  try {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->reserve_at(address, bytes);
  } catch (const std::exception& error) {
    return state_->fail_without_throwing(DeviceOp::reserve, error.what());
  }
}

Status SimDevice::allocate_at(void* address, std::size_t bytes) noexcept {
  // Not a contract call: it rebuilds a recorded state, so it is neither counted nor injected.
  try {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->allocate_at(address, bytes);
  } catch (const std::exception& error) {
    return state_->fail_without_throwing(DeviceOp::allocate, error.what());
  }
}

Stream SimDevice::create_stream() {
  std::lock_guard<std::mutex> lock(state_->mutex);  // creation is serialised (see SimClock)
  return state_->clock.create_stream();
}

// The clock methods below take no lock.

void SimDevice::launch(Stream stream, std::uint64_t duration_ns) {
  if (!state_->clock.launch(stream, duration_ns)) {
    throw State::unknown_stream_error(stream, "launch");
  }
}

void SimDevice::advance(std::uint64_t ns) { state_->clock.advance(ns); }

std::uint64_t SimDevice::now() const { return state_->clock.now(); }

std::uint64_t SimDevice::stream_done_at(Stream stream) const {
  return state_->require_stream(stream, "stream_done_at");
}

bool SimDevice::stream_idle(Stream stream) const {
  const std::uint64_t done_at = state_->require_stream(stream, "stream_idle");
  return state_->clock.now() >= done_at;
}

// --- fault injection -----------------------------------------------------------------------------

namespace {
std::size_t fault_slot(DeviceOp op, Status status, const char* method) {
  const auto slot = static_cast<int>(op);
  if (slot < 0 || slot >= kDeviceOpCount) {
    throw InvalidArgument(fmt::format("SimDevice::{}: unknown operation {}", method, slot));
  }
  if (status == Status::ok) {
    throw InvalidArgument(fmt::format("SimDevice::{}: an injected fault cannot be 'ok'", method));
  }
  return static_cast<std::size_t>(slot);
}
}  // namespace

void SimDevice::fail_nth(DeviceOp op, std::uint64_t nth, Status status) {
  const std::size_t slot = fault_slot(op, status, "fail_nth");
  if (nth == 0) throw InvalidArgument("SimDevice::fail_nth: nth counts from 1 (the next call)");
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->faults[slot].countdown = nth;
  state_->faults[slot].nth_status = status;
  state_->update_armed(op);
}

void SimDevice::fail_with_probability(DeviceOp op, double p, Status status) {
  const std::size_t slot = fault_slot(op, status, "fail_with_probability");
  if (!(p >= 0.0 && p <= 1.0)) {
    throw InvalidArgument(
        fmt::format("SimDevice::fail_with_probability: p must be in [0, 1], got {}", p));
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->faults[slot].probability = p;
  state_->faults[slot].random_status = status;
  state_->update_armed(op);
}

void SimDevice::clear_faults() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->faults.fill(Fault{});
  state_->armed.store(0, std::memory_order_release);
}

// --- observation ---------------------------------------------------------------------------------

SimCounters SimDevice::counters() const { return state_->counters.total(); }

std::size_t SimDevice::used_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->used;
}

std::size_t SimDevice::peak_used_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->peak;
}

std::size_t SimDevice::live_segments() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->segments;
}

std::size_t SimDevice::live_reservations() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->reservations;
}

std::size_t SimDevice::live_physical() const {
  // Physical allocations that still exist: a released handle that is still mapped counts until
  // its last mapping goes, as its memory does in used_bytes().
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->physical.size();
}

std::size_t SimDevice::live_events() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->clock.live_events();
}

}  // namespace cistern
