#!/usr/bin/env bash
# Non-finite values never train "successfully" (issue 16, item 4), on 2 ranks:
#   1. --init-from a safetensors file with a NaN (an export, poked): exit 2, naming the file and
#      the tensor, before any step;
#   2. --resume from a checkpoint whose master weights hold an infinity (checksums made valid
#      again, as a run that saved a diverged state would leave it): exit 1 naming the rank file
#      and the parameter;
#   3. a run whose every step overflows (fp16 with a static loss scale of 1e30) stops at the
#      configured bound of skipped steps in a row, and at the default bound (20), exit 1;
#   4. a run resumed from a checkpoint with a finite weight so large (3e38) that the forward
#      pass overflows: every step NaN and skipped, fewer of them than the bound: exit 1 at the end
#      instead of "done";
#   5. a checkpoint with a negative Adam second moment makes the next update NaN: the save of
#      that state is refused (exit 1) and the checkpoint it came from stays the newest;
#   6. every metrics line of these runs is strict JSON (no bare NaN or Infinity), a non-finite
#      value being null plus "non_finite".
# usage: nonfinite.sh ZERO_TRAIN SOURCE_DIR WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
zt=$1 src=$2 work=$3
shift 3
mpirun=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export OPENBLAS_NUM_THREADS=1
poke=(python3 "$src/tests/cli/poke_nonfinite.py")

expect() {  # expect RC REGEX -- command...
  local want=$1 regex=$2
  shift 3
  set +e
  "$@" > out.log 2>&1
  local got=$?
  set -e
  [ $got -eq "$want" ] || { cat out.log; fail "exit $got, expected $want: $*"; }
  grep -Eq "$regex" out.log || { cat out.log; fail "no '$regex' in the output of: $*"; }
  grep -Eq "Segmentation|Aborted|terminate called|core dumped|MPI_ABORT" out.log && { cat out.log; fail "crashed: $*"; }
  echo "ok: exit $got, '$regex'"
}

# A tiny fp32 run, its checkpoint and the export of its weights: the material for 1 and 2.
cat > base.json <<'EOF'
{
  "train_micro_batch_size_per_gpu": 4,
  "steps_per_print": 1,
  "gradient_clipping": 1.0,
  "optimizer": { "type": "AdamW", "params": { "lr": 2e-3 } },
  "zero_optimization": { "stage": 2 },
  "zero_train": { "device": "cpu", "model": { "preset": "tiny" } }
}
EOF
"${mpirun[@]}" -np 2 "$zt" --config base.json --steps 2 --checkpoint-dir ck --metrics m0.jsonl > run0.log 2>&1 || { cat run0.log; fail "the reference run failed"; }
"$zt" export --checkpoint ck --out model.safetensors > /dev/null

echo "== 1. --init-from a file with a NaN"
"${poke[@]}" safetensors model.safetensors h.1.mlp.c_fc.weight 1234 nan
expect 2 "model\.safetensors.*tensor 'h\.1\.mlp\.c_fc\.weight' holds 1 non-finite value.*nan at element 1234" -- \
  "${mpirun[@]}" -np 2 "$zt" --config base.json --steps 2 --init-from model.safetensors --metrics m1.jsonl
grep -q "HINT" out.log || { cat out.log; fail "no HINT"; }
grep -q "step 1/" out.log && { cat out.log; fail "trained from NaN weights"; }

echo "== 2. --resume from a checkpoint holding an infinity in its master weights"
cp -r ck damaged
file=$("${poke[@]}" checkpoint damaged/step_00000002 master h.1.attn.c_proj.weight 77 inf | sed 's/:.*//')
echo "poked $file"
expect 1 "$(basename "$file").*array 'master' holds a non-finite value \(inf\) for parameter 'h\.1\.attn\.c_proj\.weight' at element 77" -- \
  "${mpirun[@]}" -np 2 "$zt" --config base.json --steps 4 --checkpoint-dir damaged --resume --metrics m2.jsonl
grep -q "step 3/" out.log && { cat out.log; fail "trained from a damaged checkpoint"; }

