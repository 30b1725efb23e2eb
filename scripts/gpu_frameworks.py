# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""The framework check on a GPU (issue 19), run by scripts/gpu-check.sh:

  python3 scripts/gpu_frameworks.py [--out DIR] [--budget-s 175] [--steps 28]
                                    [--parts torch,cupy] [--plugin libcistern_plugin.so]
  python3 scripts/gpu_frameworks.py --report DIR      (the tables again, from DIR/rows.jsonl)

PyTorch. A small GPT-style transformer trains on batches whose shape changes every step, as
packed variable-length data does (batch and sequence length from a fixed-seed sequence, the same
for every run), through four allocators, each in its own process: PyTorch's native allocator,
native with expandable segments (PYTORCH_ALLOC_CONF and the older PYTORCH_CUDA_ALLOC_CONF),
cistern's defaults (cistern.torch.enable(); CISTERN_ALLOC_CONF is passed through when the
caller sets it, and the row says so), and cistern with vmm:False for comparison. Each process
runs its rows in this order: the fragmentation case; uncapped; then caps of 1.20, 1.05, 1.02,
1.01 and 1.00 x the native uncapped run's peak allocated bytes, set with
torch.cuda.set_per_process_memory_fraction(cap / total memory) (cistern receives it through its
memory-fraction hook). Between rows the model and optimizer are deleted, gc.collect(),
empty_cache() and the peak statistics are reset; each row builds the model afresh with the same
seed. An out-of-memory step is caught (`except torch.OutOfMemoryError`), skipped, and training
goes on. Per row: the out-of-memory steps, peak reserved, peak allocated, median step time
(completed steps, the first excluded), the error type and message of the first out of memory,
and, under cistern, whether torch.cuda's own statistics calls (memory_allocated,
max_memory_allocated, memory_reserved, max_memory_reserved, memory_stats, memory_summary) give
cistern's figures, as enable() has them do (the report counts the runs that agree).
Call stacks (cistern's defaults, last row): three training steps under
cistern.torch.record_history(stacks="all"), the snapshot written and read back, and how many
allocations carry Python frames naming the model's forward and PyTorch's C++ frames.
CUDA graphs (native and cistern's defaults, the second row of each): a step captured with
torch.cuda.graph and replayed four times with new inputs, each output checked against the same
step run eagerly, and again after tensors allocated outside the graph (which must not share its
memory, and are checked unchanged); then a small model under torch.compile(mode="reduce-overhead")
(cudagraph trees, PyTorch's default) and with torch._inductor.config.triton.cudagraph_trees off
(one torch.cuda.graph per compiled function), outputs checked against the eager model. Under a
pluggable allocator PyTorch's cudagraph trees ask the allocator for checkpoints
(getCheckpointState), which CUDAPluggableAllocator refuses: the row records the error it raises.
The fragmentation case, under a 4 GiB cap: a 3000 MiB tensor is allocated and freed (the cache
holds it), thirty 100 MiB tensors are allocated, every other one is freed (1.5 GiB free as
fifteen 100 MiB holes between live tensors), then 1.5 GiB is asked for: served or out of
memory, and how long it took. The native process also checks the MemPool route: out of memory
inside cistern.torch.mem_pool() under a cistern limit of 1 GiB.

CuPy, smaller: array workloads of changing shapes through CuPy's memory pool, cistern's defaults
and cistern with vmm:False (cupy.cuda.set_allocator), uncapped and under the same caps of the
pool's uncapped peak of used bytes (MemoryPool.set_limit; cistern.cupy.set_memory_fraction),
out of memory caught as cupy.cuda.memory.OutOfMemoryError; and the fragmentation case.

Robustness: every process is watched; a row that runs past its timeout is killed, a process
that dies marks the row it was in as crashed, a row that raises an unexpected error ends its
process (the device may be unusable), and the rows left run in a new process (an allocator
whose processes end twice in a row without running a row to the end is given up). Every row is
appended to DIR/rows.jsonl as soon as it ends, and DIR/frameworks.json and DIR/frameworks.md
are rewritten after every process, so that a partial run still reports. The whole check keeps
to --budget-s (rows that would start later are reported as skipped).

Exit status: 0 when every row ran (out-of-memory steps are figures, not failures), 1 when a row
crashed, timed out or raised an unexpected error, 77 when neither PyTorch with a GPU nor CuPy is
there, 2 for bad arguments.
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
GiB = 1 << 30
SKIP = 77

CAP_FACTORS = (1.20, 1.05, 1.02, 1.01, 1.00)
TORCH_ALLOCATORS = ("native", "expandable", "cistern", "cistern-classic")
CUPY_ALLOCATORS = ("cupy", "cistern", "cistern-classic")
FRAGMENTATION = "fragmentation"
UNCAPPED = "uncapped"
MEMPOOL = "mempool"
GRAPHS = "graphs"
GRAPHS_TIMEOUT = 180  # two torch.compile runs
STACKS = "stacks"
OOM_CHECK = "oom"
OOM_CHECK_CAP = GiB  # the cap of the out-of-memory check: 256 MiB held, 2 GiB asked for

# The fragmentation case (bytes).
FRAG_CAP = 4 * GiB
FRAG_PRIME = 3000 * MiB
FRAG_PIECE = 100 * MiB
FRAG_PIECES = 30
FRAG_REQUEST = 1536 * MiB

# Timeouts (seconds): a worker's start (imports, CUDA context), one row, the glue's build.
STARTUP_TIMEOUT = 60
ROW_TIMEOUT = 40
PREPARE_TIMEOUT = 150


# --- what is measured: pure functions, tested without a GPU (python/tests) ---------------------

def cap_row(factor):
    """The name of the row capped at `factor` x the base peak."""
    return "cap%.2f" % factor


def row_factor(row):
    """The cap factor of a row name, None for a row without a cap."""
    return float(row[3:]) if row.startswith("cap") else None


def planned_rows(framework, allocator):
    """The rows of one allocator's process, in the order they run: the fragmentation case first
    (on a fresh process), for PyTorch the out-of-memory check,
    for PyTorch's native allocator and cistern's defaults the CUDA graph check, uncapped (the base
    of the caps), the caps from loose to tight, and last for PyTorch's native allocator the
    MemPool check, for cistern's defaults the call-stack check."""
    rows = [FRAGMENTATION] + ([OOM_CHECK] if framework == "torch" else [])
    if framework == "torch" and allocator in ("native", "cistern"):
        rows.append(GRAPHS)
    rows.append(UNCAPPED)
    rows += [cap_row(f) for f in sorted(CAP_FACTORS, reverse=True)]
    if framework == "torch" and allocator == "native":
        rows.append(MEMPOOL)
    if framework == "torch" and allocator == "cistern":
        rows.append(STACKS)
    return rows


def stacks_summary(snapshot, forward_names):
    """What a snapshot written under record_history(stacks="all") says of its allocations' frames
    (PyTorch's layout: device_traces' alloc events, each with `frames` of filename, line, name,
    innermost first; C++ frames have line 0 and a shared object as filename): how many allocs,
    how many with Python frames, how many of those name one of `forward_names` (the model's
    forward functions), how many with C++ frames from PyTorch's libraries (libtorch*, libc10*)
    before any Python frame, and how many with C++ frames only (threads without Python frames,
    autograd's backward workers)."""
    out = {"allocs": 0, "python": 0, "forward": 0, "torch_cpp": 0, "cpp_only": 0}
    for trace in snapshot.get("device_traces", []):
        for event in trace:
            if event.get("action") != "alloc":
                continue
            out["allocs"] += 1
            frames = event.get("frames") or []
            native = [f for f in frames if f.get("line") == 0 and ".so" in f.get("filename", "")]
            python = [f for f in frames if f.get("filename", "").endswith(".py")]
            out["python"] += bool(python)
            out["forward"] += any(f.get("name") in forward_names for f in python)
            first_python = next((i for i, f in enumerate(frames) if f in python), len(frames))
            out["torch_cpp"] += any(
                os.path.basename(f["filename"]).startswith(("libtorch", "libc10"))
                for f in frames[:first_python] if f in native)
            out["cpp_only"] += bool(native) and not python
    return out


def cap_bytes(base_peak, factor):
    """The cap for `factor` x `base_peak`, in whole bytes."""
    return int(round(base_peak * factor))


def cap_fraction(cap, total):
    """The memory fraction that caps reserved memory at `cap` bytes of a device of `total` bytes
    (PyTorch and cistern both allow fraction x total)."""
    if total <= 0:
        raise ValueError("the device's total memory must be positive")
    return min(1.0, cap / float(total))


def shape_sequence(steps, seed=19, min_seq=128, max_seq=2048, seq_step=64, min_tokens=6144,
                   max_tokens=16384):
    """(batch, sequence length) for each training step: the length drawn from min_seq..max_seq in
    seq_step steps, the batch filling a token budget drawn from min_tokens..max_tokens, as packed
    variable-length data gives. Deterministic for a seed."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(steps):
        seq = rng.randrange(min_seq, max_seq + 1, seq_step)
        tokens = rng.randint(min_tokens, max_tokens)
        shapes.append((max(1, tokens // seq), seq))
    return shapes


def cupy_shapes(steps, seed=23, min_rows=2048, max_rows=12288, row_step=512, cols=1024):
    """(rows, cols) of the CuPy workload's matrix at each step; deterministic for a seed."""
    rng = random.Random(seed)
    return [(rng.randrange(min_rows, max_rows + 1, row_step), cols) for _ in range(steps)]


def summarize_steps(steps, warmup=1):
    """From per-step records ({"ms": float, "oom": bool}): the out-of-memory steps (indices), the
    completed count, and the median and mean time of the completed steps after the first
    `warmup` steps (which pay for kernel selection and context set-up)."""
    oom_steps = [i for i, s in enumerate(steps) if s["oom"]]
    timed = [s["ms"] for i, s in enumerate(steps) if not s["oom"] and i >= warmup]
    return {
        "steps": len(steps),
        "completed": len(steps) - len(oom_steps),
        "oom_steps": oom_steps,
        "ooms": len(oom_steps),
        "median_ms": statistics.median(timed) if timed else None,
        "mean_ms": statistics.mean(timed) if timed else None,
    }


def read_events(path):
    """The events of a rows file (one JSON object per line). A line cut short by a killed
    process is left out."""
    events = []
    if not os.path.exists(path):
        return events
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def append_event(path, event):
    """Appends one event and makes it durable at once (a crash right after loses nothing)."""
    with open(path, "a") as f:
        f.write(json.dumps(event, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def row_results(events):
    """The last result of each (framework, allocator, row)."""
    results = {}
    for e in events:
        if e.get("event") == "row":
            results[(e["framework"], e["allocator"], e["row"])] = e
    return results


def remaining_rows(framework, allocator, events):
    """The planned rows of an allocator that have no result yet, in order."""
    done = row_results(events)
    return [r for r in planned_rows(framework, allocator)
            if (framework, allocator, r) not in done]


def row_in_progress(events, framework, allocator):
    """The row a worker of this allocator started last and did not finish, else None."""
    current = None
    for e in events:
        if e.get("framework") != framework or e.get("allocator") != allocator:
            continue
        if e.get("event") == "start":
            current = e["row"]
        elif e.get("event") == "row" and e.get("row") == current:
            current = None
    return current


def base_peak(events, framework, allocator):
    """The peak the caps of `allocator` are relative to, and where it comes from: the native (or
    CuPy pool) uncapped run's peak allocated bytes; the allocator's own uncapped run when that
    one has no figure; (None, None) when neither has."""
    results = row_results(events)
    reference = "native" if framework == "torch" else "cupy"
    for who in (reference, allocator):
        r = results.get((framework, who, UNCAPPED))
        if r and r.get("status") == "ok" and r.get("peak_allocated"):
            return r["peak_allocated"], "%s uncapped peak allocated" % who
    return None, None


def tightest_clean_cap(results, framework, allocator):
    """The smallest cap factor at which `allocator` finished with no out-of-memory step."""
    clean = [row_factor(row) for (f, a, row), r in results.items()
             if f == framework and a == allocator and row_factor(row) is not None
             and r.get("status") == "ok" and r.get("ooms") == 0]
    return min(clean) if clean else None


def _gib(value):
    return "-" if value is None else "%.2f" % (value / float(GiB))


def _ms(value):
    return "-" if value is None else "%.1f" % value


def _cell(text):
    return str(text).replace("|", "/").replace("\n", " ")


def training_table(results, framework, allocators, title):
    """The markdown table of the training rows of one framework."""
    reference = results.get((framework, allocators[0], UNCAPPED), {})
    base_ms = reference.get("median_ms")
    lines = ["### " + title, "",
             "| allocator | run | cap GiB | OOM steps | peak reserved GiB | peak allocated GiB "
             "| median step ms | vs %s uncapped | status |" % allocators[0],
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for allocator in allocators:
        for row in planned_rows(framework, allocator):
            if row in (FRAGMENTATION, MEMPOOL, OOM_CHECK, GRAPHS, STACKS):
                continue
            r = results.get((framework, allocator, row))
            if r is None:
                continue
            run = "uncapped" if row == UNCAPPED else "%.2fx" % row_factor(row)
            versus = "-"
            if r.get("median_ms") and base_ms:
                versus = "%+.1f%%" % (100.0 * (r["median_ms"] / base_ms - 1.0))
            ooms = "-" if r.get("ooms") is None else "%d/%d" % (r["ooms"], r.get("steps", 0))
            status = r.get("status", "?")
            if status != "ok":
                status += ": " + _cell(r.get("detail", ""))[:160]
            elif r.get("ooms"):
                status = "ok; first OOM: %s" % _cell(r.get("oom_type", ""))
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r.get("label", allocator), run, _gib(r.get("cap")), ooms,
                _gib(r.get("peak_reserved")), _gib(r.get("peak_allocated")),
                _ms(r.get("median_ms")), versus, status))
    return lines


def _rows_named(results, row):
    """The results of `row`, PyTorch's before CuPy's, each in the order its allocators run."""
    order = [("torch", a) for a in TORCH_ALLOCATORS] + [("cupy", a) for a in CUPY_ALLOCATORS]
    found = [(key, r) for key, r in results.items() if key[2] == row]
    return sorted(found, key=lambda item: (order.index(item[0][:2])
                                           if item[0][:2] in order else len(order), item[0]))


def fragmentation_table(results):
    lines = ["### Fragmentation: %d MiB cached, %d x %d MiB allocated, every other one freed, "
             "then %d MiB, under a %d GiB cap" % (FRAG_PRIME // MiB, FRAG_PIECES, FRAG_PIECE // MiB,
                                                 FRAG_REQUEST // MiB, FRAG_CAP // GiB), "",
             "| framework | allocator | 1.5 GiB request | ms | reserved before GiB | "
             "reserved after GiB | error |",
             "|---|---|---|---:|---:|---:|---|"]
    for (framework, allocator, row), r in _rows_named(results, FRAGMENTATION):
        if r.get("status") != "ok":
            lines.append("| %s | %s | %s | - | - | - | %s |" % (
                framework, r.get("label", allocator), r.get("status"),
                _cell(r.get("detail", ""))[:160]))
            continue
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            framework, r.get("label", allocator), "served" if r["served"] else "out of memory",
            _ms(r.get("ms")), _gib(r.get("reserved_before")), _gib(r.get("reserved_after")),
            _cell(r.get("error", ""))[:160]))
    return lines


def oom_table(results):
    lines = ["### Out of memory: %d MiB held, 2 GiB asked for under a %d GiB cap, then %d MiB "
             "and a matrix product (cistern: through enable())" % (
                 256, OOM_CHECK_CAP // GiB, 256), "",
             "| allocator | raised | cistern's message | next allocation | CUDA context | "
             "message |", "|---|---|---|---|---|---|"]
    for (framework, allocator, row), r in _rows_named(results, OOM_CHECK):
        if r.get("status") != "ok":
            lines.append("| %s | %s | - | - | - | %s |" % (
                r.get("label", allocator), r.get("status"), _cell(r.get("detail", ""))[:200]))
            continue
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            r.get("label", allocator), _cell(r.get("oom_type", "nothing")),
            "yes" if r.get("carries_cistern_message") else "no", r.get("next_allocation", "-"),
            r.get("context", "-"), _cell(r.get("error", ""))[:200]))
    return lines


def graphs_table(results):
    lines = ["### CUDA graphs: torch.cuda.graph replayed with new inputs, torch.compile("
             "mode=\"reduce-overhead\") with and without cudagraph trees", "",
             "| allocator | torch.cuda.graph replays | graph pool MiB | after the graph | "
             "reduce-overhead | without cudagraph trees |", "|---|---|---:|---|---|---|"]
    for (framework, allocator, row), r in _rows_named(results, GRAPHS):
        if r.get("status") not in ("ok", "error") or "graph" not in r:
            lines.append("| %s | %s | - | - | - | %s |" % (
                r.get("label", allocator), r.get("status"), _cell(r.get("detail", ""))[:200]))
            continue
        pool = r.get("graph_pool_bytes")
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            r.get("label", allocator), _cell(r.get("graph")),
            "-" if pool is None else "%.1f" % (pool / MiB), _cell(r.get("after_graph", "-")),
            _cell(r.get("compile", "-"))[:200], _cell(r.get("compile_no_trees", "-"))[:200]))
    return lines


