# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""cistern in PyTorch, through torch.cuda.memory.CUDAPluggableAllocator.

    import cistern.torch
    cistern.torch.enable()                 # every CUDA allocation from now on goes to cistern

or, for a region only (PyTorch >= 2.5, Unix):

    with cistern.torch.mem_pool():
        model = build()                    # these tensors live in a MemPool served by cistern

`enable()` must run before PyTorch allocates any CUDA memory (PyTorch refuses to swap an
allocator that is in use).

CUDA graphs. Where PyTorch's CUDAPluggableAllocator has the graph pool hooks
(set_begin_allocate_to_pool, set_end_allocate_to_pool_fn, set_release_pool), enable() sets them:
a capture's allocations come from that graph's private pool in cistern, kept for its replays
and never handed elsewhere, given back when the graph is reset and nothing in the pool is live
(see the README). torch.compile(mode="reduce-overhead") needs
torch._inductor.config.triton.cudagraph_trees = False under any pluggable allocator: cudagraph
trees ask the allocator for checkpoints (getCheckpointState), which CUDAPluggableAllocator
refuses; without them inductor captures with torch.cuda.graph, which the hooks serve
(scripts/gpu_frameworks.py checks both on a GPU).

Statistics. Under a pluggable allocator PyTorch's own torch.cuda.memory_stats() and the calls
built on it raise. enable() therefore has cistern answer them, with PyTorch's key names and
semantics: torch.cuda.memory_stats(), memory_allocated(), max_memory_allocated(),
memory_reserved(), max_memory_reserved(), reset_peak_memory_stats(),
reset_accumulated_memory_stats() and memory_summary() (PyTorch's table). enable(memory_api=False),
or CISTERN_TORCH_MEMORY_API=0 in the environment, leaves PyTorch's functions in place.
memory._snapshot() is not replaced: use cistern.torch.snapshot().

Out of memory. PyTorch's pluggable allocator does not check the pointer its allocation function
returns, so cistern must raise instead. At first use cistern.torch compiles a small C++ glue
(_torch_glue.cpp, next to this file) against the installed PyTorch with
torch.utils.cpp_extension and caches it (in $CISTERN_TORCH_EXTENSION_DIR, else
~/.cache/cistern/torch-glue): an allocation cistern cannot serve then raises
`torch.OutOfMemoryError` whose message begins "CUDA out of memory." and goes on with cistern's
figures (requested, free, allocated, reserved, cached, the limit). Where the glue cannot be
built (no compiler, no ninja, no PyTorch headers; or CISTERN_TORCH_EXTENSION=0), the plug-in's
own `cistern_malloc_or_throw` raises `RuntimeError` with the same message instead; code that
catches `torch.OutOfMemoryError` does not see it, and PyTorch's internal recoveries from out of
memory (cuDNN trying an algorithm with a smaller workspace) do not happen. `oom_route()` says
which is active, and a log line of the "cistern.torch" logger says so when it is chosen.
In the MemPool route PyTorch's own caching allocator sits above cistern: it gives its cached
blocks back and retries before it raises `torch.OutOfMemoryError`; the glue then puts cistern's
message in place of PyTorch's (without the glue the message is PyTorch's, and cistern's is in
cistern.last_error()).
"""
import contextlib
import ctypes
import hashlib
import logging
import os
import re

import cistern
from cistern import _torch_memory
from cistern._library import load, path as library_path

__all__ = ["enable", "is_enabled", "allocator", "pool_allocator", "mem_pool", "oom_route",
           "oom_route_detail", "memory_stats", "memory_summary", "memory_api_installed",
           "snapshot", "write_snapshot", "empty_cache", "record_history"]

logger = logging.getLogger("cistern.torch")

GLUE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_glue.cpp")

# The glue's builds, best first: with the MemPool out-of-memory observer (needs the CUDA headers
# that c10/cuda includes), then without it.
_GLUE_BUILDS = (("pool", True, ["-DCISTERN_TORCH_POOL_OBSERVER"]), ("plain", False, []))

_allocator = None
_pool_allocator = None
_enabled = False
_glue = None          # a _Glue once built, False when it cannot be
_glue_failure = ""    # why it could not be built
_route = None         # "extension" or "fallback" once chosen
_route_detail = ""
_pool_observer = None  # whether cistern's message replaces PyTorch's in the MemPool route


class _Glue:
    def __init__(self, lib, path, build):
        self.lib, self.path, self.build = lib, path, build


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


def _cache_root():
    configured = os.environ.get("CISTERN_TORCH_EXTENSION_DIR")
    if configured:
        return configured
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "cistern", "torch-glue")


def glue_directory(torch_version, build, cflags, source=GLUE_SOURCE):
    """Where a build of the glue is cached: one folder per PyTorch version, build and source, so
    that a new PyTorch or a changed source gets a build of its own."""
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read() + repr((build, cflags)).encode()).hexdigest()[:16]
    version = re.sub(r"[^A-Za-z0-9.+_-]", "_", str(torch_version))
    return os.path.join(_cache_root(), "%s-%s-%s" % (version, build, digest))


def _first_line(error):
    text = str(error).strip() or type(error).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # A compiler's output: its first "error:" line says the most.
    for line in lines:
        if re.search(r"\berror:", line):
            return line[:300]
    return lines[0][:300]


def _compile(torch, build, with_cuda, cflags):
    from torch.utils import cpp_extension
    directory = glue_directory(torch.__version__, build, cflags)
    os.makedirs(directory, exist_ok=True)
    name = "cistern_torch_glue_" + build
    logger.info("cistern.torch: building cistern's PyTorch glue (%s) in %s", build, directory)
    result = cpp_extension.load(name=name, sources=[GLUE_SOURCE], extra_cflags=["-O2"] + cflags,
                                build_directory=directory, with_cuda=with_cuda,
                                is_python_module=False, verbose=False)
    # Newer PyTorch returns the library's path; older ones return None.
    return result if isinstance(result, str) else os.path.join(directory, name + ".so")


def _bind(path, build):
    lib = ctypes.CDLL(path)
    lib.cistern_torch_bind.restype = ctypes.c_int
    lib.cistern_torch_bind.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cistern_torch_attach_pool_observer.restype = ctypes.c_int
    lib.cistern_torch_has_pool_observer.restype = ctypes.c_int
    if lib.cistern_torch_bind(_hook("cistern_try_malloc"), _hook("cistern_free")) != 0:
        raise RuntimeError("cistern_torch_bind refused the plug-in's functions")
    return _Glue(lib, path, build)


def _load_glue(torch):
    """The glue, built (or found in the cache) and bound to the plug-in; None when it cannot be
    built, with the reason in _glue_failure."""
    global _glue, _glue_failure
    if _glue is None:
        if os.environ.get("CISTERN_TORCH_EXTENSION", "1").lower() in ("0", "false", "off", "no"):
            _glue, _glue_failure = False, "CISTERN_TORCH_EXTENSION=%s" % (
                os.environ["CISTERN_TORCH_EXTENSION"])
        else:
            failures = []
            for build, with_cuda, cflags in _GLUE_BUILDS:
                try:
                    _glue = _bind(_compile(torch, build, with_cuda, cflags), build)
                    break
                except Exception as error:  # any failure to build means: the next build
                    failures.append("%s build: %s" % (build, _first_line(error)))
            _glue_failure = "; ".join(failures)  # with a later build that worked: why not the first
            if not _glue:
                _glue = False
    return _glue or None


def _choose_route(torch):
    global _route, _route_detail
    if _route is not None:
        return
    glue = _load_glue(torch)
    if glue:
        _route = "extension"
        _route_detail = ("out of memory raises torch.OutOfMemoryError with cistern's message "
                         "(cistern's PyTorch glue, %s build: %s)" % (glue.build, glue.path))
        if _glue_failure:
            _route_detail += "; not the first build: " + _glue_failure
        logger.info("cistern.torch: %s", _route_detail)
    else:
        _route = "fallback"
        _route_detail = ("out of memory raises RuntimeError('CUDA out of memory. ...') from the "
                         "plug-in, not torch.OutOfMemoryError: cistern's PyTorch glue could not "
                         "be built (%s)" % _glue_failure)
        logger.warning("cistern.torch: %s", _route_detail)


def oom_route():
    """How an allocation cistern cannot serve reaches the program under enable(): "extension"
    (torch.OutOfMemoryError with cistern's message, raised by cistern's PyTorch glue),
    "fallback" (RuntimeError with the same message, raised by the plug-in, when the glue cannot
    be built), or None before enable(), allocator() or mem_pool() chose one."""
    return _route


def oom_route_detail():
    """oom_route() in words, with the glue's path or why it could not be built."""
    return _route_detail


