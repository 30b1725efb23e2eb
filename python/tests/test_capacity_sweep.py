# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""scripts/capacity_sweep.py: the capacities it probes, what it reports from their outcomes, and
a whole run against a stand-in for `cistern replay` whose policies run on known device sizes."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from tests.project_scripts import load_script, script_path, write_stand_in

SCRIPT = script_path("capacity_sweep")
cs = load_script("capacity_sweep")

MiB = cs.MiB

# A stand-in for `cistern replay`: cistern runs from 100 MiB up but not on 110 MiB; expandable
# segments from 98 MiB up. --min-capacity answers what a bisection would: 100 and 98 MiB.
STAND_IN = textwrap.dedent("""\
    import json, sys
    MiB = 1 << 20
    args = sys.argv[1:]
    out = args[args.index("--json") + 1]
    trace = args[-1]
    runs = {"cistern": lambda c: c >= 100 * MiB and c != 110 * MiB,
            "torch:expandable_segments=true": lambda c: c >= 98 * MiB}
    mins = {"cistern": 100 * MiB, "torch:expandable_segments=true": 98 * MiB}
    rows = []
    for policy in args[args.index("--policy") + 1].split(","):
        if "--min-capacity" in args:
            rows.append({"trace": trace, "policy": policy, "ooms": 0, "error": None,
                         "min_capacity": mins[policy]})
        else:
            cap = int(args[args.index("--capacity") + 1])
            rows.append({"trace": trace, "policy": policy, "error": None,
                         "ooms": 0 if runs[policy](cap) else 1})
    json.dump({"results": rows}, open(out, "w"))
    sys.exit(4 if any(r["ooms"] for r in rows) else 0)
    """)


class Grid(unittest.TestCase):
    def test_two_mib_steps_around_the_low_end_then_a_ratio_to_the_top(self):
        caps = cs.grid(100 * MiB, fine=3, top=1.05, ratio=1.02)
        self.assertEqual(caps[:11], [c * MiB for c in (84, 86, 88, 90, 92, 94, 96, 98, 100, 102,
                                                      104)])
        self.assertEqual(caps, sorted(set(caps)))
        self.assertTrue(all(c % (2 * MiB) == 0 for c in caps))
        self.assertLess(caps[-1], 105 * MiB)
        self.assertIn(int(100 * MiB * 1.02 * 1.02) // (2 * MiB) * 2 * MiB, caps)

    def test_no_capacity_below_zero(self):
        self.assertEqual(cs.grid(4 * MiB, fine=1, top=1.0, ratio=2.0), [2 * MiB, 4 * MiB])


class Judge(unittest.TestCase):
    def test_each_kind_of_capacity_is_named(self):
        outcomes = {96: (False, False), 98: (False, True), 100: (True, True), 102: (True, False),
                    104: (False, True), 106: (True, True)}
        self.assertEqual(cs.judge(outcomes, cistern_min=100, expandable_min=98),
                         {"expandable_only": [98, 104], "cistern_above_min": [104],
                          "expandable_above_min": [102]})


class WholeRun(unittest.TestCase):
    def test_a_stand_in_cli_gives_the_capacities_where_only_expandable_segments_ran(self):
        with tempfile.TemporaryDirectory() as d:
            cli = write_stand_in(d, STAND_IN)
            out = os.path.join(d, "sweep.json")
            r = subprocess.run([sys.executable, SCRIPT, "--cistern", cli, "--fine", "8", "--top",
                                "1.2", "--ratio", "1.05", "--jobs", "2", "--json", out, "a.csv",
                                "b.csv"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("expandable segments ran where cistern did not: on 2 of 2 traces",
                          r.stdout)
            with open(out, encoding="utf-8") as f:
                results = json.load(f)["results"]
            self.assertEqual([x["trace"] for x in results], ["a.csv", "b.csv"])
            for x in results:
                self.assertEqual(x["cistern_min"], 100 * MiB)
                self.assertEqual(x["expandable_min"], 98 * MiB)
                self.assertEqual(x["expandable_only"], [98 * MiB, 110 * MiB])
                self.assertEqual(x["cistern_above_min"], [110 * MiB])
                self.assertEqual(x["expandable_above_min"], [])

    def test_a_failing_cli_is_an_error_that_names_it(self):
        with tempfile.TemporaryDirectory() as d:
            cli = write_stand_in(d, "import sys\nprint('bad trace', file=sys.stderr)\n"
                                    "sys.exit(3)\n")
            r = subprocess.run([sys.executable, SCRIPT, "--cistern", cli, "a.csv"],
                               capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("failed (3): bad trace", r.stderr)

    def test_bad_options_are_refused(self):
        for args in (["--ratio", "1.0"], ["--top", "0.5"], ["--fine", "-1"], ["--jobs", "0"]):
            r = subprocess.run([sys.executable, SCRIPT, *args, "a.csv"], capture_output=True,
                               text=True)
            self.assertEqual(r.returncode, 2, args)


if __name__ == "__main__":
    unittest.main()
