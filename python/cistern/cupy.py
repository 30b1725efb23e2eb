# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""cistern in CuPy, through cupy.cuda.set_allocator.

    import cistern.cupy
    cistern.cupy.enable()        # every CuPy allocation from now on goes to cistern

Each allocation is made on CuPy's current stream and device and freed on that stream when CuPy
drops its last reference to the memory.
"""
import cistern
from cistern._library import load

__all__ = ["enable", "disable", "malloc", "memory_stats"]

_previous = None
_enabled = False


def _cupy():
    try:
        import cupy
    except ImportError as error:
        raise ImportError("cistern.cupy needs CuPy (pip install cupy-cuda12x or similar)") from error
    return cupy


class _Allocation:
    """Owns one cistern allocation; frees it when CuPy's last MemoryPointer to it is gone."""

    __slots__ = ("ptr", "size", "device", "stream", "_free")

    def __init__(self, ptr, size, device, stream, free):
        self.ptr, self.size, self.device, self.stream, self._free = ptr, size, device, stream, free

    def __del__(self):
        if self.ptr:
            self._free(self.ptr, self.size, self.device, self.stream)
            self.ptr = 0


def malloc(size):
    """The allocator function given to cupy.cuda.set_allocator: a MemoryPointer to `size` bytes
    from cistern on CuPy's current device and stream. Raises cupy's OutOfMemoryError on OOM."""
    cupy = _cupy()
    lib = load()
    if size == 0:
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None), 0)
    device = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream().ptr
    ptr = lib.cistern_malloc(size, device, stream)
    if not ptr:
        if cistern.last_error_code() == 1:
            raise cupy.cuda.memory.OutOfMemoryError(size, 0, 0)
        raise cistern.CisternError(cistern.last_error_code(), cistern.last_error())
    owner = _Allocation(ptr, size, device, stream, lib.cistern_free)
    memory = cupy.cuda.UnownedMemory(ptr, size, owner, device)
    return cupy.cuda.MemoryPointer(memory, 0)


def enable():
    """Makes cistern CuPy's allocator (the previous one is kept for disable())."""
    global _previous, _enabled
    cupy = _cupy()
    if _enabled:
        return
    _previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(malloc)
    _enabled = True


def disable():
    """Gives CuPy back the allocator it had before enable()."""
    global _enabled
    if _enabled:
        _cupy().cuda.set_allocator(_previous)
        _enabled = False


def memory_stats(device=0):
    """cistern's statistics of `device` (PyTorch's key names)."""
    return cistern.memory_stats(device)
