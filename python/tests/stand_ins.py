# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""Stand-in `torch` and `cupy` modules for testing cistern's Python glue where neither framework
is installed: each mirrors the few calls the glue makes, with the real signatures, and records
what it was asked. They sit in sys.modules only for the duration of a test (`installed`)."""
import contextlib
import ctypes
import sys
import types
from unittest import mock


def _address(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


PLUGGABLE_STATS_ERROR = ("CUDAPluggableAllocator does not yet support getDeviceStats. If you "
                         "need it, please file an issue describing your use case.")


class TorchStandIn:
    """torch with torch.cuda.memory.CUDAPluggableAllocator, change_current_allocator, MemPool,
    use_mem_pool, init, and torch.utils.cpp_extension.load, whose outcome per build name is
    `builds` ({"cistern_torch_glue_pool": path or an exception}). Its statistics calls
    (torch.cuda.memory_stats, memory_allocated, ..., memory_summary, on torch.cuda and
    torch.cuda.memory) behave as PyTorch's do under a pluggable allocator: they raise
    RuntimeError(PLUGGABLE_STATS_ERROR). The pluggable allocator's raw object takes every set_*
    hook; with `graph_hooks=False` it lacks the CUDA graph ones (set_begin_allocate_to_pool,
    set_end_allocate_to_pool_fn, set_release_pool), as older PyTorch versions do."""

    GRAPH_HOOKS = ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn",
                   "set_release_pool")

    def __init__(self, builds, version="2.11.0+standin", graph_hooks=True):
        self.builds = builds
        self.calls = []
        torch = types.ModuleType("torch")
        torch.__version__ = version
        cuda = types.ModuleType("torch.cuda")
        memory = types.ModuleType("torch.cuda.memory")
        utils = types.ModuleType("torch.utils")
        cpp_extension = types.ModuleType("torch.utils.cpp_extension")
        stand_in = self

        class RawAllocator:
            def __init__(self):
                self.hooks = {}

            def __getattr__(self, name):
                if not name.startswith("set_"):
                    raise AttributeError(name)
                if not graph_hooks and name in TorchStandIn.GRAPH_HOOKS:
                    raise AttributeError(name)
                return lambda address: self.hooks.__setitem__(name, address)

        class CUDAPluggableAllocator:
            # As PyTorch does: open the library, take the two functions' addresses.
            def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
                lib = ctypes.CDLL(path_to_so_file)
                self.path, self.names = path_to_so_file, (alloc_fn_name, free_fn_name)
                self.addresses = (_address(lib, alloc_fn_name), _address(lib, free_fn_name))
                self._raw = RawAllocator()
                stand_in.calls.append(("pluggable", path_to_so_file, alloc_fn_name,
                                       free_fn_name))

            def allocator(self):
                return self._raw

        class MemPool:
            def __init__(self, allocator=None):
                self.allocator = allocator
                stand_in.calls.append(("MemPool", allocator))

        @contextlib.contextmanager
        def use_mem_pool(pool, device=None):
            stand_in.calls.append(("use_mem_pool", pool, device))
            yield

        def load(name, sources, extra_cflags=None, build_directory=None, with_cuda=None,
                 is_python_module=True, verbose=False, **others):
            stand_in.calls.append(("load", name, list(sources), list(extra_cflags or []),
                                   build_directory, with_cuda, is_python_module))
            outcome = stand_in.builds[name]
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        def refused(*args, **kwargs):
            raise RuntimeError(PLUGGABLE_STATS_ERROR)

        for name in ("memory_stats", "memory_allocated", "max_memory_allocated",
                     "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
                     "reset_accumulated_memory_stats", "memory_summary"):
            setattr(memory, name, refused)
            setattr(cuda, name, refused)  # torch.cuda re-exports torch.cuda.memory's
        memory.CUDAPluggableAllocator = CUDAPluggableAllocator
        memory.change_current_allocator = lambda a: stand_in.calls.append(("change", a))
        cuda.memory = memory
        cuda.is_available = lambda: True
        cuda.init = lambda: stand_in.calls.append(("init",))
        cuda.current_device = lambda: 0
        cuda.MemPool = MemPool
        cuda.use_mem_pool = use_mem_pool
        cpp_extension.load = load
        utils.cpp_extension = cpp_extension
        torch.cuda = cuda
        torch.utils = utils
        self.modules = {"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory,
                        "torch.utils": utils, "torch.utils.cpp_extension": cpp_extension}

    def called(self, kind):
        return [c for c in self.calls if c[0] == kind]


class CupyStandIn:
    """cupy with cuda.runtime.getDevice, cuda.get_current_stream, cuda.UnownedMemory,
    cuda.MemoryPointer, cuda.memory.OutOfMemoryError (CuPy's constructor and message),
    get_allocator and set_allocator."""

    def __init__(self, device=0, stream=0):
        self.device, self.stream = device, stream
        self.allocator = "cupy's pool"
        cupy = types.ModuleType("cupy")
        stand_in = self

        class OutOfMemoryError(MemoryError):
            def __init__(self, size, total, limit=0):
                self._size, self._total, self._limit = size, total, limit
                if limit == 0:
                    msg = "Out of memory allocating {:,} bytes".format(size)
                    if total != -1:
                        msg += " (allocated so far: {:,} bytes).".format(total)
                else:
                    msg = ("Out of memory allocating {:,} bytes (allocated so far: {:,} bytes, "
                           "limit set to: {:,} bytes).".format(size, total, limit))
                super().__init__(msg)

        class UnownedMemory:
            def __init__(self, ptr, size, owner, device_id=-1):
                if device_id < 0 and ptr == 0:
                    raise RuntimeError("UnownedMemory requires explicit device ID for a null "
                                       "pointer.")
                self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, device_id

        class MemoryPointer:
            def __init__(self, mem, offset):
                self.mem, self.ptr = mem, mem.ptr + offset

        runtime = types.SimpleNamespace(getDevice=lambda: stand_in.device)
        cupy.cuda = types.SimpleNamespace(
            runtime=runtime, memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
            UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
            get_current_stream=lambda: types.SimpleNamespace(ptr=stand_in.stream),
            get_allocator=lambda: stand_in.allocator,
            set_allocator=lambda a: setattr(stand_in, "allocator", a))
        self.modules = {"cupy": cupy}


@contextlib.contextmanager
def installed(stand_in):
    """The stand-in's modules in sys.modules for the `with` block (the real ones, if any, are
    put back afterwards)."""
    with mock.patch.dict(sys.modules, stand_in.modules):
        yield stand_in
