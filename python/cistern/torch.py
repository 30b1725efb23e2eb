# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""cistern in PyTorch, through torch.cuda.memory.CUDAPluggableAllocator.

    import cistern.torch
    cistern.torch.enable()                 # every CUDA allocation from now on goes to cistern

or, for a region only (PyTorch >= 2.5, Unix):

    with cistern.torch.mem_pool():
        model = build()                    # these tensors live in a MemPool served by cistern

`enable()` must run before PyTorch allocates any CUDA memory (PyTorch refuses to swap an
allocator that is in use). torch.cuda.memory_stats() and memory._snapshot() do not work with a
pluggable allocator; use cistern.torch.memory_stats() and snapshot() instead.
"""
import contextlib
import ctypes

import cistern
from cistern._library import load, path as library_path

__all__ = ["enable", "is_enabled", "allocator", "mem_pool", "memory_stats", "snapshot",
           "write_snapshot", "empty_cache"]

_allocator = None
_enabled = False


def _torch():
    try:
        import torch  # noqa: F401 (absolute: the real torch, not this module)
    except ImportError as error:
        raise ImportError(
            "cistern.torch needs PyTorch (pip install torch); cistern's own functions "
            "(cistern.memory_stats, cistern.snapshot) work without it") from error
    if not torch.cuda.is_available():
        raise RuntimeError("cistern.torch: PyTorch sees no CUDA device (torch.cuda.is_available() "
                           "is False); cistern serves CUDA memory only")
    return torch


def _hook(name):
    return ctypes.cast(getattr(load(), name), ctypes.c_void_p).value


def allocator():
    """The CUDAPluggableAllocator over libcistern_plugin.so, with every optional hook set
    (init, empty_cache, memory fraction, record_stream, base allocation). Made once."""
    global _allocator
    if _allocator is None:
        torch = _torch()
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(
            library_path(), "cistern_malloc", "cistern_free")
        raw = pluggable.allocator()
        hooks = [("set_init_fn", "cistern_init"), ("set_reset_fn", "cistern_empty_cache"),
                 ("set_memory_fraction_fn", "cistern_set_memory_fraction"),
                 ("set_record_stream_fn", "cistern_record_stream"),
                 ("set_base_alloc_fn", "cistern_base_allocation")]
        for method, function in hooks:
            if hasattr(raw, method):  # older PyTorch versions lack some
                getattr(raw, method)(_hook(function))
        _allocator = pluggable
    return _allocator


def enable():
    """Makes cistern PyTorch's CUDA allocator for the whole process. Call it before the first
    CUDA allocation; calling it again does nothing."""
    global _enabled
    if _enabled:
        return
    torch = _torch()
    torch.cuda.memory.change_current_allocator(allocator())
    _enabled = True


def is_enabled():
    """Whether enable() has run."""
    return _enabled


@contextlib.contextmanager
def mem_pool(device=None):
    """A region whose allocations (from this thread) come from a torch.cuda.MemPool served by
    cistern; the pool is yielded. Needs PyTorch with MemPool (2.5 or newer)."""
    torch = _torch()
    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
        raise RuntimeError("cistern.torch.mem_pool needs torch.cuda.MemPool (PyTorch >= 2.5); "
                           "use cistern.torch.enable() instead")
    pool = torch.cuda.MemPool(allocator().allocator())
    with torch.cuda.use_mem_pool(pool, device=device):
        yield pool


def memory_stats(device=None):
    """cistern's statistics of `device` (default: the current one) with torch.cuda.memory_stats()'s
    key names."""
    if device is None:
        device = _torch().cuda.current_device()
    return cistern.memory_stats(int(device))


def snapshot():
    """cistern's state as torch.cuda.memory._snapshot() would give it."""
    return cistern.snapshot()


def write_snapshot(filename):
    """Writes the snapshot pickle (what torch.cuda.memory._dump_snapshot writes)."""
    cistern.write_snapshot(filename)


def empty_cache():
    """Returns cistern's unused cached memory (torch.cuda.empty_cache() calls this too)."""
    cistern.empty_cache()
