# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""scripts/results_md.py, which writes docs/results.md: the targets it counts from made-up
`cistern replay --json` rows (each figure chosen so that the count, the worst figure and the
traces that miss are known), the boundaries of each target, and the whole page from files."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "results_md.py")
spec = importlib.util.spec_from_file_location("results_md", SCRIPT)
rm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rm)

EXP = rm.EXPANDABLE
LIVE = 1_000_000


def row(trace, policy, min_capacity=None, device_ms=None, **extra):
    r = {"trace": f"../shared/traces/{trace}", "device": 0, "policy": policy,
         "peak_live": LIVE, "peak_reserved": LIVE, "overhead": 0.0,
         "min_capacity": min_capacity, "device_ms": device_ms, "ooms": 0, "error": None,
         "device_allocs": 0, "device_frees": 0, "maps": 0, "unmaps": 0, "handle_creates": 0,
         "syncs": 0}
    r.update(extra)
    return r


def traces(rows):
    """{trace: {policy: row}} as results_md.load() builds it."""
    out = {}
    for r in rows:
        out.setdefault(rm.trace_name(r["trace"]), {})[r["policy"]] = r
    return out


def memory_rows(name, torch, expandable, cistern):
    return [row(name, "torch", torch), row(name, EXP, expandable),
            row(name, "cistern", cistern)]


def by_key(found):
    return {t.key: t for t in found}


class MemoryTargets(unittest.TestCase):
    def setUp(self):
        rows = []
        # a/x: below torch, within expandable's + 0.5% (+0.20%), at most 1.02 x.
        rows += memory_rows("a/x", 1_050_000, 1_010_000, 1_012_000)
        # a/y: equal to torch's (met, margin 0), +3% over expandable's, 1.03 x.
        rows += memory_rows("a/y", 1_030_000, 1_000_000, 1_030_000)
        # a/z: 2% of peak_live above torch's and expandable's, 1.06 x (past the worst bound).
        rows += memory_rows("a/z", 1_040_000, 1_040_000, 1_060_000)
        # a/w: cistern's replay failed: a miss of every target.
        rows += memory_rows("a/w", 1_000_000, 1_000_000, None)
        rows[-1]["error"] = "bad trace"
        self.t = by_key(rm.memory_targets(traces(rows)))

    def test_cistern_against_torch_counts_equal_as_met_and_reports_the_worst_margin(self):
        t = self.t["min_vs_torch"]
        self.assertEqual((t.count, t.total, t.met), (2, 4, False))
        self.assertAlmostEqual(t.worst, -0.02)
        self.assertEqual([name for name, _ in t.misses], ["a/z", "a/w"])
        self.assertIn("2.00% of peak_live above", t.text)
        self.assertTrue(t.text.startswith("**not met** - "), t.text)
        self.assertIn("on 2 of 4 traces", t.text)

    def test_cistern_against_expandable_allows_half_a_percent_and_one_miss(self):
        t = self.t["min_vs_expandable"]
        self.assertEqual((t.count, t.total, t.met), (1, 4, False))
        self.assertEqual([name for name, _ in t.misses], ["a/y", "a/z", "a/w"])
        self.assertAlmostEqual(t.worst, 0.03)
        self.assertIn("(target: at least 3)", t.text)
        self.assertIn("`a/y` (+3.00%)", t.text)

    def test_at_most_1_02_of_peak_live_and_the_worst_ratio(self):
        tight, worst = self.t["min_tight"], self.t["min_worst"]
        self.assertEqual((tight.count, tight.met), (1, False))
        self.assertEqual([name for name, _ in tight.misses], ["a/y", "a/z", "a/w"])
        self.assertIn("`a/y` (1.030)", tight.text)
        self.assertAlmostEqual(worst.worst, 1.06)
        self.assertFalse(worst.met)
        self.assertIn("1.060 (`a/z`)", worst.text)
        self.assertEqual([name for name, _ in worst.misses], ["a/w"])

    def test_the_boundaries_are_met_and_misses_up_to_the_allowance_are_met(self):
        rows = []
        # Exactly expandable's + 0.5% of peak_live, exactly 1.02 x: both met.
        rows += memory_rows("b/edge", 1_020_000, 1_015_000, 1_020_000)
        # 15 traces that meet everything, then one that misses expandable's by 0.6% and is
        # 1.04 x: 16 of 17 against expandable's (target 16), 16 of 17 at 1.02 x (target 15).
        for i in range(15):
            rows += memory_rows(f"b/{i:02}", 1_100_000, 1_005_000, 1_001_000)
        rows += memory_rows("b/miss", 1_050_000, 1_034_000, 1_040_000)
        t = by_key(rm.memory_targets(traces(rows)))
        self.assertEqual((t["min_vs_torch"].count, t["min_vs_torch"].met), (17, True))
        self.assertAlmostEqual(t["min_vs_torch"].worst, 0.0)
        self.assertIn("closest: 0.00% of peak_live below torch's (`b/edge`)",
                      t["min_vs_torch"].text)
        self.assertEqual((t["min_vs_expandable"].count, t["min_vs_expandable"].met), (16, True))
        self.assertEqual(t["min_vs_expandable"].misses, [("b/miss", "+0.60%")])
        self.assertTrue(t["min_vs_expandable"].text.startswith("**met** - "))
        self.assertEqual((t["min_tight"].count, t["min_tight"].met), (16, True))
        self.assertTrue(t["min_worst"].met)
        self.assertAlmostEqual(t["min_worst"].worst, 1.04)
        # A second miss against expandable's is one too many, and so is a third past 1.02 x.
        rows += memory_rows("b/miss2", 1_050_000, 1_010_000, 1_030_000)
        rows += memory_rows("b/miss3", 1_050_000, 1_030_000, 1_030_000)
        t = by_key(rm.memory_targets(traces(rows)))
        vs_exp, tight = t["min_vs_expandable"], t["min_tight"]
        self.assertEqual((vs_exp.count, vs_exp.total, vs_exp.met), (17, 19, False))
        self.assertIn("(target: at least 18)", vs_exp.text)
        self.assertEqual((tight.count, tight.total, tight.met), (16, 19, False))
        self.assertEqual([name for name, _ in tight.misses], ["b/miss", "b/miss2", "b/miss3"])


