#!/usr/bin/env bash
# Configures and builds the project into build/ (or $ZERO_BUILD_DIR). The cuda backend is built
# whenever nvcc is found (on PATH or at the toolkit's standard location); ZERO_CUDA=OFF forces
# the cpu-only build.
#   scripts/build.sh [extra cmake -D options]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ZERO_BUILD_DIR:-$root/build}

args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}")
command -v ninja >/dev/null && args+=(-G Ninja)
nvcc=$(command -v nvcc 2>/dev/null || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ "${ZERO_CUDA:-}" = "OFF" ]; then
  args+=(-DZERO_CUDA=OFF)
elif [ -n "$nvcc" ]; then
  args+=(-DCMAKE_CUDA_COMPILER="$nvcc" -DZERO_CUDA=ON)
fi
# Reuse an existing build directory only if it was made with the same generator.
if [ -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null && ! grep -q 'CMAKE_GENERATOR:INTERNAL=Ninja' "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
cmake "${args[@]}" "$@"
cmake --build "$build" -j "$(nproc)"
