#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# Regenerates docs/results.md and docs/report-example.html: every shared trace in
# ../shared/traces replayed with
# `cistern replay --policy cistern,cistern:vmm=false,torch,torch:expandable_segments=true,nocache
# --min-capacity` (PyTorch's recorded figures come with the snapshots), the real traces again with
# --repeat 3 and, cistern and expandable segments, on a device of expandable segments'
# min_capacity (one pass, and --repeat 3 for the steady state under pressure) and on devices of
# 1.25, 2 and 4 x each trace's peak_live (one pass), formatted by
# scripts/results_md.py (which also counts issue 22's targets from the JSON).
#
# Usage: scripts/results.sh
# Environment: BUILD_DIR (default build-results; configured as Release if new, and built),
#              CISTERN_SHARED_DIR (default ../shared, the folder holding traces/),
#              EXAMPLE_TRACE (the trace of the HTML example, below traces/).
# The raw JSON is kept in results/replay/ (not committed).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build-results}"
# A relative path by default, so that the committed files name traces as a reader would.
shared="${CISTERN_SHARED_DIR:-../shared}"
example="${EXAMPLE_TRACE:-pytorch/cs336_Wedsonlin/medium_ctx512_training.pickle.gz}"
traces="$shared/traces"
if [[ ! -d "$traces" ]]; then
  echo "results.sh: no traces at $traces (set CISTERN_SHARED_DIR to the folder holding traces/)" >&2
  exit 1
fi

if [[ ! -f "$build/CMakeCache.txt" ]]; then  # an existing build keeps its options
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCISTERN_BUILD_TESTS=OFF \
    -DCISTERN_BUILD_BENCHMARKS=OFF -DCISTERN_BUILD_EXAMPLES=OFF >/dev/null
fi
cmake --build "$build" --target cistern_cli
cistern="$build/src/cli/cistern"