def summary_table(results, framework, allocators):
    lines = ["| allocator | tightest cap with 0 OOM steps | uncapped median step ms | uncapped "
             "final loss |", "|---|---:|---:|---:|"]
    for allocator in allocators:
        r = results.get((framework, allocator, UNCAPPED), {})
        if not any(f == framework and a == allocator for (f, a, _) in results):
            continue
        tight = tightest_clean_cap(results, framework, allocator)
        loss = r.get("last_loss")
        lines.append("| %s | %s | %s | %s |" % (r.get("label", allocator),
                                                "none" if tight is None else "%.2fx" % tight,
                                                _ms(r.get("median_ms")),
                                                "-" if loss is None else "%.4f" % loss))
    return lines


def torch_api_lines(results):
    """torch.cuda.memory_* under cistern.torch.enable() (TorchMemory.torch_api), over the
    training runs: how many agreed with cistern's statistics, and the first that did not."""
    answers = [(row, r["torch_api"]) for (f, a, row), r in sorted(results.items())
               if f == "torch" and "torch_api" in r]
    if not answers:
        return []
    agreed = sum(1 for _, answer in answers if answer == "agree")
    line = ("- torch.cuda.memory_* under cistern.torch.enable(): agree with cistern's statistics "
            "in %d of %d runs" % (agreed, len(answers)))
    first = next(((row, answer) for row, answer in answers if answer != "agree"), None)
    if first:
        line += "; %s: %s" % first
    return ["", line]


