#!/usr/bin/env bash
# The main job: build cistern (Release) and replay real allocation traces through the caching
# allocator on the simulated device, printing what each workload needed.
#   scripts/run.sh [TRACE.csv ...]     (default: the SOMAS lifetime lists in ../shared/traces)
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${CISTERN_SHARED_DIR:-$(pwd)/../shared}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target replay_lifetimes -j "$(nproc)"
traces=("$@")
if [ ${#traces[@]} -eq 0 ]; then
  traces=("$shared"/traces/somas/*.csv)
fi
for trace in "${traces[@]}"; do
  if [ ! -f "$trace" ]; then
    echo "run.sh: no trace at $trace (set CISTERN_SHARED_DIR to the folder holding traces/)" >&2
    exit 1
  fi
  build/examples/replay_lifetimes "$trace"
  echo
done
