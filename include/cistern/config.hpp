// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// Allocator configuration: one options table, read three ways.
//
// * In code: fill a `Config` and pass it to `CachingAllocator`.
// * As a string in PyTorch's syntax:
// `Config::parse("max_split_size_mb:512,expandable_segments:True")`
//   (`key=value` is accepted as well as `key:value`; lists are written `[64:8,256:4,>:1]`).
// * From the environment: `Config::from_env()` reads `CISTERN_ALLOC_CONF`.
//
// Unknown keys and bad values are `ConfigError`s that name the key. `options()` describes every
// key (name, type, default, meaning); the README's option list and `--help` come from it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cistern {

/// Number of power-of-two intervals of `roundup_power2_divisions` (1 MiB ... 32 GiB and above).
inline constexpr int kRoundupIntervals = 16;

/// Every allocator setting. Defaults follow PyTorch's native allocator.
struct Config {
  // --- size policy -------------------------------------------------------------------------------
  /// Blocks at least this large are never split; smaller requests never get them
  /// (`max_split_size_mb`). SIZE_MAX: unlimited.
  std::size_t max_split_size = SIZE_MAX;
  /// How much larger than a request of at least `max_split_size` a cached unsplittable block may
  /// be and still serve it (`max_non_split_rounding_mb`).
  std::size_t max_non_split_rounding = 20u << 20;
  /// Divisions per power of two for rounding, per interval [2^(20+i), 2^(21+i)) bytes; 0 or 1:
  /// round to 512 bytes only (`roundup_power2_divisions`).
  std::array<std::uint32_t, kRoundupIntervals> roundup_power2_divisions{};
  /// Segment size for requests above the small size and below `min_large_alloc`
  /// (`large_segment_size_mb`).
  std::size_t large_segment_size = 20u << 20;
  /// Smallest block size (every request is rounded up to a multiple of it).
  std::size_t min_block_size = 512;
  /// Largest request served from the small pool.
  std::size_t small_size = 1u << 20;
  /// Segment size of the small pool.
  std::size_t small_segment_size = 2u << 20;
  /// Requests of at least this size get a segment of their own, rounded to `round_large`.
  std::size_t min_large_alloc = 10u << 20;
  /// Rounding of large segments.
  std::size_t round_large = 2u << 20;

  // --- memory limits and reclamation ---------------------------------------------------------------
  /// Fraction of the device's capacity the allocator may reserve (`per_process_memory_fraction`).
  double memory_fraction = 1.0;
  /// Hard limit on reserved bytes (`memory_limit_mb`); 0: none.
  std::size_t memory_limit = 0;
  /// Reclaim old cached blocks when reserved memory exceeds this fraction of the allowed maximum
  /// (`garbage_collection_threshold`); 0: off. Needs a fraction or limit, as in PyTorch.
  double garbage_collection_threshold = 0.0;

  // --- behaviour -----------------------------------------------------------------------------------
  /// PyTorch's `expandable_segments`: True turns the virtual-memory engine on (as `vmm:true`
  /// does, where the device supports virtual memory).
  bool expandable_segments = false;
  /// The virtual-memory engine (`vmm`): physical memory in whole handles, sized by the room the
  /// device leaves, mapped into reserved address ranges only where blocks need it and reclaimed
  /// from cached free blocks instead of running out of memory. `automatic`: on when the device
  /// supports virtual memory (classic segments if it refuses the engine at its first growth),
  /// `on`: required, `off`: classic segments.
  enum class Vmm : std::uint8_t { automatic, on, off };
  Vmm vmm = Vmm::automatic;
  /// Bytes of unused physical memory (handles inside cached free blocks) the engine keeps; above
  /// it, whole handles go back to the device after a free (`release_threshold_mb`, as
  /// `cudaMemPoolAttrReleaseThreshold`); handles are then at most the pool's handle size.
  /// SIZE_MAX: unlimited.
  std::size_t release_threshold = SIZE_MAX;
  /// The least a growth of the small pool maps when the device has room (`small_handle_size_mb`):
  /// the handle extends over the free rest of its block to this size. Rounded up to the device's
  /// granularity.
  std::size_t small_handle_size = 2u << 20;
  /// The same for the large pool (`large_handle_size_mb`); there a growth extends by up to an
  /// eighth of what the pool holds (a 1024th of the room left at most).
  std::size_t large_handle_size = 8u << 20;
  /// Largest physical handle the engine creates (`max_handle_size_mb`). 0 (`auto`): at most a
  /// 32nd of the room the device and the limit leave after it - one handle per growth with room
  /// to spare (the driver prices access grants and unmaps per mapping), handles that follow the
  /// blocks near the limit - or, with a release threshold, the pool's handle size.
  std::size_t max_handle_size = 0;
  /// Let a stream take a whole cached segment from another stream's pool, ordering itself after
  /// that stream's work with an event, before asking the device (`cross_stream_reuse`).
  bool cross_stream_reuse = true;
  /// Park freed small blocks for the next request of exactly their size, coalescing them only
  /// before the allocator would grow (`park_small_blocks`): about 30% faster on mixed small
  /// sizes, but placements then drift from best fit and the small pool can need a segment more.
  /// Off by default: every placement is PyTorch's best fit.
  bool park_small_blocks = false;
  /// With several streams, publish statistics after every operation so that allocator-wide peaks
  /// are exact (`exact_peaks`); false: in batches (see stats.hpp).
  bool exact_peaks = false;
  /// No caching: one device allocation per request, returned on free (`pass_through`); for
  /// tools such as compute-sanitizer. `make_allocator` serves it with a `PassThroughAllocator`;
  /// `CachingAllocator` refuses it.
  bool pass_through = false;
  /// Accepted for compatibility with PyTorch settings strings; no effect
  /// (`release_lock_on_cudamalloc`).
  bool release_lock_on_cudamalloc = false;

  /// Parses a configuration string, starting from the defaults.
  static Config parse(const std::string& text);
  /// Parses `text` on top of this configuration (later keys override).
  Config& apply(const std::string& text);
  /// Sets one option by name from its textual value.
  Config& set(const std::string& key, const std::string& value);
  /// The defaults with `CISTERN_ALLOC_CONF` applied (and `CISTERN_NO_CACHING=1` meaning
  /// `pass_through:True`).
  static Config from_env();
  /// The configuration in the parse syntax, listing only the options that differ from the
  /// defaults ("" when none do). `Config::parse(c.to_string())` gives back `c` whenever the
  /// code-only fields (`min_block_size` ... `round_large`), which have no key, are at their
  /// defaults.
  std::string to_string() const;
  /// Checks the cross-option rules (for example `max_split_size >= large_segment_size`);
  /// throws `ConfigError` naming the key.
  void validate() const;

  friend bool operator==(const Config& a, const Config& b);
  friend bool operator!=(const Config& a, const Config& b) { return !(a == b); }
};

/// One entry of the options table.
struct OptionInfo {
  std::string name;           ///< the key, e.g. "max_split_size_mb"
  std::string type;           ///< "MiB", "bool", "fraction", "int-or-list", ...
  std::string default_value;  ///< the default, as it would be written
  std::string help;           ///< one sentence
};

/// The options table, in documentation order.
const std::vector<OptionInfo>& options();

/// The options table as a Markdown table (for the README and `--help`).
std::string options_markdown();

}  // namespace cistern
