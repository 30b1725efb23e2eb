# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""The parts of scripts/gpu_frameworks.py (the framework check on a GPU) that need no GPU: the
shape sequence, the caps, the per-run figures, the rows file, the report, and the orchestrator's
robustness (a row that hangs is killed, a process that dies is replaced, an allocator whose
processes keep dying is given up, the budget is kept), the latter with a stand-in worker
(stand_in_framework_worker.py) that runs the script's own row bookkeeping."""
import json
import os
import sys
import tempfile
import time
import unittest

from tests.project_scripts import load_script, script_path

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = script_path("gpu_frameworks")
STAND_IN = os.path.join(HERE, "stand_in_framework_worker.py")
gf = load_script("gpu_frameworks")

GiB, MiB = gf.GiB, gf.MiB


class Plan(unittest.TestCase):
    def test_the_shape_sequence_is_fixed_varied_and_within_its_bounds(self):
        shapes = gf.shape_sequence(28)
        self.assertEqual(shapes, gf.shape_sequence(28))
        self.assertEqual(shapes[:5], gf.shape_sequence(5))
        self.assertNotEqual(shapes, gf.shape_sequence(28, seed=20))
        self.assertEqual(len(shapes), 28)
        for batch, seq in shapes:
            self.assertTrue(128 <= seq <= 2048 and seq % 64 == 0, seq)
            self.assertEqual(batch, max(1, batch))
            self.assertLessEqual(batch * seq, 16384)
            self.assertGreater(batch * seq, 6144 - seq)
        # The shape changes from step to step, as packed variable-length data does.
        self.assertGreaterEqual(len(set(shapes)), 24)
        self.assertTrue(all(a != b for a, b in zip(shapes, shapes[1:])))

    def test_stacks_summary_counts_python_and_pytorchs_cpp_frames(self):
        def frame(filename, line, name):
            return {"filename": filename, "line": line, "name": name}

        torch_cpp = frame("/site-packages/torch/lib/libtorch_cuda.so", 0, "at::native::empty_cuda")
        ffi = frame("/lib/libffi.so.8", 0, "ffi_call")
        forward = frame("/work/model.py", 21, "forward")
        step = frame("/work/train.py", 5, "step")
        snapshot = {"device_traces": [[
            {"action": "alloc", "frames": [torch_cpp, forward, step]},
            {"action": "free_requested", "frames": [torch_cpp, forward, step]},
            {"action": "alloc", "frames": [ffi, step]},
            {"action": "alloc", "frames": [torch_cpp]},     # backward's worker thread
            {"action": "alloc", "frames": [step, torch_cpp]},  # C++ after Python: not counted
            {"action": "alloc", "frames": []},
        ]]}
        self.assertEqual(gf.stacks_summary(snapshot, ("forward",)),
                         {"allocs": 5, "python": 3, "forward": 1, "torch_cpp": 2, "cpp_only": 1})
        self.assertEqual(gf.stacks_summary({}, ("forward",))["allocs"], 0)

    def test_the_cupy_shapes_are_fixed_and_within_bounds(self):
        shapes = gf.cupy_shapes(28)
        self.assertEqual(shapes, gf.cupy_shapes(28))
        self.assertTrue(all(2048 <= r <= 12288 and r % 512 == 0 and c == 1024 for r, c in shapes))
        self.assertGreater(len(set(shapes)), 10)

    def test_rows_run_fragmentation_first_then_uncapped_then_caps_loose_to_tight(self):
        self.assertEqual(gf.planned_rows("torch", "native"),
                         ["fragmentation", "oom", "graphs", "uncapped", "cap1.20", "cap1.05",
                          "cap1.02", "cap1.01", "cap1.00", "mempool"])
        self.assertEqual(gf.planned_rows("torch", "cistern")[-2:], ["cap1.00", "stacks"])
        self.assertNotIn("stacks", gf.planned_rows("torch", "native"))
        self.assertEqual(gf.planned_rows("torch", "cistern")[2], "graphs")
        self.assertNotIn("graphs", gf.planned_rows("torch", "cistern-classic"))
        self.assertEqual(gf.planned_rows("cupy", "cupy"),
                         [r for r in gf.planned_rows("torch", "cistern")
                          if r not in ("oom", "graphs", "stacks")])
        self.assertEqual(gf.row_factor("cap1.02"), 1.02)
        self.assertIsNone(gf.row_factor("uncapped"))
        self.assertEqual([gf.row_factor(gf.cap_row(f)) for f in gf.CAP_FACTORS],
                         list(gf.CAP_FACTORS))

    def test_caps_are_factors_of_the_base_peak_as_fractions_of_the_device(self):
        self.assertEqual(gf.cap_bytes(4 * GiB, 1.02), 4380866642)
        self.assertEqual(gf.cap_bytes(4 * GiB, 1.0), 4 * GiB)
        total = 150754820096  # an H200's cudaMemGetInfo total
        fraction = gf.cap_fraction(gf.cap_bytes(4 * GiB, 1.05), total)
        self.assertAlmostEqual(fraction * total, 1.05 * 4 * GiB, delta=1)
        self.assertEqual(gf.cap_fraction(2 * total, total), 1.0)
        with self.assertRaises(ValueError):
            gf.cap_fraction(GiB, 0)

    def test_a_run_reports_its_oom_steps_and_the_median_of_its_completed_steps(self):
        steps = [{"ms": 900.0, "oom": False}, {"ms": 10.0, "oom": False},
                 {"ms": 5.0, "oom": True}, {"ms": 30.0, "oom": False},
                 {"ms": 20.0, "oom": False}, {"ms": 7.0, "oom": True}]
        s = gf.summarize_steps(steps)
        self.assertEqual((s["steps"], s["completed"], s["ooms"], s["oom_steps"]), (6, 4, 2, [2, 5]))
        self.assertEqual(s["median_ms"], 20.0)  # 10, 20, 30: the first step and the OOMs left out
        self.assertEqual(s["mean_ms"], 20.0)
        none = gf.summarize_steps([{"ms": 1.0, "oom": False}, {"ms": 1.0, "oom": True}])
        self.assertEqual((none["median_ms"], none["ooms"]), (None, 1))


