#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# Everything a GPU session runs, in one go, from any folder:
#   scripts/gpu-check.sh [OUT]            (default OUT: results/gpu under the repository)
#
#  1. the programs: built here (Release, in $CISTERN_BUILD_DIR, default build-gpu), or - on a
#     GPU machine without the project's build dependencies - taken prebuilt from
#     $CISTERN_PREBUILT, the folder scripts/gpu-pack.sh makes on the development machine (the
#     programs for sm_90 and the shared libraries they need beside them);
#  2. the driver's rules first: test_cuda_gpu --gtest_filter='*DriverRule*' (every rule of the
#     CUDA driver the device contract states, on CudaVmmDevice);
#  3. the rest of the GPU tests (test_cuda_gpu: the conformance suite on CudaDevice and
#     CudaVmmDevice, the allocator with its engine on the real driver) and test_cuda_device (the
#     CUDA backends over the test-only stand-in of the driver; no GPU needed);
#  4. replays of the shared traces on the GPU (`cistern replay --backend cuda --touch`: every
#     allocation is written) under cistern's defaults (the engine on CudaVmmDevice), cistern
#     without it (`cistern:vmm=false`) and the PyTorch emulation; the same on the simulated
#     device, for the real device-call times beside the simulated ones;
#  5. scripts/gpu_frameworks.py: PyTorch and CuPy through their allocators and cistern's,
#     uncapped and under caps, variable-shape training, the fragmentation case (OUT/frameworks/);
#  6. bench_vmm: every virtual-memory call timed on this GPU, the cost model's fields fitted;
#  7. bench_gpu: cache-hit allocate/free latency and replayed traces through cistern with the
#     engine and without it, cudaMalloc, cudaMallocAsync, CUB and PyTorch's allocator (through
#     bench/torch_shim, built here against the installed PyTorch), in one process;
#  8. examples/two_streams (DeviceBuffers on two streams with kernels).
# Writes OUT/summary.md (the markdown summary), OUT/*.json (results), OUT/*.md (tables),
# OUT/*.xml (the tests' JUnit output) and OUT/gpu-check.log (all output). Traces come from
# $CISTERN_SHARED_DIR/traces (default ../shared/traces next to the repository).
#
# Where something is missing - no GPU, no CUDA toolkit, no PyTorch, no traces - the parts that
# need it are skipped with a message saying so, and the script still exits 0. Exit status: 0 if
# nothing that ran failed, 1 otherwise. It never installs anything and needs no network.
#
# Budget: at most $CISTERN_GPU_BUDGET_S seconds (default 540, so that a 15-minute GPU lease
# leaves room for the machine's start): every step's timeout is cut to what is left, and a step
# that would start with less than 30 s left is skipped and says so. The steps come in order of
# value: the driver's rules and the GPU tests first.
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
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
skips=()
results=()
started=$SECONDS
budget="${CISTERN_GPU_BUDGET_S:-540}"

# All output goes to the terminal and to the log.
exec > >(tee -a "$log") 2>&1

step() { echo; echo "=== gpu-check [$((SECONDS - started))s]: $*"; }
skip() { echo "gpu-check: SKIPPED: $*"; skips+=("$*"); }
pass() { echo "gpu-check: ok: $*"; results+=("ok: $*"); }
fail() { echo "gpu-check: FAILED: $*"; results+=("FAILED: $*"); failed=1; }
# Sets t, the timeout for a step that would take up to $1 seconds: what the budget has left, at
# most $1; 0 (and a skip line naming the step $2) when less than 30 s are left.
limit() {
  local left=$((budget - (SECONDS - started)))
  t=$((left < $1 ? left : $1))
  if ((left < 30)); then
    skip "$2: the budget of $budget s is spent"
    t=0
  fi
}

