#!/usr/bin/env bash
# zero-train with the optimizer state on NVMe (configs/cpu/nvme_offload.json; issue 20 items 2,
# 5 and 6). One case per call:
#   same      2 ranks, 12 steps: the losses are exactly those of configs/cpu/stage2_offload.json
#             (the same config with device "cpu"); the start-up report shows the state on NVMe
#             and the ledger's nvme columns, the step line and the metrics the swap's bytes; the
#             swap files are gone after the run;
#   pipeline  configs/cpu/pipeline2.json (2 stages) at ZeRO stage 1 with cpu offload and with
#             nvme, 2 ranks, 10 steps: the same losses exactly; each stage's swap under its own
#             world rank's directory;
#   missing   nvme_path does not exist: exit 1 naming the path, before step 1;
#   readonly  nvme_path on a read-only tmpfs: exit 1 naming the path;
#   full      nvme_path on a 64 KiB tmpfs, smaller than the state: exit 1 naming the file and
#             the full drive, nothing left behind;
#   capacity  configs/cpu/nvme_capacity.json, 1 rank: under zero_train.host_memory_limit (40 MB)
#             it trains a 16.8M-parameter GPT whose optimizer state on the drive is over 4x that
#             limit, the host's peak within it, the ledger showing device, host and nvme; the
#             losses are exactly those of the same run with the state in RAM (no limit); with
#             sub_group_size at its default (1e9) the same limit is a clear out-of-host-memory
#             error before step 1;
#   ioerror   the swap files are truncated under a running job (1 rank, checkpoints every 5
#             steps), once step 5's checkpoint is saved: exit 1 naming the file, the newest
#             saved checkpoint untouched (resuming from it trains on), no swap file left.
# readonly and full mount a tmpfs in a private mount namespace (unshare -m) and exit 77 (ctest:
# skipped) where the machine does not allow one.
# usage: nvme_offload.sh CASE ZERO_TRAIN SOURCE_DIR WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
case_=$1 zt=$2 src=$3 work=$4
shift 4
mpirun=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }
export OPENBLAS_NUM_THREADS=1

if { [ "$case_" = readonly ] || [ "$case_" = full ]; } && [ -z "${ZERO_TEST_MOUNT_NS:-}" ]; then
  unshare -m --propagation private true 2>/dev/null ||
    skip "cannot create a mount namespace here (unshare -m needs root or CAP_SYS_ADMIN)"
  ZERO_TEST_MOUNT_NS=1 exec unshare -m --propagation private bash "$0" "$case_" "$zt" "$src" "$work" "${mpirun[@]}"
fi
rm -rf "$work"
mkdir -p "$work"
cd "$work"
run() {  # run LOG COMMAND...: the exit code in $rc, the output in LOG
  set +e
  "${@:2}" > "$1" 2>&1
  rc=$?
  set -e
  if grep -Eq "Segmentation|Aborted|terminate called|core dumped" "$1"; then cat "$1"; fail "crashed: ${*:2}"; fi
}
config_at() {  # config_at DIR: configs/cpu/nvme_offload.json with nvme_path DIR, as nvme.json
  python3 - "$src/configs/cpu/nvme_offload.json" "$1" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"]["offload_optimizer"]["nvme_path"] = sys.argv[2]
json.dump(c, open("nvme.json", "w"), indent=1)
PY
}
fails_naming() {  # fails_naming LOG TEXT...: exit 1, each TEXT in the log, no step trained
  [ $rc -eq 1 ] || { cat "$1"; fail "expected exit 1, got $rc"; }
  local t
  for t in "${@:2}"; do grep -qF -- "$t" "$1" || { cat "$1"; fail "the error does not say '$t'"; }; done
  if grep -q "step 1/" "$1"; then cat "$1"; fail "a step ran"; fi
  echo "ok: exit 1: $(grep -m1 -i error "$1")"
}

case $case_ in
same)
  mkdir swap
  config_at "$work/swap"
  run cpu.log "${mpirun[@]}" -np 2 "$zt" --config "$src/configs/cpu/stage2_offload.json" --steps 12 --metrics cpu.jsonl
  [ $rc -eq 0 ] || { cat cpu.log; fail "the cpu-offload run failed"; }
  run nvme.log "${mpirun[@]}" -np 2 "$zt" --config nvme.json --steps 12 --metrics nvme.jsonl
  [ $rc -eq 0 ] || { cat nvme.log; fail "the nvme run failed"; }
  python3 "$src/tests/cli/compare_losses.py" cpu.jsonl nvme.jsonl 1 12 0
  grep -q "optimizer state on NVMe: .* in $work/swap/zero-swap/rank0" nvme.log || { cat nvme.log; fail "no NVMe line in the start-up report"; }
  grep -q "nvme now" nvme.log || { cat nvme.log; fail "the ledger shows no nvme column"; }
  # (written may be 0 B on a step line: the write-backs run on into the next step and count there)
  grep -Eq "step 12/12 \| .*\| nvme [0-9.]+ [KM]iB \(read [0-9.]+ [KM]iB, written [0-9.]+ ([KM]i)?B\)" nvme.log ||
    { cat nvme.log; fail "the step line shows no swap traffic"; }
  python3 - <<'PY' || fail "the metrics lack the swap's bytes"
