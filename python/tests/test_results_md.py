# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""scripts/results_md.py, which writes docs/results.md: issue 22's targets it counts from made-up
`cistern replay --json` rows (each figure chosen so that the count, the worst figure and the
traces that miss are known), the boundaries of each target, and the whole page from files."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from tests.project_scripts import load_script, script_path

SCRIPT = script_path("results_md")
rm = load_script("results_md")

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
    """Targets 1 to 4: min_capacity against expandable segments' + 0.5% of peak_live (every
    trace), against expandable segments' own (all but two), against 1.02 x peak_live (all but
    one), and against torch's with at most 1.04 x peak_live (every trace)."""

    def setUp(self):
        rows = []
        # a/x: below torch, +0.20% over expandable's (within the slack, a strict miss), 1.012 x.
        rows += memory_rows("a/x", 1_050_000, 1_010_000, 1_012_000)
        # a/y: equal to torch's (met, margin 0), +3% over expandable's, 1.03 x (within 1.04 x).
        rows += memory_rows("a/y", 1_030_000, 1_000_000, 1_030_000)
        # a/z: 2% of peak_live above torch's and expandable's, 1.06 x (past the worst bound).
        rows += memory_rows("a/z", 1_040_000, 1_040_000, 1_060_000)
        # a/w: cistern's replay failed: a miss of every target.
        rows += memory_rows("a/w", 1_000_000, 1_000_000, None)
        rows[-1]["error"] = "bad trace"
        # a/v: exactly expandable's, exactly 1.02 x: met everywhere.
        rows += memory_rows("a/v", 1_100_000, 1_020_000, 1_020_000)
        self.t = by_key(rm.memory_targets(traces(rows)))

    def test_the_four_targets_in_the_issues_order(self):
        self.assertEqual(list(self.t), ["min_vs_expandable_slack", "min_vs_expandable",
                                        "min_tight", "min_vs_torch"])

    def test_expandable_plus_half_a_percent_on_every_trace(self):
        t = self.t["min_vs_expandable_slack"]
        self.assertEqual((t.count, t.total, t.met), (2, 5, False))
        self.assertEqual(t.misses, [("a/y", "+3.00%"), ("a/z", "+2.00%"),
                                    ("a/w", "no figure of cistern's")])
        self.assertAlmostEqual(t.worst, 0.03)
        self.assertIn("(target: every one)", t.text)
        self.assertIn("most above expandable segments': +3.00% of peak_live (`a/y`)", t.text)
        self.assertTrue(t.text.startswith("**not met** - "), t.text)

    def test_expandable_itself_allows_two_misses(self):
        t = self.t["min_vs_expandable"]
        self.assertEqual((t.count, t.total, t.met), (1, 5, False))
        self.assertEqual([name for name, _ in t.misses], ["a/x", "a/y", "a/z", "a/w"])
        self.assertIn("`a/x` (+0.20%)", t.text)
        self.assertIn("on 1 of 5 traces (target: at least 3)", t.text)

    def test_at_most_1_02_of_peak_live_allows_one_miss(self):
        t = self.t["min_tight"]
        self.assertEqual((t.count, t.total, t.met), (2, 5, False))
        self.assertEqual(t.misses, [("a/y", "1.030"), ("a/z", "1.060"),
                                    ("a/w", "no figure of cistern's")])
        self.assertIn("(target: at least 4)", t.text)
        self.assertAlmostEqual(t.worst, 1.06)

    def test_torchs_and_the_worst_ratio_together(self):
        t = self.t["min_vs_torch"]
        self.assertEqual((t.count, t.total, t.met), (3, 5, False))
        self.assertEqual(t.misses, [
            ("a/z", "2.00% of peak_live above torch's; 1.060 x peak_live"),
            ("a/w", "no figure of cistern's")])
        self.assertAlmostEqual(t.worst, 1.06)
        self.assertIn("furthest above torch's: 2.00% of peak_live (`a/z`)", t.text)
        self.assertIn("worst min_capacity / peak_live: 1.060 (`a/z`)", t.text)
        self.assertIn("at most torch's and at most 1.04 x peak_live on 3 of 5 traces", t.text)

    def test_above_1_04_alone_misses_target_4(self):
        t = by_key(rm.memory_targets(traces(
            memory_rows("a/ok", 1_100_000, 1_050_000, 1_040_000)
            + memory_rows("a/high", 1_100_000, 1_050_000, 1_045_000))))["min_vs_torch"]
        self.assertEqual((t.count, t.met), (1, False))
        self.assertEqual(t.misses, [("a/high", "1.045 x peak_live")])
        self.assertIn("closest to torch's: 5.50% of peak_live below (`a/high`)", t.text)

    def test_the_boundaries_are_met_and_misses_up_to_the_allowance_are_met(self):
        rows = []
        # Exactly expandable's + 0.5% of peak_live (a strict miss), exactly 1.02 x: met.
        rows += memory_rows("b/edge", 1_020_000, 1_015_000, 1_020_000)
        # 15 traces that meet everything, then one +0.2% over expandable's and 1.04 x (exactly
        # the worst allowed): 17 of 17 within the slack, 15 of 17 at most expandable's (target
        # 15), 16 of 17 at 1.02 x (target 16), 17 of 17 against torch's and 1.04 x.
        for i in range(15):
            rows += memory_rows(f"b/{i:02}", 1_100_000, 1_005_000, 1_001_000)
        rows += memory_rows("b/miss", 1_050_000, 1_038_000, 1_040_000)
        t = by_key(rm.memory_targets(traces(rows)))
        self.assertEqual((t["min_vs_expandable_slack"].count,
                          t["min_vs_expandable_slack"].met), (17, True))
        self.assertTrue(t["min_vs_expandable_slack"].text.startswith("**met** - "))
        self.assertEqual((t["min_vs_expandable"].count, t["min_vs_expandable"].met), (15, True))
        self.assertEqual(t["min_vs_expandable"].misses, [("b/edge", "+0.50%"),
                                                         ("b/miss", "+0.20%")])
        self.assertIn("(target: at least 15)", t["min_vs_expandable"].text)
        self.assertEqual((t["min_tight"].count, t["min_tight"].met), (16, True))
        self.assertEqual(t["min_tight"].misses, [("b/miss", "1.040")])
        self.assertEqual((t["min_vs_torch"].count, t["min_vs_torch"].met), (17, True))
        self.assertAlmostEqual(t["min_vs_torch"].worst, 1.04)
        self.assertIn("closest to torch's: 0.00% of peak_live below (`b/edge`)",
                      t["min_vs_torch"].text)
        # A third trace above expandable's is one too many, and so is a second past 1.02 x.
        rows += memory_rows("b/miss2", 1_050_000, 1_010_000, 1_012_000)
        rows += memory_rows("b/miss3", 1_030_000, 1_030_000, 1_030_000)
        t = by_key(rm.memory_targets(traces(rows)))
        strict, tight = t["min_vs_expandable"], t["min_tight"]
        self.assertEqual((strict.count, strict.total, strict.met), (16, 19, False))
        self.assertIn("(target: at least 17)", strict.text)
        self.assertEqual((tight.count, tight.total, tight.met), (17, 19, False))
        self.assertEqual([name for name, _ in tight.misses], ["b/miss", "b/miss3"])
        self.assertEqual(t["min_vs_expandable_slack"].count, 19)
        # One byte past the slack is a miss of target 1.
        rows += memory_rows("b/over", 1_100_000, 1_015_000, 1_020_001)
        t = by_key(rm.memory_targets(traces(rows)))["min_vs_expandable_slack"]
        self.assertEqual((t.count, t.total, t.met), (19, 20, False))
        self.assertEqual(t.misses, [("b/over", "+0.50%")])


