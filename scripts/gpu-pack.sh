#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# Builds the GPU programs on this (development) machine and packs what a GPU machine without the
# project's build dependencies needs to run scripts/gpu-check.sh:
#   scripts/gpu-pack.sh [ARCH]        (default ARCH 90: the H200 / H100's sm_90)
# Writes gpu-carry/ (ignored by git) with the programs at their build-tree paths
# (src/cli/cistern, tests/cuda/test_cuda_gpu, bench/bench_vmm, ...), lib/ with the shared
# libraries they link that a machine without Debian's -dev packages lacks (simdjson; the CUDA
# runtime in lib/cudart, used there only where the system has none), shared/traces (a copy of
# ../shared/traces, when it is there) and BUILT (the commit and the date). On the GPU machine:
#   CISTERN_PREBUILT=gpu-carry CISTERN_SHARED_DIR=gpu-carry/shared scripts/gpu-check.sh OUT
# Environment: CISTERN_BUILD_DIR (default build-gpu), CISTERN_SHARED_DIR (default ../shared),
#              CISTERN_JOBS (build parallelism).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
arch="${1:-90}"
build="${CISTERN_BUILD_DIR:-build-gpu}"
shared="${CISTERN_SHARED_DIR:-../shared}"
carry=gpu-carry
launcher=()
command -v ccache >/dev/null 2>&1 &&
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCISTERN_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" "${launcher[@]}" >/dev/null
programs=(src/cli/cistern tests/cuda/test_cuda_gpu tests/cuda/test_cuda_device bench/bench_gpu
  bench/bench_vmm examples/two_streams src/plugin/libcistern_plugin.so)
cmake --build "$build" ${CISTERN_JOBS:+--parallel "$CISTERN_JOBS"} --target cistern_cli \
  test_cuda_gpu test_cuda_device bench_gpu bench_vmm two_streams cistern_plugin

rm -rf "$carry"
mkdir -p "$carry/lib/cudart"
for p in "${programs[@]}"; do
  mkdir -p "$carry/$(dirname "$p")"
  cp "$build/$p" "$carry/$p"
done
# Every library the programs link that is neither the C/C++ runtime nor the driver.
for p in "${programs[@]}"; do ldd "$build/$p"; done | awk '/=> \// { print $3 }' | sort -u |
  while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libstdc++.so* | libgcc_s.so* | libpthread.so* | libdl.so* | librt.so* \
        | libz.so* | libcuda.so*) ;;
      libcudart.so*) cp -L "$lib" "$carry/lib/cudart/" ;;
      *) cp -L "$lib" "$carry/lib/" ;;
    esac
  done
if [[ -d "$shared/traces" ]]; then
  mkdir -p "$carry/shared"
  cp -r "$shared/traces" "$carry/shared/"
fi
echo "commit $(git rev-parse --short HEAD)$([[ -n "$(git status --porcelain -- src include)" ]] \
  && echo ' with uncommitted changes'), sm_$arch, $(date -u '+%Y-%m-%d %H:%M UTC')" >"$carry/BUILT"
du -sh "$carry"
ls -R "$carry/lib"