def markdown(meta, events):
    """The report: what ran and how, then one table per part."""
    results = row_results(events)
    lines = ["## Framework check (scripts/gpu_frameworks.py)", ""]
    for key in ("gpu", "torch", "cupy", "cistern_oom_route"):
        if meta.get(key):
            lines.append("- %s: %s" % (key.replace("_", " "), meta[key]))
    lines.append("- method: " + meta.get("method", ""))
    if meta.get("notes"):
        for note in meta["notes"]:
            lines.append("- note: " + note)
    for framework, allocators, title in (
            ("torch", TORCH_ALLOCATORS, "PyTorch: variable-shape GPT training"),
            ("cupy", CUPY_ALLOCATORS, "CuPy: arrays of changing shapes")):
        if not any(f == framework for (f, _, _) in results):
            continue
        base = meta.get("base_peak", {}).get(framework)
        lines += [""] + training_table(results, framework, allocators, "%s (caps x %s)" % (
            title, "%s GiB" % _gib(base) if base else "the base peak"))
        lines += [""] + summary_table(results, framework, allocators)
    if any(row == OOM_CHECK for (_, _, row) in results):
        lines += [""] + oom_table(results)
    if any(row == FRAGMENTATION for (_, _, row) in results):
        lines += [""] + fragmentation_table(results)
    if any(row == GRAPHS for (_, _, row) in results):
        lines += [""] + graphs_table(results)
    stacks = results.get(("torch", "cistern", STACKS))
    if stacks:
        lines += ["", "### cistern.torch.record_history(stacks=\"all\"): three training steps' "
                  "snapshot", "", "- status: %s" % stacks.get("status")]
        for key, what in (("allocs", "alloc events"), ("python", "with Python frames"),
                          ("forward", "naming the model's forward"),
                          ("torch_cpp", "with PyTorch's C++ frames (libtorch, libc10)"),
                          ("cpp_only", "with C++ frames only (backward's threads)"),
                          ("steps_s", "the three steps, seconds"), ("detail", "detail")):
            if key in stacks:
                lines.append("- %s: %s" % (what, _cell(str(stacks[key]))[:300]))
    lines += torch_api_lines(results)
    mempool = results.get(("torch", "native", MEMPOOL))
    if mempool:
        lines += ["", "### cistern.torch.mem_pool(): 2 GiB asked for under a cistern limit of "
                  "1 GiB", "", "- status: %s" % mempool.get("status")]
        for key in ("oom_type", "carries_cistern_message", "next_allocation", "error", "detail"):
            if key in mempool:
                lines.append("- %s: %s" % (key.replace("_", " "), _cell(mempool[key])[:300]))
    return "\n".join(lines) + "\n"


