#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/dev/gpu-pack.sh carried
# .device/ there: every GPU test program (single-GPU cases; the 2-rank cases need 2 GPUs and
# report Skipped), then a short zero-train run on cuda. Logs go to $OUT/gpu-tests/ (the device
# tool brings $OUT back); a summary line per program is printed. Exit status: the number of
# programs that failed.
set -uo pipefail
source .device/env.sh
out=${OUT:-/tmp}/gpu-tests
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
failed=0
run() {  # run NAME COMMAND...
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local verdict=passed
  [ $rc -eq 4 ] && verdict=skipped   # Catch2: every case skipped
  [ $rc -ne 0 ] && [ $rc -ne 4 ] && { verdict="FAILED (rc $rc)"; failed=$((failed + 1)); }
  printf '%-34s %-14s %4ds  %s\n' "$name" "$verdict" $((SECONDS - t0)) "$(tail -1 "$out/$name.log")"
}
for t in core_cuda_checks_test core_cuda_device_test core_cuda_dtype_test core_cuda_stream_test \
         optim_cuda_adam_test offload_cuda_host_memory_test offload_cuda_copy_engine_test \
         models_cuda_ops_test models_cuda_gpt_test; do
  run "$t" ".device/bin/$t"
done
for t in mpi_cuda_nccl_test mpi_cuda_engine_test; do
  run "${t}_np1" mpirun --allow-run-as-root -np 1 ".device/bin/$t"
done
# zero-train on cuda: the tiny default job's model on token-free defaults (the addition task).
run zero_train_cuda .device/bin/zero-train --config configs/cpu/stage2_offload.json --device cuda \
    --steps 20 --metrics "$out/zero_train_cuda.jsonl" --progress off
echo "failed programs: $failed (logs in $out)"
exit $failed
