#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# Everything a GPU session runs, in one go, from any folder:
#   scripts/gpu-check.sh [OUT]            (default OUT: results/gpu under the repository)
#
#  1. builds cistern with the CUDA backends (Release, in $CISTERN_BUILD_DIR, default build-gpu);
#  2. ctest -L gpu: the device conformance suite on CudaDevice and CudaVmmDevice, the GPU tests,
#     the bench smoke run (one at a time: the tests compare free memory);
#  3. examples/two_streams (DeviceBuffers on two streams with kernels);
#  4. replays the shared traces on the GPU under cistern and the PyTorch emulation
#     (`cistern replay --backend cuda --touch`: every allocation is written), and the same on
#     the simulated device, for the real device-call times beside the simulated ones;
#  5. bench_gpu: cache-hit allocate/free latency and replayed real traces through cistern,
#     cudaMalloc, cudaMallocAsync (pool, release threshold unlimited), CUB's
#     CachingDeviceAllocator and PyTorch's allocator (through bench/torch_shim, built against the
#     installed PyTorch), in one process;
#  6. scripts/gpu-plugins.sh when it exists (the framework plug-ins).
# Writes OUT/summary.md (the markdown summary), OUT/*.json (results), OUT/gpu-check.log (all
# output) and OUT/ctest-gpu.xml (JUnit). Traces come from $CISTERN_SHARED_DIR/traces (default
# ../shared/traces next to the repository).
#
# Where something is missing - no GPU, no CUDA toolkit, no PyTorch, no traces - the parts that
# need it are skipped with a message saying so, and the script still exits 0. Exit status: 0 if
# nothing that ran failed, 1 otherwise. It never installs anything and needs no network.
# Budget: about 6 minutes on a 16-core machine with an H200, the build included.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
out="${1:-results/gpu}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
build="${CISTERN_BUILD_DIR:-build-gpu}"
shared="${CISTERN_SHARED_DIR:-$root/../shared}"
traces="$shared/traces"
jobs="${CISTERN_JOBS:-$(nproc 2>/dev/null || echo 4)}"
python="${PYTHON:-python3}"
log="$out/gpu-check.log"
summary="$out/summary.md"
: >"$log"
failed=0
skips=()
results=()
started=$SECONDS

# All output goes to the terminal and to the log.
exec > >(tee -a "$log") 2>&1

step() { echo; echo "=== gpu-check [$((SECONDS - started))s]: $*"; }
skip() { echo "gpu-check: SKIPPED: $*"; skips+=("$*"); }
pass() { echo "gpu-check: ok: $*"; results+=("ok: $*"); }
fail() { echo "gpu-check: FAILED: $*"; results+=("FAILED: $*"); failed=1; }

write_summary() {
  {
    echo "# cistern GPU check"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $((SECONDS - started)) s, commit" \
      "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
      "$( [[ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ]] && echo '(uncommitted changes)')"
    echo
    echo "GPU: ${gpu_name:-none}"
    echo
    echo "## Steps"
    echo
    for r in "${results[@]+"${results[@]}"}"; do echo "- $r"; done
    for s in "${skips[@]+"${skips[@]}"}"; do echo "- skipped: $s"; done
    if [[ -f "$out/replay-summary.md" ]]; then echo; cat "$out/replay-summary.md"; fi
    if [[ -f "$out/bench_gpu.md" ]]; then echo; cat "$out/bench_gpu.md"; fi
    echo
    echo "Raw results in $out: $(find "$out" -maxdepth 1 \( -name '*.json' -o -name '*.xml' \) \
      -printf '%f ' | sort)"
  } >"$summary"
  echo "gpu-check: wrote $summary"
}

finish() {
  write_summary
  if [[ $failed -ne 0 ]]; then
    echo "gpu-check: FAILED (see above and $log)"
    exit 1
  fi
  echo "gpu-check: done in $((SECONDS - started)) s (skipped parts say so above)"
  exit 0
}

# --- what this machine has ----------------------------------------------------------------------
step "environment"
gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu_name="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    | head -n 1)"
  echo "gpu-check: GPU: $gpu_name"
else
  echo "gpu-check: no GPU found (nvidia-smi is missing or lists none)"