def write_report(out, meta, events):
    """frameworks.json and frameworks.md, each replaced whole (never left half-written)."""
    results = row_results(events)
    document = {"meta": meta, "rows": [results[k] for k in sorted(results)]}
    for name, text in (("frameworks.json", json.dumps(document, indent=1, sort_keys=True) + "\n"),
                       ("frameworks.md", markdown(meta, events))):
        path = os.path.join(out, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


# --- the orchestrator ---------------------------------------------------------------------------

def _allocator_env(framework, allocator, base_env):
    """The environment of one allocator's process, and its label."""
    env = dict(base_env)
    for key in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        env.pop(key, None)
    label = allocator
    caller_conf = base_env.get("CISTERN_ALLOC_CONF")
    env.pop("CISTERN_ALLOC_CONF", None)
    if allocator == "expandable":
        env["PYTORCH_ALLOC_CONF"] = env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        label = "native, expandable_segments:True"
    elif allocator == "cistern":
        if caller_conf:
            env["CISTERN_ALLOC_CONF"] = caller_conf
            label = "cistern (CISTERN_ALLOC_CONF=%s)" % caller_conf
        else:
            label = "cistern (defaults)"
    elif allocator == "cistern-classic":
        env["CISTERN_ALLOC_CONF"] = "vmm:False"
        label = "cistern vmm:False"
    elif allocator == "native" and framework == "torch":
        # The MemPool row uses cistern's configuration as the "cistern" rows do.
        if caller_conf:
            env["CISTERN_ALLOC_CONF"] = caller_conf
        label = "native"
    elif allocator == "cupy":
        label = "CuPy's memory pool"
    return env, label


class Orchestrator:
    """Runs the workers one allocator at a time, watching each (see the module's comment)."""

    def __init__(self, out, budget_s, steps, worker_command, env, row_timeout=ROW_TIMEOUT,
                 startup_timeout=STARTUP_TIMEOUT, log=print):
        self.out, self.steps, self.worker_command, self.env = out, steps, worker_command, env
        self.rows_path = os.path.join(out, "rows.jsonl")
        self.deadline = time.monotonic() + budget_s
        self.row_timeout, self.startup_timeout, self.log = row_timeout, startup_timeout, log
        self.meta = {"notes": [], "base_peak": {}, "steps": steps, "budget_s": budget_s}
        self.failed = False

    def events(self):
        return read_events(self.rows_path)

    def record(self, event):
        append_event(self.rows_path, event)

    def report(self):
        write_report(self.out, self.meta, self.events())

    def left(self):
        return self.deadline - time.monotonic()

    def watch(self, command, env, framework, allocator, log_path, startup_timeout=None):
        """Runs one worker until it exits, kills it when a row (or its start) runs past its
        timeout or the budget is spent. Returns (exit code, why it was killed or None)."""
        startup_timeout = startup_timeout or self.startup_timeout
        seen = len(self.events())
        started = time.monotonic()
        progress = started
        current = None
        with open(log_path, "a") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            killed = None
            while process.poll() is None:
                time.sleep(0.2)
                events = self.events()
                for e in events[seen:]:
                    if e.get("framework") == framework and e.get("allocator") == allocator:
                        if e.get("event") == "start":
                            current, progress = e["row"], time.monotonic()
                        elif e.get("event") == "row":
                            current, progress = None, time.monotonic()
                seen = len(events)
                limit = self.row_timeout if current else startup_timeout
                if current == GRAPHS:
                    limit = max(limit, GRAPHS_TIMEOUT)
                now = time.monotonic()
                if now - progress > limit:
                    killed = ("timeout: %s ran past %d s" % (
                        "row " + current if current else "the worker's start", limit))
                elif self.left() <= 0:
                    killed = "timeout: the budget of the framework check is spent"
                if killed:
                    try:
                        os.killpg(process.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    process.wait()
                    break
        return process.returncode, killed

    def finished(self, framework, allocator, events):
        """Rows of an allocator that ran to the end."""
        return sum(1 for (f, a, _), r in row_results(events).items()
                   if f == framework and a == allocator and r.get("status") == "ok")

    def run_allocator(self, framework, allocator):
        """Runs an allocator's rows, in as many processes as crashes make necessary."""
        env, label = _allocator_env(framework, allocator, self.env)
        log_path = os.path.join(self.out, "worker-%s-%s.log" % (framework, allocator))
        deaths = 0  # workers in a row that ended (died, hung, or hit an error) with no row done
        while True:
            events = self.events()
            rows = remaining_rows(framework, allocator, events)
            if not rows:
                return
            if self.left() < 10:
                self.skip(framework, allocator, label, "the budget of the framework check is spent")
                return
            base, source = base_peak(events, framework, allocator)
            command = list(self.worker_command) + [
                "worker", framework, "--allocator", allocator, "--label", label,
                "--rows", ",".join(rows), "--out", self.out, "--steps", str(self.steps)]
            if base:
                command += ["--base-peak", str(base), "--base-source", source]
            self.log("gpu-frameworks: %s, %s: %s" % (framework, label, ", ".join(rows)))
            finished_before = self.finished(framework, allocator, events)
            code, killed = self.watch(command, env, framework, allocator, log_path)
            events = self.events()
            current = row_in_progress(events, framework, allocator)
            if current is not None:
                self.failed = True
                self.record({"event": "row", "framework": framework, "allocator": allocator,
                             "label": label, "row": current,
                             "status": "timeout" if killed else "crashed",
                             "detail": killed or "the worker died (exit %s): %s" % (
                                 code, _tail(log_path))})
                events = self.events()
            if not remaining_rows(framework, allocator, events):
                return
            if code == SKIP:
                self.skip(framework, allocator, label, "the worker found no GPU")
                return
            self.failed = True
            deaths = 0 if self.finished(framework, allocator, events) > finished_before else \
                deaths + 1
            if deaths >= 2:
                self.skip(framework, allocator, label,
                          "two workers in a row ended without running a row to the end (last "
                          "exit %s: %s)" % (code, _tail(log_path)))
                return
            self.report()

    def skip(self, framework, allocator, label, why):
        """Reports every row the allocator has left as skipped, saying why."""
        for row in remaining_rows(framework, allocator, self.events()):
            self.record(self.skipped(framework, allocator, label, row, why))

    @staticmethod
    def skipped(framework, allocator, label, row, why):
        return {"event": "row", "framework": framework, "allocator": allocator, "label": label,
                "row": row, "status": "skipped", "detail": why}


def _tail(path, lines=3):
    try:
        with open(path, errors="replace") as f:
            text = [line.strip() for line in f.read().splitlines() if line.strip()]
    except OSError:
        return ""
    return " / ".join(text[-lines:])[:400]


# --- the workers (run on the GPU machine) -------------------------------------------------------

class Worker:
    """What every worker shares: its identity, the rows file, and row bookkeeping."""

    def __init__(self, args):
        self.args = args
        self.framework, self.allocator, self.label = args.framework, args.allocator, args.label
        self.rows_path = os.path.join(args.out, "rows.jsonl")
        self.base = args.base_peak
        self.base_source = args.base_source

    def emit(self, event):
        event.update(framework=self.framework, allocator=self.allocator, label=self.label)
        append_event(self.rows_path, event)

    def run(self, rows, handlers):
        """Runs each row; an unexpected error ends the row as "error" and, since the device may
        be unusable after it, the worker (exit 3: the orchestrator starts a new one)."""
        for row in rows:
            self.emit({"event": "start", "row": row, "time": time.time()})
            started = time.monotonic()
            try:
                result = handlers(row)
                result.setdefault("status", "ok")
            except Exception as error:  # the row's outcome, whatever it is, must be written
                self.emit({"event": "row", "row": row, "status": "error",
                           "detail": "%s: %s" % (type(error).__name__, str(error)[:500]),
                           "seconds": time.monotonic() - started})
                return 3
            result.update(event="row", row=row, seconds=time.monotonic() - started)
            self.emit(result)
            if row == UNCAPPED and result.get("peak_allocated") and not self.base:
                self.base = result["peak_allocated"]
                self.base_source = "%s uncapped peak allocated" % self.allocator
        return 0

    def cap_for(self, row, total):
        """(cap bytes, fraction) of a capped row, from the base peak."""
        factor = row_factor(row)
        if not self.base:
            raise RuntimeError("no base peak for the caps (the uncapped runs failed)")
        cap = cap_bytes(self.base, factor)
        return cap, cap_fraction(cap, total)


def _is_oom(error, torch):
    """(is it out of memory, the type's name) for an exception of a training step."""
    if isinstance(error, torch.OutOfMemoryError):
        return True, "torch.OutOfMemoryError"
    if isinstance(error, RuntimeError) and str(error).startswith("CUDA out of memory."):
        return True, "RuntimeError (not torch.OutOfMemoryError)"
    return False, type(error).__name__


class TorchMemory:
    """Peaks, caps and the cache, through PyTorch for its allocators and cistern for cistern."""

    def __init__(self, torch, cistern_torch):
        self.torch, self.cistern = torch, cistern_torch
        self.total = torch.cuda.mem_get_info()[1]

    def set_fraction(self, fraction):
        self.torch.cuda.set_per_process_memory_fraction(float(fraction), 0)

    def reset(self):
        import gc
        gc.collect()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()
        if self.cistern:
            import cistern
            cistern.reset_peak_memory_stats(0)
        else:
            self.torch.cuda.reset_peak_memory_stats(0)

    def stats(self):
        if self.cistern:
            s = self.cistern.memory_stats(0)
            return {"peak_reserved": s["reserved_bytes.all.peak"],
                    "peak_allocated": s["allocated_bytes.all.peak"],
                    "reserved": s["reserved_bytes.all.current"],
                    "torch_api": self.torch_api(s)}
        return {"peak_reserved": self.torch.cuda.max_memory_reserved(0),
                "peak_allocated": self.torch.cuda.max_memory_allocated(0),
                "reserved": self.torch.cuda.memory_reserved(0)}

    def torch_api(self, s):
        """Under cistern.torch.enable(): whether torch.cuda's own calls give cistern's figures
        `s` ("agree"), which differ, or the error one raised."""
        cuda = self.torch.cuda
        calls = {"memory_allocated": ("allocated_bytes.all.current", cuda.memory_allocated),
                 "max_memory_allocated": ("allocated_bytes.all.peak", cuda.max_memory_allocated),
                 "memory_reserved": ("reserved_bytes.all.current", cuda.memory_reserved),
                 "max_memory_reserved": ("reserved_bytes.all.peak", cuda.max_memory_reserved)}
        try:
            differ = [name for name, (key, call) in sorted(calls.items()) if call(0) != s[key]]
            if cuda.memory_stats(0)["allocation.all.current"] != s["allocation.all.current"]:
                differ.append("memory_stats")
            if "PyTorch CUDA memory summary" not in cuda.memory_summary(0):
                differ.append("memory_summary")
        except Exception as error:  # PyTorch's own call, raising under a pluggable allocator
            return "%s: %s" % (type(error).__name__, str(error).split("\n")[0][:200])
        return "differ: " + ", ".join(differ) if differ else "agree"


def _gpt(torch, vocab, width, heads, layers):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            b, s, w = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, heads, w // heads).permute(
                2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, w))
            return x + self.out(F.gelu(self.fc(self.norm2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.position = nn.Embedding(4096, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens) + self.position(
                torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return GPT()


def _reduce_overhead(torch, trees):
    """torch.compile(mode="reduce-overhead") on a small model, with cudagraph trees (PyTorch's
    default) or without (one torch.cuda.graph per compiled function): "correct (N calls)", "wrong
    outputs ..." or the error it raised."""
    import torch._inductor.config as inductor
    saved = inductor.triton.cudagraph_trees
    inductor.triton.cudagraph_trees = trees
    try:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                    torch.nn.Linear(512, 256)).cuda().eval()
        compiled = torch.compile(model, mode="reduce-overhead")
        wrong = []
        with torch.no_grad():
            for i in range(6):  # warm-up, recording, then replays
                x = torch.randn(32, 256, device="cuda")
                out = compiled(x).clone()  # the next replay overwrites the graph's output
                if not torch.allclose(out, model(x), rtol=1e-3, atol=1e-3):
                    wrong.append(i)
        torch.cuda.synchronize()
        return "correct (6 calls)" if not wrong else "wrong outputs at calls %s" % wrong
    except Exception as error:
        return "%s: %s" % (type(error).__name__, str(error).strip().split("\n")[0][:300])
    finally:
        inductor.triton.cudagraph_trees = saved
        torch._dynamo.reset()


def torch_worker(args):
    import torch
    if not torch.cuda.is_available():
        print("gpu-frameworks: SKIP: torch sees no CUDA GPU")
        return SKIP
    cistern_torch = None
    worker = Worker(args)
    if args.allocator.startswith("cistern"):
        import cistern.torch as cistern_torch
        cistern_torch.enable()
    torch.backends.cuda.matmul.allow_tf32 = True
    memory = TorchMemory(torch, cistern_torch)
    vocab, width, heads, layers = 16384, 768, 12, 6
    shapes = shape_sequence(args.steps)
    worker.emit({"event": "worker", "pid": os.getpid(), "torch": torch.__version__,
                 "gpu": torch.cuda.get_device_name(0), "total_memory": memory.total,
                 "oom_route": cistern_torch.oom_route_detail() if cistern_torch else None})

    def train(row):
        cap = fraction = None
        if row != UNCAPPED:
            cap, fraction = worker.cap_for(row, memory.total)
        memory.reset()
        memory.set_fraction(fraction if fraction else 1.0)
        memory.reset()
        torch.manual_seed(0)
        model = _gpt(torch, vocab, width, heads, layers).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        generator = torch.Generator().manual_seed(1)
        steps, first_oom, losses = [], None, []
        for batch, seq in shapes:
            tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
            started = time.perf_counter()
            oom = None
            try:
                tokens = tokens.cuda()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(tokens[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                         tokens[:, 1:].reshape(-1))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss.item())
                torch.cuda.synchronize()
            except Exception as error:
                is_oom, kind = _is_oom(error, torch)
                if not is_oom:
                    raise
                oom = (kind, str(error).split("\n")[0][:400])
            finally:
                logits = loss = None
            if oom:
                # The step is skipped; its partial gradients go, training goes on.
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                first_oom = first_oom or oom
            steps.append({"ms": 1000.0 * (time.perf_counter() - started), "oom": bool(oom)})
        result = summarize_steps(steps)
        result.update(memory.stats())
        result.update(cap=cap, fraction=fraction, base_peak=worker.base,
                      base_source=worker.base_source, last_loss=losses[-1] if losses else None,
                      step_ms=[round(s["ms"], 2) for s in steps])
        if first_oom:
            result.update(oom_type=first_oom[0], oom_message=first_oom[1])
        del model, optimizer
        memory.set_fraction(1.0)
        memory.reset()
        return result

    def fragmentation(row):
        memory.reset()
        memory.set_fraction(cap_fraction(FRAG_CAP, memory.total))
        memory.reset()
        empty = lambda n: torch.empty(n, dtype=torch.uint8, device="cuda")  # noqa: E731
        prime = empty(FRAG_PRIME)
        del prime
        pieces = [empty(FRAG_PIECE) for _ in range(FRAG_PIECES)]
        for i in range(1, FRAG_PIECES, 2):
            pieces[i] = None
        torch.cuda.synchronize()
        before = memory.stats()["reserved"]
        started = time.perf_counter()
        result = {"served": False}
        try:
            big = empty(FRAG_REQUEST)
            torch.cuda.synchronize()
            result["served"] = True
            del big
        except Exception as error:
            is_oom, kind = _is_oom(error, torch)
            if not is_oom:
                raise
            result.update(error="%s: %s" % (kind, str(error).split("\n")[0][:300]))
        result["ms"] = 1000.0 * (time.perf_counter() - started)
        result.update(reserved_before=before, reserved_after=memory.stats()["reserved"])
        del pieces
        memory.set_fraction(1.0)
        memory.reset()
        return result

    def mempool(row):
        import cistern
        import cistern.torch
        memory.reset()
        result = {}
        with cistern.torch.mem_pool():
            cistern.set_memory_fraction(cap_fraction(GiB, memory.total), 0)
            held = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
            try:
                torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
                result.update(status="error", detail="2 GiB was served under a 1 GiB limit")
            except torch.OutOfMemoryError as error:
                message = str(error).split("\n")[0]
                result.update(oom_type="torch.OutOfMemoryError", error=message[:400],
                              carries_cistern_message="cistern: out of memory" in message)
            again = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            result["next_allocation"] = "served"
            del held, again
        result["route"] = cistern.torch.oom_route_detail()
        return result

    def oom_check(row):
        memory.reset()
        memory.set_fraction(cap_fraction(OOM_CHECK_CAP, memory.total))
        memory.reset()
        result = {}
        held = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        try:
            torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
            result.update(status="error", detail="2 GiB was served under a 1 GiB cap")
        except Exception as error:
            is_oom, kind = _is_oom(error, torch)
            if not is_oom:
                raise
            message = str(error).split("\n")[0]
            result.update(oom_type=kind, error=message[:400],
                          carries_cistern_message="cistern: out of memory" in message)
        again = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        result["next_allocation"] = "served"
        a = torch.ones(1024, 1024, device="cuda")
        product = float((a @ a).sum().item())
        result["context"] = "usable" if product == 1024.0 ** 3 else "wrong result %r" % product
        del held, again, a
        memory.set_fraction(1.0)
        memory.reset()
        return result

    def graphs(row):
        memory.reset()
        result = {}
        torch.manual_seed(0)
        layer = torch.nn.Linear(1024, 1024).cuda()
        step = lambda x: torch.relu(layer(x)) * 2.0 + 1.0  # noqa: E731
        static_in = torch.randn(64, 1024, device="cuda")
        side = torch.cuda.Stream()  # warm-up on a side stream, as PyTorch's documentation does
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step(static_in)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        before = memory.stats()["reserved"]
        with torch.no_grad():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = step(static_in)
            torch.cuda.synchronize()
            result["graph_pool_bytes"] = memory.stats()["reserved"] - before
            wrong = []
            for i in range(4):
                x = torch.randn(64, 1024, device="cuda")
                static_in.copy_(x)
                graph.replay()
                if not torch.allclose(static_out, step(x), rtol=1e-3, atol=1e-3):
                    wrong.append(i)
            # Tensors allocated now must not share the graph's memory: a replay would change them.
            outside = [torch.full((64, 1024), 7.0, device="cuda") for _ in range(16)]
            x = torch.randn(64, 1024, device="cuda")
            static_in.copy_(x)
            graph.replay()
            torch.cuda.synchronize()
            same = torch.allclose(static_out, step(x), rtol=1e-3, atol=1e-3)
            untouched = all(bool((t == 7.0).all()) for t in outside)
        result["graph"] = ("4 of 4 correct" if not wrong else
                           "wrong outputs at replays %s" % wrong)
        result["after_graph"] = "%s output, %s tensors outside" % (
            "correct" if same else "wrong", "unchanged" if untouched else "CHANGED")
        del graph, static_out, outside
        result["compile"] = _reduce_overhead(torch, trees=True)
        result["compile_no_trees"] = _reduce_overhead(torch, trees=False)
        if wrong or not same or not untouched or "wrong" in result["compile_no_trees"]:
            result["status"] = "error"
            result["detail"] = "; ".join(result[k] for k in ("graph", "after_graph",
                                                              "compile_no_trees"))
        memory.reset()
        return result

    def stacks(row):
        # record_history(stacks="all"): a few training steps, the snapshot, its frames.
        import pickle
        memory.reset()
        torch.manual_seed(0)
        model = _gpt(torch, 4096, 256, 4, 2).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        cistern_torch.record_history(stacks="all")
        started = time.perf_counter()
        for batch, seq in ((4, 256), (2, 512), (4, 256)):
            tokens = torch.randint(0, 4096, (batch, seq), device="cuda")
            loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1),
                                                     tokens.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "stacks.pickle")
            cistern_torch.write_snapshot(path)
            with open(path, "rb") as f:
                snapshot = pickle.load(f)  # written by cistern: plain values
        cistern_torch.record_history(None)
        result = stacks_summary(snapshot, ("forward",))
        result["steps_s"] = round(seconds, 3)
        if not result["allocs"] or not result["forward"] or not result["torch_cpp"]:
            result["status"] = "error"
            result["detail"] = "allocs %(allocs)d, naming forward %(forward)d, with PyTorch's " \
                               "C++ frames %(torch_cpp)d" % result
        del model, optimizer
        memory.reset()
        return result

    handlers = {FRAGMENTATION: fragmentation, MEMPOOL: mempool, OOM_CHECK: oom_check,
                GRAPHS: graphs, STACKS: stacks}
    return worker.run(args.rows.split(","), lambda row: handlers.get(row, train)(row))


def cupy_worker(args):
    import cupy
    worker = Worker(args)
    cistern_cupy = None
    pool = cupy.get_default_memory_pool()
    if args.allocator.startswith("cistern"):
        import cistern
        import cistern.cupy as cistern_cupy
        cistern_cupy.enable()
    total = cupy.cuda.runtime.memGetInfo()[1]
    peaks = {"used": 0, "total": 0}

    class PeakHook(cupy.cuda.MemoryHook):
        name = "cistern-framework-check"

        def _update(self, **kwargs):
            peaks["used"] = max(peaks["used"], pool.used_bytes())
            peaks["total"] = max(peaks["total"], pool.total_bytes())

        alloc_postprocess = malloc_postprocess = _update

    hook = PeakHook()
    worker.emit({"event": "worker", "pid": os.getpid(), "cupy": cupy.__version__,
                 "total_memory": total})

    def reset():
        import gc
        gc.collect()
        cupy.cuda.Device().synchronize()
        if cistern_cupy:
            cistern.empty_cache()
            cistern.reset_peak_memory_stats(0)
        else:
            pool.free_all_blocks()
        peaks.update(used=0, total=0)

    def set_cap(cap):
        if cistern_cupy:
            cistern_cupy.set_memory_fraction(cap_fraction(cap, total) if cap else 1.0)
        else:
            pool.set_limit(size=cap or 0)

    def stats():
        if cistern_cupy:
            s = cistern.memory_stats(0)
            return {"peak_reserved": s["reserved_bytes.all.peak"],
                    "peak_allocated": s["allocated_bytes.all.peak"],
                    "reserved": s["reserved_bytes.all.current"]}
        return {"peak_reserved": peaks["total"], "peak_allocated": peaks["used"],
                "reserved": pool.total_bytes()}

    def arrays(row):
        cap = None
        if row != UNCAPPED:
            cap, _ = worker.cap_for(row, total)
        reset()
        set_cap(cap)
        rng = cupy.random.RandomState(seed=0)

        def step(rows, cols):
            a = rng.standard_normal((rows, cols), dtype=cupy.float32)
            b = a @ a.T
            return cupy.tanh(b / cols)  # a and b go when the step returns (or raises)

        kept, steps, first_oom = [], [], None
        with hook:
            for rows, cols in cupy_shapes(args.steps):
                started = time.perf_counter()
                oom = None
                try:
                    kept = (kept + [step(rows, cols)])[-2:]  # a result lives two more steps
                    cupy.cuda.Device().synchronize()
                except cupy.cuda.memory.OutOfMemoryError as error:
                    oom = str(error)[:400]
                    first_oom = first_oom or oom
                steps.append({"ms": 1000.0 * (time.perf_counter() - started), "oom": bool(oom)})
        kept = None
        result = summarize_steps(steps)
        result.update(stats())
        result.update(cap=cap, base_peak=worker.base, base_source=worker.base_source,
                      step_ms=[round(s["ms"], 2) for s in steps])
        if first_oom:
            result.update(oom_type="cupy.cuda.memory.OutOfMemoryError", oom_message=first_oom)
        set_cap(None)
        reset()
        return result

    def fragmentation(row):
        reset()
        set_cap(FRAG_CAP)
        with hook:
            prime = cupy.empty(FRAG_PRIME, dtype=cupy.uint8)
            del prime
            pieces = [cupy.empty(FRAG_PIECE, dtype=cupy.uint8) for _ in range(FRAG_PIECES)]
            for i in range(1, FRAG_PIECES, 2):
                pieces[i] = None
            cupy.cuda.Device().synchronize()
            before = stats()["reserved"]
            started = time.perf_counter()
            result = {"served": False}
            try:
                big = cupy.empty(FRAG_REQUEST, dtype=cupy.uint8)
                cupy.cuda.Device().synchronize()
                result["served"] = True
                del big
            except cupy.cuda.memory.OutOfMemoryError as error:
                result["error"] = "cupy.cuda.memory.OutOfMemoryError: " + str(error)[:300]
            result["ms"] = 1000.0 * (time.perf_counter() - started)
        result.update(reserved_before=before, reserved_after=stats()["reserved"])
        del pieces
        set_cap(None)
        reset()
        return result

    rows = args.rows.split(",")
    return worker.run(rows, lambda row: fragmentation(row) if row == FRAGMENTATION else
                      arrays(row))


def prepare_worker(args):
    """Builds cistern's PyTorch glue once (the workers then load it from the cache) and says
    which out-of-memory route is active."""
    import torch
    if not torch.cuda.is_available():
        print("gpu-frameworks: SKIP: torch sees no CUDA GPU")
        return SKIP
    import cistern.torch
    started = time.monotonic()
    cistern.torch.allocator()
    append_event(os.path.join(args.out, "rows.jsonl"), {
        "event": "prepare", "framework": "torch", "oom_route": cistern.torch.oom_route(),
        "detail": cistern.torch.oom_route_detail(), "seconds": time.monotonic() - started,
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)})
    return 0