def reserved_rows(name, torch, cistern):
    return [row(name, "torch", peak_reserved=torch), row(name, "cistern", peak_reserved=cistern)]


class ReservedTarget(unittest.TestCase):
    """Target 5: peak reserved at 80 GiB at most torch's on every trace."""

    def test_above_torchs_or_without_a_figure_is_a_miss(self):
        rows = (reserved_rows("e/a", 2_000_000, 1_999_800) + reserved_rows("e/b", 3_000_000,
                                                                           3_000_000)
                + reserved_rows("e/c", 2_000_000, 2_002_000)
                + reserved_rows("e/d", 2_000_000, 1_000_000))
        rows[-1]["error"] = "bad trace"
        t = rm.reserved_target(traces(rows))
        self.assertEqual((t.key, t.count, t.total, t.met), ("reserved_vs_torch", 2, 4, False))
        self.assertEqual(t.misses, [("e/c", "1.0010 x torch's"), ("e/d", "no figure")])
        self.assertAlmostEqual(t.worst, 1.001)
        self.assertIn("peak reserved at 80 GiB at most torch's on 2 of 4 traces "
                      "(target: every one)", t.text)

    def test_equal_is_met(self):
        t = rm.reserved_target(traces(reserved_rows("e/a", 2_000_000, 1_999_800)
                                      + reserved_rows("e/b", 3_000_000, 3_000_000)))
        self.assertEqual((t.count, t.total, t.met), (2, 2, True))
        self.assertIn("most: 1.0000 x torch's (`e/b`)", t.text)
        self.assertTrue(t.text.startswith("**met** - "), t.text)


