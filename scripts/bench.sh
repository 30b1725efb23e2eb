#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# Runs the hot-path benchmark and writes everything into one results folder:
#   hot_path.json         Google Benchmark's JSON (every workload x allocator x threads)
#   callgrind.json        instructions per pair, from callgrind, for every workload x allocator
#                         and for cistern's cross-stream free (cross_stream/<workload>/cistern)
#   callgrind/*.out       the raw callgrind profiles (callgrind_annotate reads them)
#   cistern_mix_small.annotate.txt   where cistern's instructions go on the small mix
#   ratios.json           cistern / mimalloc and cistern / glibc (also printed)
#
# Usage: scripts/bench.sh RESULTS_DIR [extra Google Benchmark flags...]
# Environment: BUILD_DIR (default build-bench; configured as Release and built when needed),
#              PAIRS_FIXED / PAIRS_MIX: pairs counted by callgrind per fixed-size / mix workload
#              (default 20000 / 150000: every fixed-size pair costs the same; the mixes need
#              several passes over their 30k and 68k sizes), SKIP_CALLGRIND=1, SKIP_TIMING=1.
# Instruction counts are exact and independent of machine load; they count a `rep stos` memset
# per byte block, which inflates mimalloc's 2MiB/100MiB figures compared with its real time.
# Needs: valgrind (for callgrind and <valgrind/callgrind.h>), python3.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 RESULTS_DIR [Google Benchmark flags...]" >&2
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
results="$1"
shift
build="${BUILD_DIR:-$root/build-bench}"
pairs_fixed="${PAIRS_FIXED:-20000}"
pairs_mix="${PAIRS_MIX:-150000}"
workloads=(512B 64KiB 2MiB 100MiB mix_small mix_all)
allocators=(cistern mimalloc glibc)

build_benchmark() {
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
  fi
  cmake --build "$build" --target bench_hot_path
}

run_timing() {
  "$build/bench/bench_hot_path" --benchmark_out="$results/hot_path.json" \
    --benchmark_out_format=json "$@"
}

pairs_of() {
  [[ "$1" == mix_* ]] && echo "$pairs_mix" || echo "$pairs_fixed"
}

# Instructions of exactly $pairs pairs (after the warm-up) of one allocator on one workload;
# a third argument "cross" frees on a second stream (cistern only: the cross_stream rows).
# The binary's own line (pairs, cistern's device allocations and takeovers) goes to .txt.
count_instructions() {
  local allocator="$1" workload="$2" cross="${3:-}" pairs
  pairs="$(pairs_of "$workload")"
  local out="$results/callgrind/$allocator.$workload.out" extra=()
  if [[ "$cross" == cross ]]; then
    out="$results/callgrind/$allocator.cross_stream.$workload.out"
    extra=(--cross-stream)
  fi
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
    "$build/bench/bench_hot_path" --callgrind-pairs="$pairs" --allocator="$allocator" \
    --workload="$workload" "${extra[@]}" >"$out.txt" 2>"$out.log" || {
    echo "callgrind failed for $allocator/$workload; see $out.log" >&2
    return 1
  }
  # With --instr-atstart=no the summary line stays 0; totals holds the instrumented pairs.
  awk '/^totals:/ { print $2 }' "$out"
}

run_callgrind() {
  mkdir -p "$results/callgrind"
  local first=1 instructions per_pair line runs="" row
  {
    echo "{\"instructions_per_pair\": {"
    for workload in "${workloads[@]}"; do
      # Every allocator's pair, then cistern freeing on a second stream (cross_stream rows).
      for allocator in "${allocators[@]}" cistern.cross_stream; do
        if [[ "$allocator" == cistern.cross_stream ]]; then
          instructions="$(count_instructions cistern "$workload" cross)" || continue
          row="cross_stream/$workload/cistern"
        else
          instructions="$(count_instructions "$allocator" "$workload")" || continue
          row="pair/$workload/$allocator"
        fi
        [[ $first -eq 1 ]] || echo ","
        [[ $first -eq 1 ]] || runs+=","
        first=0
        per_pair="$(awk -v n="$instructions" -v p="$(pairs_of "$workload")" \
          'BEGIN { printf "%.1f", n / p }')"
        printf '  "%s": %s' "$row" "$per_pair"
        line="$(cat "$results/callgrind/$allocator.$workload.out.txt")"
        runs+=$'\n  '"\"$row\": $line"
      done
    done
    echo ""
    echo "}, \"counting_runs\": {$runs"
    echo "}}"
  } >"$results/callgrind.json"
  local profile="$results/callgrind/cistern.mix_small.out"
  [[ ! -f "$profile" ]] || callgrind_annotate --inclusive=no "$profile" \
    >"$results/cistern_mix_small.annotate.txt"
}

mkdir -p "$results"
results="$(cd "$results" && pwd)"
build_benchmark
[[ "${SKIP_TIMING:-0}" == 1 ]] || run_timing "$@"
if [[ "${SKIP_CALLGRIND:-0}" != 1 ]]; then
  if command -v valgrind >/dev/null; then
    run_callgrind
  else
    echo "valgrind not found (Debian: valgrind): no instruction counts" >&2
  fi
fi
python3 "$root/scripts/bench_ratios.py" "$results"