class TimeTargets(unittest.TestCase):
    def rows(self):
        out = []
        # c/ok: 0.5 x torch, 0.8 x expandable.
        out += [row("c/ok", "torch", device_ms=10.0), row("c/ok", EXP, device_ms=6.25),
                row("c/ok", "cistern", device_ms=5.0)]
        # c/edge: exactly 2 x torch (met), 4 x expandable (a miss).
        out += [row("c/edge", "torch", device_ms=10.0), row("c/edge", EXP, device_ms=5.0),
                row("c/edge", "cistern", device_ms=20.0)]
        # c/slow: 2.1 x torch, 1.05 x expandable.
        out += [row("c/slow", "torch", device_ms=10.0), row("c/slow", EXP, device_ms=20.0),
                row("c/slow", "cistern", device_ms=21.0)]
        for name in ("c/ok", "c/edge", "c/slow"):
            out[[r["trace"] for r in out].index(f"../shared/traces/{name}")]["at_min_capacity"] = {
                "device_ms": 10.0, "syncs": 0, "unmaps": 0}
        return out

    def test_device_time_at_80_gib_against_torch_and_expandable(self):
        t = by_key(rm.time_targets(traces(self.rows()), {}))
        self.assertNotIn("time_at_torch_min", t)
        vs_torch, vs_exp = t["time_vs_torch"], t["time_vs_expandable"]
        self.assertEqual((vs_torch.count, vs_torch.total, vs_torch.met), (2, 3, False))
        self.assertEqual(vs_torch.misses, [("c/slow", "2.10x")])
        self.assertAlmostEqual(vs_torch.worst, 2.1)
        self.assertEqual((vs_exp.count, vs_exp.met), (1, True))  # 3 traces allow two misses
        self.assertEqual([name for name, _ in vs_exp.misses], ["c/edge", "c/slow"])
        self.assertAlmostEqual(vs_exp.worst, 4.0)
        self.assertIn("(target: at least 1)", vs_exp.text)
        self.assertIn("worst 4.00x (`c/edge`)", vs_exp.text)

    def test_device_time_on_torchs_min_capacity_counts_an_out_of_memory_as_a_miss(self):
        at_min = traces([
            row("c/ok", "cistern", device_ms=15.0), row("c/ok", EXP, device_ms=30.0),
            row("c/edge", "cistern", device_ms=20.0),
            row("c/edge", EXP, device_ms=1.0, ooms=1),
            row("c/slow", "cistern", device_ms=9.0, ooms=2),
        ])
        t = by_key(rm.time_targets(traces(self.rows()), at_min))["time_at_torch_min"]
        self.assertEqual((t.count, t.total, t.met), (2, 3, False))
        self.assertEqual(t.misses, [("c/slow", "out of memory")])
        self.assertAlmostEqual(t.worst, 2.0)
        # Expandable segments' figure is for comparison only; one that ran out of memory is left
        # out of it.
        self.assertIn("expandable segments there: at most 3.00x torch's", t.text)
        at_min = traces([row(n, "cistern", device_ms=12.0) for n in ("c/ok", "c/edge", "c/slow")])
        t = by_key(rm.time_targets(traces(self.rows()), at_min))["time_at_torch_min"]
        self.assertEqual((t.count, t.met), (3, True))
        self.assertTrue(t.text.startswith("**met** - "), t.text)