import json
rows = [json.loads(l) for l in open("nvme.jsonl") if '"loss"' in l]
assert all(r["nvme_bytes"] > 0 and r["nvme_read_bytes"] > 0 for r in rows), rows[-1]
# Each step reads every group's state once: the same bytes every step but the first.
assert len({r["nvme_read_bytes"] for r in rows[1:]}) == 1, [r["nvme_read_bytes"] for r in rows]
# Every step writes it all back, a step's write-backs counted in the next report once done (a
# group is read only after its last write-back): all but the last step's are in the reports.
assert sum(r["nvme_written_bytes"] for r in rows) >= (len(rows) - 1) * rows[-1]["nvme_read_bytes"]
assert all("nvme_read_bytes" not in json.loads(l) for l in open("cpu.jsonl"))
PY
  # No file left (an empty zero-swap/ may stay: the rank that made it cannot remove it while the
  # other rank's directory is still there).
  [ -z "$(find swap -type f)" ] || fail "swap files left behind: $(find swap)"
  echo "ok: nvme losses == cpu offload losses, steps 1-12; report, step line, metrics; no files left"
  ;;
pipeline)
  mkdir swap
  python3 - "$src/configs/cpu/pipeline2.json" "$work/swap" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
z = c.setdefault("zero_optimization", {})
z["stage"] = 1
z["offload_optimizer"] = {"device": "cpu"}
json.dump(c, open("cpu.json", "w"), indent=1)
z["offload_optimizer"] = {"device": "nvme", "nvme_path": sys.argv[2], "buffer_count": 2,
                          "pipeline_read": True, "pipeline_write": True}
json.dump(c, open("nvme.json", "w"), indent=1)
PY
  run cpu.log "${mpirun[@]}" -np 2 "$zt" --config cpu.json --steps 10 --metrics cpu.jsonl
  [ $rc -eq 0 ] || { cat cpu.log; fail "the cpu-offload pipeline run failed"; }
  run nvme.log "${mpirun[@]}" -np 2 "$zt" --config nvme.json --steps 10 --metrics nvme.jsonl
  [ $rc -eq 0 ] || { cat nvme.log; fail "the nvme pipeline run failed"; }
  python3 "$src/tests/cli/compare_losses.py" cpu.jsonl nvme.jsonl 1 10 0
  grep -Eq "^ +1 +.* [0-9.]+ KiB$" nvme.log || { cat nvme.log; fail "the per-rank table shows no nvme bytes for rank 1"; }
  [ -z "$(find swap -type f)" ] || fail "swap files left behind: $(find swap)"
  echo "ok: pipeline stages with nvme train as with cpu offload, steps 1-10"
  ;;
missing)
  config_at "$work/no/such/dir"
  run missing.log "$zt" --config nvme.json --steps 2
  fails_naming missing.log "$work/no/such/dir"
  ;;
readonly)
  mkdir fs
  mount -t tmpfs -o size=4m zero-test fs 2>/dev/null || skip "mounting a tmpfs is not permitted here"
  mount -o remount,ro fs
  config_at "$work/fs"
  run ro.log "$zt" --config nvme.json --steps 2
  fails_naming ro.log "$work/fs" "read-only"
  umount fs
  ;;
full)
  mkdir fs
  mount -t tmpfs -o size=64k zero-test fs 2>/dev/null || skip "mounting a tmpfs is not permitted here"
  config_at "$work/fs"
  run full.log "$zt" --config nvme.json --steps 2
  fails_naming full.log "$work/fs/zero-swap/rank0/" "No space left on device"
  [ -z "$(find fs -name '*.swp')" ] || fail "swap files left behind: $(find fs)"
  umount fs
  ;;
capacity)
  mkdir swap
  python3 - "$src/configs/cpu/nvme_capacity.json" "$work/swap" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"]["offload_optimizer"]["nvme_path"] = sys.argv[2]
