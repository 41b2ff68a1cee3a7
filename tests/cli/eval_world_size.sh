#!/usr/bin/env bash
# Held-out evaluation does not depend on the world size (issue 16, item 9): the same weights give
# the same held-out loss and exact match on 1, 2 and 4 ranks, bit for bit, on the addition task
# and on --eval-data token shards, at ZeRO stage 2 and 3, for the whole set and for its first N
# sequences; and `--eval-only` of a checkpoint prints what the training run printed at that step.
#
# Exact equality is the expectation, not luck: every chunk of micro-batch-many held-out sequences
# is one forward pass over the same rows on any world size, and rank 0 adds the chunks' sums in
# chunk order (runtime/train/held_out_eval.hpp), so no tolerance is needed.
# usage: eval_world_size.sh ZERO_TRAIN SOURCE_DIR WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
zt=$1 src=$2 work=$3
shift 3
mpirun=("$@")
cfg2=$src/tests/data/configs/resume_stage2.json  # micro-batch 4 on any world size
cfg3=$src/tests/data/configs/resume_stage3.json
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export OPENBLAS_NUM_THREADS=1

echo "== 20 steps on 2 ranks, evaluated during training at step 20, checkpoint saved"
"${mpirun[@]}" -np 2 "$zt" --config "$cfg2" --checkpoint-dir ck --eval-interval 20 --metrics train.jsonl \
  > train.log 2>&1 || { cat train.log; fail "training failed"; }
grep -q "eval step 20 | held-out loss" train.log || { cat train.log; fail "no evaluation at step 20"; }

# A token shard to evaluate on (llm.c format, ids below the tiny preset's 64): 3000 tokens give
# 46 windows of 64, i.e. 12 chunks of 4, the last of 2.
python3 - <<'PY'
import struct
n = 3000
toks = [(i * 37 + 11) % 64 if i % 5 else (i * 13) % 64 for i in range(n)]
with open("val.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *toks))
PY

# eval NAME CONFIG NP [flags...]: --eval-only of the step-20 checkpoint; its metrics go to NAME.jsonl.
evaluate() {
  local name=$1 cfg=$2 np=$3
  shift 3
  "${mpirun[@]}" -np "$np" "$zt" --config "$cfg" --checkpoint-dir ck --resume --eval-only \
    --metrics "$name.jsonl" "$@" > "$name.log" 2>&1 || { cat "$name.log"; fail "$name: --eval-only failed"; }
  grep -q "evaluation only: nothing trained, nothing saved" "$name.log" || { cat "$name.log"; fail "$name: not evaluation only"; }
  echo "$name: $(grep 'eval step' "$name.log")"
}
for np in 1 2 4; do
  evaluate add_np$np "$cfg2" $np
  evaluate add37_np$np "$cfg2" $np --eval-sequences 37
  evaluate shards_np$np "$cfg2" $np --eval-data val.bin
done
for np in 2 4; do
  evaluate add_s3_np$np "$cfg3" $np
  evaluate shards_s3_np$np "$cfg3" $np --eval-data val.bin
done
# 37 sequences = 10 chunks on 4 ranks: in the third round two ranks have no chunk and, at stage 3
# (the forward gathers parameters, a collective), run a stand-in forward whose result is dropped.
evaluate add37_s3_np4 "$cfg3" 4 --eval-sequences 37
# Nothing was trained or saved by the evaluations.
[ "$(cat ck/latest)" = step_00000020 ] && [ "$(ls ck | grep -c '^step_')" = 1 ] || fail "an evaluation saved a checkpoint"

python3 - <<'PY'
import json
def only(name):
    rows = [json.loads(l) for l in open(name + ".jsonl")]
    assert len(rows) == 1 and "loss" not in rows[0], f"{name}: expected one evaluation line, got {rows}"
    return rows[0]
def same(names, expect_sequences):
    rows = {n: only(n) for n in names}
    ref = rows[names[0]]
    for n, r in rows.items():
        if r != ref:
            raise SystemExit(f"FAIL: {n} gives {r}, {names[0]} gives {ref}: the held-out result depends on the world size")
    if ref["eval_sequences"] != expect_sequences:
        raise SystemExit(f"FAIL: {names[0]} evaluated {ref['eval_sequences']} sequences, expected {expect_sequences}")
    print(f"same on {len(names)} runs: {ref}")
    return ref
add = same(["add_np1", "add_np2", "add_np4", "add_s3_np2", "add_s3_np4"], 1000)  # every held-out problem
same(["add37_np1", "add37_np2", "add37_np4", "add37_s3_np4"], 37)
same(["shards_np1", "shards_np2", "shards_np4", "shards_s3_np2", "shards_s3_np4"], 46)  # every window
# --eval-only of the checkpoint is the evaluation the training run made at that step.
trained = [json.loads(l) for l in open("train.jsonl") if "eval_loss" in l][-1]
if trained != add:
    raise SystemExit(f"FAIL: during training at step 20: {trained}; --eval-only of its checkpoint: {add}")
print("the training run's evaluation at step 20 is the same:", trained)
PY

echo "== flags"
set +e
"$zt" --config "$cfg2" --eval-batches 4 > bad.log 2>&1; rc=$?
set -e
[ $rc -eq 2 ] && grep -q "replaced by --eval-sequences" bad.log || { cat bad.log; fail "--eval-batches: exit $rc"; }
echo "eval_world_size: all checks passed"
