# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
"""A stand-in for the GPU workers of scripts/gpu_frameworks.py, for testing its orchestrator on
the CPU: it takes the workers' arguments and runs their row bookkeeping (the script's own
Worker.run), but each row does what $STAND_IN_PLAN says ({"torch/cistern/uncapped": "crash"}):
"ok" (the default: a result with made-up figures), "crash" (the process dies), "hang" (it never
ends), "error" (the row raises, as after a CUDA error), "exit" (the process ends before its
first row)."""
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "gpu_frameworks", os.path.join(HERE, "..", "..", "scripts", "gpu_frameworks.py"))
gf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gf)

PEAK = {"native": 4 * gf.GiB, "expandable": 4 * gf.GiB, "cistern": 4 * gf.GiB}


def main(argv):
    assert argv[0] == "worker"
    args = gf.parse_worker(argv[1:])
    plan = json.loads(os.environ.get("STAND_IN_PLAN", "{}"))
    if plan.get("%s/%s" % (args.framework, args.allocator)) == "exit":
        print("ImportError: no module named torch_stand_in_missing")
        return 1
    worker = gf.Worker(args)

    def row(name):
        what = plan.get("%s/%s/%s" % (args.framework, args.allocator, name), "ok")
        if what == "crash":
            print("Fatal Python error: Segmentation fault")
            sys.stdout.flush()
            os._exit(139)
        if what == "hang":
            time.sleep(3600)
        if what == "error":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        steps = [{"ms": 30.0 + i, "oom": False} for i in range(args.steps)]
        result = gf.summarize_steps(steps)
        result.update(peak_allocated=PEAK.get(args.allocator, gf.GiB),
                      peak_reserved=PEAK.get(args.allocator, gf.GiB) + 256 * gf.MiB,
                      base_peak=worker.base, base_source=worker.base_source, pid=os.getpid())
        if gf.row_factor(name) is not None:
            result["cap"] = worker.cap_for(name, 141 * gf.GiB)[0]
        if name == gf.FRAGMENTATION:
            result.update(served=args.allocator != "native", ms=11.0, reserved_before=3 * gf.GiB,
                          reserved_after=3 * gf.GiB)
        return result

    return worker.run(args.rows.split(","), row)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