write_summary() {
  {
    echo "# cistern GPU check"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $((SECONDS - started)) s (budget $budget s), commit" \
      "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
      "$( [[ -n "$(git -C "$root" status --porcelain 2>/dev/null)" ]] && echo '(uncommitted changes)')"
    echo
    echo "GPU: ${gpu_name:-none}"
    echo
    echo "## Steps"
    echo
    for r in "${results[@]+"${results[@]}"}"; do echo "- $r"; done
    for s in "${skips[@]+"${skips[@]}"}"; do echo "- skipped: $s"; done
    if [[ -f "$out/engine-info.txt" ]]; then echo; echo '```'; cat "$out/engine-info.txt"; echo '```'; fi
    if [[ -f "$out/bench_vmm.md" ]]; then echo; cat "$out/bench_vmm.md"; fi
    if [[ -f "$out/replay-summary.md" ]]; then echo; cat "$out/replay-summary.md"; fi
    if [[ -f "$out/bench_gpu.md" ]]; then echo; cat "$out/bench_gpu.md"; fi
    if [[ -f "$out/frameworks/frameworks.md" ]]; then echo; cat "$out/frameworks/frameworks.md"; fi
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

# --- 1. the programs -------------------------------------------------------------------------------
if [[ -n "${CISTERN_PREBUILT:-}" ]]; then
  step "prebuilt programs from $CISTERN_PREBUILT"
  build="$(cd "$CISTERN_PREBUILT" && pwd)"
  # The libraries the programs were linked with and this machine may lack (simdjson); the CUDA
  # runtime only where the system has none of its own.
  export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! ldconfig -p 2>/dev/null | grep -q 'libcudart.so.13' && [[ -d "$build/lib/cudart" ]]; then
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$build/lib/cudart"
  fi
  if "$build/src/cli/cistern" --version; then
    pass "prebuilt programs ($(cat "$build/BUILT" 2>/dev/null || echo "no BUILT note"))"
  else
    fail "the prebuilt cistern does not run here (ldd: $(ldd "$build/src/cli/cistern" 2>&1 \
      | grep -c 'not found') libraries not found)"
    finish
  fi
else
  step "build ($build, $jobs jobs)"
  arch=()
  # Code for the GPU that is here (compute capability 9.0 -> 90); else the toolkit's default,
  # which the driver compiles from PTX when the program starts.
  if [[ -n "$gpu_name" ]]; then
    cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 \
      | tr -d ' .')"
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
  targets=(cistern_cli test_cuda_device test_cuda_gpu bench_gpu bench_vmm two_streams cistern_plugin)
  limit 360 "the build"
  ((t > 0)) || finish
  if timeout "$t" cmake --build "$build" --parallel "$jobs" --target "${targets[@]}"; then
    pass "build (${targets[*]})"
  else
    fail "build"
    finish
  fi
fi
cistern="$build/src/cli/cistern"

if [[ -z "$gpu_name" ]]; then
  # The CPU-side CUDA tests run anywhere.
  step "the CUDA backends over the test-only stand-in (test_cuda_device, no GPU needed)"
  if "$build/tests/cuda/test_cuda_device" --gtest_brief=1; then
    pass "test_cuda_device"
  else
    fail "test_cuda_device"
  fi
  skip "the driver's rules and the GPU tests: no GPU on this machine"
  skip "examples/two_streams: no GPU on this machine"
  skip "replays on the GPU: no GPU on this machine"
  skip "bench_gpu: no GPU on this machine"
  skip "bench_vmm: no GPU on this machine"
  skip "gpu_frameworks: no GPU on this machine"
  # The built programs must agree that there is no device, and say so clearly.
  "$build/bench/bench_gpu" --out "$out/no-gpu" --smoke >/dev/null
  rc=$?
  if [[ $rc -eq 77 ]]; then pass "bench_gpu says skipped (77) without a GPU"; else
    fail "bench_gpu without a GPU exited $rc, not 77"; fi
  vmm_said="$("$build/bench/bench_vmm" --out "$out/no-gpu" --smoke)"
  rc=$?
  echo "$vmm_said"
  if [[ $rc -eq 0 && "$vmm_said" == *"bench_vmm: SKIPPED"* ]]; then
    pass "bench_vmm says SKIPPED without a GPU"
  else
    fail "bench_vmm without a GPU exited $rc without a SKIPPED line"
  fi
  rm -rf "$out/no-gpu"
  finish
fi

# --- 2. the driver's rules -------------------------------------------------------------------------
# gtest_run NAME TIMEOUT ARGS...: one test binary, its JUnit XML in OUT/NAME.xml, and a line that
# says how many ran (a GPU test that skipped itself on a GPU machine tested nothing).
gtest_run() {
  local name="$1" seconds="$2"
  shift 2
  timeout "$seconds" "$@" --gtest_output="xml:$out/$name.xml"
  local rc=$?
  local counts
  counts="$(grep -o -E '(tests|failures|disabled|skipped)="[0-9]+"' "$out/$name.xml" 2>/dev/null \
    | head -n 4 | tr '\n' ' ')"
  if [[ $rc -eq 0 ]]; then pass "$name ($counts)"; else fail "$name (exit $rc; $counts)"; fi
}
step "the CUDA driver's rules (test_cuda_gpu --gtest_filter='*DriverRule*')"
limit 90 "the driver's rules"
((t > 0)) && gtest_run driver-rules "$t" "$build/tests/cuda/test_cuda_gpu" \
  --gtest_filter='*DriverRule*'

# Whether cistern's engine runs on this GPU (its first growth made, as a program's first
# allocation makes it), with the defaults.
limit 30 "cistern info --engine"
if ((t > 0)); then
  if timeout "$t" "$cistern" info --engine --backend cuda | tee "$out/engine-info.txt"; then
    pass "cistern info --engine --backend cuda: $(grep "cistern's engine" "$out/engine-info.txt" \
      | sed 's/^ *//')"
  else
    fail "cistern info --engine --backend cuda"
  fi
fi

# --- 3. the GPU tests ---------------------------------------------------------------------------------
step "the GPU tests (test_cuda_gpu, then test_cuda_device)"
limit 150 "test_cuda_gpu"
((t > 0)) && gtest_run test_cuda_gpu "$t" "$build/tests/cuda/test_cuda_gpu" \
  --gtest_filter='-*DriverRule*'
limit 60 "test_cuda_device"
((t > 0)) && gtest_run test_cuda_device "$t" "$build/tests/cuda/test_cuda_device" --gtest_brief=1

# --- 4. replays on the GPU ----------------------------------------------------------------------
step "replays of $traces on the GPU (cistern with and without its engine, torch emulation)"
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
  # cistern without its page engine, where this build has the policy option (checked on the
  # simulated device with the smallest trace).
  policies="cistern,torch"
  smallest="$(ls -S "${trace_files[@]}" | tail -n 1)"
  if "$cistern" replay --quiet --policy cistern:vmm=false "$smallest" >/dev/null 2>&1; then
    policies="cistern,cistern:vmm=false,torch"
  else
    skip "the replays' cistern:vmm=false rows: this cistern has no such policy option"
  fi
  limit 180 "the replays on the GPU"
  if ((t > 0)); then
    timeout "$t" "$cistern" replay --backend cuda --touch --policy "$policies" --quiet \
      --json "$out/replay-gpu.json" "${trace_files[@]}"
    rc=$?
    if [[ $rc -eq 0 || $rc -eq 4 ]]; then  # 4: an OOM on the GPU is a figure, not a failure
      pass "cistern replay --backend cuda --touch --policy $policies (exit $rc)"
    else
      fail "cistern replay --backend cuda --touch --policy $policies (exit $rc)"
    fi
  fi
  capacity="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)"
  limit 60 "the replays on the simulated device"
  if ((t > 0)); then
    timeout "$t" "$cistern" replay --policy "$policies" --quiet \
      --capacity "${capacity:-81920}MiB" --json "$out/replay-sim.json" "${trace_files[@]}" ||
      echo "gpu-check: note: the simulated replay exited $?"
  fi
  if [[ -f "$out/replay-gpu.json" ]] && command -v "$python" >/dev/null 2>&1; then
    "$python" - "$out/replay-gpu.json" "$out/replay-sim.json" >"$out/replay-summary.md" <<'EOF'
import json, os, sys
gpu = json.load(open(sys.argv[1]))
sim = {}
def calls(r):
    maps = r.get("maps", r.get("device_maps", 0))
    unmaps = r.get("unmaps", r.get("device_unmaps", 0))
    return f"{r['device_allocs']}/{r['device_frees']}/{maps}/{unmaps}"
if os.path.exists(sys.argv[2]):
    for r in json.load(open(sys.argv[2]))["results"]:
        sim[(r["trace"], r["policy"])] = r
def gib(v): return "-" if v is None else f"{v / 2**30:.2f}"
def num(v, f="{:.0f}"): return "-" if v is None else f.format(v)
vmm = "virtual memory" if gpu.get("virtual_memory") else "no virtual memory: " + gpu.get("device_note", "")
print(f"## Replays on the GPU ({gpu['device']}, {vmm}; every allocation written)\n")
print("| trace | policy | peak live GiB | peak reserved GiB (sim) | OOMs | allocs/frees/maps/unmaps | "
      "ns/op | allocator ns/op | device ms sim | device ms real |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in gpu["results"]:
    name = "/".join(r["trace"].split("/")[-2:])
    if r["error"]:
        print(f"| {name} | {r['policy']} | error: {r['error']} | | | | | | | |")
        continue
    s = sim.get((r["trace"], r["policy"]), {})
    print(f"| {name} | {r['policy']} | {gib(r['peak_live'])} | {gib(r['peak_reserved'])} "
          f"({gib(s.get('peak_reserved'))}) | {r['ooms']} | {calls(r)} "
          f"| {num(r['ns_per_op'])} | {num(r['allocator_ns_per_op'])} | {num(r['device_ms'], '{:.1f}')} "
          f"| {num(r['device_real_ms'], '{:.1f}')} |")
EOF
  fi
fi

# --- 5. the framework check ---------------------------------------------------------------------
step "scripts/gpu_frameworks.py (PyTorch and CuPy under caps, the fragmentation case)"
limit 200 "the framework check"
if ((t > 0)); then
  plugin_lib="$build/src/plugin/libcistern_plugin.so"
  if [[ -z "${CISTERN_PREBUILT:-}" ]]; then
    timeout "$t" cmake --build "$build" --target cistern_plugin >/dev/null ||
      echo "gpu-check: note: cistern_plugin did not build; the cistern rows will say so"
  fi
  timeout "$t" "$python" scripts/gpu_frameworks.py --out "$out/frameworks" \
    --budget-s "$((t - 10))" --plugin "$plugin_lib"
  case $? in
    0) pass "gpu_frameworks (every row ran; $out/frameworks/frameworks.md)" ;;
    77) skip "gpu_frameworks: neither PyTorch with a GPU nor CuPy" ;;
    *) fail "gpu_frameworks (rows crashed or failed: $out/frameworks/frameworks.md)" ;;
  esac
