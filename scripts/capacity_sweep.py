#!/usr/bin/env python3
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""Device sizes on which expandable segments run a trace and cistern does not.

min_capacity is one number per policy, found by bisection, which assumes that a policy that runs
on a device also runs on every larger one. A user who switches from PyTorch's
`expandable_segments:True` to cistern cares about every size: on no device should cistern run out
of memory where expandable segments do not. This script replays each trace under both on a grid
of capacities - every 2 MiB from 16 MiB below the smaller min_capacity of the two for `--fine`
steps, then every `--ratio` up to `--top` x that min_capacity - and reports, per trace:

  - the capacities where expandable segments ran and cistern ran out of memory;
  - the capacities above a policy's own min_capacity where it ran out of memory anyway (the
    bisection's assumption broken).

Usage: scripts/capacity_sweep.py [--cistern build/src/cli/cistern] [--fine 24] [--top 1.6]
                                 [--ratio 1.003] [--jobs 2] [--json OUT] trace...
Exit status 1 when expandable segments ran on some capacity where cistern did not.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

MiB = 1 << 20
STEP = 2 * MiB
EXPANDABLE = "torch:expandable_segments=true"
POLICIES = f"cistern,{EXPANDABLE}"
OOM_EXIT = 4  # `cistern replay`: a replay ran out of memory at the given --capacity


def grid(low, fine, top, ratio):
    """Capacities to probe from `low` (a multiple of 2 MiB): 8 steps of 2 MiB below it, `fine`
    from it, then every `ratio` up to `top` x low, each rounded down to 2 MiB; sorted, unique."""
    caps = {low + k * STEP for k in range(-8, fine) if low + k * STEP > 0}
    f = 1.0
    while f < top:
        caps.add(int(low * f) // STEP * STEP)
        f *= ratio
    return sorted(c for c in caps if c > 0)


def judge(outcomes, cistern_min, expandable_min):
    """outcomes: {capacity: (cistern ran, expandable ran)}. The capacities where expandable
    segments ran and cistern did not, and where each failed above its own min_capacity."""
    caps = sorted(outcomes)
    return {
        "expandable_only": [c for c in caps if outcomes[c][1] and not outcomes[c][0]],
        "cistern_above_min": [c for c in caps if c >= cistern_min and not outcomes[c][0]],
        "expandable_above_min": [c for c in caps if c >= expandable_min and not outcomes[c][1]],
    }


def replay(cistern, args):
    """`cistern replay ... --json FILE`; its rows (an out-of-memory exit is an answer, not an
    error)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        r = subprocess.run([cistern, "replay", "--quiet", "--json", out.name, *args],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode not in (0, OOM_EXIT):
            raise RuntimeError(f"cistern replay {' '.join(args)} failed ({r.returncode}): "
                               f"{r.stderr.strip()}")
        with open(out.name, encoding="utf-8") as f:
            return json.load(f)["results"]


def ran(rows):
    """{policy: no out-of-memory} of one replay's rows."""
    out = {}
    for row in rows:
        if row.get("error"):
            raise RuntimeError(f"{row['trace']} under {row['policy']}: {row['error']}")
        out[row["policy"]] = row["ooms"] == 0
    return out


def sweep(cistern, trace, fine, top, ratio):
    mins = {row["policy"]: row["min_capacity"]
            for row in replay(cistern, ["--policy", POLICIES, "--min-capacity", trace])}
    if not all(mins.get(p) for p in ("cistern", EXPANDABLE)):
        raise RuntimeError(f"{trace}: no min_capacity for every policy ({mins})")
    cmin, emin = mins["cistern"], mins[EXPANDABLE]
    outcomes = {}
    for cap in grid(min(cmin, emin), fine, top, ratio):
        r = ran(replay(cistern, ["--policy", POLICIES, "--capacity", str(cap), trace]))
        outcomes[cap] = (r["cistern"], r[EXPANDABLE])
    return {"trace": trace, "cistern_min": cmin, "expandable_min": emin,
            "probes": len(outcomes), **judge(outcomes, cmin, emin)}


def mib(caps):
    return ", ".join(f"{c // MiB}" for c in caps[:6]) + (" ..." if len(caps) > 6 else "")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--cistern", default="build/src/cli/cistern")
    p.add_argument("--fine", type=int, default=24, help="2 MiB steps from the lower min_capacity")
    p.add_argument("--top", type=float, default=1.6, help="the grid's end, x that min_capacity")
    p.add_argument("--ratio", type=float, default=1.003, help="the grid's step above the fine part")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", help="write every trace's figures here")
    a = p.parse_args()
    if a.fine < 0 or a.top < 1.0 or a.ratio <= 1.0 or a.jobs < 1:
        p.error("--fine must be at least 0, --top at least 1, --ratio above 1, --jobs at least 1")
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda t: sweep(a.cistern, t, a.fine, a.top, a.ratio), a.traces))
    print(f"{'trace':48s} {'cistern':>9s} {'expand.':>9s} {'probes':>6s}  (min_capacity, MiB)")
    for r in results:
        print(f"{os.path.basename(r['trace']):48s} {r['cistern_min'] // MiB:9d} "
              f"{r['expandable_min'] // MiB:9d} {r['probes']:6d}")
        for key, what in (("expandable_only", "expandable segments ran, cistern did not"),
                          ("cistern_above_min", "cistern failed above its min_capacity"),
                          ("expandable_above_min", "expandable failed above its min_capacity")):
            if r[key]:
                print(f"    {what} at {len(r[key])} (MiB: {mib(r[key])})")
    worse = [r for r in results if r["expandable_only"]]
    print(f"expandable segments ran where cistern did not: on {len(worse)} of {len(results)} "
          f"traces ({sum(r['probes'] for r in results)} capacities probed)")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"results": results}, f, indent=1)
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
