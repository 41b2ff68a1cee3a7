#!/usr/bin/env bash
# Parameters on NVMe through zero-train (issue 20 item 3): configs/cpu/stage3_offload.json with
# offload_param.device "nvme" (every shard on the drive: max_in_cpu 0, 2 swap buffers, a fresh
# nvme_path) trains bitwise like offload_param "cpu" (losses equal to their 17 significant
# digits, steps 1-30) on 2 ranks; the swap files are gone after the run; the config reader does
# not call offload_param nvme "not implemented"; a missing nvme_path is exit 1 naming the path.
# The same on 2 pipeline stages (configs/cpu/pipeline2.json at ZeRO stage 3): each stage's
# process has its own swap directory (rank<r> counts every process of the grid). And with the
# optimizer state on the same nvme_path too (both tiers share the rank directory's store).
# usage: nvme_param.sh ZERO_TRAIN SOURCE_DIR WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
zt=$1 src=$2 work=$3
shift 3
mpirun=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work/nvme" && cd "$work"
export OPENBLAS_NUM_THREADS=1
python3 - "$src/configs/cpu/stage3_offload.json" "$work/nvme" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
json.dump(c, open("cpu.json", "w"), indent=2)
c["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": sys.argv[2], "pin_memory": True,
                                           "buffer_count": 2, "max_in_cpu": 0}
json.dump(c, open("nvme.json", "w"), indent=2)
both = json.loads(json.dumps(c))
both["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": sys.argv[2], "buffer_count": 2,
                                                  "pipeline_read": True, "pipeline_write": True}
json.dump(both, open("both.json", "w"), indent=2)
c["zero_optimization"]["offload_param"]["nvme_path"] = sys.argv[2] + "/missing"
json.dump(c, open("missing.json", "w"), indent=2)
PY
python3 - "$src/configs/cpu/pipeline2.json" "$work/nvme" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"] = {"stage": 3, "overlap_comm": True, "stage3_param_persistence_threshold": 1000,
                          "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
json.dump(c, open("pipe_cpu.json", "w"), indent=2)
c["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": sys.argv[2], "buffer_count": 2,
                                           "max_in_cpu": 0}
json.dump(c, open("pipe_nvme.json", "w"), indent=2)
PY
"${mpirun[@]}" -np 2 "$zt" --config cpu.json --steps 30 --metrics cpu.jsonl > cpu.log 2>&1 || { cat cpu.log; fail "run with offload_param cpu failed"; }
"${mpirun[@]}" -np 2 "$zt" --config nvme.json --steps 30 --metrics nvme.jsonl > nvme.log 2>&1 || { cat nvme.log; fail "run with offload_param nvme failed"; }
grep -q "parameters offloaded to NVMe" nvme.log || { cat nvme.log; fail "the start-up line does not say NVMe"; }
python3 "$src/tests/cli/compare_losses.py" cpu.jsonl nvme.jsonl 1 30 0
if grep -q "offload_param.*not implemented" nvme.log; then cat nvme.log; fail "offload_param nvme is still reported as not implemented"; fi
[ ! -e "$work/nvme/zero-swap" ] || { ls -R "$work/nvme"; fail "swap files left behind"; }
# Optimizer state and parameters on the same nvme_path: one swap store per rank directory.
"${mpirun[@]}" -np 2 "$zt" --config both.json --steps 30 --metrics both.jsonl > both.log 2>&1 || { cat both.log; fail "run with both tiers on nvme failed"; }
python3 "$src/tests/cli/compare_losses.py" cpu.jsonl both.jsonl 1 30 0
[ ! -e "$work/nvme/zero-swap" ] || { ls -R "$work/nvme"; fail "swap files left behind by the run with both tiers"; }
for n in pipe_cpu pipe_nvme; do
  "${mpirun[@]}" -np 2 "$zt" --config $n.json --steps 20 --metrics $n.jsonl > $n.log 2>&1 || { cat $n.log; fail "$n failed"; }
done
python3 "$src/tests/cli/compare_losses.py" pipe_cpu.jsonl pipe_nvme.jsonl 1 20 0
[ ! -e "$work/nvme/zero-swap" ] || { ls -R "$work/nvme"; fail "swap files left behind by the pipeline run"; }
rc=0
"${mpirun[@]}" -np 2 "$zt" --config missing.json --steps 3 > missing.log 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat missing.log; fail "a missing nvme_path exited $rc, not 1"; }
grep -q "setting up the engine and its NVMe swap files: nvme_path .$work/nvme/missing. does not exist" missing.log || { cat missing.log; fail "the error does not name the missing nvme_path"; }
echo "parameters on nvme: ok"