# PyTorch's CUDA graph hooks and the plug-in's C++ functions of the types PyTorch casts them to
# (torch/csrc/cuda/Module.cpp: void(int, MempoolId_t, std::function<bool(cudaStream_t)>) and
# void(int, MempoolId_t)). PyTorch versions before them named (and typed) them otherwise
# (set_begin_allocate_stream_to_pool): those are left unset.
GRAPH_HOOKS = (("set_begin_allocate_to_pool", "cistern_torch_begin_allocate_to_pool"),
               ("set_end_allocate_to_pool_fn", "cistern_torch_end_allocate_to_pool"),
               ("set_release_pool", "cistern_torch_release_pool"))


def _pluggable(torch, path, malloc_name, free_name, graph_hooks=False):
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(path, malloc_name, free_name)
    raw = pluggable.allocator()
    hooks = [("set_init_fn", "cistern_init"), ("set_reset_fn", "cistern_empty_cache"),
             ("set_memory_fraction_fn", "cistern_set_memory_fraction"),
             ("set_record_stream_fn", "cistern_record_stream"),
             ("set_base_alloc_fn", "cistern_base_allocation")]
    if graph_hooks:  # the global allocator only: under a MemPool PyTorch's own pools serve graphs
        hooks += GRAPH_HOOKS
        if not all(hasattr(raw, method) for method, _ in GRAPH_HOOKS):
            logger.warning("cistern.torch: this PyTorch's CUDAPluggableAllocator has no CUDA graph "
                           "pool hooks (set_begin_allocate_to_pool): under cistern an allocation "
                           "that needs new memory during a graph capture fails, saying so; "
                           "capture graphs under PyTorch's own allocator instead")
    for method, function in hooks:
        if hasattr(raw, method):  # older PyTorch versions lack some
            getattr(raw, method)(_hook(function))
    return pluggable