echo "== 3. every step overflows: the run stops at the bound, exit 1"
cat > overflow.json <<'EOF'
{
  "train_micro_batch_size_per_gpu": 4,
  "steps_per_print": 1,
  "fp16": { "enabled": true, "loss_scale": 1e30 },
  "optimizer": { "type": "AdamW", "params": { "lr": 2e-3 } },
  "zero_optimization": { "stage": 1 },
  "zero_train": { "device": "cpu", "model": { "preset": "tiny" }, "max_consecutive_skipped_steps": 4 }
}
EOF
expect 1 "training stopped at step 4: 4 steps in a row did not train.*max_consecutive_skipped_steps allows \(4\)" -- \
  "${mpirun[@]}" -np 2 "$zt" --config overflow.json --steps 30 --checkpoint-dir ck3 --save-interval 2 --metrics m3.jsonl
grep -q "HINT" out.log || { cat out.log; fail "no HINT"; }
grep -q "step 5/" out.log && { cat out.log; fail "went on past the bound"; }
# The step that stops the run is not saved (step 2's skipped steps left a finite state: saved).
grep -q "The newest checkpoint, ck3/step_00000002, is kept" out.log || { cat out.log; fail "the kept checkpoint is not named"; }
[ ! -e ck3/step_00000004 ] || fail "the stopping step was saved"
sed 's/, "max_consecutive_skipped_steps": 4//' overflow.json > overflow_default.json
expect 1 "training stopped at step 20: 20 steps in a row" -- \
  "${mpirun[@]}" -np 2 "$zt" --config overflow_default.json --steps 30 --metrics m3d.jsonl

echo "== 4. a checkpoint whose weights overflow the forward pass (finite, 3e38, so it loads):"
echo "   every resumed step is NaN and skipped; a run shorter than the bound still fails, exit 1"
cp -r ck huge
"${poke[@]}" checkpoint huge/step_00000002 master h.0.mlp.c_fc.weight 5 3e38
expect 1 "the run ended at step 6 without one step that trained: all 4" -- \
  "${mpirun[@]}" -np 2 "$zt" --config base.json --steps 6 --checkpoint-dir huge --resume --metrics m4.jsonl
grep -q "step 6/6 | loss -\?nan" out.log || { cat out.log; fail "the steps were not NaN"; }
[ "$(cat huge/latest)" = step_00000002 ] || fail "latest is '$(cat huge/latest)', not step_00000002"

echo "== 5. a checkpoint with a negative Adam second moment (finite, so it loads) makes step 3's"
echo "   update NaN: the save of that state is refused, exit 1; latest stays step 2"
cp -r ck negv
"${poke[@]}" checkpoint negv/step_00000002 exp_avg_sq h.1.mlp.c_proj.weight 9 -1
expect 1 "checkpoint negv/step_00000003.*the model state is not finite \(master of parameter h\.1\.mlp\.c_proj\.weight, element 9, is -?nan\).*not saved" -- \
  "${mpirun[@]}" -np 2 "$zt" --config base.json --steps 6 --checkpoint-dir negv --resume --save-interval 1 --metrics m5.jsonl
[ "$(cat negv/latest)" = step_00000002 ] || fail "latest is '$(cat negv/latest)', not step_00000002"
[ ! -e negv/step_00000003 ] || fail "the non-finite state of step 3 was saved"

echo "== 6. every metrics line is strict JSON"
python3 - m0.jsonl m3.jsonl m3d.jsonl m4.jsonl m5.jsonl <<'PY'
import json, math, sys
def refuse(name):
    raise ValueError(f"bare {name} in a metrics line")
nonfinite = 0
for path in sys.argv[1:]:
    for n, line in enumerate(open(path), 1):
        row = json.loads(line, parse_constant=refuse)
        for k, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                sys.exit(f"{path}:{n}: {k} = {v}")
        if row.get("loss") is None and "loss" in row:
            if row.get("non_finite", {}).get("loss") not in ("nan", "inf", "-inf"):
                sys.exit(f"{path}:{n}: loss is null without non_finite naming it: {line}")
            nonfinite += 1
if nonfinite == 0:
    sys.exit("no metrics line had a non-finite loss: the check saw nothing")
print(f"all metrics lines parse strictly; {nonfinite} carry a non-finite loss as null + non_finite")
PY
echo "nonfinite: all checks passed"