def event(framework, allocator, row, **fields):
    e = {"event": "row", "framework": framework, "allocator": allocator, "row": row,
         "status": "ok"}
    e.update(fields)
    return e


class RowsFile(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.folder.name, "rows.jsonl")

    def tearDown(self):
        self.folder.cleanup()

    def test_a_line_cut_short_by_a_killed_process_is_left_out(self):
        gf.append_event(self.path, {"event": "start", "row": "uncapped"})
        with open(self.path, "a") as f:
            f.write('{"event": "row", "row": "unc')
        self.assertEqual(gf.read_events(self.path), [{"event": "start", "row": "uncapped"}])
        self.assertEqual(gf.read_events(os.path.join(self.folder.name, "none")), [])

    def test_what_is_left_in_progress_and_the_base_of_the_caps(self):
        events = [
            {"event": "start", "framework": "torch", "allocator": "native", "row": "fragmentation"},
            event("torch", "native", "fragmentation", served=False),
            {"event": "start", "framework": "torch", "allocator": "native", "row": "uncapped"},
            event("torch", "native", "uncapped", peak_allocated=5 * GiB),
            {"event": "start", "framework": "torch", "allocator": "native", "row": "cap1.20"},
        ]
        self.assertEqual(gf.row_in_progress(events, "torch", "native"), "cap1.20")
        self.assertIsNone(gf.row_in_progress(events, "torch", "cistern"))
        self.assertEqual(gf.remaining_rows("torch", "native", events),
                         ["oom", "graphs", "cap1.20", "cap1.05", "cap1.02", "cap1.01",
                          "cap1.00", "mempool"])
        self.assertEqual(gf.base_peak(events, "torch", "cistern"),
                         (5 * GiB, "native uncapped peak allocated"))
        # Without a native figure, an allocator's caps follow its own uncapped run.
        own = [event("torch", "native", "uncapped", status="crashed"),
               event("torch", "cistern", "uncapped", peak_allocated=3 * GiB)]
        self.assertEqual(gf.base_peak(own, "torch", "cistern"),
                         (3 * GiB, "cistern uncapped peak allocated"))
        self.assertEqual(gf.base_peak(own, "torch", "expandable"), (None, None))

    def test_the_report_has_every_run_and_the_fragmentation_case(self):
        events = [
            event("torch", "native", "uncapped", label="native", steps=28, ooms=0,
                  peak_reserved=5 * GiB, peak_allocated=4 * GiB, median_ms=30.0),
            event("torch", "native", "cap1.02", label="native", steps=28, ooms=3,
                  cap=gf.cap_bytes(4 * GiB, 1.02), peak_reserved=int(4.08 * GiB),
                  peak_allocated=4 * GiB, median_ms=33.0, oom_type="torch.OutOfMemoryError"),
            event("torch", "cistern", "uncapped", label="cistern (defaults)", steps=28, ooms=0,
                  peak_reserved=int(4.1 * GiB), peak_allocated=4 * GiB, median_ms=31.5,
                  last_loss=7.25, torch_api="agree"),
            event("torch", "cistern", "cap1.02", label="cistern (defaults)", steps=28, ooms=0,
                  cap=gf.cap_bytes(4 * GiB, 1.02), peak_reserved=int(4.07 * GiB),
                  peak_allocated=4 * GiB, median_ms=32.0, torch_api="differ: memory_summary"),
            event("torch", "cistern", "cap1.00", label="cistern (defaults)", status="crashed",
                  detail="the worker died (exit -11): Segmentation | fault"),
            event("torch", "native", "fragmentation", label="native", served=False, ms=2.5,
                  reserved_before=3000 * MiB, reserved_after=3000 * MiB,
                  error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB"),
            event("torch", "expandable", "fragmentation", label="native, expandable", served=True,
                  ms=11.0, reserved_before=3000 * MiB, reserved_after=3036 * MiB),
            event("torch", "native", "mempool", oom_type="torch.OutOfMemoryError",
                  carries_cistern_message=True, next_allocation="served"),
            event("torch", "cistern", "oom", label="cistern (defaults)",
                  oom_type="torch.OutOfMemoryError", carries_cistern_message=True,
                  next_allocation="served", context="usable",
                  error="CUDA out of memory. cistern: out of memory on device 0: requested"),
            event("torch", "expandable", "oom", label="native, expandable", status="crashed",
                  detail="the worker died (exit 139)"),
        ]
        meta = {"gpu": "NVIDIA H200", "method": "one process per allocator",
                "base_peak": {"torch": 4 * GiB}, "notes": ["a note"]}
        text = gf.markdown(meta, events)
        self.assertIn("caps x 4.00 GiB", text)
        self.assertIn("| native | uncapped | - | 0/28 | 5.00 | 4.00 | 30.0 | +0.0% | ok |", text)
        self.assertIn("| native | 1.02x | 4.08 | 3/28 | 4.08 | 4.00 | 33.0 | +10.0% | ok; first "
                      "OOM: torch.OutOfMemoryError |", text)
        self.assertIn("| cistern (defaults) | 1.02x | 4.08 | 0/28 | 4.07 | 4.00 | 32.0 | +6.7% "
                      "| ok |", text)
        self.assertIn("| cistern (defaults) | 1.00x | - | - | - | - | - | - | crashed: the worker "
                      "died (exit -11): Segmentation / fault |", text)
        self.assertIn("| cistern (defaults) | 1.02x | 31.5 | 7.2500 |", text)  # tightest clean
        self.assertIn("| native | none | 30.0 | - |", text)
        self.assertIn("| torch | native | out of memory | 2.5 | 2.93 | 2.93 | torch.OutOfMemory"
                      "Error: CUDA out of memory. Tried to allocate 1.50 GiB |", text)
        self.assertIn("| torch | native, expandable | served | 11.0 | 2.93 | 2.96 |  |", text)
        self.assertIn("- carries cistern message: True", text)
        self.assertIn("| cistern (defaults) | torch.OutOfMemoryError | yes | served | usable | "
                      "CUDA out of memory. cistern: out of memory on device 0: requested |", text)
        self.assertIn("| native, expandable | crashed | - | - | - | the worker died (exit 139) |",
                      text)
        self.assertIn("- note: a note", text)
        self.assertIn("\n- torch.cuda.memory_* under cistern.torch.enable(): agree with cistern's "
                      "statistics in 1 of 2 runs; cap1.02: differ: memory_summary\n", text)
        self.assertNotIn("CuPy", text)
        gf.write_report(self.folder.name, meta, events)
        with open(os.path.join(self.folder.name, "frameworks.json")) as f:
            document = json.load(f)
        self.assertEqual(len(document["rows"]), len(events))
        self.assertEqual(document["meta"]["gpu"], "NVIDIA H200")
        with open(os.path.join(self.folder.name, "frameworks.md")) as f:
            self.assertEqual(f.read(), text)
        self.assertEqual(sorted(os.listdir(self.folder.name)),
                         ["frameworks.json", "frameworks.md"])


class OrchestratorWithAStandInWorker(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.lines = []

    def tearDown(self):
        os.environ.pop("STAND_IN_PLAN", None)
        self.folder.cleanup()

    def orchestrator(self, plan, budget_s=60.0):
        env = dict(os.environ, STAND_IN_PLAN=json.dumps(plan))
        env.pop("CISTERN_ALLOC_CONF", None)
        return gf.Orchestrator(self.folder.name, budget_s, 4, [sys.executable, STAND_IN], env,
                               row_timeout=1.5, startup_timeout=20, log=self.lines.append)

    def results(self, o):
        return {(a, r): e for (f, a, r), e in gf.row_results(o.events()).items()}

    def test_every_row_ends_and_is_reported_whatever_the_workers_do(self):
        o = self.orchestrator({
            "torch/expandable/cap1.02": "hang",
            "torch/cistern/fragmentation": "error",
            "torch/cistern/oom": "crash",
            "torch/cistern-classic/cap1.05": "error",
        })
        started = time.monotonic()
        for allocator in gf.TORCH_ALLOCATORS:
            o.run_allocator("torch", allocator)
        results = self.results(o)
        # native: everything, the MemPool row included, in one process.
        native = [results[("native", r)] for r in gf.planned_rows("torch", "native")]
        self.assertEqual({r["status"] for r in native}, {"ok"})
        self.assertEqual(len({r["pid"] for r in native}), 1)
        self.assertEqual(native[0]["label"], "native")
        # The caps of the others follow native's uncapped peak allocated, through the command.
        capped = results[("expandable", "cap1.20")]
        self.assertEqual((capped["base_peak"], capped["base_source"]),
                         (4 * GiB, "native uncapped peak allocated"))
        self.assertEqual(capped["cap"], gf.cap_bytes(4 * GiB, 1.2))
        self.assertEqual(capped["label"], "native, expandable_segments:True")
        # expandable: the hung row is killed at its timeout, the rest run in a new process.
        hung = results[("expandable", "cap1.02")]
        self.assertEqual(hung["status"], "timeout")
        self.assertEqual(hung["detail"], "timeout: row cap1.02 ran past 1 s")
        after = [results[("expandable", r)] for r in ("cap1.01", "cap1.00")]
        self.assertEqual([r["status"] for r in after], ["ok", "ok"])
        self.assertNotEqual(after[0]["pid"], capped["pid"])
        # cistern: an error, then a crash, each in the first row of its process: the rest is
        # given up, and said so.
        self.assertEqual(results[("cistern", "fragmentation")]["status"], "error")
        self.assertEqual(results[("cistern", "oom")]["status"], "crashed")
        self.assertIn("exit 139", results[("cistern", "oom")]["detail"])
        self.assertIn("Segmentation fault", results[("cistern", "oom")]["detail"])
        for row in ("uncapped", "cap1.20", "cap1.05", "cap1.02", "cap1.01", "cap1.00", "stacks"):
            self.assertEqual(results[("cistern", row)]["status"], "skipped")
            self.assertIn("two workers in a row ended without running a row to the end",
                          results[("cistern", row)]["detail"])
        self.assertEqual(results[("cistern", "oom")]["label"], "cistern (defaults)")
        # cistern-classic: an error ends its row and its process; the next process goes on.
        error = results[("cistern-classic", "cap1.05")]
        self.assertEqual(error["status"], "error")
        self.assertIn("illegal memory access", error["detail"])
        self.assertEqual(results[("cistern-classic", "cap1.02")]["status"], "ok")
        self.assertEqual(results[("cistern-classic", "cap1.00")]["label"], "cistern vmm:False")
        self.assertTrue(o.failed)
        # native: the graphs and MemPool rows; cistern: the graphs and stacks rows.
        self.assertEqual(len(results), 10 + 10 + 2 * 8)
        self.assertLess(time.monotonic() - started, 40)
        o.report()
        with open(os.path.join(self.folder.name, "frameworks.md")) as f:
            text = f.read()
        self.assertIn("timeout: row cap1.02 ran past 1 s", text)
        self.assertTrue(os.path.exists(os.path.join(self.folder.name, "worker-torch-cistern.log")))

    def test_a_worker_that_cannot_start_is_tried_twice_then_given_up(self):
        o = self.orchestrator({"cupy/cupy": "exit"})
        o.run_allocator("cupy", "cupy")
        results = self.results(o)
        self.assertEqual({r["status"] for r in results.values()}, {"skipped"})
        self.assertEqual(len(results), 7)
        self.assertIn("no module named torch_stand_in_missing",
                      results[("cupy", "uncapped")]["detail"])
        self.assertEqual(sum(1 for line in self.lines if "cupy" in line), 2)

    def test_rows_past_the_budget_are_skipped(self):
        o = self.orchestrator({}, budget_s=5.0)
        o.run_allocator("torch", "native")
        self.assertEqual({r["status"] for r in self.results(o).values()}, {"skipped"})
        self.assertIn("budget", self.results(o)[("native", "uncapped")]["detail"])

    def test_the_callers_cistern_configuration_is_passed_through_and_named(self):
        env, label = gf._allocator_env("torch", "cistern", {"CISTERN_ALLOC_CONF": "vmm:False",
                                                            "PYTORCH_ALLOC_CONF": "x"})
        self.assertEqual((env["CISTERN_ALLOC_CONF"], label),
                         ("vmm:False", "cistern (CISTERN_ALLOC_CONF=vmm:False)"))
        self.assertNotIn("PYTORCH_ALLOC_CONF", env)
        env, _ = gf._allocator_env("torch", "native", {"PYTORCH_CUDA_ALLOC_CONF": "x"})
        self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", env)
        env, _ = gf._allocator_env("torch", "expandable", {})
        self.assertEqual((env["PYTORCH_ALLOC_CONF"], env["PYTORCH_CUDA_ALLOC_CONF"]),
                         ("expandable_segments:True", "expandable_segments:True"))
        env, _ = gf._allocator_env("cupy", "cistern-classic", {"CISTERN_ALLOC_CONF": "a:1"})
        self.assertEqual(env["CISTERN_ALLOC_CONF"], "vmm:False")
        env, _ = gf._allocator_env("cupy", "cupy", {"CISTERN_ALLOC_CONF": "a:1"})
        self.assertNotIn("CISTERN_ALLOC_CONF", env)
        # When the caller's configuration is vmm:False, the comparison rows would repeat it.
        self.assertNotIn("cistern-classic", gf._torch_allocators({"CISTERN_ALLOC_CONF":
                                                                  "vmm:False"}))
        self.assertIn("cistern-classic", gf._torch_allocators({}))

    def test_the_script_without_frameworks_says_so(self):
        out = os.path.join(self.folder.name, "out")
        code = gf.main(["--out", out, "--parts", "none"])
        self.assertEqual(code, gf.SKIP)
        with open(os.path.join(out, "frameworks.md")) as f:
            self.assertIn("## Framework check", f.read())
        self.assertEqual(gf.main(["--steps", "1"]), 2)


if __name__ == "__main__":
    unittest.main()