def time_rows(name, expandable, cistern):
    return [row(name, EXP, device_ms=expandable), row(name, "cistern", device_ms=cistern)]


class TimeTarget(unittest.TestCase):
    """Target 6: device time at 80 GiB / expandable segments': median at most 1.25, at most 2 x
    on every trace."""

    def rows(self):
        out = []
        for name, x in (("f/1", 1.0), ("f/2", 1.2), ("f/3", 1.25), ("f/4", 2.0), ("f/5", 0.9)):
            out += time_rows(name, 4.0, 4.0 * x)
        return out

    def test_median_and_worst_at_their_bounds_are_met(self):
        t = rm.time_target(traces(self.rows()))
        self.assertEqual((t.key, t.count, t.total, t.met), ("time_vs_expandable", 5, 5, True))
        self.assertAlmostEqual(t.worst, 2.0)
        self.assertEqual(t.misses, [])
        self.assertIn("median 1.20x over 5 of 5 traces (target: at most 1.25x)", t.text)
        self.assertIn("at most 2 x on 5 of 5 (target: every one); worst 2.00x (`f/4`)", t.text)
        self.assertIn("at most expandable segments' own on 2 of 5.", t.text)
        # Two more at 1.3 and 1.4: the median is 1.25 exactly, still met; one more at 1.5 puts
        # it at 1.275.
        rows = self.rows() + time_rows("f/6", 4.0, 5.2) + time_rows("f/7", 4.0, 5.6)
        self.assertTrue(rm.time_target(traces(rows)).met)
        t = rm.time_target(traces(rows + time_rows("f/8", 4.0, 6.0)))
        self.assertEqual((t.count, t.total, t.met, t.misses), (8, 8, False, []))
        self.assertIn("median 1.27x", t.text)
        self.assertTrue(t.text.startswith("**not met** - "), t.text)

    def test_above_2_x_or_no_figure_is_a_miss_whatever_the_median(self):
        rows = self.rows() + time_rows("f/9", 4.0, 8.04) + time_rows("f/10", None, 3.0)
        t = rm.time_target(traces(rows))
        self.assertEqual((t.count, t.total, t.met), (5, 7, False))
        self.assertEqual(t.misses, [("f/9", "2.01x"), ("f/10", "no figure")])
        self.assertAlmostEqual(t.worst, 2.01)
        self.assertIn("median 1.23x over 6 of 7 traces", t.text)
        self.assertIn("not on `f/9` (2.01x), `f/10` (no figure)", t.text)