fi
nvcc_bin="$(command -v nvcc || true)"
[[ -z "$nvcc_bin" && -x /usr/local/cuda/bin/nvcc ]] && nvcc_bin=/usr/local/cuda/bin/nvcc
if [[ -z "$nvcc_bin" ]]; then
  skip "everything: no CUDA toolkit (nvcc is neither on PATH nor in /usr/local/cuda/bin)"
  finish
fi
echo "gpu-check: CUDA toolkit: $("$nvcc_bin" --version | tail -n 1)"
nvcc_dir="$(dirname "$nvcc_bin")"
export PATH="$nvcc_dir:$PATH"

# --- 1. build -----------------------------------------------------------------------------------
step "build ($build, $jobs jobs)"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
arch=()
# Code for the GPU that is here (compute capability 9.0 -> 90); else the toolkit's default, which
# the driver compiles from PTX when the program starts.
if [[ -n "$gpu_name" ]]; then
  cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')"
  [[ "$cc" =~ ^[0-9]+$ ]] && arch=(-DCMAKE_CUDA_ARCHITECTURES="$cc")
fi
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCISTERN_WITH_CUDA=ON \
    "${arch[@]}" || { fail "configure"; finish; }
fi
if ! cmake --build "$build" --target help 2>/dev/null | grep -q "bench_gpu"; then
  skip "the CUDA parts: CMake did not enable the CUDA backends and nvcc (see the configure output)"
  finish
fi
targets=(cistern_cli test_cuda_device test_cuda_gpu bench_gpu two_streams)
if cmake --build "$build" --parallel "$jobs" --target "${targets[@]}"; then
  pass "build (${targets[*]})"
else
  fail "build"
  finish
fi
cistern="$build/src/cli/cistern"

# The CPU-side CUDA tests run anywhere.
step "the CUDA backends over the test-only stand-in (test_cuda_device, no GPU needed)"
if "$build/tests/cuda/test_cuda_device" --gtest_brief=1; then
  pass "test_cuda_device"
else
  fail "test_cuda_device"
fi

if [[ -z "$gpu_name" ]]; then
  skip "ctest -L gpu: no GPU on this machine"
  skip "examples/two_streams: no GPU on this machine"
  skip "replays on the GPU: no GPU on this machine"
  skip "bench_gpu: no GPU on this machine"
  skip "gpu-plugins: no GPU on this machine"
  # The built programs must agree that there is no device, and say so clearly.
  "$build/bench/bench_gpu" --out "$out/no-gpu" --smoke >/dev/null
  rc=$?
  if [[ $rc -eq 77 ]]; then pass "bench_gpu says skipped (77) without a GPU"; else
    fail "bench_gpu without a GPU exited $rc, not 77"; fi
  rm -rf "$out/no-gpu"
  finish
fi

# --- 2. ctest -L gpu ----------------------------------------------------------------------------
step "ctest -L gpu"
if timeout 300 ctest --test-dir "$build" -L gpu -j 1 --output-on-failure \
     --output-junit "$out/ctest-gpu.xml"; then
  # Say how many ran: a GPU test that skipped itself on a GPU machine did not test anything.
  pass "ctest -L gpu ($(grep -o -E '(tests|failures|skipped)="[0-9]+"' "$out/ctest-gpu.xml" \
    | head -n 3 | tr '\n' ' '))"
else
  fail "ctest -L gpu"
fi

# --- 3. the example -----------------------------------------------------------------------------
step "examples/two_streams"
if timeout 60 "$build/examples/two_streams"; then pass "two_streams"; else fail "two_streams"; fi

# --- 4. replays on the GPU ----------------------------------------------------------------------
step "replays of $traces on the GPU (cistern, torch emulation)"
trace_files=()
if [[ -d "$traces" ]]; then
  while IFS= read -r f; do trace_files+=("$f"); done < <(
    find "$traces" -type f \( -name '*.pickle' -o -name '*.pickle.gz' -o -name '*.csv' \
      -o -name '*.json.gz' -o -name '*.json' \) ! -name 'example.*' | sort)
