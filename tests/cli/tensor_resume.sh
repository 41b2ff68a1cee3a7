#!/usr/bin/env bash
# zero-train's checkpoints across tensor, pipeline and data layouts (issue 19, "Resume"), end to
# end, on configs/cpu/grid2x2x2.json (2 tensor x 2 pipeline x 2 data, ZeRO 1, zb-h1, clipping
# 1.0) run in fp32 (bf16 off), so that the bounds below are fp32's:
#   1. on 8 ranks, 20 steps, saving at step 10: the reference;
#   2. its step-10 checkpoint resumes at the same layout: steps 11-20 bitwise equal;
#   3. and at (T=4, P=1, D=2) on 8 ranks, and on one rank (no grid), the same global batch of 96:
#      steps 11-20 within a relative 1e-5 (tests/mpi/tensor_equivalence_test bounds the
#      parameters at 2e-6 relative; only summation order differs: the tensor ranks' partial
#      sums, the data ranks' sums, the norm's parts; the largest gap is printed);
#   4. zero-train export of the grid's step-10 checkpoint and of a 1-rank run's own step-10
#      checkpoint (trained from scratch on the same data): the two files hold the same names
#      and shapes and their parameters agree within a relative L2 of 2e-6, the equivalence
#      test's bound; a 1-rank --init-from of the grid's export evaluates as the checkpoint
#      evaluates on the grid, within 1e-6.
# usage: tensor_resume.sh ZERO_TRAIN SOURCE_DIR WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
zt=$1 src=$2 work=$3
shift 3
mpirun=("$@")
cmp=$src/tests/cli/compare_losses.py
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export OPENBLAS_NUM_THREADS=1

# layout NAME TENSOR PIPELINE: the grid config in fp32 with another tensor and pipeline size.
layout() {
  python3 - "$src/configs/cpu/grid2x2x2.json" "$1.json" "$2" "$3" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["bf16"] = {"enabled": False}
c["zero_train"]["parallel"]["tensor"] = int(sys.argv[3])
c["zero_train"]["parallel"]["pipeline"] = int(sys.argv[4])
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
}
run() {
  local name=$1 cfg=$2 np=$3
  shift 3
  "${mpirun[@]}" -np "$np" "$zt" --config "$cfg" --steps 20 --metrics "$name.jsonl" "$@" > "$name.log" 2>&1 ||
    { cat "$name.log"; fail "$name failed"; }
}
from() {
  mkdir -p "$1" && cp -r ck/step_00000010 "$1/" && echo step_00000010 > "$1/latest"
}
layout grid 2 2
layout t4 4 1
layout one 1 1

echo "== 1. 2 tensor x 2 pipeline x 2 data on 8 ranks, 20 steps, saved at step 10"
run ref grid.json 8 --checkpoint-dir ck --save-interval 10
grep -q "pipeline: grid 2 data x 2 pipeline x 2 tensor" ref.log || { cat ref.log; fail "not the 3-D grid"; }
[ -d ck/step_00000010 ] || fail "no checkpoint at step 10"

echo "== 2. resumed at the same layout: bitwise"
from same
run same grid.json 8 --checkpoint-dir same --resume
grep -q "resumed from same/step_00000010 at step 10" same.log || { cat same.log; fail "did not resume from step 10"; }
python3 "$cmp" ref.jsonl same.jsonl 11 20 0

echo "== 3. resumed at 4 tensor x 1 pipeline x 2 data, and on one rank"
from to_t4 && run to_t4 t4.json 8 --checkpoint-dir to_t4 --resume
grep -q "tensor slicing: grid 2 data x 1 pipeline x 4 tensor" to_t4.log || { cat to_t4.log; fail "not 4 x 1 x 2"; }
python3 "$cmp" ref.jsonl to_t4.jsonl 11 20 1e-5
from to_one && run to_one one.json 1 --checkpoint-dir to_one --resume
python3 "$cmp" ref.jsonl to_one.jsonl 11 20 1e-5

echo "== 4. export: the grid's file against a 1-rank run's; --init-from"
run alone one.json 1 --checkpoint-dir ck_alone --save-interval 10
"$zt" export --checkpoint ck --tag step_00000010 --out grid.safetensors > export.log 2>&1 || { cat export.log; fail "export failed"; }
"$zt" export --checkpoint ck_alone --tag step_00000010 --out alone.safetensors > export_alone.log 2>&1 ||
  { cat export_alone.log; fail "export of the 1-rank run failed"; }
python3 - grid.safetensors alone.safetensors <<'PY'
import json, math, struct, sys
def load(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    h = json.loads(blob[8:8 + n]); h.pop("__metadata__", None)
    data = blob[8 + n:]
    out = {}
    for name, t in h.items():
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        out[name] = (t["shape"], struct.unpack_from("<%df" % ((b - a) // 4), data, a))
    return out
g, r = load(sys.argv[1]), load(sys.argv[2])
if set(g) != set(r): sys.exit("FAIL: the names differ: %s" % sorted(set(g) ^ set(r)))
num = den = 0.0
for name in r:
    if g[name][0] != r[name][0]: sys.exit("FAIL: %s has shape %s, the 1-rank file %s" % (name, g[name][0], r[name][0]))
    for x, y in zip(g[name][1], r[name][1]):
        num += (x - y) ** 2; den += y * y
d = math.sqrt(num / den)
print("exports: %d tensors, relative L2 difference %.3g" % (len(r), d))
if not d <= 2e-6: sys.exit("FAIL: the grid's export differs from the 1-rank export by %.3g" % d)
PY
"${mpirun[@]}" -np 1 "$zt" --config one.json --eval-only --init-from grid.safetensors --metrics init.jsonl > init.log 2>&1 ||
  { cat init.log; fail "--init-from the export failed"; }
from at10
"${mpirun[@]}" -np 8 "$zt" --config grid.json --eval-only --checkpoint-dir at10 --resume \
  --metrics grid_eval.jsonl > grid_eval.log 2>&1 || { cat grid_eval.log; fail "--eval-only on the grid failed"; }
python3 - init.jsonl grid_eval.jsonl <<'PY'
import json, sys
a, b = (json.loads(open(p).readline()) for p in sys.argv[1:3])
print("eval of the export on 1 rank: loss %.9g; of the checkpoint on the grid: %.9g" % (a["eval_loss"], b["eval_loss"]))
if abs(a["eval_loss"] - b["eval_loss"]) > 1e-6 * abs(b["eval_loss"]): sys.exit("FAIL: the evaluations differ")
for k in ("eval_exact_match",):
    if k in a and a[k] != b[k]: sys.exit("FAIL: %s %s vs %s" % (k, a[k], b[k]))
PY
echo "tensor resume: ok"
