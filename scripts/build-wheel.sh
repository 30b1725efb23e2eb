#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# Builds the Python package's wheel with the plug-in inside:
#   cistern_alloc_cu<N>-<version>-py3-none-<platform>.whl
# N is the CUDA major the plug-in links (libcudart.so.N); a plug-in built without the CUDA
# toolkit has the simulated device only and makes cistern_alloc_sim-... instead. The wheel holds
# the package (python/cistern), libcistern_plugin.so in it and _torch_glue.cpp; `import cistern`
# finds the library next to itself. The distribution is cistern-alloc-cu<N> ("cistern" on PyPI
# is another project); the import name stays cistern.
#
# Usage: scripts/build-wheel.sh [--build-dir DIR | --plugin FILE] [OUTDIR]
#   OUTDIR            where the wheel is written (default: build-wheel/dist)
#   --build-dir DIR   the CMake build folder to configure (Release, if not yet configured) and
#                     build the cistern_plugin target in (default: build-wheel)
#   --plugin FILE     use this already built libcistern_plugin.so; nothing is built
# Environment: PYTHON     the interpreter that builds the wheel (default: the first of python3
#                         and /usr/bin/python3 that has setuptools, wheel and pip)
#              CISTERN_JOBS  build parallelism
# Needs: Debian's python3-setuptools, python3-wheel and python3-pip (no network: pip runs with
# --no-index --no-build-isolation), readelf (binutils), cmake.
#
# The copy in the wheel is stripped and has no RUNPATH (the build's points at the build
# machine's CUDA toolkit). It needs nothing beyond the C/C++ runtime and libcudart.so.N: fmt is
# compiled in (header-only) and the plug-in uses no other library. libcudart.so.N comes from the
# CUDA toolkit or the framework's CUDA wheels (cistern/_library.py looks for it there if the
# loader does not find it). The script fails if the library needs anything else.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$root/build-wheel"
plugin=""
outdir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir="$(realpath -m "$2")"; shift 2 ;;
    --plugin) plugin="$(realpath "$2")"; shift 2 ;;
    -h | --help) sed -n '3,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "build-wheel: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) outdir="$1"; shift ;;
  esac
done
outdir="$(realpath -m "${outdir:-$root/build-wheel/dist}")"

# The first interpreter that can build a wheel without the network.
pick_python() {
  local candidate
  for candidate in ${PYTHON:-python3 /usr/bin/python3}; do
    if "$candidate" -c 'import setuptools, wheel, pip' >/dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  echo "build-wheel: no Python with setuptools, wheel and pip (apt-get install python3-setuptools" \
    "python3-wheel python3-pip, or set PYTHON)" >&2
  return 1
}

# Builds the plug-in target alone in $build_dir; a sanitized build cannot go into a wheel.
build_plugin() {
  if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
    cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
  fi
  if grep -q '^CISTERN_SANITIZE:STRING=..*' "$build_dir/CMakeCache.txt"; then
    echo "build-wheel: $build_dir is a sanitized build; use a Release one" >&2
    return 1
  fi
  cmake --build "$build_dir" --target cistern_plugin ${CISTERN_JOBS:+--parallel "$CISTERN_JOBS"}
  plugin="$build_dir/src/plugin/libcistern_plugin.so"
}

# The libraries the plug-in names (DT_NEEDED), one a line.
needed_libraries() {
  readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
}

# Fails unless every needed library is the C/C++ runtime or the CUDA runtime.
check_needed() {
  local library bad=0
  while read -r library; do
    case "$library" in
      libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux*.so.*) ;;
      libstdc++.so.6 | libgcc_s.so.1 | libcudart.so.*) ;;
      *)
        echo "build-wheel: the plug-in needs $library, which a system with the CUDA runtime" \
          "need not have: link it statically (or carry it in the wheel with RUNPATH \$ORIGIN)" >&2
        bad=1
        ;;
    esac
  done < <(needed_libraries "$1")
  return "$bad"
}

# "cu13" for a plug-in that links libcudart.so.13, "sim" for one without the CUDA backends.
variant_of() {
  local cudart
  cudart="$(needed_libraries "$1" | grep -E '^libcudart\.so\.[0-9]+$' || true)"
  if [[ -z "$cudart" ]]; then
    echo "build-wheel: the plug-in has no CUDA backend (built without the CUDA toolkit): the" \
      "wheel runs on the simulated device only" >&2
    echo sim
  else
    echo "cu${cudart##*.}"
  fi
}

# The wheel's copy of the library: stripped, without the build's RUNPATH.
stage_library() {
  local target="$1"
  cp "$plugin" "$target"
  chmod u+w "$target"
  strip --strip-unneeded "$target"
  # shellcheck disable=SC2016  # ${FILE} is CMake's
  echo 'file(RPATH_REMOVE FILE "${FILE}")' >"$stage/rpath_remove.cmake"
  cmake -DFILE="$target" -P "$stage/rpath_remove.cmake"
}

python="$(pick_python)"
if [[ -z "$plugin" ]]; then build_plugin; fi
if [[ ! -f "$plugin" ]]; then
  echo "build-wheel: $plugin: no such file" >&2
  exit 1
fi
check_needed "$plugin"
variant="$(variant_of "$plugin")"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/cistern" "$outdir"
cp "$root/python/pyproject.toml" "$root/python/setup.py" "$root/python/README.md" \
  "$root/LICENSE" "$root/NOTICE" "$stage/"
cp "$root"/python/cistern/*.py "$root/python/cistern/_torch_glue.cpp" "$stage/cistern/"
stage_library "$stage/cistern/libcistern_plugin.so"
sed -i "s/^name = \"cistern-alloc\"$/name = \"cistern-alloc-$variant\"/" "$stage/pyproject.toml"
if ! grep -q "^name = \"cistern-alloc-$variant\"$" "$stage/pyproject.toml"; then
  echo "build-wheel: python/pyproject.toml has no line 'name = \"cistern-alloc\"'" >&2
  exit 1
fi

"$python" -m pip wheel --no-deps --no-index --no-build-isolation --disable-pip-version-check \
  --no-cache-dir --quiet --wheel-dir "$stage/dist" "$stage"
built=("$stage"/dist/*.whl)
wheel="$outdir/$(basename "${built[0]}")"
mv -f "${built[0]}" "$wheel"
echo "build-wheel: $(du -k "$wheel" | cut -f1) KiB, from $plugin"
echo "$wheel"
