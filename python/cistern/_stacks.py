# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""The Python call stacks of cistern's allocations, for snapshots' `frames`
(cistern.torch.record_history(stacks="python")).

PyTorch calls the plug-in's allocation function from C++ with no Python code in between, so the
stack is taken from the plug-in: after each successful allocation it calls a hook (a ctypes
callback, which takes the GIL) on the allocating thread. The hook walks that thread's Python
frames from the one that called into C++ (torch.empty, a layer's forward, ...) outward, as
PyTorch's own `_record_memory_history(stacks="python")` does, and answers the id of that stack in
the plug-in's table; each distinct stack is handed to the plug-in once (`cistern_add_stack`), so
an allocation from a known stack costs one frame walk and one dict lookup. A thread with no
Python frames (PyTorch's autograd workers during backward) gets no frames.

With `native` (stacks="all"), the plug-in also takes the thread's C/C++ frames
(`cistern_set_native_stacks`): those between the plug-in and the Python interpreter - PyTorch's
C++ that called the allocator, the operator - come innermost, then the Python frames, each named
from the shared objects' dynamic symbols (filename the object, line 0)."""
import atexit
import ctypes
import sys

from cistern._library import load

STACK_HOOK = ctypes.CFUNCTYPE(ctypes.c_uint32)
MAX_FRAMES = 256  # deeper stacks keep their innermost frames

_callback = None  # the installed STACK_HOOK (kept alive while the plug-in holds it)
_ids = {}         # stack (a tuple of (filename, line, name), innermost first) -> plug-in id


def _functions():
    lib = load()
    set_hook, add_stack = lib.cistern_set_stack_hook, lib.cistern_add_stack
    set_native = lib.cistern_set_native_stacks
    set_hook.restype = add_stack.restype = set_native.restype = ctypes.c_int
    set_hook.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    set_native.argtypes = [ctypes.c_int, ctypes.c_size_t]
    add_stack.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p),
                          ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_char_p),
                          ctypes.POINTER(ctypes.c_uint32)]
    return set_hook, add_stack, set_native


def current_stack(skip=1):
    """The calling thread's Python frames as (filename, line, name), innermost first, from the
    frame `skip` levels above this function's caller."""
    try:
        frame = sys._getframe(skip + 1)
    except ValueError:  # no Python frames on this thread
        return ()
    frames = []
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        frames.append((code.co_filename, frame.f_lineno or 0, code.co_name))
        frame = frame.f_back
    return tuple(frames)


def _register(stack):
    def text(value):
        return value.encode("utf-8", "replace")

    count = len(stack)
    ident = ctypes.c_uint32(0)
    code = _functions()[1](count, (ctypes.c_char_p * count)(*[text(f) for f, _, _ in stack]),
                           (ctypes.c_int64 * count)(*[line for _, line, _ in stack]),
                           (ctypes.c_char_p * count)(*[text(n) for _, _, n in stack]),
                           ctypes.byref(ident))
    return ident.value if code == 0 else 0


def _hook():
    # Runs inside the allocation: it must not raise (ctypes would print and answer 0 anyway).
    try:
        # One level above this function: the code that called into C.
        stack = current_stack(skip=1)
        ident = _ids.get(stack)
        if ident is None:
            ident = _register(stack) if stack else 0
            _ids[stack] = ident
        return ident
    except Exception:  # noqa: BLE001 (never into the allocator)
        return 0


def enable(max_entries, native=False):
    """Starts taking each allocation's Python stack (the newest `max_entries` per device), and
    with `native` its C/C++ frames too."""
    global _callback
    first = _callback is None
    callback = _callback or STACK_HOOK(_hook)
    set_hook, _, set_native = _functions()
    code = set_native(1 if native else 0, max_entries)
    if code == 0:
        code = set_hook(ctypes.cast(callback, ctypes.c_void_p), max_entries)
    if code == 0:
        _callback = callback
        if first:
            # An allocation after the interpreter is gone must not call back into it.
            atexit.register(disable)
    return code


def disable():
    """Stops taking stacks; the ones taken stay for the snapshot."""
    set_hook, _, set_native = _functions()
    code = set_native(0, 0)
    return set_hook(None, 0) if code == 0 else code
