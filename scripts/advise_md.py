#!/usr/bin/env python3
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""The `cistern advise` section of docs/results.md, from `cistern advise --json` output."""
import argparse
import json
import os


def gib(n):
    return f"{n / 2**30:.2f} GiB"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("json", help="cistern advise --json file")
    args = parser.parse_args()
    with open(args.json, encoding="utf-8") as f:
        results = json.load(f)["results"]
    print("\n## cistern advise on the shared PyTorch snapshots\n")
    print("`cistern advise` replays PyTorch's allocator options on the `torch` emulation (cold "
          "start) and ranks them by min_capacity, the smallest device that runs the trace. "
          "Saving = how much less than PyTorch's defaults the best configuration needs; "
          "cistern = cistern's own allocator with its defaults, replayed the same way, and how "
          "much less than the best configuration it needs (negative: more). The best "
          "configuration is set with `PYTORCH_ALLOC_CONF` (PyTorch 2.9 and earlier read "
          "`PYTORCH_CUDA_ALLOC_CONF`).\n")
    print("| snapshot | defaults: min_capacity | best PYTORCH_ALLOC_CONF | its min_capacity "
          "| saving | cistern | cistern vs best | configurations | search time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        name = r["trace"].split("traces/")[-1]
        base = r["defaults"]["min_capacity"]
        best = r["best"]
        saving = (base - best["min_capacity"]) / base if base else 0.0
        config = f"`{best['config']}`" if best["config"] else "(the defaults)"
        cistern = r["cistern"]
        if cistern["min_capacity"] is None:
            cistern_cells = f"error: {cistern['error']} | - "
        else:
            cistern_cells = (f"{gib(cistern['min_capacity'])} ({cistern['min_capacity']}) | "
                             f"{100 * cistern['saving_vs_best']:.2f}% ")
        print(f"| `{name}` | {gib(base)} ({base}) | {config} | {gib(best['min_capacity'])} "
              f"({best['min_capacity']}) | {100 * saving:.2f}% | {cistern_cells}| "
              f"{len(r['candidates'])} | {r['seconds']:.1f} s |")


if __name__ == "__main__":
    main()