def allocator():
    """The CUDAPluggableAllocator that enable() installs: allocation through cistern's PyTorch
    glue (or, without it, the plug-in's cistern_malloc_or_throw), never a NULL for PyTorch to
    hand on; every optional hook set (init, empty_cache, memory fraction, record_stream, base
    allocation) and, where PyTorch has them, the CUDA graph pool hooks (torch.cuda.graph and
    torch.compile's CUDA graphs allocate from a private pool per graph). Made once."""
    global _allocator
    if _allocator is None:
        torch = _torch()
        _choose_route(torch)
        if _glue:
            _allocator = _pluggable(torch, _glue.path, "cistern_torch_malloc",
                                    "cistern_torch_free", graph_hooks=True)
        else:
            _allocator = _pluggable(torch, library_path(), "cistern_malloc_or_throw",
                                    "cistern_free", graph_hooks=True)
    return _allocator


def pool_allocator():
    """The CUDAPluggableAllocator that mem_pool() gives its MemPool: out of memory is a NULL
    there, which PyTorch's caching allocator above it checks (see the module's comment)."""
    global _pool_allocator
    if _pool_allocator is None:
        torch = _torch()
        _choose_route(torch)
        if _glue:
            _pool_allocator = _pluggable(torch, _glue.path, "cistern_torch_pool_malloc",
                                         "cistern_torch_free")
        else:
            _pool_allocator = _pluggable(torch, library_path(), "cistern_malloc", "cistern_free")
    return _pool_allocator