# --- the command line ---------------------------------------------------------------------------

def _has(module):
    import importlib.util
    return importlib.util.find_spec(module) is not None


def orchestrate(args):
    os.makedirs(args.out, exist_ok=True)
    args.out = os.path.abspath(args.out)
    rows_path = os.path.join(args.out, "rows.jsonl")
    if os.path.exists(rows_path):
        os.replace(rows_path, rows_path + ".previous")
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(root, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("CISTERN_BACKEND", "cuda")
    # The glue's build: ninja may sit next to this Python (a virtual environment's bin), and the
    # cache must be writable.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("CISTERN_TORCH_EXTENSION_DIR", os.path.join(
        tempfile.gettempdir(), "cistern-torch-glue-%d" % os.getuid()))
    if args.plugin:
        env["CISTERN_PLUGIN_LIBRARY"] = os.path.abspath(args.plugin)
    worker_command = [sys.executable, args.worker_script or os.path.abspath(__file__)]
    o = Orchestrator(args.out, args.budget_s, args.steps, worker_command, env,
                     row_timeout=args.row_timeout, startup_timeout=args.startup_timeout)
    o.meta["method"] = (
        "one process per allocator; rows in the order fragmentation, uncapped, caps %s x the "
        "base peak (the native/CuPy-pool uncapped peak allocated); between rows: model deleted, "
        "gc.collect(), empty_cache(), peak statistics reset; caps set as a memory fraction of "
        "the device's total memory (torch.cuda.set_per_process_memory_fraction, "
        "MemoryPool.set_limit, cistern's memory fraction); %d steps per run, median over the "
        "completed steps after the first; out-of-memory steps skipped" % (
            ", ".join("%.2f" % f for f in sorted(CAP_FACTORS, reverse=True)), args.steps))
    o.meta["shapes"] = shape_sequence(args.steps)
    parts = args.parts.split(",")
    ran = False
    if "torch" in parts:
        if not _has("torch"):
            o.meta["notes"].append("PyTorch is not installed: its part is skipped")
        else:
            ran = True
            code, killed = (0, None) if args.no_prepare else o.watch(
                worker_command + ["worker", "prepare", "--out", args.out], env, "torch",
                "prepare", os.path.join(args.out, "worker-torch-prepare.log"),
                startup_timeout=min(PREPARE_TIMEOUT, max(o.left() - 60, 10)))
            prepared = [e for e in o.events() if e.get("event") == "prepare"]
            if code == SKIP:
                o.meta["notes"].append("torch sees no CUDA GPU: its part is skipped")
                ran = False
            else:
                if prepared:
                    o.meta.update(cistern_oom_route=prepared[-1]["detail"],
                                  torch=prepared[-1]["torch"], gpu=prepared[-1]["gpu"],
                                  glue_build_s=round(prepared[-1]["seconds"], 1))
                    if prepared[-1]["oom_route"] != "extension":
                        env["CISTERN_TORCH_EXTENSION"] = "0"  # no worker tries the build again
                        o.env = env
                elif not args.no_prepare:
                    # A build killed half-way leaves torch.utils.cpp_extension's lock behind,
                    # on which every later build would wait: the workers use the fallback route.
                    env["CISTERN_TORCH_EXTENSION"] = "0"
                    o.env = env
                    o.meta["notes"].append(
                        "building cistern's PyTorch glue failed (%s): %s; the cistern rows use "
                        "the fallback route (CISTERN_TORCH_EXTENSION=0)" % (
                            killed or "exit %s" % code,
                            _tail(os.path.join(args.out, "worker-torch-prepare.log"))))
                for allocator in _torch_allocators(env):
                    o.run_allocator("torch", allocator)
                    o.meta["base_peak"]["torch"] = base_peak(o.events(), "torch", "native")[0]
                    o.report()
    if "cupy" in parts:
        if not _has("cupy"):
            o.meta["notes"].append("CuPy is not installed: its part is skipped")
        else:
            ran = True
            for allocator in _cupy_allocators(env):
                o.run_allocator("cupy", allocator)
                o.meta["base_peak"]["cupy"] = base_peak(o.events(), "cupy", "cupy")[0]
                o.report()
    for e in o.events():
        if e.get("event") == "worker":
            for key in ("gpu", "torch", "cupy"):
                if e.get(key):
                    o.meta.setdefault(key, e[key])
    o.report()
    with open(os.path.join(args.out, "frameworks.md")) as f:
        print(f.read())
    if not ran:
        print("gpu-frameworks: SKIPPED: neither PyTorch with a GPU nor CuPy is here")
        return SKIP
    results = row_results(o.events()).values()
    bad = [r for r in results if r.get("status") not in ("ok",)]
    return 1 if bad or o.failed else 0


