# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""scripts/heldout.py, issue 22's check on workloads not in ../shared: the workloads it writes
for a range of seeds (the same files for the same seeds, other files for others), the rules it
counts from made-up `cistern replay --json` rows, and a run on traces of one's own against a
stand-in for `cistern replay`."""
import filecmp
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from tests.project_scripts import load_script, script_path, write_stand_in

SCRIPT = script_path("heldout")
ho = load_script("heldout")

FAMILIES = ("holes_100m", "holes_odd", "huge", "rand", "rand_small", "mixed")


def names(paths):
    return sorted(os.path.basename(p) for p in paths)


class Seeds(unittest.TestCase):
    def test_each_family_for_each_seed_and_the_four_transformers(self):
        with tempfile.TemporaryDirectory() as out:
            paths = ho.write_workloads(out, first_seed=7, seeds=2)
            expected = sorted([f"{f}_{s}.csv" for f in FAMILIES for s in (7, 8)] +
                              [f"{t}.trace.gz" for t in ho.TRANSFORMERS])
            self.assertEqual(names(paths), expected)
            for p in paths:
                self.assertGreater(os.path.getsize(p), 0, p)

    def test_a_seed_writes_the_same_workload_whatever_the_range_it_is_in(self):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            ho.write_workloads(a, first_seed=3, seeds=1)
            ho.write_workloads(b, first_seed=2, seeds=2)
            for f in FAMILIES:
                self.assertTrue(filecmp.cmp(os.path.join(a, f"{f}_3.csv"),
                                            os.path.join(b, f"{f}_3.csv"), shallow=False), f)
                self.assertFalse(filecmp.cmp(os.path.join(b, f"{f}_2.csv"),
                                             os.path.join(b, f"{f}_3.csv"), shallow=False), f)

    def test_a_bad_range_is_refused(self):
        for args in (["--seeds", "0"], ["--first-seed", "-1"]):
            r = subprocess.run([sys.executable, SCRIPT, "--cistern", "/nonexistent", *args],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn("--first-seed must be at least 0 and --seeds at least 1", r.stderr)


def row(trace, policy, min_capacity, live=1000, device_ms=None):
    return {"trace": trace, "policy": policy, "peak_live": live, "min_capacity": min_capacity,
            "device_ms": device_ms}


class Rules(unittest.TestCase):
    def test_each_rule_counts_its_workloads_and_names_the_misses(self):
        rows = []
        # (cistern, expandable, torch) min_capacity for peak_live 1000; cistern's and expandable
        # segments' device time, ms
        for name, (c, e, t), (ct, et) in (("a.csv", (1000, 1000, 1100), (3.0, 1.0)),
                                          ("b.csv", (1004, 1000, 1100), (2.0, 1.0)),
                                          ("c.csv", (1030, 1020, 1020), (1.0, 1.0)),
                                          ("d.csv", (1010, 1030, 1005), (0.5, 1.0))):
            rows += [row(name, "cistern", c, device_ms=ct), row(name, ho.EXPANDABLE, e, device_ms=et),
                     row(name, "torch", t)]
        n, rules, worst, table, times = ho.count(rows)
        self.assertEqual(n, 4)
        self.assertEqual(rules["vs_expandable_slack"]["holds"], 3)  # c: +1.0% of peak_live
        self.assertEqual([w for w, _ in rules["vs_expandable_slack"]["misses"]], ["c.csv"])
        self.assertEqual(rules["vs_expandable"]["holds"], 2)  # b and c above
        self.assertEqual(rules["tight"]["holds"], 3)  # c: 1.03 x
        self.assertEqual(rules["vs_torch"]["holds"], 2)  # c and d above torch
        self.assertEqual(worst, (1.03, "c.csv"))
        self.assertEqual(len(table), 4)
        # a: 3 x expandable segments' device time, past 2 x; b: exactly 2 x holds.
        self.assertEqual(rules["time"]["holds"], 3)
        self.assertEqual(rules["time"]["misses"], [("a.csv", "3.00 x expandable segments'")])
        self.assertEqual(times, [3.0, 2.0, 1.0, 0.5])
        self.assertEqual(table[0], ("a.csv", 1.0, 1.0, 1.1, 3.0))

    def test_device_time_counts_where_min_capacity_has_no_figure(self):
        rows = [row("a.csv", "cistern", None, device_ms=1.0),
                row("a.csv", ho.EXPANDABLE, 1000, device_ms=4.0), row("a.csv", "torch", 1000)]
        n, rules, _, table, times = ho.count(rows)
        self.assertEqual((n, times, table), (1, [0.25], []))
        self.assertEqual(rules["time"]["holds"], 1)
        self.assertEqual(rules["tight"]["misses"], [("a.csv", "no figure")])

    def test_a_workload_without_a_figure_misses_every_rule(self):
        rows = [row("a.csv", "cistern", 1000), row("a.csv", ho.EXPANDABLE, None),
                row("a.csv", "torch", 1000)]
        n, rules, _, _, _ = ho.count(rows)
        self.assertEqual(n, 1)
        for rule in rules.values():
            self.assertEqual(rule["holds"], 0)
            self.assertEqual(rule["misses"], [("a.csv", "no figure")])


# A stand-in for `cistern replay --min-capacity --json OUT`: records its arguments beside OUT and
# answers for each trace cistern 1004, expandable segments 1000, PyTorch's default 1020 (of 1000
# live), but for traces named "big*" cistern 1030; cold-pass device time: cistern 1.5 ms (3 ms for
# "big*"), expandable segments 1 ms.
STAND_IN = textwrap.dedent("""\
    import json, os, sys
    args = sys.argv[1:]
    out = args[args.index("--json") + 1]
    json.dump(args, open(os.path.join(os.path.dirname(out), "args.json"), "w"))
    traces = [a for a in args if a.endswith((".pickle", ".csv"))]
    mins = {"torch:expandable_segments=true": 1000, "torch": 1020}
    big = lambda t: os.path.basename(t).startswith("big")
    rows = [{"trace": t, "policy": p, "peak_live": 1000,
             "min_capacity": mins.get(p, 1030 if big(t) else 1004),
             "device_ms": 1.0 if p in mins else (3.0 if big(t) else 1.5)}
            for t in traces for p in args[args.index("--policy") + 1].split(",")]
    json.dump({"results": rows}, open(out, "w"))
    """)


class OwnTraces(unittest.TestCase):
    def run_script(self, tmp, *args):
        cli = write_stand_in(tmp, STAND_IN)
        out = os.path.join(tmp, "out")
        r = subprocess.run([sys.executable, SCRIPT, "--cistern", cli, "--out", out, *args],
                           capture_output=True, text=True)
        return r, out

    def test_the_rules_are_counted_on_the_traces_given_and_nothing_is_written(self):
        with tempfile.TemporaryDirectory() as tmp:
            r, out = self.run_script(tmp, "--traces", "a.pickle", "big.csv", "--device", "1")
            self.assertEqual(r.returncode, 1, r.stderr)  # 1 of 2 within expandable's + 0.5%
            with open(os.path.join(out, "args.json"), encoding="utf-8") as f:
                args = json.load(f)
            self.assertEqual(args[-2:], ["a.pickle", "big.csv"])
            self.assertEqual(args[args.index("--device") + 1], "1")
            self.assertEqual(sorted(os.listdir(out)), ["args.json", "replay.json", "summary.json"])
            with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
                summary = json.load(f)
            self.assertEqual(summary["workloads"], 2)
            self.assertEqual(summary["rules"]["vs_expandable_slack"]["holds"], 1)
            self.assertEqual(summary["rules"]["vs_torch"]["holds"], 1)
            self.assertIn("NOT MET: min_capacity at most expandable segments' + 0.5% of peak_live "
                          "on 1 of 2 - not on big.csv", r.stdout)
            self.assertEqual(summary["rules"]["time"]["holds"], 1)
            self.assertEqual(summary["time_median"], 2.25)
            self.assertIn("NOT MET: device time of the cold pass at most 2 x expandable segments' "
                          "on 1 of 2 - not on big.csv (3.00 x expandable segments')", r.stdout)
            self.assertIn("NOT MET: device time of the cold pass, median over 2 workloads: 2.25 x "
                          "expandable segments' (issue 22: at most 1.25 x)", r.stdout)

    def test_device_without_traces_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            r, _ = self.run_script(tmp, "--device", "0")
            self.assertEqual(r.returncode, 2)
            self.assertIn("--device goes with --traces", r.stderr)


if __name__ == "__main__":
    unittest.main()