out=results/replay
mkdir -p "$out" docs
expandable=torch:expandable_segments=true  # PyTorch's allocator with expandable segments
replay() {  # replay NAME [flags and traces...]
  local name="$1"
  shift
  echo "results.sh: replaying $name" >&2
  "$cistern" replay --quiet --policy "cistern,cistern:vmm=false,torch,$expandable,nocache" \
    --min-capacity --json "$out/$name.json" "$@"
}
replay pytorch "$traces"/pytorch/*/*.pickle.gz "$traces"/h200/*.pickle.gz
replay kineto "$traces"/kineto/*.json.gz
replay somas "$traces"/somas/*.csv
# minimalloc's sets are in normalised units (2^20 units = the intended capacity): 1 unit = 1 KiB.
replay minimalloc --scale 1024 "$traces"/minimalloc/*.csv

real_traces=("$traces"/pytorch/*/*.pickle.gz "$traces"/h200/*.pickle.gz "$traces"/kineto/*.json.gz
  "$traces"/somas/*.csv)
# The steady state of a training step: each window three times in a row.
echo "results.sh: --repeat 3" >&2
"$cistern" replay --quiet --policy "cistern,torch,$expandable" --repeat 3 \
  --json "$out/repeat.json" "${real_traces[@]}"
# cistern and expandable segments on a device of exactly expandable segments' min_capacity, trace
# by trace (exit status 4: a replay ran out of memory there; its JSON says so, the table shows it
# and the target counts it as a miss).
rm -f "$out"/at-torch-min-*.json "$out"/at-torch-min-*.err "$out"/at-expandable-min-*.json \
  "$out"/at-expandable-min-*.err "$out"/repeat-at-expandable-min-*.json \
  "$out"/repeat-at-expandable-min-*.err
python3 - "$expandable" "$out/pytorch.json" "$out/kineto.json" "$out/somas.json" \
  >"$out/expandable-min.txt" <<'PY'
import json, sys
for path in sys.argv[2:]:
    for row in json.load(open(path, encoding="utf-8"))["results"]:
        if row["policy"] == sys.argv[1] and row.get("min_capacity"):
            print(row["min_capacity"], row["trace"])
PY
n=0
while read -r capacity trace; do
  n=$((n + 1))
  status=0
  "$cistern" replay --quiet --policy "cistern,$expandable" --capacity "$capacity" \
    --json "$out/at-expandable-min-$n.json" "$trace" 2>"$out/at-expandable-min-$n.err" ||
    status=$?
  if [[ $status -ne 0 && $status -ne 4 ]]; then
    cat "$out/at-expandable-min-$n.err" >&2
    exit "$status"
  fi
  # The steady state there: passes 2-3 are what a training loop at the limit pays every step.
  status=0
  "$cistern" replay --quiet --policy "cistern,$expandable" --capacity "$capacity" --repeat 3 \
    --json "$out/repeat-at-expandable-min-$n.json" "$trace" \
    2>"$out/repeat-at-expandable-min-$n.err" || status=$?
  if [[ $status -ne 0 && $status -ne 4 ]]; then
    cat "$out/repeat-at-expandable-min-$n.err" >&2
    exit "$status"
  fi
done <"$out/expandable-min.txt"

# The same cold pass on devices the workload fills to 80%, a half and a quarter: 1.25, 2 and 4 x
# each real trace's peak_live (from cistern's row above), rounded up to 2 MiB.
rm -f "$out"/at-fill-*.json "$out"/at-fill-*.err
python3 - "$out/pytorch.json" "$out/kineto.json" "$out/somas.json" >"$out/peak-live.txt" <<'PY'
import json, sys
for path in sys.argv[1:]:
    for row in json.load(open(path, encoding="utf-8"))["results"]:
        if row["policy"] == "cistern" and row.get("peak_live"):
            print(row["peak_live"], row["trace"])
PY
fills=()
for factor in 1.25 2 4; do
  n=0
  while read -r live trace; do
    n=$((n + 1))
    capacity=$(python3 -c "import math; g = 2 << 20; print(math.ceil($factor * $live / g) * g)")
    status=0
    "$cistern" replay --quiet --policy "cistern,$expandable" --capacity "$capacity" \
      --json "$out/at-fill-$factor-$n.json" "$trace" 2>"$out/at-fill-$factor-$n.err" || status=$?
    if [[ $status -ne 0 && $status -ne 4 ]]; then
      cat "$out/at-fill-$factor-$n.err" >&2
      exit "$status"
    fi
    fills+=("$factor:$out/at-fill-$factor-$n.json")
  done <"$out/peak-live.txt"
done

commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git status --porcelain -- src include CMakeLists.txt 2>/dev/null)" ]]; then
  commit="$commit (with uncommitted changes)"
fi
cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)"
machine="$(uname -srm), ${cpu:-unknown CPU}, $(nproc) cores"

python3 scripts/results_md.py --commit "$commit" --machine "$machine" \
  --version "$("$cistern" --version)" --example report-example.html \
  --example-trace "$example" \
  --repeat "$out/repeat.json" --at-expandable-min "$out"/at-expandable-min-*.json \
  --at-expandable-min-repeat "$out"/repeat-at-expandable-min-*.json --by-fill "${fills[@]}" -- \
  "$out/pytorch.json" "$out/kineto.json" "$out/somas.json" "$out/minimalloc.json" \
  >docs/results.md
# Which PYTORCH_CUDA_ALLOC_CONF needs the least memory on each snapshot (a section of its own).
"$cistern" advise --quiet --json "$out/advise.json" "$traces"/pytorch/*/*.pickle.gz
python3 scripts/advise_md.py "$out/advise.json" >>docs/results.md
"$cistern" replay --quiet --policy "cistern,torch,$expandable,nocache" --min-capacity \
  --html docs/report-example.html "$traces/$example"
echo "results.sh: wrote docs/results.md and docs/report-example.html" >&2
