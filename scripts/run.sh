#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# The main job (the README's first command): build the cistern command (Release, in build/) and
# replay, on the simulated device under cistern, the PyTorch emulation and no caching, the traces
# the project ships (traces/, made by scripts/synth_trace.py) and, when ../shared is there, the
# real traces in ../shared/traces - PyTorch memory snapshots, the Kineto trace and the SOMAS
# lifetime lists - printing each workload's peak live memory, peak reserved memory, overhead and
# the smallest device that runs it without an out-of-memory error.
#
# Usage: scripts/run.sh [cistern replay flags and traces...]
#   (no arguments: --min-capacity over the project's and the shared traces; with arguments they
#    are passed on, e.g. scripts/run.sh --html report.html my_snapshot.pickle)
# Environment: CISTERN_SHARED_DIR (default ../shared, the folder holding traces/),
#              BUILD_DIR (default build), CISTERN_JOBS (build parallelism).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build="${BUILD_DIR:-build}"
shared="${CISTERN_SHARED_DIR:-../shared}"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target cistern_cli ${CISTERN_JOBS:+--parallel "$CISTERN_JOBS"}
cistern="$build/src/cli/cistern"

if [[ $# -gt 0 ]]; then
  exec "$cistern" replay "$@"
fi
# The project's own traces always; the shared ones when they are there.
mapfile -t files < <(find traces -type f -name '*.trace.gz' | sort)
shared_traces="$shared/traces"
if [[ -d "$shared_traces" ]]; then
  mapfile -t -O "${#files[@]}" files < <(find "$shared_traces/pytorch" "$shared_traces/h200" \
    "$shared_traces/kineto" "$shared_traces/somas" -type f \( -name '*.pickle' \
    -o -name '*.pickle.gz' -o -name '*.json' -o -name '*.json.gz' -o -name '*.csv' \) | sort)
else
  echo "run.sh: no shared traces at $shared_traces (set CISTERN_SHARED_DIR to the folder holding" \
    "traces/); replaying the project's own traces only" >&2
fi
if [[ ${#files[@]} -eq 0 ]]; then
  echo "run.sh: no traces found (traces/ is part of the repository)" >&2
  exit 1
fi
exec "$cistern" replay --policy cistern,torch,nocache --min-capacity "${files[@]}"
