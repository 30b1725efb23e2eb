# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""Finding and loading libcistern_plugin.so, with the C signatures of include/cistern/plugin.h."""
import ctypes
import glob
import os
import re
import sys
import threading

LIBRARY_NAME = "libcistern_plugin.so"

_lock = threading.Lock()
_library = None
_path = None


class CisternError(RuntimeError):
    """An error the plug-in recorded: `.code` is one of the CISTERN_ERROR_* values."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


OK = 0
OUT_OF_MEMORY = 1
INVALID_ARGUMENT = 4

ERROR_NAMES = {
    0: "ok",
    1: "out_of_memory",
    2: "invalid_pointer",
    3: "size_mismatch",
    4: "invalid_argument",
    5: "config",
    6: "device",
    7: "internal",
}


def candidates():
    """The places searched, in order: $CISTERN_PLUGIN_LIBRARY alone when it is set; otherwise
    this package's folder (where an installed wheel has it), the source tree's build folders
    (build*/src/plugin/, when this package is python/cistern of a checkout), then the system's
    library path."""
    env = os.environ.get("CISTERN_PLUGIN_LIBRARY")
    if env:
        return [env]
    found = []
    here = os.path.dirname(os.path.abspath(__file__))
    found.append(os.path.join(here, LIBRARY_NAME))
    root = os.path.dirname(os.path.dirname(here))  # python/cistern -> repository root
    if os.path.exists(os.path.join(root, "CMakeLists.txt")):  # not in site-packages
        found.extend(sorted(glob.glob(os.path.join(root, "build*", "src", "plugin",
                                                   LIBRARY_NAME))))
    found.append(LIBRARY_NAME)  # the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache)
    return found


def cuda_runtime_candidates(soname):
    """Where a CUDA runtime (`soname`, e.g. libcudart.so.13) the loader did not find may be: the
    CUDA toolkit ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda), then NVIDIA's runtime wheels
    (site-packages/nvidia/*/lib, which PyTorch's CUDA wheels install)."""
    folders = []
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            folders += [os.path.join(home, "lib64"), os.path.join(home, "lib")]
    for entry in sys.path:
        folders += sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*", "lib")))
    return [os.path.join(folder, soname) for folder in folders
            if os.path.exists(os.path.join(folder, soname))]


def _preload_cuda_runtime(error):
    """After `error` says the CUDA runtime was not found: loads the first one found (RTLD_GLOBAL,
    so that the plug-in's dependency resolves to it). True when one was loaded."""
    match = re.search(r"(libcudart\.so\.\d+): cannot open shared object file", str(error))
    if not match:
        return False
    for candidate in cuda_runtime_candidates(match.group(1)):
        try:
            ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
            return True
        except OSError:
            continue
    return False


def _open(path):
    """ctypes.CDLL(path), once more after loading the CUDA runtime when only that was missing."""
    try:
        return ctypes.CDLL(path)
    except OSError as error:
        if not _preload_cuda_runtime(error):
            raise
    return ctypes.CDLL(path)


def _declare(lib):
    c = ctypes
    signatures = {
        "cistern_malloc": (c.c_void_p, [c.c_size_t, c.c_int, c.c_void_p]),
        "cistern_free": (None, [c.c_void_p, c.c_size_t, c.c_int, c.c_void_p]),
        "cistern_try_malloc": (c.c_int, [c.c_size_t, c.c_int, c.c_void_p, c.POINTER(c.c_void_p),
                                         c.c_char_p, c.c_size_t]),
        "cistern_init": (None, [c.c_int]),
        "cistern_empty_cache": (None, []),
        "cistern_set_memory_fraction": (None, [c.c_double, c.c_int]),
        "cistern_record_stream": (None, [c.c_void_p, c.c_void_p]),
        "cistern_base_allocation": (c.c_void_p, [c.c_void_p, c.POINTER(c.c_size_t)]),
        "cistern_memory_stats_json": (c.c_size_t, [c.c_int, c.c_char_p, c.c_size_t]),
        "cistern_reset_peak_stats": (c.c_int, [c.c_int]),
        "cistern_reset_accumulated_stats": (c.c_int, [c.c_int]),
        "cistern_record_history": (c.c_int, [c.c_int, c.c_size_t]),
        "cistern_write_snapshot": (c.c_int, [c.c_char_p]),
        "cistern_check": (c.c_int, [c.c_int]),
        "cistern_last_error_code": (c.c_int, []),
        "cistern_last_error": (c.c_size_t, [c.c_char_p, c.c_size_t]),
        "cistern_misuse_count": (c.c_uint64, []),
        "cistern_clear_error": (None, []),
        "cistern_backend": (c.c_char_p, []),
        "cistern_version": (c.c_char_p, []),
        "cistern_shutdown": (None, []),
        "cistern_sim_create_stream": (c.c_void_p, [c.c_int]),
        "cistern_sim_launch": (c.c_int, [c.c_int, c.c_void_p, c.c_uint64]),
        "cistern_sim_synchronize": (c.c_int, [c.c_int]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


def load():
    """The loaded plug-in library (loaded once). Raises OSError listing the places searched."""
    global _library, _path
    with _lock:
        if _library is not None:
            return _library
        tried = []
        for path in candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(path + " (missing)")
                continue
            try:
                lib = _open(path)
            except OSError as error:
                tried.append("%s (%s)" % (path, error))
                continue
            _declare(lib)
            _library, _path = lib, path
            return lib
        raise OSError(
            "cistern: cannot find %s. Install the wheel that carries it (scripts/build-wheel.sh "
            "builds cistern-alloc-cu<N>), or build it (cmake --build build --target "
            "cistern_plugin) and set CISTERN_PLUGIN_LIBRARY to its path. "
            "Tried:\n  %s" % (LIBRARY_NAME, "\n  ".join(tried)))


def path():
    """The path of the loaded library (loading it if needed)."""
    load()
    return _path


def try_malloc(size, device, stream):
    """`cistern_try_malloc`: (code, pointer or None, this call's message)."""
    ptr = ctypes.c_void_p()
    message = ctypes.create_string_buffer(4096)
    code = load().cistern_try_malloc(size, device, stream, ctypes.byref(ptr), message,
                                     len(message))
    return code, ptr.value, message.value.decode("utf-8", "replace")


def text(function, *args):
    """Calls a C function that fills a buffer snprintf-style and returns the whole text."""
    size = function(*args, None, 0)
    buffer = ctypes.create_string_buffer(size + 1)
    function(*args, buffer, size + 1)
    return buffer.value.decode("utf-8", "replace")
