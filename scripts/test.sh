#!/usr/bin/env bash
# Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#
# The default test run (the README's test command): configures a Release build in build/ with
# Ninja, builds everything, and runs the unit tests and the benchmark smoke test. Tests that need
# a CUDA GPU (label "gpu") and the full-size randomized run (label "long") are left out:
#   ctest --test-dir build -L gpu     # on a machine with a GPU
#   ctest --test-dir build -L long    # the full randomized run
#
# Usage: scripts/test.sh            (from anywhere; it works in the repository root)
# Environment: CISTERN_JOBS         build parallelism (default: ninja's own choice)
# Needs: cmake >= 3.22, ninja, a C++17 compiler, and the packages .ci/run installs.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build ${CISTERN_JOBS:+--parallel "$CISTERN_JOBS"}
ctest --test-dir build --output-on-failure -j2 -LE "gpu|long"
