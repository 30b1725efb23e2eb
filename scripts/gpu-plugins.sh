#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# GPU checks of the framework plug-ins (issue 5), for a machine with a CUDA GPU; called by
# scripts/gpu-check.sh, or on its own from the repository root:
#   scripts/gpu-plugins.sh [BUILD_DIR]          (default build/; builds cistern_plugin there)
#
#  1. PyTorch: a small GPT-style model trains 20 steps with cistern swapped in
#     (CUDAPluggableAllocator) and, in a separate process, with PyTorch's native allocator: the
#     losses must be identical; both peak reserved figures are printed side by side.
#  2. CuPy: the same kind of check through cupy.cuda.set_allocator.
#  3. The snapshot the plug-in wrote in (1) is loaded by PyTorch's torch.cuda._memory_viz
#     (stats and trace).
#  4. The Python package's tests with the real backend (torch parts no longer skip).
# A part whose framework or GPU is missing is skipped with a message (not a failure).
# Exit status: 0 if nothing failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build="${1:-build}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
failed=0
python="${PYTHON:-python3}"

echo "=== gpu-plugins: building cistern_plugin in $build"
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release || exit 1
fi
cmake --build "$build" --target cistern_plugin || exit 1
export CISTERN_PLUGIN_LIBRARY="$PWD/$build/src/plugin/libcistern_plugin.so"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export CISTERN_BACKEND=cuda
unset CISTERN_ALLOC_CONF

# Runs one mode; 77 means skipped.
run() {
  "$python" scripts/gpu_plugins.py "$@"
  local rc=$?
  if [[ $rc -eq 77 ]]; then return 77; fi
  if [[ $rc -ne 0 ]]; then echo "gpu-plugins: FAIL: $*"; failed=1; fi
  return $rc
}

echo "=== gpu-plugins: PyTorch, 20 training steps, cistern vs native"
# cuBLAS needs this for deterministic results (torch.use_deterministic_algorithms).
export CUBLAS_WORKSPACE_CONFIG=:4096:8
if run torch-train cistern "$out/torch-cistern.json" "$out/snapshot.pickle" &&
   run torch-train native "$out/torch-native.json"; then
  "$python" scripts/gpu_plugins.py compare "$out/torch-cistern.json" "$out/torch-native.json" ||
    failed=1
  echo "=== gpu-plugins: the plug-in's snapshot in PyTorch's _memory_viz"
  if "$python" -m torch.cuda._memory_viz stats "$out/snapshot.pickle" >"$out/viz-stats.txt" &&
     "$python" -m torch.cuda._memory_viz trace "$out/snapshot.pickle" >"$out/viz-trace.txt" &&
     "$python" -m torch.cuda._memory_viz trace_plot "$out/snapshot.pickle" -o "$out/trace.html"; then
    head -n 5 "$out/viz-stats.txt"
    echo "gpu-plugins: _memory_viz read the snapshot ($(wc -l <"$out/viz-trace.txt") trace lines)"
  else
    echo "gpu-plugins: FAIL: torch.cuda._memory_viz could not read the plug-in's snapshot"
    failed=1
  fi
fi

echo "=== gpu-plugins: CuPy, cistern vs native"
if run cupy cistern "$out/cupy-cistern.json" && run cupy native "$out/cupy-native.json"; then
  "$python" scripts/gpu_plugins.py compare "$out/cupy-cistern.json" "$out/cupy-native.json" ||
    failed=1
fi

echo "=== gpu-plugins: the Python package's tests on the GPU"
# The ctypes tests set CISTERN_BACKEND=sim for themselves; the torch test uses the GPU.
"$python" -m unittest discover -s python/tests -t python || failed=1

if [[ $failed -ne 0 ]]; then
  echo "gpu-plugins: FAILED"
  exit 1
fi
echo "gpu-plugins: passed (skipped parts say so above)"
