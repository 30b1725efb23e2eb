#!/usr/bin/env python3
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""Formats `cistern replay --json` files as docs/results.md (Markdown on stdout).

One table per trace family (the folder below traces/: pytorch, h200, kineto, somas,
minimalloc), one row per trace: peak_live, then for PyTorch's recorded run, the torch emulation,
nocache and cistern's defaults the overhead (peak reserved / peak_live - 1) and min_capacity /
peak_live.
Standard library only; called by scripts/results.sh.
"""

import argparse
import datetime
import json
import statistics
import sys

POLICIES = [  # (policy in the JSON, column title)
    ("recorded", "PyTorch recorded"),
    ("torch", "torch emulation"),
    ("nocache", "nocache"),
    ("cistern:vmm=false", "cistern, vmm=false"),
    ("cistern", "cistern"),
]

# Device sizes of the headline table, in multiples of each trace's peak_live.
HEADLINE_DEVICES = (1.02, 1.05)

# Recorded from real programs; minimalloc's instances are synthetic planning benchmarks and are
# summarised on their own.
REAL_FAMILIES = ("pytorch", "h200", "kineto", "somas")

FAMILIES = {
    "pytorch": "PyTorch memory snapshots",
    "h200": "PyTorch memory snapshots recorded on an H200 (PyTorch 2.11)",
    "kineto": "Kineto (PyTorch profiler) trace",
    "somas": "MindSpore SOMAS lifetime lists",
    "minimalloc": "minimalloc challenging instances (sizes x 1024: 1 unit = 1 KiB)",
}


def trace_name(path):
    """The path below traces/, as the shared README names it."""
    marker = "traces/"
    at = path.rfind(marker)
    return path[at + len(marker):] if at >= 0 else path


def format_bytes(n):
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def percent(x):
    return "-" if x is None else f"{x * 100:.2f}%"


def ratio(row):
    if row is None or row.get("min_capacity") is None or not row["peak_live"]:
        return None
    return row["min_capacity"] / row["peak_live"]


def fmt_ratio(x):
    return "-" if x is None else f"{x:.3f}"


def load(paths):
    """Rows grouped by trace, in file order: {trace: {policy: row}}."""
    traces = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for row in json.load(f)["results"]:
                traces.setdefault(trace_name(row["trace"]), {})[row["policy"]] = row
    return traces


def columns(rows_by_trace):
    """The policies present, and whether each has min_capacity figures."""
    present = []
    for policy, title in POLICIES:
        rows = [r[policy] for r in rows_by_trace.values() if policy in r]
        if rows:
            present.append((policy, title, any(r.get("min_capacity") is not None for r in rows)))
    return present


def family_table(rows_by_trace):
    cols = columns(rows_by_trace)
    head = ["trace", "peak_live"]
    for _, title, has_ratio in cols:
        head.append(f"{title}: overhead")
        if has_ratio:
            head.append(f"{title}: min_cap / live")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    stats = {policy: ([], []) for policy, _, _ in cols}
    for name, rows in rows_by_trace.items():
        any_row = next(iter(rows.values()))
        cells = [f"`{name}`", format_bytes(any_row["peak_live"])]
        for policy, _, has_ratio in cols:
            row = rows.get(policy)
            if row is not None and row.get("error"):
                cells.append("error")
                if has_ratio:
                    cells.append("error")
                continue
            overhead = None if row is None else row.get("overhead")
            cells.append(percent(overhead))
            if overhead is not None:
                stats[policy][0].append(overhead)
            if has_ratio:
                r = ratio(row)
                cells.append(fmt_ratio(r))
                if r is not None:
                    stats[policy][1].append(r)
        lines.append("| " + " | ".join(cells) + " |")
    if len(rows_by_trace) > 2:
        cells = ["**median**", ""]
        for policy, _, has_ratio in cols:
            overheads, ratios = stats[policy]
            cells.append(percent(statistics.median(overheads)) if overheads else "-")
            if has_ratio:
                cells.append(fmt_ratio(statistics.median(ratios)) if ratios else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def overall_table(traces):
    """Per policy, across every trace: median and worst overhead and min_cap / live."""
    lines = [
        "| policy | traces | median overhead | worst overhead | median min_cap / live | "
        "worst min_cap / live | OOMs at 80 GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for policy, title in POLICIES:
        rows = [r[policy] for r in traces.values() if policy in r and not r[policy].get("error")]
        if not rows:
            continue
        overheads = [r["overhead"] for r in rows if r.get("overhead") is not None]
        ratios = [x for x in (ratio(r) for r in rows) if x is not None]
        ooms = sum(r.get("ooms") or 0 for r in rows) if policy != "recorded" else None
        lines.append("| " + " | ".join([
            title,
            str(len(rows)),
            percent(statistics.median(overheads)) if overheads else "-",
            percent(max(overheads)) if overheads else "-",
            fmt_ratio(statistics.median(ratios)) if ratios else "-",
            fmt_ratio(max(ratios)) if ratios else "-",
            "-" if ooms is None else str(ooms),
        ]) + " |")
    return "\n".join(lines)


def headline_table(traces):
    """Per policy: on how many traces it runs without an out-of-memory error on a device of
    1.02 x and 1.05 x the trace's peak_live (min_capacity, found by the capacity search, at most
    that)."""
    head = ["policy", "traces"] + [f"runs on {d:.2f} x peak_live" for d in HEADLINE_DEVICES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for policy, title in POLICIES:
        ratios = [ratio(r[policy]) for r in traces.values()
                  if policy in r and not r[policy].get("error")]
        ratios = [x for x in ratios if x is not None]
        if not ratios:
            continue
        cells = [title, str(len(ratios))]
        cells += [str(sum(1 for x in ratios if x <= d + 1e-9)) for d in HEADLINE_DEVICES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rows_by_trace(paths):
    """{trace: {policy: row}} of several JSON files (later files add to earlier ones)."""
    return load(paths) if paths else {}


def ms(x):
    return "-" if x is None else f"{x:.2f}"


def times(a, b):
    return None if a is None or b in (None, 0) else a / b


def fmt_times(x):
    return "-" if x is None else f"{x:.2f}x"


def device_time_table(traces):
    """At 80 GiB: each trace's device time (cost model) under torch and cistern; handles created
    against torch's cudaMallocs; and cistern's peak reserved against classic segments'
    (vmm=false)."""
    head = ["trace", "torch", "cistern", "/ torch", "handles created / torch's cudaMallocs",
            "peak reserved / vmm=false"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    worst = None
    for name, rows in traces.items():
        torch, cistern = rows.get("torch"), rows.get("cistern")
        if not torch or not cistern:
            continue
        x = times(cistern.get("device_ms"), torch.get("device_ms"))
        if x is not None and (worst is None or x > worst):
            worst = x
        classic = rows.get("cistern:vmm=false", {}).get("peak_reserved")
        peak = fmt_ratio(times(cistern.get("peak_reserved"), classic))
        lines.append("| " + " | ".join([
            f"`{name}`", ms(torch.get("device_ms")), ms(cistern.get("device_ms")), fmt_times(x),
            f"{cistern.get('handle_creates', 0)} / {torch.get('device_allocs', 0)}", peak,
        ]) + " |")
    return "\n".join(lines), worst


def at_capacity_table(traces, at_torch_min):
    """Device time and synchronisations at each policy's own min_capacity, and cistern's on a
    device of torch's min_capacity."""
    head = ["trace", "torch at its min_cap: ms", "syncs", "cistern at its min_cap: ms", "syncs",
            "unmaps", "cistern at torch's min_cap: ms", "/ torch", "syncs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    worst = None
    for name, rows in traces.items():
        t = (rows.get("torch") or {}).get("at_min_capacity")
        c = (rows.get("cistern") or {}).get("at_min_capacity")
        if not t or not c:
            continue
        there = at_torch_min.get(name, {}).get("cistern")
        ok = there and not there.get("ooms")
        x = times(there.get("device_ms"), t["device_ms"]) if ok else None
        if x is not None and (worst is None or x > worst):
            worst = x
        lines.append("| " + " | ".join([
            f"`{name}`", ms(t["device_ms"]), str(t["syncs"]), ms(c["device_ms"]), str(c["syncs"]),
            str(c["unmaps"]), ms(there.get("device_ms")) if there else "-", fmt_times(x),
            str(there.get("syncs")) if there else "-",
        ]) + " |")
    return "\n".join(lines), worst


def repeat_table(repeat):
    """`--repeat 3`: device calls (segments, maps, unmaps) of the first pass and the later ones."""
    head = ["trace", "torch: pass 1", "passes 2-3", "cistern: pass 1", "passes 2-3"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    quiet = 0
    total = 0
    for name, rows in repeat.items():
        cells = [f"`{name}`"]
        for policy in ("torch", "cistern"):
            passes = (rows.get(policy) or {}).get("passes") or []
            calls = [p["device_allocs"] + p["device_frees"] + p["maps"] + p["unmaps"]
                     for p in passes]
            cells += [str(calls[0]) if calls else "-", str(sum(calls[1:])) if calls else "-"]
            if policy == "cistern" and calls:
                total += 1
                quiet += 1 if sum(calls[1:]) == 0 else 0
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), quiet, total


def device_sections(real, model, repeat, at_torch_min):
    """The device-time sections (the at-the-limit and steady-state ones only when their replays
    were given)."""
    out = []
    table, worst = device_time_table(real)
    out += ["## Device time", "",
            "Simulated device time of each policy's device calls over the whole trace, ms, on the "
            f"80 GiB device, priced by the cost model `{model}` ([cost-model.md](cost-model.md)"
            f"{': every call as measured on an NVIDIA H200' if model == 'h200' else ''}). "
            f"Worst cistern / torch: {fmt_times(worst)}.", "", table, ""]
    if at_torch_min:
        table, worst = at_capacity_table(real, at_torch_min)
        out += ["### At the limit", "",
                "The same on a device of exactly each policy's own min_capacity (JSON "
                "`at_min_capacity`): what running at the limit costs - torch's release-and-retry, "
                "cistern's reclaim (unmaps after a query or a synchronisation of the stream that "
                "used the pages). Then cistern on a device of torch's min_capacity: worst "
                f"cistern / torch there {fmt_times(worst)}.", "", table, ""]
    if repeat:
        table, quiet, total = repeat_table(repeat)
        out += ["### Steady state", "",
                "`--repeat 3` on the 80 GiB device: device calls (segments allocated and freed, "
                "maps, unmaps) in the first pass and in passes 2 and 3. cistern makes none after "
                f"the first pass on {quiet} of {total} traces.", "", table, ""]
    return out


def cost_model_name(paths):
    """The cost model that priced the replays (`cost_model.name` of their JSON), or "unknown";
    an error if the files disagree."""
    names = set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            names.add((json.load(f).get("cost_model") or {}).get("name", "unknown"))
    if len(names) > 1:
        sys.exit(f"results_md.py: the replays were priced by different cost models: {sorted(names)}")
    return names.pop() if names else "unknown"


HOW_TO_READ = """\
## How to read this

`peak_live` is the most memory the program's live allocations needed at any one time, counted in
the sizes the program asked for (including blocks already live when a recorded window opened). No
allocator can run the trace in less, so every other figure is measured against it:

- **overhead** = peak reserved / peak_live - 1: how much more than that the allocator held from the
  device at its peak on an 80 GiB device (rounding, fragmentation, cached free memory).
- **min_cap / live** = the smallest device capacity (to 2 MiB) on which the whole trace replays with
  no out-of-memory error, divided by peak_live. This is the figure that decides whether a job fits:
  an allocator that caches freely can still squeeze into a smaller device by freeing its cache and
  retrying, and one that never caches (nocache) can still fail because the device rounds every
  allocation to 2 MiB pages.
- **PyTorch recorded** is what PyTorch's own allocator held while the trace was recorded (from the
  snapshot's segment events, or the Kineto trace's Total Reserved counter); it has no min_cap
  figure. **torch emulation** is cistern's replay of PyTorch's allocator on the same events, and
  should sit close to the recorded figure. **nocache** is one `cudaMalloc` per allocation; its
  reserved bytes are the sizes it asks for, so its overhead is about zero, and the driver's
  rounding of every allocation to 2 MiB pages shows in its min_cap instead. **cistern** is cistern
  with its default options: PyTorch's size policy and best fit, with the virtual-memory engine
  (pages mapped only where live blocks are, reclaimed from cached free blocks before running out
  of memory). **cistern, vmm=false** is cistern with classic segments (one device allocation
  each), which places every block where PyTorch would and matches the emulation closely.

Every replay starts cold: blocks live before the recorded window are allocated first on an empty
device, so a recorded run that had cached more before the window (the Kineto trace: its reserved
memory was already at its high-water mark when the window opened) can show more overhead than any
replay of the window can.
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("json", nargs="+", help="cistern replay --json files")
    parser.add_argument("--repeat", nargs="*", default=[], help="replays with --repeat 3")
    parser.add_argument("--at-torch-min", nargs="*", default=[],
                        help="replays of cistern on a device of torch's min_capacity")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--machine", default="unknown")
    parser.add_argument("--version", default="unknown")
    parser.add_argument("--example", help="the HTML report's file name, next to results.md")
    parser.add_argument("--example-trace", help="the trace the HTML report shows")
    args = parser.parse_args()

    traces = load(args.json)
    families = {}
    for name, rows in traces.items():
        families.setdefault(name.split("/")[0], {})[name] = rows

    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = [
        "# Replay results",
        "",
        "<!-- Generated by scripts/results.sh; do not edit by hand. -->",
        "",
        f"Every trace in `../shared/traces` (see its README for sources and licenses) replayed by "
        f"`cistern replay --policy cistern,cistern:vmm=false,torch,nocache --min-capacity` on the "
        f"simulated device "
        f"(80 GiB).",
        "",
        f"- date: {today}",
        f"- version: {args.version}, commit {args.commit}",
        f"- machine: {args.machine}",
        "",
    ]
    if args.example:
        what = f" of `{args.example_trace}`" if args.example_trace else ""
        out += [f"An HTML report{what} - memory timeline, results, segment maps at the peak - is "
                f"in [{args.example}]({args.example}) (open it in a browser; it needs no network).",
                ""]
    real = {name: rows for name, rows in traces.items() if name.split("/")[0] in REAL_FAMILIES}
    if real:
        out += ["## Real workloads at a glance", "",
                f"Across the {len(real)} traces recorded from real programs (PyTorch snapshots, "
                f"the Kineto trace, SOMAS lists; minimalloc's synthetic instances have their own "
                f"table below):", "", overall_table(real), "",
                "How many of them each policy runs without an out-of-memory error on a device "
                "barely larger than the live data (from the capacity search: min_cap / live at "
                "most the factor):", "", headline_table(real), ""]
        out += device_sections(
            real, cost_model_name(args.json + args.repeat + args.at_torch_min),
            rows_by_trace(args.repeat), rows_by_trace(args.at_torch_min))
    for family, rows in families.items():
        out += [f"## {FAMILIES.get(family, family)}", "", family_table(rows), ""]
    out.append(HOW_TO_READ)
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
