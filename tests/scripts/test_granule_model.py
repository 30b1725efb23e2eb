#!/usr/bin/env python3
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""scripts/granule_model.py on lifetime lists whose answer is worked out by hand.

Usage: test_granule_model.py --source SOURCE_DIR
"""
import argparse
import os
import subprocess
import sys
import tempfile

MiB = 1 << 20


def run(script, rows, tmp, name, *flags):
    path = os.path.join(tmp, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write("id,lower,upper,size\n")
        for i, (lower, upper, size) in enumerate(rows):
            f.write(f"{i},{lower},{upper},{size}\n")
    out = subprocess.run([sys.executable, script, *flags, path], check=True, capture_output=True,
                         text=True).stdout.split()
    return int(out[1]), float(out[2])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--source", required=True)
    script = os.path.join(p.parse_args().source, "scripts", "granule_model.py")
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got}, expected {want}")

    with tempfile.TemporaryDirectory() as tmp:
        # a (1 MiB + 512 B) at 0 and b (2 MiB) after it live on; c (4 MiB) cut after b at t=2
        # touches granules 1-3: four granules for 7 MiB + 512 B live.
        live = (MiB + 512) + 2 * MiB + 4 * MiB
        peak, ratio = run(script, [(0, 10, MiB + 512), (1, 10, 2 * MiB), (2, 3, 4 * MiB)], tmp,
                          "packed.csv")
        expect("packed: peak_live", peak, live)
        expect("packed: ratio", ratio, round(4 * 2 * MiB / live, 4))
        # c freed at t=3 before d (4 MiB) comes at t=3: d takes c's place, no more granules; the
        # 512 B block e has a range of its own, so its granule is a fifth.
        peak, ratio = run(script, [(0, 10, MiB + 512), (1, 10, 2 * MiB), (2, 3, 4 * MiB),
                                   (3, 10, 4 * MiB), (4, 10, 512)], tmp, "reuse.csv")
        expect("reuse: peak_live", peak, live + 512)
        expect("reuse: ratio", ratio, round(5 * 2 * MiB / (live + 512), 4))
        # Best fit: P (6 MiB at 2 MiB, granules 1-3) and Q (1.25 MiB at 9.5 MiB) are freed; R
        # (1 MiB + 512 B) takes Q's place, inside granules 4-5 that Y and Z already touch (first
        # fit would take P's, a new granule 1); W (8 MiB) fits no hole and goes after Z,
        # granules 6-10. At t=3: granules 0 and 4-10, 16 MiB, the most at any time.
        half = MiB // 2
        rows = [(0, 10, 2 * MiB), (0, 1, 6 * MiB), (0, 10, 3 * half), (0, 1, 5 * half // 2),
                (0, 10, 2 * MiB), (2, 10, MiB + 512), (3, 10, 8 * MiB)]
        live = 2 * MiB + 3 * half + 2 * MiB + (MiB + 512) + 8 * MiB
        peak, ratio = run(script, rows, tmp, "best_fit.csv")
        expect("best fit: peak_live", peak, live)
        expect("best fit: ratio", ratio, round(8 * 2 * MiB / live, 4))
        # First fit puts R in P's place, a new granule 1: nine granules.
        peak, ratio = run(script, rows, tmp, "first_fit.csv", "--first-fit")
        expect("first fit: ratio", ratio, round(9 * 2 * MiB / live, 4))
        # --end: A (3 MiB) at 0, F (4.5 MiB) and B (2.5 MiB, granules 3-4) after it; F is freed
        # and R (1.25 MiB) comes: at F's start it would add granule 2, at its end it lies inside
        # granule 3, which B touches. W (4 MiB) fits neither rest and goes after B, granules 5-6:
        # seven granules at t=3 with R at the start, six with --end.
        rows = [(0, 10, 3 * MiB), (0, 1, 9 * half), (0, 10, 5 * half), (2, 10, 5 * half // 2),
                (3, 10, 4 * MiB)]
        live = 3 * MiB + 5 * half + 5 * half // 2 + 4 * MiB
        peak, ratio = run(script, rows, tmp, "start.csv")
        expect("start: peak_live", peak, live)
        expect("start: ratio", ratio, round(7 * 2 * MiB / live, 4))
        peak, ratio = run(script, rows, tmp, "end.csv", "--end")
        expect("end: ratio", ratio, round(6 * 2 * MiB / live, 4))
        no_args = subprocess.run([sys.executable, script], capture_output=True, text=True)
        expect("no arguments: exit status", no_args.returncode, 2)

    for f in failures:
        print("FAILED:", f)
    print("granule_model.py:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
