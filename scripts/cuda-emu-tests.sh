#!/usr/bin/env bash
# The cuda backend's own tests on a machine without a GPU, under the CPU emulation of the CUDA
# runtime, cuBLAS and NCCL (cuda_emu: ../shared/cuda_emu next to the checkout, or $ZERO_CUDA_EMU).
# It builds the unmodified cuda code and the tests/*/cuda_*_test.cpp programs with g++ against
# the emulator, with AddressSanitizer and UBSan, in $ZERO_EMU_BUILD_DIR (default build/emu/: the
# emulator copies the checkout there, leaving out build/ and .git/, so the copy does not contain
# itself; the checkout is never modified), and runs them; tests/mpi/ ones on $EMU_NP ranks
# (default 2). Costs on a 2-core machine: docs/gpu-runs.md, "The cuda tests without a GPU".
#   scripts/cuda-emu-tests.sh            every cuda test program
#   scripts/cuda-emu-tests.sh --fast     the quick subset (FAST below)
#   scripts/cuda-emu-tests.sh NAME...    these test programs (e.g. models_cuda_ops_test)
# Environment: EMU_JOBS (parallel compile jobs, default 2), EMU_NP, EMU_JITTER_US (a random delay
# before every stream operation, to expose a missing event wait), EMU_DEVICE_GIB (emulated
# memory, default 8), EMU_TIMEOUT (seconds per program, default 1800): see the emulator's README.
# Without the emulator it says so and exits 0: there is nothing to run. Exit status non-zero if
# the build or any program failed, or the emulator reported an EMU-VIOLATION (a launch CUDA
# would reject, a warp collective naming absent lanes, a deadlock, a misused API).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
emu=${ZERO_CUDA_EMU:-$root/../shared/cuda_emu}
work=${ZERO_EMU_BUILD_DIR:-$root/build/emu}

# About a minute of running (2-core machine): the device, ledger, streams, dtype kernels, copy
# engine, the whole GPT's forward and backward against the cpu backend (every model kernel once),
# and the NCCL communicator. Left out: models_cuda_ops_test and optim_cuda_adam_test (5 minutes
# each) and mpi_cuda_engine_test (8 minutes on one rank, 15 on two).
FAST=(core_cuda_checks_test core_cuda_device_test core_cuda_dtype_test core_cuda_stream_test
      offload_cuda_copy_engine_test offload_cuda_host_memory_test models_cuda_gpt_test
      mpi_cuda_nccl_test)

if [ ! -x "$emu/build.sh" ] || [ ! -x "$emu/run_tests.sh" ]; then
  echo "cuda-emu-tests: no CUDA emulator at $emu (set ZERO_CUDA_EMU): skipped"
  exit 0
fi
tests=()
if [ "${1:-}" = "--fast" ]; then
  tests=("${FAST[@]}")
  shift
fi
tests+=("$@")

mkdir -p "$work"
# The emulator's tools/patch_cmake.py (as shipped) marks the project's .cu files as C++ by globbing
# runtime/, models/, optim/, collectives/ and offload/: it predates core/ moving to the top level
# (issue 17), so core/cuda/dtype_convert.cu would be left out of the emulated build and every test
# using the device conversions would fail to link. When the glob does not name core/, a copy of
# the emulator in the work directory is used whose glob also covers core/ (its only difference).
if ! grep -q 'PROJECT_SOURCE_DIR}/core/' "$emu/tools/patch_cmake.py"; then
  rm -rf "$work/emu-tool" && cp -rp "$emu" "$work/emu-tool" && chmod -R u+w "$work/emu-tool"
  sed -i 's#${PROJECT_SOURCE_DIR}/runtime/\*\.cu#${PROJECT_SOURCE_DIR}/core/*.cu ${PROJECT_SOURCE_DIR}/runtime/*.cu#' \
    "$work/emu-tool/tools/patch_cmake.py"
  grep -q 'PROJECT_SOURCE_DIR}/core/' "$work/emu-tool/tools/patch_cmake.py" ||
    { echo "cuda-emu-tests: could not extend the emulator's .cu glob to core/ ($emu/tools/patch_cmake.py)"; exit 1; }
  echo "cuda-emu-tests: the emulator's .cu glob misses core/: using a copy with core/ added ($work/emu-tool)"
  emu="$work/emu-tool"
fi
log="$work/emu-tests.log"
t0=$SECONDS
if ! "$emu/build.sh" "$root" "$work" "${tests[@]}" >"$work/emu-build.log" 2>&1; then
  tail -30 "$work/emu-build.log"
  echo "cuda-emu-tests: the emulated build failed (log: $work/emu-build.log)"
  exit 1
fi
echo "cuda-emu-tests: built in $((SECONDS - t0)) s"
t1=$SECONDS
"$emu/run_tests.sh" "$work" "${tests[@]}" >"$log" 2>&1
rc=$?
# The test cases' totals (colour codes removed: under mpirun Catch2 writes them), then one line
# per program.
sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^=== .* exit [0-9]+$|^test cases:|^All tests passed'
# Each violation prints one EMU-VIOLATION line; a process the emulator aborts (an NCCL batch
# timing out, EMU_ABORT) prints no EMU-SUMMARY, so the summaries alone can read 0: take the larger.
summed=$(grep -Eo 'EMU-SUMMARY: [0-9]+' "$log" | awk '{s += $2} END {print s + 0}')
lines=$(grep -o 'EMU-VIOLATION:' "$log" | wc -l)
violations=$((summed > lines ? summed : lines))
echo "cuda-emu-tests: ran in $((SECONDS - t1)) s; EMU-VIOLATIONs: $violations (log: $log)"
if [ "$violations" -gt 0 ]; then
  grep -m 20 'EMU-VIOLATION' "$log"
  rc=1
fi
exit $rc
