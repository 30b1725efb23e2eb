#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# The main job (the README's first command): build the cistern command (Release, in build/) and
# replay the real traces in ../shared/traces - PyTorch memory snapshots, the Kineto trace and the
# SOMAS lifetime lists - on the simulated device under cistern, the PyTorch emulation and no
# caching, printing each workload's peak live memory, peak reserved memory, overhead and the
# smallest device that runs it without an out-of-memory error.
#
# Usage: scripts/run.sh [cistern replay flags and traces...]
#   (no arguments: --min-capacity over the shared traces; with arguments they are passed on, e.g.
#    scripts/run.sh --html report.html my_snapshot.pickle)
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
traces="$shared/traces"
if [[ ! -d "$traces" ]]; then
  echo "run.sh: no traces at $traces (set CISTERN_SHARED_DIR to the folder holding traces/)" >&2
  exit 1
fi
mapfile -t files < <(find "$traces/pytorch" "$traces/kineto" "$traces/somas" -type f \
  \( -name '*.pickle' -o -name '*.pickle.gz' -o -name '*.json' -o -name '*.json.gz' \
     -o -name '*.csv' \) | sort)
exec "$cistern" replay --policy cistern,torch,nocache --min-capacity "${files[@]}"