fi

# --- 6. the virtual-memory calls' times ---------------------------------------------------------
step "bench_vmm (every virtual-memory call on this GPU)"
limit 90 "bench_vmm"
if ((t > 0)); then
  timeout "$t" "$build/bench/bench_vmm" --out "$out" --repetitions 100 | tee "$out/bench_vmm.log"
  rc=${PIPESTATUS[0]}
  if [[ $rc -ne 0 ]]; then
    fail "bench_vmm (exit $rc)"
  elif grep -q "bench_vmm: SKIPPED" "$out/bench_vmm.log"; then
    skip "bench_vmm: $(sed -n 's/.*SKIPPED: //p' "$out/bench_vmm.log" | head -n 1)"
  else
    pass "bench_vmm"
  fi
fi

# --- 7. bench_gpu -------------------------------------------------------------------------------
step "bench_gpu"
shim_args=()
torch_prefix="$("$python" -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)"
if [[ -z "$torch_prefix" ]]; then
  skip "bench_gpu's torch rows: PyTorch is not importable by $python"
else
  shim_build="$build/torch_shim"
  limit 120 "bench_gpu's torch rows (building the shim)"
  if ((t > 0)); then
    if timeout "$t" cmake -S bench/torch_shim -B "$shim_build" "${generator[@]}" \
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix" \
         >"$out/torch-shim-build.log" 2>&1 &&
       timeout "$t" cmake --build "$shim_build" --parallel "$jobs" \
         >>"$out/torch-shim-build.log" 2>&1; then
      shim_args=(--torch-shim "$(cd "$shim_build" && pwd)/libcistern_torch_shim.so")
    else
      tail -n 20 "$out/torch-shim-build.log"
      skip "bench_gpu's torch rows: the shim did not build against PyTorch ($out/torch-shim-build.log)"
    fi
  fi
fi
bench_traces=()
for f in pytorch/DeComFL/memory.pickle.gz pytorch/cs336_Wedsonlin/medium_ctx1024_training.pickle.gz; do
  [[ -f "$traces/$f" ]] && bench_traces+=(--trace "$traces/$f")
done
limit 120 "bench_gpu"
if ((t > 0)); then
  if timeout "$t" "$build/bench/bench_gpu" --out "$out" --budget-s 15 "${bench_traces[@]}" \
       "${shim_args[@]}"; then
    pass "bench_gpu"
  else
    fail "bench_gpu"
  fi
fi

# --- 8. the example -----------------------------------------------------------------------------
step "examples/two_streams"
limit 60 "two_streams"
if ((t > 0)); then
  if timeout "$t" "$build/examples/two_streams"; then pass "two_streams"; else
    fail "two_streams"; fi
fi

finish
