#!/usr/bin/env python3
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""The ratio table of the hot-path benchmark: cistern / mimalloc and cistern / glibc.

Reads a results folder written by scripts/bench.sh (hot_path.json from Google Benchmark and,
when present, callgrind.json), prints the table and writes ratios.json next to them.

Per workload x threads it compares three costs of one allocate+free pair:
  wall   ns_per_pair: wall-clock time of one pair in one thread
  cpu    Google Benchmark's cpu_time: CPU time of all threads / all pairs (robust on a busy machine)
  instr  callgrind instructions per pair (single thread only; deterministic)
and checks the target on the small mix, single thread: cistern <= 4x mimalloc and <= glibc.

Usage: bench_ratios.py RESULTS_DIR
       bench_ratios.py --benchmark-json FILE [--callgrind-json FILE] [--out FILE]
Python 3 standard library only.
"""

import argparse
import json
import os
import statistics
import sys

ALLOCATORS = ("cistern", "mimalloc", "glibc")
TARGET = {"workload": "mix_small", "threads": 1, "max_vs_mimalloc": 4.0, "max_vs_glibc": 1.0}
TO_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def parse_run_name(run_name):
    """('512B', 'cistern') from 'pair/512B/cistern[/threads:N]', or None for other rows."""
    parts = run_name.split("/")
    if len(parts) < 3 or parts[0] != "pair" or parts[2] not in ALLOCATORS:
        return None
    return parts[1], parts[2]


def chosen_rows(benchmarks):
    """The rows to use: the median aggregates when repetitions were run, else the plain runs."""
    medians = [b for b in benchmarks if b.get("aggregate_name") == "median"]
    if medians:
        return medians
    return [b for b in benchmarks if b.get("run_type", "iteration") == "iteration"]


def read_timings(path):
    """{(workload, allocator, threads): {metric: value}} from Google Benchmark's JSON."""
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    samples = {}
    for row in chosen_rows(document.get("benchmarks", [])):
        parsed = parse_run_name(row.get("run_name", row["name"]))
        if parsed is None or row.get("error_occurred"):
            continue
        key = (parsed[0], parsed[1], int(row.get("threads", 1)))
        scale = TO_NS[row.get("time_unit", "ns")]
        samples.setdefault(key, []).append({
            "ns_per_pair": row.get("ns_per_pair"),
            "cpu_ns_per_pair": row["cpu_time"] * scale,
            "items_per_second": row.get("items_per_second"),
            "device_allocs": row.get("device_allocs"),
            "takeovers": row.get("takeovers"),
        })
    return {key: merge_samples(rows) for key, rows in samples.items()}, document.get("context", {})


def merge_samples(rows):
    """The median of each metric over repeated rows of one benchmark."""
    merged = {}
    for metric in rows[0]:
        values = [r[metric] for r in rows if r[metric] is not None]
        merged[metric] = statistics.median(values) if values else None
    return merged


def read_instructions(path):
    """{(workload, allocator): instructions per pair} from callgrind.json."""
    if path is None or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    counts = {}
    for name, value in document.get("instructions_per_pair", {}).items():
        parsed = parse_run_name(name)
        if parsed is not None:
            counts[parsed] = value
    return counts


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def build_report(timings, instructions):
    """The rows, the ratios, the scaling and the target verdict."""
    workloads = sorted({k[0] for k in timings} | {k[0] for k in instructions}, key=workload_order)
    threads = sorted({k[2] for k in timings} | {1})
    rows, ratios = [], []
    for workload in workloads:
        for n in threads:
            cost = {}
            for allocator in ALLOCATORS:
                timing = timings.get((workload, allocator, n), {})
                instr = instructions.get((workload, allocator)) if n == 1 else None
                if not timing and instr is None:
                    continue
                cost[allocator] = {"wall": timing.get("ns_per_pair"),
                                   "cpu": timing.get("cpu_ns_per_pair"), "instr": instr}
                rows.append({"workload": workload, "allocator": allocator, "threads": n,
                             **timing, "instructions_per_pair": instr})
            if "cistern" in cost:
                ratios.append(ratio_entry(workload, n, cost))
    return {"rows": rows, "ratios": ratios, "scaling": scaling(timings),
            "target": target_verdict(ratios)}


def ratio_entry(workload, threads, cost):
    entry = {"workload": workload, "threads": threads}
    for other in ("mimalloc", "glibc"):
        if other in cost:
            entry["cistern/" + other] = {m: ratio(cost["cistern"][m], cost[other][m])
                                         for m in ("wall", "cpu", "instr")}
    return entry