def _attach_pool_observer(torch):
    """Once: the glue's observer on PyTorch's caching allocator, so that an out of memory in the
    MemPool route carries cistern's message."""
    global _pool_observer
    if _pool_observer is not None:
        return
    _pool_observer = False
    if not _glue or not _glue.lib.cistern_torch_has_pool_observer():
        logger.warning("cistern.torch: out of memory in a MemPool carries PyTorch's message; "
                       "cistern's is in cistern.last_error() (%s)",
                       "the glue was built without its observer" if _glue else _route_detail)
        return
    torch.cuda.init()  # the caching allocator gives observers to the devices it has set up
    if _glue.lib.cistern_torch_attach_pool_observer() != 0:
        logger.warning("cistern.torch: PyTorch refused the out-of-memory observer (is a "
                       "pluggable allocator current?); out of memory in a MemPool carries "
                       "PyTorch's message")
        return
    _pool_observer = True


def _memory_api_wanted(memory_api):
    if memory_api is not None:
        return bool(memory_api)
    setting = os.environ.get("CISTERN_TORCH_MEMORY_API", "1").lower()
    return setting not in ("0", "false", "off", "no")


def enable(memory_api=None):
    """Makes cistern PyTorch's CUDA allocator for the whole process. Call it before the first
    CUDA allocation; calling it again does nothing. `memory_api`: whether torch.cuda.memory_stats()
    and the calls built on it answer from cistern (see the module's comment); None: yes, unless
    CISTERN_TORCH_MEMORY_API is 0, false, off or no."""
    global _enabled
    if _enabled:
        return
    torch = _torch()
    torch.cuda.memory.change_current_allocator(allocator())
    _enabled = True
    if _memory_api_wanted(memory_api):
        _torch_memory.install(torch)


def memory_api_installed():
    """Whether torch.cuda.memory_stats() and its kin answer from cistern (enable() put them in)."""
    return _torch_memory.installed()


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary()'s table from cistern's statistics of `device` (default: the
    current one)."""
    index = _torch_memory.device_index(_torch(), device)
    return _torch_memory.summary(cistern.memory_stats(index), index, abbreviated)


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
    pool = torch.cuda.MemPool(pool_allocator().allocator())
    _attach_pool_observer(torch)
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


def record_history(enabled="all", stacks="python", max_entries=1000000):
    """torch.cuda.memory._record_memory_history() for cistern: records every device's allocator
    events for the snapshot's timeline (snapshot(), write_snapshot()), with each allocation's
    Python call stack as the events' and blocks' `frames`, so that pytorch.org/memory_viz names
    the code that allocated what. `enabled`: "all" or True to start, None or False to stop
    ("state" records events without stacks). `stacks`: "python" for the Python frames, "all" for
    the C/C++ frames between the allocator and Python as well (named from the shared objects'
    exported symbols: filename the object, line 0), None for none. `max_entries`: the newest
    events (and stacks) kept per device. A stack costs a walk of the allocating thread's frames
    under the GIL per allocation, as PyTorch's does, and "all" an unwind of its native frames;
    threads without Python frames (autograd's workers) get their native frames with "all", none
    with "python"."""
    from cistern import _stacks
    if stacks not in ("python", "all", None):
        raise ValueError("record_history: stacks must be 'python', 'all' or None, not %r"
                         % (stacks,))
    on = enabled not in (None, False)
    cistern.record_history(on, max_entries)
    with_stacks = on and enabled != "state" and stacks is not None
    code = (_stacks.enable(max_entries, native=stacks == "all") if with_stacks
            else _stacks.disable())
    if code != 0:
        raise cistern.CisternError(code, cistern.last_error())


def empty_cache():
    """Returns cistern's unused cached memory (torch.cuda.empty_cache() calls this too)."""
    cistern.empty_cache()
