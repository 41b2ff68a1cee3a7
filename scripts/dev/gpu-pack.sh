#!/usr/bin/env bash
# For development sessions that are lent the GPU machine (see docs/gpu-runs.md): builds the cuda
# configuration for Hopper in build-gpu/ (Release: small binaries), and packs zero-train and the
# GPU test programs with their libraries and a relocatable Open MPI into .device/ with the
# session tooling's pack.sh (../shared/device/pack.sh, outside this repository). Then:
#   device tool: carry [".device"], command "bash scripts/dev/gpu-tests.sh"
# Users with a GPU do not need this: scripts/test.sh builds and runs everything in place.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
pack=${ZERO_PACK_SH:-$root/../shared/device/pack.sh}
[ -f "$pack" ] || { echo "gpu-pack.sh: $pack not found (set ZERO_PACK_SH)" >&2; exit 2; }
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo /.device/ >> .git/info/exclude

ZERO_BUILD_DIR=$root/build-gpu CMAKE_BUILD_TYPE=Release scripts/build.sh \
  -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
b=build-gpu
bins=("$b/zero-train")
for t in core_cuda_checks_test core_cuda_device_test core_cuda_dtype_test core_cuda_stream_test \
         models_cuda_ops_test models_cuda_gpt_test optim_cuda_adam_test \
         offload_cuda_copy_engine_test offload_cuda_host_memory_test \
         mpi_cuda_nccl_test mpi_cuda_engine_test; do
  f=$(find "$b/tests" -name "$t" -type f | head -1)
  [ -n "$f" ] || { echo "gpu-pack.sh: $t was not built" >&2; exit 1; }
  bins+=("$f")
done
bash "$pack" .device "${bins[@]}"
# Symbols are of no use there and cost carry space.
strip --strip-unneeded .device/bin/* 2>/dev/null || true
du -sh .device
