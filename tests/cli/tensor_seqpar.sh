#!/usr/bin/env bash
# zero-train with sequence parallelism (zero_train.parallel.sequence_parallel) trains the model one
# rank trains: tests/data/configs/tensor/seqpar3.json (3 tensor ranks, fp32, the addition task's
# 9-token sequences split 3 ways) against the same config with tensor 1 on one rank, steps 1-20
# within a relative 1e-5 (only summation order differs: the row-split partial sums and the
# LayerNorm gradients' sum over the token shards; tests/mpi/gpt_tensor_parallel_test bounds the
# gradients at 1e-5 of their scale, measured 7.4e-7). Also: a sequence the degree does not divide
# is refused at start-up, naming the key.
# usage: tensor_seqpar.sh ZERO_TRAIN SOURCE_DIR WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
zt=$1 src=$2 work=$3
shift 3
mpirun=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work"
export OPENBLAS_NUM_THREADS=1
cfg=$src/tests/data/configs/tensor/seqpar3.json
python3 - "$cfg" one.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_train"]["parallel"] = {"tensor": 1}
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
"${mpirun[@]}" -np 3 "$zt" --config "$cfg" --steps 20 --metrics sp.jsonl > sp.log 2>&1 || { cat sp.log; fail "sequence-parallel run failed"; }
grep -q "tensor slicing: grid 1 data x 1 pipeline x 3 tensor" sp.log || { cat sp.log; fail "no tensor grid"; }
"${mpirun[@]}" -np 1 "$zt" --config one.json --steps 20 --metrics one.jsonl > one.log 2>&1 || { cat one.log; fail "1-rank run failed"; }
python3 "$src/tests/cli/compare_losses.py" one.jsonl sp.jsonl 1 20 1e-5
if "${mpirun[@]}" -np 2 "$zt" --config "$src/tests/data/configs/tensor/seqpar_odd.json" --steps 2 > odd.log 2>&1; then
  fail "9-token sequences over 2 tensor ranks were not refused"
fi
grep -q "sequence_parallel[^\n]*the data's sequences have 9 tokens, which the tensor degree 2" odd.log || { cat odd.log; fail "unclear error"; }
echo "tensor seqpar: ok"