class AtExpandableMinTarget(unittest.TestCase):
    """Target 8: on a device of expandable segments' min_capacity, cistern's device time at most
    expandable segments' there on all but two traces; out of memory is a miss."""

    NAMES = ("g/fast", "g/equal", "g/slow", "g/oom", "g/missing", "g/fallback", "g/expoom")

    def real(self, names):
        out = []
        for name in names:
            out += [row(name, "torch", device_ms=1.0,
                        at_min_capacity={"device_ms": 1.0, "syncs": 0, "unmaps": 0}),
                    row(name, EXP, device_ms=1.0,
                        at_min_capacity={"device_ms": 10.0, "syncs": 2, "unmaps": 0}),
                    row(name, "cistern", device_ms=1.0,
                        at_min_capacity={"device_ms": 7.0, "syncs": 1, "unmaps": 3})]
        return traces(out)

    def there(self):
        return traces([
            row("g/fast", "cistern", device_ms=8.0), row("g/fast", EXP, device_ms=10.0),
            row("g/equal", "cistern", device_ms=10.0), row("g/equal", EXP, device_ms=10.0),
            row("g/slow", "cistern", device_ms=11.0), row("g/slow", EXP, device_ms=10.0),
            row("g/oom", "cistern", device_ms=3.0, ooms=1), row("g/oom", EXP, device_ms=10.0),
            # g/missing: not replayed there. g/fallback: expandable's time from the capacity
            # search's at_min_capacity (10 ms).
            row("g/fallback", "cistern", device_ms=9.0),
            row("g/expoom", "cistern", device_ms=5.0), row("g/expoom", EXP, ooms=1),
        ])

    def test_slower_out_of_memory_and_missing_are_misses(self):
        t = rm.at_expandable_min_target(self.real(self.NAMES), self.there())
        self.assertEqual((t.key, t.count, t.total, t.met),
                         ("time_at_expandable_min", 3, 7, False))
        self.assertEqual(t.misses, [
            ("g/slow", "1.10x"), ("g/oom", "out of memory"), ("g/missing", "no figure"),
            ("g/expoom", "expandable segments ran out of memory there")])
        self.assertAlmostEqual(t.worst, 1.1)
        self.assertIn("on 3 of 7 traces (target: at least 5); worst 1.10x (`g/slow`)", t.text)
        self.assertIn("`g/oom` (out of memory)", t.text)

    def test_two_misses_of_seventeen_are_met_three_of_eighteen_not(self):
        names = [f"g/{i:02}" for i in range(15)]
        there = [r for i in range(15) for r in (row(f"g/{i:02}", "cistern", device_ms=9.0),
                                                 row(f"g/{i:02}", EXP, device_ms=10.0))]
        there += [row("g/slow", "cistern", device_ms=11.0), row("g/slow", EXP, device_ms=10.0),
                  row("g/oom", "cistern", ooms=1), row("g/oom", EXP, device_ms=10.0)]
        t = rm.at_expandable_min_target(self.real(names + ["g/slow", "g/oom"]), traces(there))
        self.assertEqual((t.count, t.total, t.met), (15, 17, True))
        self.assertTrue(t.text.startswith("**met** - "), t.text)
        there += [row("g/slow2", "cistern", device_ms=12.0), row("g/slow2", EXP, device_ms=10.0)]
        t = rm.at_expandable_min_target(self.real(names + ["g/slow", "g/oom", "g/slow2"]),
                                        traces(there))
        self.assertEqual((t.count, t.total, t.met), (15, 18, False))
        self.assertEqual([name for name, _ in t.misses], ["g/slow", "g/oom", "g/slow2"])
        self.assertAlmostEqual(t.worst, 1.2)

    def test_the_at_the_limit_table(self):
        table = rm.at_capacity_table(self.real(self.NAMES), self.there())
        self.assertIn("| `g/slow` | 1.00 | 0 | 7.00 | 1 | 3 | 10.00 | 0 | 11.00 | 1.10x | 0 | 0 |",
                      table)
        self.assertIn("| `g/oom` | 1.00 | 0 | 7.00 | 1 | 3 | 10.00 | 0 | out of memory |", table)
        self.assertIn("| `g/fallback` | 1.00 | 0 | 7.00 | 1 | 3 | 10.00 | 2 | 9.00 | 0.90x |",
                      table)
        self.assertIn("| `g/missing` | 1.00 | 0 | 7.00 | 1 | 3 | 10.00 | 2 | - | - | - | - |",
                      table)
        self.assertIn("| `g/expoom` | 1.00 | 0 | 7.00 | 1 | 3 | out of memory | - | 5.00 | - |",
                      table)


