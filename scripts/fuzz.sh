#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# Builds the libFuzzer harnesses (tests/fuzz, clang, ASan + UBSan, the libraries instrumented with
# -fsanitize=fuzzer-no-link), writes the seed corpus with the project's own writers (make_corpus),
# then runs each harness for SECONDS with the formats' dictionary. Fails on any crash, leak,
# sanitizer report or timeout; the reproducer is left in the work folder and named.
#
# Usage: scripts/fuzz.sh [SECONDS] [BUILD_DIR] [WORK_DIR]
#   SECONDS    per harness (default 60)
#   BUILD_DIR  default build-ci-fuzz
#   WORK_DIR   corpora and crash files (default: a new temporary folder, kept on failure)
# Environment: CISTERN_JOBS build parallelism; CISTERN_FUZZ_NICE=19 runs the fuzzers niced (a
#              long campaign in the background).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds="${1:-60}"
build="${2:-build-ci-fuzz}"
work="${3:-$(mktemp -d /tmp/cistern-fuzz-XXXXXX)}"
clang="$(command -v clang++-14 || command -v clang++)"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$clang" \
  -DCISTERN_BUILD_FUZZERS=ON -DCISTERN_SANITIZE=address,undefined -DCISTERN_BUILD_TESTS=OFF \
  -DCISTERN_BUILD_BENCHMARKS=OFF -DCISTERN_BUILD_EXAMPLES=OFF >/dev/null
ninja -C "$build" ${CISTERN_JOBS:+-j "$CISTERN_JOBS"} tests/fuzz/fuzz_pickle \
  tests/fuzz/fuzz_readers tests/fuzz/make_corpus

mkdir -p "$work/pickle" "$work/readers" "$work/crashes"
"$build/tests/fuzz/make_corpus" "$work/pickle" "$work/readers"

# fuzz_pickle: small inputs suffice for the parser; fuzz_readers replays what reads, so larger.
declare -A max_len=([fuzz_pickle]=4096 [fuzz_readers]=16384)
status=0
for harness in fuzz_pickle fuzz_readers; do
  corpus="$work/${harness#fuzz_}"
  echo "fuzz: $harness for ${seconds}s, corpus $corpus"
  if ! ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    nice -n "${CISTERN_FUZZ_NICE:-0}" "$build/tests/fuzz/$harness" \
    -max_total_time="$seconds" -max_len="${max_len[$harness]}" -timeout=10 -rss_limit_mb=2048 \
    -dict=tests/fuzz/cistern.dict -print_final_stats=1 \
    -artifact_prefix="$work/crashes/$harness-" "$corpus" 2>"$work/$harness.log"; then
    echo "fuzz: $harness FAILED; log $work/$harness.log, reproducer(s):" >&2
    ls "$work/crashes" >&2
    tail -n 40 "$work/$harness.log" >&2
    status=1
  fi
  grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|^#[0-9]+.*DONE' \
    "$work/$harness.log" || true
  echo "fuzz: $harness edges: $(grep -o 'cov: [0-9]*' "$work/$harness.log" | tail -n 1)"
done
if [[ "$status" -eq 0 && -z "${3:-}" ]]; then rm -rf "$work"; fi
exit "$status"
