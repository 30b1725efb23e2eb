# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""cistern.torch.record_history(stacks="python"): each allocation's Python frames reach the
snapshot as PyTorch writes them (events' and blocks' `frames`: filename, line, name, innermost
first). PyTorch (the stand-in's pluggable allocator here) calls the plug-in's allocation function
from C with the GIL released; the plug-in asks cistern's hook for the stack on that thread."""
import ctypes
import os
import sys
import threading
import unittest

import cistern
import cistern.torch
from tests.stand_ins import TorchStandIn, installed
from tests.test_framework_glue import SimulatedBackend

MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
HERE = os.path.abspath(__file__)


class RecordHistoryStacks(SimulatedBackend):
    def setUp(self):
        super().setUp()
        os.environ["CISTERN_TORCH_EXTENSION"] = "0"  # the fallback route: no glue to build
        self.torch = TorchStandIn({})

    def tearDown(self):
        cistern.torch.record_history(None)
        super().tearDown()

    def pytorch_functions(self):
        # What PyTorch holds after change_current_allocator: the two functions' addresses.
        pluggable = self.torch.called("change")[0][1]
        malloc_address, free_address = pluggable.addresses
        return MALLOC(malloc_address), FREE(free_address)

    def allocate_in_layer(self, malloc, size):
        return malloc(size, 0, None)  # the known call site: this line, in allocate_in_layer

    def entries(self, snapshot, action):
        return [e for e in snapshot["device_traces"][0] if e["action"] == action]

    def test_each_event_carries_its_allocations_python_frames(self):
        with installed(self.torch):
            cistern.torch.enable(memory_api=False)
            malloc, free = self.pytorch_functions()
            cistern.torch.record_history(stacks="python")
            line = self.allocate_in_layer.__code__.co_firstlineno + 1
            caller = None

            def train_step():
                nonlocal caller
                caller = sys._getframe().f_lineno + 1
                return self.allocate_in_layer(malloc, 3 << 20)

            test_line = sys._getframe().f_lineno + 1
            kept = train_step()
            freed = self.allocate_in_layer(malloc, 1000)
            free(freed, 1000, 0, None)
            snap = cistern.torch.snapshot()

        allocs = self.entries(snap, "alloc")
        self.assertEqual(len(allocs), 2)
        first = allocs[0]["frames"]
        self.assertEqual(first[0], {"filename": HERE, "line": line, "name": "allocate_in_layer"})
        self.assertEqual(first[1], {"filename": HERE, "line": caller, "name": "train_step"})
        test_name = "test_each_event_carries_its_allocations_python_frames"
        self.assertEqual(first[2], {"filename": HERE, "line": test_line, "name": test_name})
        # The free events carry the frames of the allocation they free, as PyTorch's do.
        second = allocs[1]["frames"]
        self.assertEqual(second[0]["line"], line)
        self.assertEqual(second[1]["name"], test_name)
        for action in ("free_requested", "free_completed"):
            (entry,) = self.entries(snap, action)
            self.assertEqual(entry["frames"], second)
        # The live block carries its allocation's frames in the segments.
        blocks = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == kept]
        self.assertEqual(len(blocks), 1)
        self.assertEqual(blocks[0]["state"], "active_allocated")
        self.assertEqual(blocks[0]["frames"], first)

    def test_without_stacks_there_are_none_and_each_thread_has_its_own(self):
        with installed(self.torch):
            cistern.torch.enable(memory_api=False)
            malloc, _ = self.pytorch_functions()
            cistern.torch.record_history(stacks=None)
            self.allocate_in_layer(malloc, 4096)
            without = cistern.torch.snapshot()
            cistern.torch.record_history(stacks="python")  # starts a new history
            thread = threading.Thread(target=lambda: self.allocate_in_layer(malloc, 8192))
            thread.start()
            thread.join()
            with_stacks = cistern.torch.snapshot()
        (plain,) = self.entries(without, "alloc")
        self.assertEqual(plain["frames"], [])
        (threaded,) = self.entries(with_stacks, "alloc")
        # The allocating thread's own frames: the call site, the thread's target, threading's.
        names = [f["name"] for f in threaded["frames"]]
        self.assertEqual(names[:2], ["allocate_in_layer", "<lambda>"])
        self.assertIn("run", names)

    def test_all_stacks_put_the_native_callers_frames_before_the_python_ones(self):
        with installed(self.torch):
            cistern.torch.enable(memory_api=False)
            malloc, free = self.pytorch_functions()
            cistern.torch.record_history(stacks="python")
            p = self.allocate_in_layer(malloc, 4096)
            python_only = cistern.torch.snapshot()
            cistern.torch.record_history(stacks="all")
            q = self.allocate_in_layer(malloc, 8192)
            with_native = cistern.torch.snapshot()
            free(p, 4096, 0, None)
            free(q, 8192, 0, None)
        (plain,) = self.entries(python_only, "alloc")
        (full,) = self.entries(with_native, "alloc")
        python_frames = plain["frames"]
        self.assertEqual(python_frames[0]["name"], "allocate_in_layer")
        # The Python frames come last, as they were; before them the native frames between the
        # plug-in and the interpreter (here ctypes' call into the plug-in), none of the plug-in's.
        # The Python frames differ in the caller's line only (the test's, two calls apart).
        first_python = next(i for i, f in enumerate(full["frames"]) if f["filename"] == HERE)
        native, tail = full["frames"][:first_python], full["frames"][first_python:]
        self.assertGreater(len(native), 0)
        self.assertEqual([f["name"] for f in tail], [f["name"] for f in python_frames])
        self.assertEqual(tail[0], python_frames[0])
        plugin = os.path.realpath(os.environ["CISTERN_PLUGIN_LIBRARY"])
        for frame in native:
            self.assertEqual(frame["line"], 0)
            self.assertTrue(frame["filename"].endswith(".so") or ".so." in frame["filename"],
                            frame)
            self.assertNotEqual(os.path.realpath(frame["filename"]), plugin)
            self.assertTrue(frame["name"])
        # Back to "python": no native frames.
        with installed(self.torch):
            cistern.torch.record_history(stacks="python")
            r = self.allocate_in_layer(malloc, 4096)
            again = cistern.torch.snapshot()
            free(r, 4096, 0, None)
        (last,) = self.entries(again, "alloc")
        self.assertEqual(last["frames"][0]["name"], "allocate_in_layer")

    def test_bad_stacks_argument_is_refused(self):
        with self.assertRaises(ValueError):
            cistern.torch.record_history(stacks="cpp")


if __name__ == "__main__":
    unittest.main()