def passes(*calls):
    """Passes of a --repeat replay: (memory calls, every call) each, the memory calls as maps."""
    return [{"peak_reserved": LIVE, "device_allocs": 0, "device_frees": 0, "maps": m,
             "unmaps": 0, "device_calls": every} for m, every in calls]


class RepeatTarget(unittest.TestCase):
    def test_memory_calls_after_the_first_pass_are_misses_and_events_are_reported(self):
        rows = [
            row("d/quiet", "cistern", passes=passes((5, 9), (0, 0), (0, 0))),
            row("d/quiet", "torch", passes=passes((3, 3), (0, 0), (0, 0))),
            row("d/events", "cistern", passes=passes((5, 9), (0, 4), (0, 4))),
            row("d/events", "torch", passes=passes((3, 50), (0, 40), (0, 40))),
            row("d/maps", "cistern", passes=passes((5, 9), (2, 2), (1, 1))),
            row("d/maps", EXP, passes=passes((5, 9), (0, 0), (0, 0))),
        ]
        t = rm.repeat_target(traces(rows))
        self.assertEqual((t.count, t.total, t.met), (2, 3, False))
        self.assertEqual(t.misses, [("d/maps", "3 calls")])
        self.assertIn("torch: on 2, expandable segments: on 1", t.text)
        self.assertIn("none on 1 of 3", t.text)
        self.assertIn("`d/events` (8 calls; torch: 80)", t.text)
        table = rm.repeat_table(traces(rows))
        self.assertIn("| `d/events` | 3 | 0 | - | - | 5 | 0 | 80 / - / 8 |", table)

    def test_older_files_without_every_call_count_the_memory_calls(self):
        p = passes((4, 0), (1, 0))
        for x in p:
            del x["device_calls"]
        t = rm.repeat_target(traces([row("d/old", "cistern", passes=p)]))
        self.assertEqual(t.misses, [("d/old", "1 calls")])


class WholePage(unittest.TestCase):
    def test_the_page_prints_every_target_and_how_many_are_met(self):
        real = (memory_rows("pytorch/x.pickle.gz", 1_050_000, 1_010_000, 1_012_000)
                + memory_rows("somas/y.csv", 1_030_000, 1_000_000, 1_030_000))
        for r in real:
            r["device_ms"] = {"torch": 10.0, EXP: 20.0, "cistern": 5.0}[r["policy"]]
            if r["policy"] == "torch":
                r["at_min_capacity"] = {"device_ms": 10.0, "syncs": 0, "unmaps": 0}
            if r["policy"] == "cistern":
                r["at_min_capacity"] = {"device_ms": 12.0, "syncs": 1, "unmaps": 7}
        planning = memory_rows("minimalloc/z.csv", 2_000_000, 1_500_000, 1_010_000)
        repeat = [row(r["trace"].split("traces/")[1], "cistern",
                      passes=passes((5, 5), (0, 0), (0, 0))) for r in real[::3]]
        at_min = [row(r["trace"].split("traces/")[1], "cistern", device_ms=30.0)
                  for r in real[::3]]
        model = {"name": "h200", "fields": {}}
        with tempfile.TemporaryDirectory() as tmp:
            files = {}
            for name, rows in (("real", real + planning), ("repeat", repeat), ("min", at_min)):
                files[name] = os.path.join(tmp, f"{name}.json")
                with open(files[name], "w", encoding="utf-8") as f:
                    json.dump({"version": "0", "cost_model": model, "results": rows}, f)
            page = subprocess.run(
                [sys.executable, SCRIPT, "--repeat", files["repeat"], "--at-torch-min",
                 files["min"], "--", files["real"]],
                check=True, capture_output=True, text=True).stdout
        targets = [line for line in page.splitlines()
                   if line.startswith("- **met**") or line.startswith("- **not met**")]
        self.assertEqual(len(targets), 8, page)
        # somas/y is 1.03 x and 3% over expandable's, within the misses allowed (two and one);
        # the one target not met: cistern at torch's min_capacity takes 3 x torch's time there.
        self.assertIn("7 of 8 are met.", page)
        self.assertIn("over the 2 traces recorded from real programs", page)
        self.assertIn("- **not met** - on a device of torch's min_capacity", page)
        self.assertIn("| `pytorch/x.pickle.gz` | 10.00 | 20.00 | 5.00 | 0.50x | 0.25x |", page)
        self.assertIn("--policy cistern,torch,torch:expandable_segments=true --min-capacity", page)
        # minimalloc has its own table and is not counted (2 traces above, not 3).
        self.assertIn("## minimalloc challenging instances", page)


if __name__ == "__main__":
    unittest.main()
