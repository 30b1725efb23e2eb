# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""torch.cuda.memory_* answered by cistern (cistern.torch.enable() installs them).

Under a pluggable allocator PyTorch's own statistics calls raise (they ask the native caching
allocator, which is no longer there). cistern keeps the same statistics under the same key names,
so these replacements give the answers PyTorch's calls would: `memory_stats` (sorted, as
PyTorch sorts it), `memory_allocated`, `max_memory_allocated`, `memory_reserved`,
`max_memory_reserved`, `reset_peak_memory_stats`, `reset_accumulated_memory_stats` and
`memory_summary` (PyTorch's table, line for line). Each is set on both `torch.cuda` and
`torch.cuda.memory`, where PyTorch defines them; `restore` puts PyTorch's back.
"""
import collections

import cistern

# The calls replaced, by name; the originals are kept in _saved while installed.
NAMES = ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
         "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
         "memory_summary")

_saved = {}  # (module, name) -> PyTorch's function


def device_index(torch, device):
    """The ordinal of `device` as PyTorch's calls take it: None (the current device), an int, a
    torch.device or a string ("cuda:1"; "cuda" is the current device)."""
    if device is None:
        return int(torch.cuda.current_device())
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda":
            raise ValueError("Expected a cuda device, but got: %s" % device)
        return int(index) if index else int(torch.cuda.current_device())
    index = getattr(device, "index", None)
    if getattr(device, "type", "cuda") != "cuda":
        raise ValueError("Expected a cuda device, but got: %s" % (device,))
    return int(torch.cuda.current_device()) if index is None else int(index)


def _format_size(size, reference):
    """A byte count in the unit that suits `reference` (its metric's first row): "  1024 KiB"."""
    unit = "B  "
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if reference < 768 * 1024:
            break
        unit, size, reference = bigger, size // 1024, reference / 1024
    return "%6d %s" % (size, unit)


def _format_count(count, reference):
    """A count in the unit that suits `reference`: "     12   ", "    750 K "."""
    unit = " "
    for bigger in ("K", "M"):
        if reference < 750 * 1000:
            break
        unit, count, reference = bigger, count // 1000, reference / 1000
    return "%7d %s " % (count, unit)


_POOLED = (("allocated_bytes", "Allocated memory", _format_size),
           ("active_bytes", "Active memory", _format_size),
           ("requested_bytes", "Requested memory", _format_size),
           ("reserved_bytes", "GPU reserved memory", _format_size),
           ("inactive_split_bytes", "Non-releasable memory", _format_size),
           ("allocation", "Allocations", _format_count),
           ("active", "Active allocs", _format_count),
           ("segment", "GPU reserved segments", _format_count),
           ("inactive_split", "Non-releasable allocs", _format_count))
_UNPOOLED = (("oversize_allocations", "Oversize allocations", _format_count),
             ("oversize_segments", "Oversize GPU segments", _format_count))
_FIELDS = ("current", "peak", "allocated", "freed")


def _row(name, values, references, formatter):
    cells = " | ".join(formatter(v, r) for v, r in zip(values, references))
    return " %-21s | %s " % (name, cells)


def summary(stats, device, abbreviated=False):
    """torch.cuda.memory_summary()'s text for `stats` (memory_stats' keys) of `device`."""
    rule, double = "-" * 75, "=" * 75
    lines = [double,
             " %16s PyTorch CUDA memory summary, device ID %-17d " % ("", device),
             rule,
             "  %9s CUDA OOMs: %-12d | %6s cudaMalloc retries: %-8d  " % (
                 "", stats["num_ooms"], "", stats["num_alloc_retries"]),
             double,
             "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    pools = [("all", None)] if abbreviated else [
        ("all", None), ("large_pool", "      from large pool"),
        ("small_pool", "      from small pool")]
    for key, name, formatter in _POOLED:
        lines.append(rule)
        # Every pool's row takes its units from the "all" row.
        references = [stats["%s.all.%s" % (key, f)] for f in _FIELDS]
        for pool, label in pools:
            values = [stats["%s.%s.%s" % (key, pool, f)] for f in _FIELDS]
            lines.append(_row(label or name, values, references, formatter))
    for key, name, formatter in _UNPOOLED:
        lines.append(rule)
        values = [stats["%s.%s" % (key, f)] for f in _FIELDS]
        lines.append(_row(name, values, values, formatter))
    lines.append(double)
    return "|" + "|\n|".join(lines) + "|\n"


def _replacements(torch):
    def memory_stats(device=None):
        stats = cistern.memory_stats(device_index(torch, device))
        return collections.OrderedDict(sorted(stats.items()))

    def stat(key):
        return lambda device=None: cistern.memory_stats(device_index(torch, device)).get(key, 0)

    def reset_peak_memory_stats(device=None):
        cistern.reset_peak_memory_stats(device_index(torch, device))

    def reset_accumulated_memory_stats(device=None):
        cistern.reset_accumulated_memory_stats(device_index(torch, device))

    def memory_summary(device=None, abbreviated=False):
        index = device_index(torch, device)
        return summary(cistern.memory_stats(index), index, abbreviated)

    calls = {"memory_stats": memory_stats,
             "memory_allocated": stat("allocated_bytes.all.current"),
             "max_memory_allocated": stat("allocated_bytes.all.peak"),
             "memory_reserved": stat("reserved_bytes.all.current"),
             "max_memory_reserved": stat("reserved_bytes.all.peak"),
             "reset_peak_memory_stats": reset_peak_memory_stats,
             "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
             "memory_summary": memory_summary}
    for name, call in calls.items():
        call.__name__ = name
        call.__doc__ = "torch.cuda.%s, answered by cistern (cistern.torch.enable())." % name
    return calls


def install(torch):
    """Sets the replacements on torch.cuda and torch.cuda.memory (once per torch module)."""
    if _saved and next(iter(_saved))[0] is torch.cuda:
        return
    restore()  # from another torch module (a test's stand-in)
    calls = _replacements(torch)
    for module in (torch.cuda, getattr(torch.cuda, "memory", None)):
        if module is None:
            continue
        for name in NAMES:
            _saved[(module, name)] = getattr(module, name, None)
            setattr(module, name, calls[name])


def restore():
    """Puts PyTorch's own functions back (those it had)."""
    for (module, name), original in _saved.items():
        if original is None:
            delattr(module, name)
        else:
            setattr(module, name, original)
    _saved.clear()


def installed():
    """Whether the replacements are in place."""
    return bool(_saved)