class AtExpandableMinSteadyState(unittest.TestCase):
    """Target 8 with the `--repeat 3` replays there: the device time of passes 2-3 counted (the
    steady state under pressure), the single cold pass stated beside it."""

    NAMES = ("s/fast", "s/equal", "s/slow", "s/expoom", "s/oom", "s/quiet", "s/missing")

    @staticmethod
    def timed(*ms, ooms=0):
        return {"passes": [{"peak_reserved": LIVE, "device_allocs": 0, "device_frees": 0,
                            "maps": 1 if t else 0, "unmaps": 0, "device_calls": 1 if t else 0,
                            "device_ms": t} for t in ms], "ooms": ooms}

    def repeat_there(self):
        rows = []
        for name, c, e in (("s/fast", self.timed(9.0, 1.0, 1.0), self.timed(5.0, 2.0, 2.0)),
                           ("s/equal", self.timed(9.0, 1.5, 1.5), self.timed(5.0, 2.0, 1.0)),
                           ("s/slow", self.timed(9.0, 2.5, 2.5), self.timed(5.0, 2.0, 2.0)),
                           ("s/expoom", self.timed(9.0, 3.0, 3.0),
                            self.timed(5.0, 1.0, 1.0, ooms=2)),
                           ("s/oom", self.timed(9.0, 0.0, 0.0, ooms=1),
                            self.timed(5.0, 2.0, 2.0)),
                           ("s/quiet", self.timed(9.0, 0.0, 0.0), self.timed(5.0, 0.0, 0.0))):
            rows += [row(name, "cistern", **c), row(name, EXP, **e)]
        return traces(rows)

    def test_passes_2_3_are_counted_and_expandables_out_of_memory_holds(self):
        real = AtExpandableMinTarget().real(self.NAMES)
        cold = traces([r for name in self.NAMES for r in (row(name, "cistern", device_ms=9.0),
                                                          row(name, EXP, device_ms=5.0))])
        t = rm.at_expandable_min_target(real, cold, self.repeat_there())
        self.assertEqual((t.key, t.count, t.total, t.met), ("time_at_expandable_min", 4, 7, False))
        self.assertEqual(t.misses, [("s/slow", "1.25x"), ("s/oom", "out of memory"),
                                    ("s/missing", "no figure")])
        self.assertAlmostEqual(t.worst, 1.25)
        self.assertIn("passes 2-3 (the steady state)", t.text)
        self.assertIn("on 4 of 7 traces (target: at least 5); worst 1.25x (`s/slow`)", t.text)
        # Every cold pass there costs 9 ms against 5: none within expandable segments'.
        self.assertIn("a single cold pass there (paid once per process) costs at most expandable "
                      "segments' on 0 of 7, worst 1.80x", t.text)
        table = rm.pressure_table(real, self.repeat_there())
        self.assertIn("| `s/slow` | 4.00 | 2 | 0 | 5.00 | 2 | 0 | 1.25x |", table)
        self.assertIn("| `s/expoom` | 2.00 | 2 | 2 | 6.00 | 2 | 0 | (expandable out of memory) |",
                      table)
        self.assertIn("| `s/missing` | - | - | - | - | - | - | - |", table)
        self.assertIn("| `s/quiet` | 0.00 | 0 | 0 | 0.00 | 0 | 0 | (no call) |", table)
        # The table and the target read each trace alike (steady_state_of).
        self.assertIn("| `s/oom` | 4.00 | 2 | 0 | 0.00 | 0 | 1 | (cistern out of memory) |", table)

    def test_without_the_repeat_replays_the_cold_pass_is_counted(self):
        real = AtExpandableMinTarget().real(self.NAMES[:2])
        cold = traces([row("s/fast", "cistern", device_ms=4.0), row("s/fast", EXP, device_ms=5.0),
                       row("s/equal", "cistern", device_ms=6.0), row("s/equal", EXP, device_ms=5.0)])
        t = rm.at_expandable_min_target(real, cold)
        self.assertEqual((t.count, t.total), (1, 2))
        self.assertNotIn("passes 2-3", t.text)


