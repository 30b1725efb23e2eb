# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""libcistern_plugin.so from Python ctypes on the simulated backend (CISTERN_BACKEND=sim,
1 GiB per device): allocation, frees on streams, statistics, misuse, concurrent callers, and
the snapshot read back with the standard library's pickle."""
import ctypes
import os
import threading
import unittest

import cistern
from cistern import _library

MiB = 1 << 20


def setUpModule():
    os.environ["CISTERN_BACKEND"] = "sim"
    os.environ["CISTERN_SIM_CAPACITY"] = "1GiB"
    os.environ.pop("CISTERN_ALLOC_CONF", None)


class PluginTest(unittest.TestCase):
    def setUp(self):
        self.lib = _library.load()
        self.lib.cistern_shutdown()

    def tearDown(self):
        self.lib.cistern_shutdown()

    def stat(self, key, device=0):
        return cistern.memory_stats(device)[key]

    def test_allocate_free_and_statistics(self):
        self.assertEqual(cistern.backend(), "sim")
        p = self.lib.cistern_malloc(1000, 0, None)
        self.assertEqual(p % 512, 0)
        self.assertEqual(self.stat("allocated_bytes.all.current"), 1024)
        self.assertEqual(self.stat("requested_bytes.all.current"), 1000)
        self.assertEqual(self.stat("reserved_bytes.all.current"), 2 * MiB)
        self.assertEqual(self.stat("segment.small_pool.current"), 1)
        self.lib.cistern_free(p, 1000, 0, None)
        stats = cistern.memory_stats(0)
        self.assertEqual(stats["allocated_bytes.all.current"], 0)
        self.assertEqual(stats["allocated_bytes.all.peak"], 1024)
        self.assertEqual(stats["num_ooms"], 0)
        self.assertEqual(stats["max_split_size"], -1)
        cistern.empty_cache()
        self.assertEqual(self.stat("reserved_bytes.all.current"), 0)
        cistern.reset_peak_memory_stats(0)
        self.assertEqual(self.stat("allocated_bytes.all.peak"), 0)
        cistern.reset_accumulated_memory_stats(0)
        self.assertEqual(self.stat("allocation.all.allocated"), 0)
        self.assertEqual(cistern.misuse_count(), 0)
        self.assertEqual(cistern.last_error(), "")

    def test_graph_pool_keeps_its_blocks_and_gives_them_back_when_released(self):
        lib = self.lib
        Filter = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
        lib.cistern_begin_allocate_to_pool.argtypes = [ctypes.c_int, ctypes.c_uint64,
                                                       ctypes.c_uint64, Filter, ctypes.c_void_p]
        for name in ("cistern_end_allocate_to_pool", "cistern_release_pool"):
            getattr(lib, name).argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
        lib.cistern_sim_create_stream.restype = ctypes.c_void_p
        lib.cistern_sim_create_stream.argtypes = [ctypes.c_int]
        captured = lib.cistern_sim_create_stream(0)
        accepts = Filter(lambda context, stream: int(stream == captured))
        self.assertEqual(lib.cistern_begin_allocate_to_pool(0, 3, 0, accepts, None), 0)
        in_pool = lib.cistern_malloc(1000, 0, captured)
        general = lib.cistern_malloc(1000, 0, None)  # the filter refuses the default stream
        self.assertEqual(lib.cistern_end_allocate_to_pool(0, 3, 0), 0)
        lib.cistern_free(in_pool, 1000, 0, captured)
        lib.cistern_free(general, 1000, 0, None)
        self.assertEqual(self.stat("reserved_bytes.all.current"), 4 * MiB)  # pool's and general
        cistern.empty_cache()  # a pool in use keeps its memory for its graph's replays
        self.assertEqual(self.stat("reserved_bytes.all.current"), 2 * MiB)
        self.assertEqual(lib.cistern_release_pool(0, 3, 0), 0)
        self.assertEqual(self.stat("reserved_bytes.all.current"), 0)
        self.assertEqual(cistern.last_error(), "")

    def test_out_of_memory_returns_null(self):
        self.assertIsNone(self.lib.cistern_malloc(2048 * MiB, 0, None))
        self.assertEqual(cistern.last_error_code(), 1)
        self.assertIn("out of memory", cistern.last_error())
        self.assertEqual(self.stat("num_ooms"), 1)
        self.assertEqual(cistern.misuse_count(), 0)
        p = self.lib.cistern_malloc(MiB, 0, None)
        self.assertIsNotNone(p)
        self.lib.cistern_free(p, MiB, 0, None)

    def test_double_free_unknown_pointer_and_size_mismatch(self):
        p = self.lib.cistern_malloc(4096, 0, None)
        q = self.lib.cistern_malloc(1000, 0, None)
        self.lib.cistern_free(p, 4096, 0, None)
        self.lib.cistern_free(p, 4096, 0, None)
        self.assertEqual(cistern.last_error_code(), 2)
        self.assertIn("double free", cistern.last_error())
        self.lib.cistern_free(0x1000, 16, 0, None)
        self.assertEqual(cistern.last_error_code(), 2)
        self.assertIn("not allocated by this allocator", cistern.last_error())
        self.lib.cistern_free(q, 999, 0, None)
        self.assertEqual(cistern.last_error_code(), 3)
        self.assertIn("the allocation has size 1000 on device 0", cistern.last_error())
        self.assertEqual(cistern.misuse_count(), 3)
        self.assertEqual(self.stat("allocated_bytes.all.current"), 1024)
        self.lib.cistern_free(q, 1000, 0, None)
        self.assertEqual(self.stat("allocated_bytes.all.current"), 0)
        cistern.clear_error()
        self.assertEqual(cistern.last_error_code(), 0)

    def test_frees_on_streams_and_record_stream(self):
        s1 = self.lib.cistern_sim_create_stream(0)
        s2 = self.lib.cistern_sim_create_stream(0)
        p = self.lib.cistern_malloc(4096, 0, s1)
        self.lib.cistern_free(p, 4096, 0, s1)
        self.assertEqual(self.lib.cistern_malloc(4096, 0, s1), p)
        self.lib.cistern_record_stream(p, s2)
        self.assertEqual(self.lib.cistern_sim_launch(0, s2, 1000000), 0)
        self.lib.cistern_free(p, 4096, 0, s1)
        self.assertEqual(self.stat("active_bytes.all.current"), 4096)
        states = [b["state"] for s in cistern.snapshot()["segments"] for b in s["blocks"]]
        self.assertEqual(states, ["active_pending_free", "inactive"])
        self.assertEqual(self.lib.cistern_sim_synchronize(0), 0)
        cistern.empty_cache()
        self.assertEqual(self.stat("active_bytes.all.current"), 0)
        self.assertEqual(self.stat("reserved_bytes.all.current"), 0)

    def test_memory_fraction(self):
        self.lib.cistern_set_memory_fraction(0.25, 0)
        self.assertIsNone(self.lib.cistern_malloc(300 * MiB, 0, None))
        self.assertEqual(cistern.last_error_code(), 1)
        self.lib.cistern_set_memory_fraction(2.0, 0)
        self.assertEqual(cistern.last_error_code(), 4)

    def test_snapshot_has_pytorch_keys(self):
        cistern.record_history(True)
        p = self.lib.cistern_malloc(3 * MiB, 0, None)
        self.lib.cistern_free(p, 3 * MiB, 0, None)
        snap = cistern.snapshot()
        self.assertEqual(sorted(snap), ["allocator_settings", "device_traces",
                                        "external_annotations", "segments"])
        # The simulated device has virtual memory: far from the limit the engine maps the
        # block's whole 20 MiB page in its address range, as expandable segments do, and the
        # snapshot shows the mapped range as an expandable segment, as PyTorch would.
        segment = snap["segments"][0]
        self.assertEqual(segment["total_size"], 20 * MiB)
        self.assertEqual(segment["segment_type"], "large")
        self.assertTrue(segment["is_expandable"])
        self.assertEqual(segment["segment_pool_id"], (0, 0))
        self.assertEqual(segment["blocks"], [{"address": p, "size": 20 * MiB, "requested_size": 0,
                                              "state": "inactive", "frames": []}])
        actions = [(e["action"], e["addr"], e["size"]) for e in snap["device_traces"][0]]
        self.assertEqual(actions, [("segment_map", p, 20 * MiB),
                                   ("alloc", p, 3 * MiB), ("free_requested", p, 3 * MiB),
                                   ("free_completed", p, 3 * MiB)])
        self.assertEqual(snap["allocator_settings"]["max_split_size"], -1)
        cistern.record_history(False)

    def test_concurrent_callers(self):
        streams = [self.lib.cistern_sim_create_stream(0) for _ in range(4)]
        errors = []

        def work(stream):
            held = []
            for i in range(500):
                size = 512 + (i * 7919) % (3 * MiB)
                p = self.lib.cistern_malloc(size, 0, stream)
                if not p:
                    errors.append(cistern.last_error())
                    continue
                held.append((p, size))
                if len(held) > 8:
                    q, n = held.pop(0)
                    self.lib.cistern_free(q, n, 0, stream)
            for q, n in held:
                self.lib.cistern_free(q, n, 0, stream)

        threads = [threading.Thread(target=work, args=(s,)) for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(self.stat("allocation.all.allocated"), 2000)
        self.assertEqual(self.stat("allocated_bytes.all.current"), 0)
        self.assertEqual(cistern.misuse_count(), 0)

    def test_every_failing_package_call_raises_cistern_error_with_its_code(self):
        failing = [
            (lambda: cistern.memory_stats(64), 4, "memory_stats: device 64 is out of range"),
            (lambda: cistern.reset_peak_memory_stats(-1), 4, "device -1 is out of range"),
            (lambda: cistern.reset_accumulated_memory_stats(64), 4, "device 64 is out of range"),
            (lambda: cistern.write_snapshot("/nonexistent-cistern/x.pickle"), 4,
             "No such file or directory"),
            (lambda: cistern.set_memory_fraction(0), 4, "not in (0, 1]"),
            (lambda: cistern.set_memory_fraction(float("nan")), 4, "not in (0, 1]"),
            (lambda: cistern.set_memory_fraction(0.5, 64), 4, "device 64 is out of range"),
            (lambda: cistern.check(-1), 4, "check: device -1 is out of range"),
        ]
        for call, code, says in failing:
            with self.assertRaises(cistern.CisternError) as caught:
                call()
            self.assertEqual(caught.exception.code, code)
            self.assertIn(says, str(caught.exception))
        cistern.set_memory_fraction(0.5)
        cistern.check(0)

    def test_try_malloc_returns_the_code_and_this_calls_message(self):
        code, ptr, message = _library.try_malloc(2048 * MiB, 0, None)
        self.assertEqual((code, ptr), (1, None))
        self.assertTrue(message.startswith("cistern: out of memory on device 0"), message)
        code, ptr, message = _library.try_malloc(4096, 0, None)
        self.assertEqual((code, message), (0, ""))
        self.lib.cistern_free(ptr, 4096, 0, None)
        self.assertEqual(_library.try_malloc(4096, 99, None)[0], 4)

    def test_bad_configuration_raises_in_python(self):
        os.environ["CISTERN_BACKEND"] = "tpu"
        try:
            self.lib.cistern_shutdown()
            with self.assertRaises(cistern.CisternError) as caught:
                cistern.backend()
            self.assertEqual(caught.exception.code, 5)
            self.assertIn("CISTERN_BACKEND='tpu'", str(caught.exception))
        finally:
            os.environ["CISTERN_BACKEND"] = "sim"


if __name__ == "__main__":
    unittest.main()
