# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""cistern in CuPy, through cupy.cuda.set_allocator.

    import cistern.cupy
    cistern.cupy.enable()        # every CuPy allocation from now on goes to cistern

Each allocation is made on CuPy's current stream and device and freed on that stream when CuPy
drops its last reference to the memory. An allocation cistern cannot serve raises CuPy's own
`cupy.cuda.memory.OutOfMemoryError` (what CuPy code catches) with cistern's message; any other
failure raises `cistern.CisternError`.
"""
import cistern
from cistern._library import OUT_OF_MEMORY, OK, load, try_malloc

__all__ = ["enable", "disable", "malloc", "memory_stats", "set_memory_fraction"]

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


def out_of_memory_error(cupy, size, device, message):
    """CuPy's OutOfMemoryError for `size` bytes on `device`, with cistern's message in place of
    the one CuPy's constructor writes (its figures, the bytes allocated so far, are cistern's)."""
    try:
        allocated = cistern.memory_stats(device)["allocated_bytes.all.current"]
    except Exception:  # the statistics are a courtesy; the error must be raised regardless
        allocated = -1
    error = cupy.cuda.memory.OutOfMemoryError(size, allocated)
    error.args = (message,)
    return error


def malloc(size):
    """The allocator function given to cupy.cuda.set_allocator: a MemoryPointer to `size` bytes
    from cistern on CuPy's current device and stream. Out of memory raises
    cupy.cuda.memory.OutOfMemoryError with cistern's message; another failure, CisternError."""
    cupy = _cupy()
    lib = load()
    device = cupy.cuda.runtime.getDevice()
    if size == 0:  # UnownedMemory needs the device of a null pointer
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device), 0)
    stream = cupy.cuda.get_current_stream().ptr
    code, ptr, message = try_malloc(size, device, stream)
    if code == OUT_OF_MEMORY:
        raise out_of_memory_error(cupy, size, device, message)
    if code != OK:
        raise cistern.CisternError(code, message)
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


def set_memory_fraction(fraction, device=0):
    """Limits cistern on `device` to `fraction` of the device's memory (CuPy's pool has
    set_limit(fraction=...); with cistern as the allocator, this is its counterpart)."""
    cistern.set_memory_fraction(fraction, device)
