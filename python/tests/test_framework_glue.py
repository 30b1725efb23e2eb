# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""cistern.torch and cistern.cupy against stand-in framework modules (tests/stand_ins.py) on the
simulated backend (CISTERN_BACKEND=sim, 1 GiB): which allocation functions PyTorch is handed in
each route (the glue's when it builds, the plug-in's throwing entry when it cannot, never the
NULL-returning one under enable()), what is logged and reported, and that CuPy code gets
cupy.cuda.memory.OutOfMemoryError with cistern's message. The glue "built" here is the library
CMake compiles from _torch_glue.cpp against a c10 stand-in ($CISTERN_TEST_TORCH_GLUE); the
real build against PyTorch runs on a GPU machine (scripts/gpu_frameworks.py)."""
import collections
import ctypes
import gc
import importlib
import os
import tempfile
import types
import unittest

import cistern
import cistern.cupy
import cistern.torch
from cistern import _library, _torch_memory
from tests.stand_ins import CupyStandIn, TorchStandIn, installed

MiB = 1 << 20
GLUE = os.environ.get("CISTERN_TEST_TORCH_GLUE", "")
POOL, PLAIN = "cistern_torch_glue_pool", "cistern_torch_glue_plain"


def plugin_address(name):
    return ctypes.cast(getattr(_library.load(), name), ctypes.c_void_p).value


class SimulatedBackend(unittest.TestCase):
    def setUp(self):
        self.saved = {k: os.environ.get(k) for k in
                      ("CISTERN_BACKEND", "CISTERN_SIM_CAPACITY", "CISTERN_ALLOC_CONF",
                       "CISTERN_TORCH_EXTENSION", "CISTERN_TORCH_EXTENSION_DIR")}
        os.environ.update(CISTERN_BACKEND="sim", CISTERN_SIM_CAPACITY="1GiB")
        os.environ.pop("CISTERN_ALLOC_CONF", None)
        os.environ.pop("CISTERN_TORCH_EXTENSION", None)
        self.cache = tempfile.TemporaryDirectory()
        os.environ["CISTERN_TORCH_EXTENSION_DIR"] = self.cache.name
        self.lib = _library.load()
        self.lib.cistern_shutdown()
        importlib.reload(cistern.torch)  # forget the route chosen by another test

    def tearDown(self):
        self.lib.cistern_shutdown()
        importlib.reload(cistern.torch)  # leave no route or allocator to the next test
        importlib.reload(cistern.cupy)
        self.cache.cleanup()
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def allocated(self):
        return cistern.memory_stats(0)["allocated_bytes.all.current"]


GRAPH_HOOKS = {"set_begin_allocate_to_pool": "cistern_torch_begin_allocate_to_pool",
               "set_end_allocate_to_pool_fn": "cistern_torch_end_allocate_to_pool",
               "set_release_pool": "cistern_torch_release_pool"}


class TorchRoutes(SimulatedBackend):
    def hooks_are_the_plugins(self, pluggable, graph_hooks=True):
        """The pluggable allocator's hooks are the plug-in's functions; enable()'s also has the
        CUDA graph hooks (a MemPool's allocator does not: PyTorch's own pools serve graphs)."""
        expected = {"set_init_fn": "cistern_init", "set_reset_fn": "cistern_empty_cache",
                    "set_memory_fraction_fn": "cistern_set_memory_fraction",
                    "set_record_stream_fn": "cistern_record_stream",
                    "set_base_alloc_fn": "cistern_base_allocation"}
        if graph_hooks:
            expected.update(GRAPH_HOOKS)
        self.assertEqual(pluggable.allocator().hooks,
                         {k: plugin_address(v) for k, v in expected.items()})

    @unittest.skipUnless(os.path.exists(GLUE), "CISTERN_TEST_TORCH_GLUE (the glue built against "
                         "the c10 stand-in) is not set")
    def test_enable_hands_pytorch_the_glue_that_raises_torchs_error(self):
        torch = TorchStandIn({POOL: GLUE})
        with installed(torch), self.assertLogs("cistern.torch", "INFO") as logs:
            cistern.torch.enable()
            cistern.torch.enable()  # once only
        self.assertEqual(cistern.torch.oom_route(), "extension")
        self.assertIn("torch.OutOfMemoryError", cistern.torch.oom_route_detail())
        self.assertTrue(any("torch.OutOfMemoryError" in line and GLUE in line
                            for line in logs.output), logs.output)
        # One build, with the MemPool observer, against the installed PyTorch's CUDA headers,
        # as a plain library, cached under CISTERN_TORCH_EXTENSION_DIR.
        [load] = torch.called("load")
        _, name, sources, cflags, directory, with_cuda, is_python_module = load
        self.assertEqual((name, sources, with_cuda, is_python_module),
                         (POOL, [cistern.torch.GLUE_SOURCE], True, False))
        self.assertIn("-DCISTERN_TORCH_POOL_OBSERVER", cflags)
        self.assertTrue(directory.startswith(self.cache.name + os.sep), directory)
        self.assertIn("2.11.0+standin-pool-", directory)
        [pluggable] = torch.called("pluggable")
        self.assertEqual(pluggable[1:], (GLUE, "cistern_torch_malloc", "cistern_torch_free"))
        [change] = torch.called("change")
        self.assertIs(change[1], cistern.torch.allocator())
        self.hooks_are_the_plugins(change[1])
        # The glue is bound to the very plug-in Python loaded: its allocations are cistern's.
        glue = ctypes.CDLL(GLUE)
        glue.cistern_torch_malloc.restype = ctypes.c_void_p
        glue.cistern_torch_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        glue.cistern_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                            ctypes.c_void_p]
        ptr = glue.cistern_torch_malloc(4096, 0, None)
        self.assertTrue(ptr)
        self.assertEqual(self.allocated(), 4096)
        glue.cistern_torch_free(ptr, 4096, 0, None)
        self.assertEqual(self.allocated(), 0)

    @unittest.skipUnless(os.path.exists(GLUE), "CISTERN_TEST_TORCH_GLUE is not set")
    def test_mem_pool_gets_the_null_returning_glue_and_its_observer(self):
        torch = TorchStandIn({POOL: GLUE})
        with installed(torch):
            with cistern.torch.mem_pool(device=0) as pool:
                pass
        [pluggable] = torch.called("pluggable")
        self.assertEqual(pluggable[1:], (GLUE, "cistern_torch_pool_malloc", "cistern_torch_free"))
        self.assertIs(pool.allocator, cistern.torch.pool_allocator().allocator())
        self.hooks_are_the_plugins(cistern.torch.pool_allocator(), graph_hooks=False)
        self.assertEqual(torch.called("use_mem_pool"), [("use_mem_pool", pool, 0)])
        self.assertEqual(len(torch.called("init")), 1)  # the devices exist before the observer
        self.assertTrue(cistern.torch._pool_observer)
        self.assertEqual(torch.called("change"), [])  # the MemPool route swaps nothing

    @unittest.skipUnless(os.path.exists(GLUE), "CISTERN_TEST_TORCH_GLUE is not set")
    def test_glue_without_cuda_headers_is_the_second_build(self):
        torch = TorchStandIn({POOL: RuntimeError("Error building extension 'cistern_torch_glue_"
                                                 "pool':\n[1/2] c++ ...\nfatal error: "
                                                 "cuda_runtime_api.h: No such file"),
                              PLAIN: GLUE})
        with installed(torch):
            cistern.torch.enable()
        self.assertEqual([c[1] for c in torch.called("load")], [POOL, PLAIN])
        plain = torch.called("load")[1]
        self.assertEqual((plain[5], "-DCISTERN_TORCH_POOL_OBSERVER" in plain[3]), (False, False))
        self.assertEqual(cistern.torch.oom_route(), "extension")
        self.assertIn("plain build", cistern.torch.oom_route_detail())

    def test_without_the_glue_pytorch_gets_the_throwing_plugin_entry(self):
        error = RuntimeError("Ninja is required to load C++ extensions")
        torch = TorchStandIn({POOL: error, PLAIN: error})
        with installed(torch), self.assertLogs("cistern.torch", "WARNING") as logs:
            cistern.torch.enable()
            with cistern.torch.mem_pool():
                pass
        self.assertEqual(cistern.torch.oom_route(), "fallback")
        detail = cistern.torch.oom_route_detail()
        self.assertIn("RuntimeError('CUDA out of memory. ...')", detail)
        self.assertIn("pool build: Ninja is required", detail)
        self.assertIn("plain build: Ninja is required", detail)
        self.assertTrue(any("not torch.OutOfMemoryError" in line for line in logs.output))
        self.assertTrue(any("MemPool carries PyTorch's message" in line for line in logs.output))
        enable_route, pool_route = torch.called("pluggable")
        plugin = _library.path()
        # Never the NULL-returning cistern_malloc under enable(); PyTorch checks for NULL in a
        # MemPool, so that route keeps it.
        self.assertEqual(enable_route[1:], (plugin, "cistern_malloc_or_throw", "cistern_free"))
        self.assertEqual(pool_route[1:], (plugin, "cistern_malloc", "cistern_free"))
        self.hooks_are_the_plugins(cistern.torch.allocator())
        self.assertIs(cistern.torch._pool_observer, False)

    def test_the_glue_can_be_switched_off(self):
        os.environ["CISTERN_TORCH_EXTENSION"] = "0"
        torch = TorchStandIn({})
        with installed(torch), self.assertLogs("cistern.torch", "WARNING"):
            cistern.torch.allocator()
        self.assertEqual(torch.called("load"), [])
        self.assertEqual(cistern.torch.oom_route(), "fallback")
        self.assertIn("CISTERN_TORCH_EXTENSION=0", cistern.torch.oom_route_detail())

    def test_enable_sets_the_graph_hooks_to_the_plugins_cpp_functions(self):
        os.environ["CISTERN_TORCH_EXTENSION"] = "0"
        torch = TorchStandIn({})
        with installed(torch):
            cistern.torch.enable()
        [change] = torch.called("change")
        hooks = change[1].allocator().hooks
        for method, function in GRAPH_HOOKS.items():
            self.assertEqual(hooks[method], plugin_address(function), method)
        # What PyTorch's capture does through them, here through the plug-in's C functions: a
        # pool begun, an allocation in it, the pool released once nothing in it is live.
        lib = self.lib
        for name in ("cistern_begin_allocate_to_pool", "cistern_end_allocate_to_pool",
                     "cistern_release_pool"):
            getattr(lib, name).argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64] + (
                [ctypes.c_void_p, ctypes.c_void_p] if "begin" in name else [])
        self.assertEqual(lib.cistern_begin_allocate_to_pool(0, 1, 0, None, None), 0)
        ptr = lib.cistern_malloc(4096, 0, None)
        self.assertEqual(lib.cistern_end_allocate_to_pool(0, 1, 0), 0)
        self.assertEqual(self.allocated(), 4096)
        self.assertEqual(lib.cistern_release_pool(0, 1, 0), 0)
        lib.cistern_free(ptr, 4096, 0, None)
        self.assertEqual(cistern.memory_stats(0)["reserved_bytes.all.current"], 0)

    def test_an_older_pytorch_without_graph_hooks_gets_the_others_and_a_warning(self):
        os.environ["CISTERN_TORCH_EXTENSION"] = "0"
        torch = TorchStandIn({}, graph_hooks=False)
        with installed(torch), self.assertLogs("cistern.torch", "WARNING") as logs:
            cistern.torch.enable()
        self.hooks_are_the_plugins(cistern.torch.allocator(), graph_hooks=False)
        self.assertTrue(any("no CUDA graph pool hooks" in line for line in logs.output),
                        logs.output)

    def test_the_build_is_tried_once_per_process(self):
        error = RuntimeError("no compiler")
        torch = TorchStandIn({POOL: error, PLAIN: error})
        with installed(torch), self.assertLogs("cistern.torch", "WARNING"):
            cistern.torch.allocator()
            cistern.torch.pool_allocator()
            cistern.torch.allocator()
        self.assertEqual(len(torch.called("load")), 2)
        self.assertEqual(len(torch.called("pluggable")), 2)

    def test_no_route_before_it_is_needed(self):
        self.assertIsNone(cistern.torch.oom_route())
        self.assertEqual(cistern.torch.oom_route_detail(), "")

    def test_the_cache_folder_follows_pytorch_the_build_and_the_source(self):
        d = cistern.torch.glue_directory
        self.assertEqual(d("2.11.0", "pool", ["-DX"]), d("2.11.0", "pool", ["-DX"]))
        self.assertNotEqual(d("2.11.0", "pool", ["-DX"]), d("2.10.0", "pool", ["-DX"]))
        self.assertNotEqual(d("2.11.0", "pool", ["-DX"]), d("2.11.0", "plain", []))
        with tempfile.NamedTemporaryFile("w", suffix=".cpp") as other:
            other.write("// another source\n")
            other.flush()
            self.assertNotEqual(d("2.11.0", "pool", []), d("2.11.0", "pool", [], other.name))
        self.assertEqual(os.path.dirname(d("2.11.0+cu130", "pool", [])), self.cache.name)
        self.assertTrue(os.path.basename(d("2.11.0 cu/130", "pool", [])).startswith(
            "2.11.0_cu_130-pool-"))

    def test_a_compilers_error_line_is_the_reason_given(self):
        error = RuntimeError("Error building extension 'x':\n[1/2] c++ -c glue.cpp\n"
                             "glue.cpp:3:10: fatal error: c10/util/Exception.h: No such file\n"
                             "compilation terminated.")
        self.assertEqual(cistern.torch._first_line(error),
                         "glue.cpp:3:10: fatal error: c10/util/Exception.h: No such file")
        self.assertEqual(cistern.torch._first_line(RuntimeError("\n  no ninja\n")), "no ninja")
        self.assertEqual(cistern.torch._first_line(OSError()), "OSError")


class TorchMemoryCalls(SimulatedBackend):
    """torch.cuda.memory_* answered by cistern after enable() (cistern/_torch_memory.py)."""

    NAMES = ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
             "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
             "memory_summary")

    def setUp(self):
        super().setUp()
        os.environ["CISTERN_TORCH_EXTENSION"] = "0"  # the fallback route: no glue to build
        self.saved_api = os.environ.pop("CISTERN_TORCH_MEMORY_API", None)
        self.torch = TorchStandIn({})

    def tearDown(self):
        _torch_memory.restore()
        if self.saved_api is not None:
            os.environ["CISTERN_TORCH_MEMORY_API"] = self.saved_api
        super().tearDown()

    def malloc(self, size):
        ptr = self.lib.cistern_malloc(size, 0, None)
        self.assertTrue(ptr)
        return ptr

    def test_the_calls_answer_with_pytorchs_names_and_semantics(self):
        with installed(self.torch):
            with self.assertLogs("cistern.torch", "WARNING"):  # the fallback route is logged
                cistern.torch.enable()
            self.assertTrue(cistern.torch.memory_api_installed())
            torch = self.torch.modules["torch"]
            small, large = self.malloc(1000), self.malloc(3 * MiB)
            # Segments as cistern's defaults size them: a 2 MiB small one and a large one.
            reserved = cistern.memory_stats(0)["reserved_bytes.all.current"]
            self.assertGreater(reserved, 2 * MiB + 3 * MiB)
            for module in (torch.cuda, torch.cuda.memory):
                for device in (None, 0, "cuda", "cuda:0", types.SimpleNamespace(type="cuda",
                                                                                 index=0)):
                    self.assertEqual(module.memory_allocated(device), 1024 + 3 * MiB)
                    self.assertEqual(module.memory_reserved(device=device), reserved)
            stats = torch.cuda.memory_stats()
            self.assertIsInstance(stats, collections.OrderedDict)
            self.assertEqual(list(stats), sorted(stats))  # sorted by key, as PyTorch's
            self.assertEqual(dict(stats), cistern.memory_stats(0))
            self.assertEqual(stats["allocation.all.current"], 2)
            self.assertEqual(stats["requested_bytes.all.current"], 1000 + 3 * MiB)

            self.lib.cistern_free(large, 3 * MiB, 0, None)
            self.assertEqual(torch.cuda.memory_allocated(), 1024)
            self.assertEqual(torch.cuda.max_memory_allocated(), 1024 + 3 * MiB)
            self.assertEqual(torch.cuda.max_memory_reserved(), reserved)
            torch.cuda.reset_peak_memory_stats()
            self.assertEqual(torch.cuda.max_memory_allocated(0), 1024)
            self.assertEqual(torch.cuda.memory_stats()["allocation.all.allocated"], 2)
            torch.cuda.memory.reset_accumulated_memory_stats(0)
            self.assertEqual(torch.cuda.memory_stats()["allocation.all.allocated"], 0)
            self.assertEqual(torch.cuda.memory_stats()["allocation.all.current"], 1)
            self.lib.cistern_free(small, 1000, 0, None)
            with self.assertRaisesRegex(ValueError, "Expected a cuda device, but got: cpu"):
                torch.cuda.memory_allocated("cpu")

    def test_memory_summary_is_pytorchs_table(self):
        with installed(self.torch), self.assertLogs("cistern.torch", "WARNING"):
            cistern.torch.enable()
            torch = self.torch.modules["torch"]
            small, large = self.malloc(1000), self.malloc(3 * MiB)
            self.lib.cistern_free(large, 3 * MiB, 0, None)
            text = torch.cuda.memory_summary()
            self.assertEqual(torch.cuda.memory.memory_summary(device=0), text)
            self.assertEqual(cistern.torch.memory_summary(0), text)
            short = torch.cuda.memory_summary(abbreviated=True)
            self.lib.cistern_free(small, 1000, 0, None)
        lines = text.split("\n")
        self.assertEqual(lines[-1], "")
        lines = lines[:-1]
        # 6 heading lines, 9 metrics of 4 lines (a rule, all, large pool, small pool), 2 of 2,
        # the closing rule; every line 77 characters between its bars.
        self.assertEqual(len(lines), 6 + 9 * 4 + 2 * 2 + 1)
        for line in lines:
            self.assertEqual((len(line), line[0], line[-1]), (77, "|", "|"), line)
        self.assertEqual(lines[:6], [
            "|" + "=" * 75 + "|",
            "|                  PyTorch CUDA memory summary, device ID 0                 |",
            "|" + "-" * 75 + "|",
            "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |",
            "|" + "=" * 75 + "|",
            "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |"])
        # Units follow the "all" row of each metric: KiB for 3 MiB (from 768 KiB up).
        self.assertEqual(lines[6:10], [
            "|" + "-" * 75 + "|",
            "| Allocated memory      |   1024 B   |   3073 KiB |   3073 KiB |   3072 KiB |",
            "|       from large pool |      0 B   |   3072 KiB |   3072 KiB |   3072 KiB |",
            "|       from small pool |   1024 B   |      1 KiB |      1 KiB |      0 KiB |"])
        allocations = "| Allocations           |       1    |       2    |       2    |       1    |"
        self.assertIn(allocations, lines)
        self.assertEqual(lines[-5:], [
            "|" + "-" * 75 + "|",
            "| Oversize allocations  |       0    |       0    |       0    |       0    |",
            "|" + "-" * 75 + "|",
            "| Oversize GPU segments |       0    |       0    |       0    |       0    |",
            "|" + "=" * 75 + "|"])
        # Abbreviated: the "all" rows only.
        self.assertEqual(len(short.split("\n")) - 1, 6 + 9 * 2 + 2 * 2 + 1)
        self.assertNotIn("from large pool", short)

    def test_opting_out_leaves_pytorchs_calls(self):
        for opt_out in ("argument", "environment"):
            importlib.reload(cistern.torch)
            torch = TorchStandIn({})
            with installed(torch), self.assertLogs("cistern.torch", "WARNING"):
                if opt_out == "argument":
                    cistern.torch.enable(memory_api=False)
                else:
                    os.environ["CISTERN_TORCH_MEMORY_API"] = "0"
                    cistern.torch.enable()
                    del os.environ["CISTERN_TORCH_MEMORY_API"]
                self.assertFalse(cistern.torch.memory_api_installed())
                for name in self.NAMES:
                    with self.assertRaisesRegex(RuntimeError, "does not yet support getDevice"):
                        getattr(torch.modules["torch"].cuda, name)()

    def test_restore_puts_pytorchs_functions_back(self):
        with installed(self.torch), self.assertLogs("cistern.torch", "WARNING"):
            cuda = self.torch.modules["torch"].cuda
            originals = {name: getattr(cuda, name) for name in self.NAMES}
            cistern.torch.enable()
            self.assertEqual(cuda.memory_allocated(), 0)
            _torch_memory.restore()
            self.assertEqual({name: getattr(cuda, name) for name in self.NAMES}, originals)
            self.assertFalse(cistern.torch.memory_api_installed())


class CupyRoute(SimulatedBackend):
    def test_allocations_are_cisterns_and_are_freed_with_the_last_reference(self):
        cupy = CupyStandIn()
        with installed(cupy):
            memory = cistern.cupy.malloc(4096)
            self.assertEqual(self.allocated(), 4096)
            self.assertEqual(memory.ptr % 512, 0)
            empty = cistern.cupy.malloc(0)
            self.assertEqual((empty.ptr, empty.mem.device_id), (0, 0))
            del memory
            gc.collect()
            self.assertEqual(self.allocated(), 0)

    def test_out_of_memory_is_cupys_error_with_cisterns_message(self):
        cupy = CupyStandIn()
        with installed(cupy):
            held = cistern.cupy.malloc(100 * MiB)
            with self.assertRaises(cupy.modules["cupy"].cuda.memory.OutOfMemoryError) as caught:
                cistern.cupy.malloc(2048 * MiB)
            self.assertIs(type(caught.exception), cupy.modules["cupy"].cuda.memory.OutOfMemoryError)
            message = str(caught.exception)
            self.assertTrue(message.startswith("cistern: out of memory on device 0: requested "
                                               "2147483648 bytes (2.00 GiB)"), message)
            self.assertEqual((caught.exception._size, caught.exception._total),
                             (2048 * MiB, 100 * MiB))
            again = cistern.cupy.malloc(500 * MiB)  # usable afterwards
            self.assertEqual(self.allocated(), 600 * MiB)
            del held, again
            gc.collect()
        self.assertEqual(self.allocated(), 0)
        cistern.check(0)

    def test_the_memory_fraction_caps_cupys_allocations(self):
        cupy = CupyStandIn()
        with installed(cupy):
            cistern.cupy.set_memory_fraction(0.25)
            with self.assertRaises(MemoryError) as caught:
                cistern.cupy.malloc(300 * MiB)
            self.assertIn("It may reserve at most 256.00 MiB", str(caught.exception))
            with self.assertRaises(cistern.CisternError) as bad:
                cistern.cupy.set_memory_fraction(1.5)
            self.assertEqual(bad.exception.code, 4)

    def test_other_failures_are_cistern_errors(self):
        cupy = CupyStandIn(device=70)
        with installed(cupy):
            with self.assertRaises(cistern.CisternError) as caught:
                cistern.cupy.malloc(4096)
            self.assertEqual(caught.exception.code, 4)
            self.assertIn("device 70 is out of range", str(caught.exception))
            cupy.device, cupy.stream = 0, 0xdead0
            with self.assertRaises(cistern.CisternError) as caught:
                cistern.cupy.malloc(4096)
            self.assertIn("unknown stream handle 0xdead0", str(caught.exception))

    def test_enable_and_disable_swap_cupys_allocator(self):
        cupy = CupyStandIn()
        with installed(cupy):
            cistern.cupy.enable()
            self.assertIs(cupy.allocator, cistern.cupy.malloc)
            cistern.cupy.disable()
            self.assertEqual(cupy.allocator, "cupy's pool")


if __name__ == "__main__":
    unittest.main()