def _torch_allocators(env):
    allocators = list(TORCH_ALLOCATORS)
    if env.get("CISTERN_ALLOC_CONF", "").replace(" ", "") == "vmm:False":
        allocators.remove("cistern-classic")  # the same as the cistern rows
    return allocators


def _cupy_allocators(env):
    allocators = list(CUPY_ALLOCATORS)
    if env.get("CISTERN_ALLOC_CONF", "").replace(" ", "") == "vmm:False":
        allocators.remove("cistern-classic")
    return allocators


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/gpu/frameworks")
    parser.add_argument("--budget-s", type=float, default=175.0)
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--parts", default="torch,cupy")
    parser.add_argument("--plugin", help="libcistern_plugin.so (default: cistern's own search)")
    parser.add_argument("--report", metavar="DIR", help="only rewrite DIR's tables")
    parser.add_argument("--row-timeout", type=float, default=ROW_TIMEOUT)
    parser.add_argument("--startup-timeout", type=float, default=STARTUP_TIMEOUT)
    parser.add_argument("--worker-script", help=argparse.SUPPRESS)  # tests: a stand-in worker
    parser.add_argument("--no-prepare", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def parse_worker(argv):
    parser = argparse.ArgumentParser(prog="gpu_frameworks.py worker")
    parser.add_argument("framework", choices=("torch", "cupy", "prepare"))
    parser.add_argument("--allocator", default="")
    parser.add_argument("--label", default="")
    parser.add_argument("--rows", default="")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--base-peak", type=int, default=None)
    parser.add_argument("--base-source", default=None)
    return parser.parse_args(argv)


def main(argv):
    if argv and argv[0] == "worker":
        args = parse_worker(argv[1:])
        return {"torch": torch_worker, "cupy": cupy_worker,
                "prepare": prepare_worker}[args.framework](args)
    args = parse(argv)
    if args.steps < 2 or args.budget_s <= 0:
        print("gpu-frameworks: --steps must be at least 2 and --budget-s positive")
        return 2
    if args.report:
        meta_path = os.path.join(args.report, "frameworks.json")
        meta = {}
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)["meta"]
        write_report(args.report, meta, read_events(os.path.join(args.report, "rows.jsonl")))
        with open(os.path.join(args.report, "frameworks.md")) as f:
            print(f.read())
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