class AllTargets(unittest.TestCase):
    def test_the_issues_order_and_the_optional_ones(self):
        real = traces(memory_rows("h/x", 1_050_000, 1_010_000, 1_012_000))
        self.assertEqual([t.key for t in rm.targets(real, {}, {})], [
            "min_vs_expandable_slack", "min_vs_expandable", "min_tight", "min_vs_torch",
            "reserved_vs_torch", "time_vs_expandable"])
        repeat = traces([row("h/x", "cistern", passes=passes((1, 1), (0, 0)))])
        there = traces([row("h/x", "cistern", device_ms=1.0)])
        self.assertEqual([t.key for t in rm.targets(real, repeat, there)][-2:],
                         ["repeat_quiet", "time_at_expandable_min"])


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
        self.assertEqual(t.misses, [("d/old", "1 call")])


class FirstPassByFill(unittest.TestCase):
    """The cold pass on devices of a few multiples of peak_live: the summary row (median, worst,
    sums, how many at most expandable segments'), each trace's cells, and the traces left out."""

    NAMES = ("f/cheap", "f/dear", "f/equal", "f/oom", "f/missing")

    @staticmethod
    def fill(scale):
        rows = []
        for name, c, e in (("f/cheap", 4.0, 8.0), ("f/dear", 9.0, 3.0), ("f/equal", 5.0, 5.0)):
            rows += [row(name, "cistern", device_ms=c * scale, capacity=2 * LIVE),
                     row(name, EXP, device_ms=e, capacity=2 * LIVE)]
        rows += [row("f/oom", "cistern", device_ms=1.0, ooms=2),
                 row("f/oom", EXP, device_ms=1.0)]
        return traces(rows)

    def test_the_summary_and_the_cells(self):
        real = traces([row(name, "cistern", capacity=4 * LIVE) for name in self.NAMES])
        fills = {"1.25": self.fill(2.0), "2": self.fill(1.0)}
        median, worst, below, n, c_ms, e_ms, left_out = rm.fill_summary(real, fills["2"])
        # x: 0.5, 3.0, 1.0; f/oom and f/missing are left out of the ratios and the sums.
        self.assertEqual((median, worst, below, n), (1.0, (3.0, "f/dear"), 2, 3))
        self.assertEqual((c_ms, e_ms, left_out), (18.0, 16.0, ["f/oom", "f/missing"]))
        table = rm.fill_table(real, fills)
        self.assertIn("| trace | 1.25 x peak_live: cistern / expandable, ms | 2 x peak_live: "
                      "cistern / expandable, ms |", table)
        self.assertIn("| **median (worst); sums** | 2.00x (6.00x); 36 / 16; at most expandable's "
                      "on 1 of 3; 2 left out | 1.00x (3.00x); 18 / 16; at most expandable's on 2 "
                      "of 3; 2 left out |", table)
        self.assertIn("| `f/dear` | 18.00 / 3.00 (6.00x) | 9.00 / 3.00 (3.00x) |", table)
        self.assertIn("| `f/oom` | cistern out of memory | cistern out of memory |", table)
        self.assertIn("| `f/missing` | - | - |", table)
        # The real rows' own device: peak_live / capacity of cistern's rows, here a quarter.
        self.assertEqual(rm.fill_range(real), "25.0-25%")

    def test_factor_and_path_are_read_from_each_argument(self):
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for i, name in enumerate(("f/a", "f/b")):
                paths.append(os.path.join(tmp, f"{i}.json"))
                with open(paths[-1], "w", encoding="utf-8") as f:
                    json.dump({"results": [row(name, "cistern", device_ms=1.0)]}, f)
            fills = rm.by_fill([f"1.25:{paths[0]}", f"1.25:{paths[1]}", f"4:{paths[0]}"])
        self.assertEqual(list(fills), ["1.25", "4"])
        self.assertEqual(sorted(fills["1.25"]), ["f/a", "f/b"])
        for bad in ("1.25", "x:a.json", "2:"):
            with self.assertRaises(SystemExit) as cm:
                rm.by_fill([bad])
            self.assertIn(repr(bad), str(cm.exception))