def scaling(timings):
    """Throughput (all threads' pairs per wall second) at N threads over 1 thread."""
    result = []
    for (workload, allocator, n), timing in sorted(timings.items(),
                                                   key=lambda kv: workload_order(kv[0][0])):
        base = timings.get((workload, allocator, 1), {}).get("items_per_second")
        if n != 1 and base:
            result.append({"workload": workload, "allocator": allocator, "threads": n,
                           "throughput_vs_1_thread": ratio(timing.get("items_per_second"), base)})
    return result


def target_verdict(ratios):
    entry = next((r for r in ratios if r["workload"] == TARGET["workload"]
                  and r["threads"] == TARGET["threads"]), None)
    verdict = dict(TARGET)
    if entry is None:
        verdict["met"] = None
        return verdict
    for metric in ("wall", "cpu", "instr"):
        vs_mi = entry.get("cistern/mimalloc", {}).get(metric)
        vs_glibc = entry.get("cistern/glibc", {}).get(metric)
        if vs_mi is None or vs_glibc is None:
            continue
        met = vs_mi <= TARGET["max_vs_mimalloc"] and vs_glibc <= TARGET["max_vs_glibc"]
        verdict[metric] = {"cistern/mimalloc": vs_mi, "cistern/glibc": vs_glibc, "met": met}
    return verdict


def workload_order(name):
    order = ["512B", "64KiB", "2MiB", "100MiB", "mix_small", "mix_all"]
    return (order.index(name) if name in order else len(order), name)


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def print_report(report):
    print("| workload | threads | allocator | wall ns/pair | cpu ns/pair | instr/pair | Mpairs/s "
          "| device_allocs | takeovers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in report["rows"]:
        mps = None if r.get("items_per_second") is None else r["items_per_second"] / 1e6
        cells = [r["workload"], str(r["threads"]), r["allocator"], fmt(r.get("ns_per_pair")),
                 fmt(r.get("cpu_ns_per_pair")), fmt(r.get("instructions_per_pair")), fmt(mps, 2),
                 fmt(r.get("device_allocs"), 0), fmt(r.get("takeovers"), 0)]
        print("| " + " | ".join(cells) + " |")
    print()
    print("| workload | threads | cistern/mimalloc wall | cpu | instr "
          "| cistern/glibc wall | cpu | instr |")
    print("|---|---|---|---|---|---|---|---|")
    for r in report["ratios"]:
        mi, gl = r.get("cistern/mimalloc", {}), r.get("cistern/glibc", {})
        print(f"| {r['workload']} | {r['threads']} | " + " | ".join(
            fmt(d.get(m), 2) for d in (mi, gl) for m in ("wall", "cpu", "instr")) + " |")
    print()
    if report["scaling"]:
        print("Throughput (pairs of all threads per second) at N threads / at 1 thread:")
        for r in report["scaling"]:
            print(f"  {r['workload']:9} {r['allocator']:8} x{r['threads']}: "
                  f"{fmt(r['throughput_vs_1_thread'], 2)}")
        print()
    t = report["target"]
    print(f"Target on {t['workload']}, {t['threads']} thread: cistern <= "
          f"{t['max_vs_mimalloc']:g}x mimalloc and <= {t['max_vs_glibc']:g}x glibc")
    for metric in ("wall", "cpu", "instr"):
        if metric in t:
            v = t[metric]
            print(f"  {metric:5}: cistern/mimalloc {v['cistern/mimalloc']:.2f}, cistern/glibc "
                  f"{v['cistern/glibc']:.2f} -> {'met' if v['met'] else 'MISSED'}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", help="folder with hot_path.json (and callgrind.json)")
    parser.add_argument("--benchmark-json")
    parser.add_argument("--callgrind-json")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.results:
        args.benchmark_json = args.benchmark_json or os.path.join(args.results, "hot_path.json")
        args.callgrind_json = args.callgrind_json or os.path.join(args.results, "callgrind.json")
        args.out = args.out or os.path.join(args.results, "ratios.json")
    if not args.benchmark_json and not args.callgrind_json:
        parser.error("give RESULTS_DIR or --benchmark-json")
    timings, context = ({}, {})
    if args.benchmark_json and os.path.exists(args.benchmark_json):
        timings, context = read_timings(args.benchmark_json)
    report = build_report(timings, read_instructions(args.callgrind_json))
    report["context"] = context
    print_report(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
