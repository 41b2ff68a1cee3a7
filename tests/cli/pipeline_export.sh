#!/usr/bin/env bash
# `zero-train export` of a pipeline checkpoint: a tiny GPT (2 blocks, wte tied between the first
# and the last stage) trained over 2 and 4 pipeline stages by tests/mpi/pipeline_checkpoint_test
# (its hidden "[.keep]" case saves into $ZERO_PIPE_CKPT_KEEP) exports, unchanged, as ONE
# safetensors file of the whole model: every GPT-2 name once (wte once, not per stage), shapes,
# fp32, finite, trained (check_safetensors.py, a reader written from the format's
# specification alone), and with --hf-config a config.json from the recorded n_head.
# usage: pipeline_export.sh ZERO_TRAIN TEST_BINARY SOURCE_DIR WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
zt=$1 bin=$2 src=$3 work=$4
shift 4
mpirun=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
export OPENBLAS_NUM_THREADS=1
for np in 2 4; do
  echo "== a GPT trained over $np pipeline stages, saved, exported"
  ck=$work/ck$np
  "${mpirun[@]}" -np "$np" -x ZERO_PIPE_CKPT_KEEP="$ck" "$bin" "[.keep]" > "$work/keep$np.log" 2>&1 ||
    { cat "$work/keep$np.log"; fail "the pipeline run that saves the checkpoint failed"; }
  grep -Eq '"stages": *'"$np" "$ck/step_00000003/manifest.json" || fail "the manifest does not record $np stages"
  mkdir -p "$work/out$np"
  "$zt" export --checkpoint "$ck" --out "$work/out$np/model.safetensors" --hf-config > "$work/export$np.log" 2>&1 ||
    { cat "$work/export$np.log"; fail "export failed"; }
  cat "$work/export$np.log"
  grep -q "step_00000003 -> .*: 28 tensors" "$work/export$np.log" || fail "export did not write the whole model's 28 tensors"
  # n_layer 2, n_embd 16, vocab 13, seq_len 6: the test's kGpt.
  python3 "$src/tests/cli/check_safetensors.py" "$work/out$np/model.safetensors" 2 16 13 6
  grep -q '"n_head": 2' "$work/out$np/config.json" || fail "config.json lacks the recorded n_head"
done
echo "pipeline export: ok"
