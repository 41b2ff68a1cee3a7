#!/usr/bin/env bash
# The test command: checks the source layout (scripts/check-layout.sh), installs the
# dependencies, builds, and runs the whole test suite (unit tests, multi-rank tests under
# mpirun, program tests). GPU tests report "Skipped" on a machine without a GPU. Exits
# non-zero if anything fails.
#   scripts/test.sh [ctest options, e.g. -R config]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The layout rules (dependency direction, file length) first: a violation fails in a second,
# before the dependencies are installed and anything is built.
"$root/scripts/check-layout.sh"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${ZERO_BUILD_DIR:-$root/build}
# Several ranks share few cores: one BLAS thread per process.
export OPENBLAS_NUM_THREADS=1
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