json.dump(c, open("nvme.json", "w"), indent=1)
c["zero_optimization"]["sub_group_size"] = 1000000000
json.dump(c, open("whole.json", "w"), indent=1)
c["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
del c["zero_train"]["host_memory_limit"]
json.dump(c, open("ram.json", "w"), indent=1)
PY
  run nvme.log "$zt" --config nvme.json --metrics nvme.jsonl
  [ $rc -eq 0 ] || { cat nvme.log; fail "the capacity run failed"; }
  grep -Eq "category +device now +device peak +host now +host peak +nvme now +nvme peak" nvme.log ||
    { cat nvme.log; fail "the ledger does not show device, host and nvme"; }
  python3 - nvme.jsonl 40000000 <<'PY' || { cat nvme.log; fail "capacity"; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
limit = int(sys.argv[2])
assert len(rows) == 3, rows
for r in rows:
    assert r["host_peak_bytes"] <= limit, (r["host_peak_bytes"], limit)
    assert r["nvme_bytes"] >= 4 * limit, (r["nvme_bytes"], limit)
    assert r["device_bytes"] > 0
r = rows[-1]
print(f"ok: optimizer state on the drive {r['nvme_bytes']} B = {r['nvme_bytes'] / limit:.2f} x the host "
      f"limit {limit} B; host peak {r['host_peak_bytes']} B; device {r['device_bytes']} B")
PY
  run ram.log "$zt" --config ram.json --metrics ram.jsonl
  [ $rc -eq 0 ] || { cat ram.log; fail "the same run in RAM failed"; }
  python3 "$src/tests/cli/compare_losses.py" ram.jsonl nvme.jsonl 1 3 0
  run whole.log "$zt" --config whole.json
  fails_naming whole.log "out of host memory" "zero_train.host_memory_limit"
  [ -z "$(find swap -type f)" ] || fail "swap files left behind: $(find swap)"
  ;;
ioerror)
  mkdir swap
  python3 - "$src/configs/cpu/nvme_capacity.json" "$work/swap" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"]["offload_optimizer"]["nvme_path"] = sys.argv[2]
c["zero_optimization"]["sub_group_size"] = 20000
c["zero_train"]["steps"] = 2000  # far more than the truncation needs: the run never ends first
c["zero_train"]["model"] = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "seq_len": 16}
json.dump(c, open("nvme.json", "w"), indent=1)
PY
  set +e
  "$zt" --config nvme.json --checkpoint-dir ck --save-interval 5 > io.log 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -q "saved ck/step_00000005" io.log && break; sleep 0.05; done
  grep -q "saved ck/step_00000005" io.log || { kill $pid; cat io.log; fail "no checkpoint at step 5"; }
  find swap -name '*.swp' -exec truncate -c -s 0 {} +  # -c: never create one the run removed
  wait $pid
  rc=$?
  set -e
  if grep -Eq "Segmentation|Aborted|terminate called|core dumped" io.log; then cat io.log; fail "crashed"; fi
  [ $rc -eq 1 ] || { cat io.log; fail "expected exit 1 after the swap files were truncated, got $rc"; }
  grep -Eq "$work/swap/zero-swap/rank0/opt-g[0-9.]+\.swp: read of [0-9]+ bytes .* truncated" io.log ||
    { cat io.log; fail "the error does not name the truncated swap file"; }
  grep -q "step 2000/" io.log && fail "the run went on to the end"
  [ -z "$(find swap -type f)" ] || fail "swap files left behind: $(find swap)"
  # The newest checkpoint (step 5, or a later one the run saved before the truncation took
  # effect) is whole: a resumed run (fresh swap files) trains from it.
  latest=$(cat ck/latest)
  [[ $latest =~ ^step_0*([0-9]+)$ ]] || fail "ck/latest is '$latest'"
  at=${BASH_REMATCH[1]}
  [ "$at" -ge 5 ] && [ "$at" -lt 2000 ] || fail "ck/latest names step $at"
  python3 - $((at + 2)) <<'PY'
import json, sys
c = json.load(open("nvme.json"))
c["zero_train"]["steps"] = int(sys.argv[1])
json.dump(c, open("resume.json", "w"), indent=1)
PY
  run resume.log "$zt" --config resume.json --checkpoint-dir ck --resume
  [ $rc -eq 0 ] || { cat resume.log; fail "resuming from step $at failed"; }
  grep -q "resumed from ck/$latest at step $at" resume.log || { cat resume.log; fail "not resumed from $latest"; }
  grep -q "step $((at + 2))/$((at + 2))" resume.log || { cat resume.log; fail "the resumed run did not reach step $((at + 2))"; }
  echo "ok: exit 1 naming $(grep -Eo 'opt-g[0-9.]+\.swp' io.log | head -1); step $at's checkpoint resumed; no files left"
  ;;
*) fail "unknown case $case_" ;;
esac
