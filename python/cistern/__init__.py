# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""cistern's caching CUDA allocator for Python frameworks.

    import cistern.torch
    cistern.torch.enable()          # PyTorch: before the first CUDA allocation

    import cistern.cupy
    cistern.cupy.enable()           # CuPy

The framework-independent functions below talk to the plug-in library (libcistern_plugin.so)
directly; importing this package needs nothing but the standard library, and the library is
loaded on first use. The plug-in is configured by CISTERN_ALLOC_CONF (cistern's options, in
PyTorch's syntax) and CISTERN_BACKEND ("cuda", or "sim" for the simulated device in tests).
"""
import json
import os
import pickle
import tempfile

from cistern._library import CisternError, ERROR_NAMES, load, path as library_path, text

__all__ = [
    "CisternError", "load", "library_path", "backend", "version", "memory_stats",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "empty_cache",
    "record_history", "write_snapshot", "snapshot", "last_error", "last_error_code",
    "misuse_count", "clear_error", "set_memory_fraction", "check",
]

__version__ = "0.1.0"


def _check(code):
    if code != 0:
        raise CisternError(code, last_error() or ERROR_NAMES.get(code, str(code)))


def backend():
    """The device backend: "cuda" or "sim" (raises CisternError if CISTERN_BACKEND is invalid)."""
    name = load().cistern_backend().decode()
    if not name:
        _check(last_error_code())
    return name


def version():
    """The plug-in library's version."""
    return load().cistern_version().decode()


def memory_stats(device=0):
    """cistern's statistics of `device` under torch.cuda.memory_stats()'s key names, as a dict
    ({"allocated_bytes.all.current": ..., "num_ooms": ..., ...})."""
    lib = load()
    size = lib.cistern_memory_stats_json(device, None, 0)
    if size == 0:
        _check(last_error_code())
    return json.loads(text(lib.cistern_memory_stats_json, device))


def reset_peak_memory_stats(device=0):
    """Sets every peak of `device` to its current value."""
    _check(load().cistern_reset_peak_stats(device))


def reset_accumulated_memory_stats(device=0):
    """Zeroes the running sums and num_* counters of `device`."""
    _check(load().cistern_reset_accumulated_stats(device))


def set_memory_fraction(fraction, device=0):
    """Limits `device` to `fraction` (0, 1] of its memory, as
    torch.cuda.set_per_process_memory_fraction does (raises CisternError outside that range)."""
    fraction = float(fraction)
    if not 0.0 < fraction <= 1.0:
        raise CisternError(4, "cistern: memory fraction %r is not in (0, 1]" % fraction)
    lib = load()
    lib.cistern_clear_error()
    lib.cistern_set_memory_fraction(fraction, device)
    _check(last_error_code())


def check(device=0):
    """Runs the invariant checker of `device`'s allocator; raises CisternError if one is broken
    (a bug in cistern) or the device is out of range."""
    _check(load().cistern_check(device))


def empty_cache():
    """Returns every device's unused cached memory."""
    load().cistern_empty_cache()


def record_history(enabled=True, max_entries=1000000):
    """Starts (or stops) recording allocator events on every device, for snapshots' timelines."""
    _check(load().cistern_record_history(1 if enabled else 0, max_entries))


def write_snapshot(filename):
    """Writes a PyTorch memory snapshot pickle of every device (segments, blocks, recorded
    events): open it at pytorch.org/memory_viz or with torch.cuda._memory_viz."""
    _check(load().cistern_write_snapshot(os.fsencode(filename)))


def snapshot():
    """The snapshot as a dict, as torch.cuda.memory._snapshot() returns it (keys "segments",
    "device_traces", "allocator_settings", "external_annotations")."""
    handle, name = tempfile.mkstemp(suffix=".pickle", prefix="cistern-snapshot-")
    os.close(handle)
    try:
        write_snapshot(name)
        with open(name, "rb") as f:
            return pickle.load(f)
    finally:
        os.unlink(name)


def last_error():
    """The message of the last error the plug-in recorded ("" if none)."""
    return text(load().cistern_last_error)


def last_error_code():
    """The code of the last error (0: none; see CISTERN_ERROR_* in plugin.h)."""
    return load().cistern_last_error_code()


def misuse_count():
    """How many misuses (bad pointers, size mismatches, bad arguments) were recorded."""
    return load().cistern_misuse_count()


def clear_error():
    """Forgets the last error."""
    load().cistern_clear_error()