fi
if [[ ${#trace_files[@]} -eq 0 ]]; then
  skip "replays and the bench's trace rows: no traces in $traces (set CISTERN_SHARED_DIR)"
else
  echo "gpu-check: ${#trace_files[@]} traces"
  timeout 300 "$cistern" replay --backend cuda --touch --policy cistern,torch --quiet \
    --json "$out/replay-gpu.json" "${trace_files[@]}"
  rc=$?
  if [[ $rc -eq 0 || $rc -eq 4 ]]; then  # 4: an OOM on the GPU is a figure, not a failure
    pass "cistern replay --backend cuda --touch (exit $rc)"
  else
    fail "cistern replay --backend cuda --touch (exit $rc)"
  fi
  capacity="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)"
  timeout 300 "$cistern" replay --policy cistern,torch --quiet --capacity "${capacity:-81920}MiB" \
    --json "$out/replay-sim.json" "${trace_files[@]}" ||
    echo "gpu-check: note: the simulated replay exited $?"
  if [[ -f "$out/replay-gpu.json" ]] && command -v "$python" >/dev/null 2>&1; then
    "$python" - "$out/replay-gpu.json" "$out/replay-sim.json" >"$out/replay-summary.md" <<'EOF'
import json, os, sys
gpu = json.load(open(sys.argv[1]))
sim = {}
if os.path.exists(sys.argv[2]):
    for r in json.load(open(sys.argv[2]))["results"]:
        sim[(r["trace"], r["policy"])] = r
def gib(v): return "-" if v is None else f"{v / 2**30:.2f}"
def num(v, f="{:.0f}"): return "-" if v is None else f.format(v)
print(f"## Replays on the GPU ({gpu['device']}, every allocation written)\n")
print("| trace | policy | peak live GiB | peak reserved GiB (sim) | OOMs | allocs/frees | "
      "ns/op | allocator ns/op | device ms sim | device ms real |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in gpu["results"]:
    name = "/".join(r["trace"].split("/")[-2:])
    if r["error"]:
        print(f"| {name} | {r['policy']} | error: {r['error']} | | | | | | | |")
        continue
    s = sim.get((r["trace"], r["policy"]), {})
    print(f"| {name} | {r['policy']} | {gib(r['peak_live'])} | {gib(r['peak_reserved'])} "
          f"({gib(s.get('peak_reserved'))}) | {r['ooms']} | {r['device_allocs']}/{r['device_frees']} "
          f"| {num(r['ns_per_op'])} | {num(r['allocator_ns_per_op'])} | {num(r['device_ms'], '{:.1f}')} "
          f"| {num(r['device_real_ms'], '{:.1f}')} |")
EOF
  fi
fi

# --- 5. bench_gpu -------------------------------------------------------------------------------
step "bench_gpu"
shim_args=()
torch_prefix="$("$python" -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)"
if [[ -z "$torch_prefix" ]]; then
  skip "bench_gpu's torch rows: PyTorch is not importable by $python"
else
  shim_build="$build/torch_shim"
  if cmake -S bench/torch_shim -B "$shim_build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_PREFIX_PATH="$torch_prefix" >"$out/torch-shim-build.log" 2>&1 &&
     cmake --build "$shim_build" --parallel "$jobs" >>"$out/torch-shim-build.log" 2>&1; then
    shim_args=(--torch-shim "$(cd "$shim_build" && pwd)/libcistern_torch_shim.so")
  else
    tail -n 20 "$out/torch-shim-build.log"
    skip "bench_gpu's torch rows: the shim did not build against PyTorch ($out/torch-shim-build.log)"
  fi
fi
bench_traces=()
for t in pytorch/DeComFL/memory.pickle.gz pytorch/cs336_Wedsonlin/medium_ctx1024_training.pickle.gz; do
  [[ -f "$traces/$t" ]] && bench_traces+=(--trace "$traces/$t")
done
if timeout 420 "$build/bench/bench_gpu" --out "$out" --budget-s 20 "${bench_traces[@]}" \
     "${shim_args[@]}"; then
  pass "bench_gpu"
else
  fail "bench_gpu"
fi

# --- 6. the framework plug-ins ------------------------------------------------------------------
if [[ -x scripts/gpu-plugins.sh ]]; then
  step "scripts/gpu-plugins.sh"
  if timeout 300 scripts/gpu-plugins.sh "$build"; then pass "gpu-plugins"; else fail "gpu-plugins"; fi
fi

finish