class WholePage(unittest.TestCase):
    def test_the_page_prints_every_target_and_how_many_are_met(self):
        real = (memory_rows("pytorch/x.pickle.gz", 1_050_000, 1_010_000, 1_012_000)
                + memory_rows("somas/y.csv", 1_030_000, 1_000_000, 1_030_000))
        for r in real:
            r["device_ms"] = {"torch": 10.0, EXP: 20.0, "cistern": 5.0}[r["policy"]]
            r["at_min_capacity"] = {"device_ms": {"torch": 10.0, EXP: 20.0, "cistern": 12.0}[
                r["policy"]], "syncs": 1, "unmaps": 7}
        planning = memory_rows("minimalloc/z.csv", 2_000_000, 1_500_000, 1_010_000)
        repeat = [row(r["trace"].split("traces/")[1], "cistern",
                      passes=passes((5, 5), (0, 0), (0, 0))) for r in real[::3]]
        at_min = [row("pytorch/x.pickle.gz", "cistern", device_ms=30.0),
                  row("pytorch/x.pickle.gz", EXP, device_ms=20.0),
                  row("somas/y.csv", "cistern", ooms=1), row("somas/y.csv", EXP, device_ms=20.0)]
        model = {"name": "h200", "fields": {}}
        with tempfile.TemporaryDirectory() as tmp:
            files = {}
            for name, rows in (("real", real + planning), ("repeat", repeat), ("min", at_min)):
                files[name] = os.path.join(tmp, f"{name}.json")
                with open(files[name], "w", encoding="utf-8") as f:
                    json.dump({"version": "0", "cost_model": model, "results": rows}, f)
            page = subprocess.run(
                [sys.executable, SCRIPT, "--repeat", files["repeat"], "--at-expandable-min",
                 files["min"], "--by-fill", f"2:{files['min']}", "--", files["real"]],
                check=True, capture_output=True, text=True).stdout
        targets = [line for line in page.splitlines()
                   if line.startswith("- **met**") or line.startswith("- **not met**")]
        self.assertEqual(len(targets), 8, page)
        self.assertIn("Issue 22's targets", page)
        self.assertNotIn("Issue 18", page)
        # somas/y is 3% over expandable's: the one target not met (every trace within 0.5%).
        # Two traces allow two misses at expandable's min_capacity (x: 1.5 x, y: out of memory).
        self.assertIn("7 of 8 are met.", page)
        self.assertIn("over the 2 traces recorded from real programs", page)
        self.assertIn("- **not met** - cistern's min_capacity at most expandable segments' + 0.5%",
                      page)
        self.assertIn("- **met** - on a device of expandable segments' min_capacity", page)
        self.assertIn("not on `pytorch/x.pickle.gz` (1.50x), `somas/y.csv` (out of memory)", page)
        self.assertIn("| `pytorch/x.pickle.gz` | 10.00 | 20.00 | 5.00 | 0.50x | 0.25x |", page)
        self.assertIn("| `pytorch/x.pickle.gz` | 10.00 | 1 | 12.00 | 1 | 7 | 20.00 | 0 | 30.00 | "
                      "1.50x | 0 | 0 |", page)
        self.assertIn("| `somas/y.csv` | 10.00 | 1 | 12.00 | 1 | 7 | 20.00 | 0 | out of memory |",
                      page)
        self.assertIn("--policy cistern,torch,torch:expandable_segments=true --min-capacity", page)
        self.assertIn("on a device of expandable segments' min_capacity.", page)
        # The same replays read as a device of 2 x peak_live: one trace slower, one out of memory.
        self.assertIn("### The first pass, by how full the device gets", page)
        self.assertIn("| **median (worst); sums** | 1.50x (1.50x); 30 / 20; at most "
                      "expandable's on 0 of 1; 1 left out |", page)
        self.assertIn("| `somas/y.csv` | cistern out of memory |", page)
        # minimalloc has its own table and is not counted (2 traces above, not 3).
        self.assertIn("## minimalloc challenging instances", page)


if __name__ == "__main__":
    unittest.main()
