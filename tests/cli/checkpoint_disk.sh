#!/usr/bin/env bash
# zero-train's checkpoint directory under real disk faults (issue 16, item 7). One case per call:
#   full      a disk that fills during a save (tmpfs of 12 MiB, 2 ranks, ~5 MB per checkpoint):
#             exit 1 naming the file and "No space left on device", no temporary directory
#             left; after freeing space the previous checkpoint resumes with the uninterrupted
#             run's losses exactly;
#   latest    a save whose last step, writing DIR/latest, fails (a file bind-mounted over latest
#             makes the rename fail with EBUSY): exit 1, the new checkpoint complete; --resume
#             then takes it, not the older one latest names, and says so;
#   leftover  saves killed (SIGKILL) before and after sealing: the next start removes the
#             unsealed temporary directory and installs the sealed one, logging both; the
#             resumed losses are the uninterrupted run's;
#   readonly  a read-only checkpoint directory: exit 2 at start, before step 1;
#   nearly    a filesystem smaller than one checkpoint: exit 2 at start naming the bytes needed
#             and available; with --no-space-check the run starts and its first save fails
#             cleanly (exit 1, nothing left behind).
# The cases that mount filesystems run in a private mount namespace (unshare -m) and exit 77
# (ctest: skipped) where the machine does not allow one.
# usage: checkpoint_disk.sh CASE ZERO_TRAIN SOURCE_DIR WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
case_=$1 zt=$2 src=$3 work=$4
shift 4
mpirun=("$@")
cfg=$src/tests/data/configs/resume_stage2.json
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }
export OPENBLAS_NUM_THREADS=1

needs_mounts=1
[ "$case_" = leftover ] && needs_mounts=0
if [ $needs_mounts = 1 ] && [ -z "${ZERO_TEST_MOUNT_NS:-}" ]; then
  unshare -m --propagation private true 2>/dev/null ||
    skip "cannot create a mount namespace here (unshare -m needs root or CAP_SYS_ADMIN)"
  ZERO_TEST_MOUNT_NS=1 exec unshare -m --propagation private bash "$0" "$case_" "$zt" "$src" "$work" "${mpirun[@]}"
fi
rm -rf "$work"
mkdir -p "$work"
cd "$work"
# A tmpfs of SIZE at ./fs; its free space is exact, in pages.
small_fs() {
  mkdir -p fs
  mount -t tmpfs -o "size=$1" zero-test fs 2>/dev/null || skip "mounting a tmpfs is not permitted here"
}
run() {  # run LOG COMMAND...: the exit code in $rc, the output in LOG
  set +e
  "${@:2}" > "$1" 2>&1
  rc=$?
  set -e
  if grep -Eq "Segmentation|Aborted|terminate called|core dumped" "$1"; then cat "$1"; fail "crashed: ${*:2}"; fi
}
no_leftovers() {  # no dot-directory or temporary file of a save in $1
  local left
  left=$(find "$1" -maxdepth 1 -name '.*' ! -name . -o -maxdepth 1 -name 'latest.tmp.*' | tr '\n' ' ')
  [ -z "$left" ] || fail "leftovers in $1: $left"
}
reference() {  # the uninterrupted run's losses on $1 ranks, in m0.jsonl
  run ref.log "${mpirun[@]}" -np "$1" "$zt" --config "$cfg" --metrics m0.jsonl
  [ $rc -eq 0 ] || { cat ref.log; fail "the reference run failed"; }
}
same_losses() { python3 "$src/tests/cli/compare_losses.py" m0.jsonl "$1" "$2" "$3" 0; }

case $case_ in
full)
  reference 2
  small_fs 12m
  echo "== saves every 5 steps into 12 MiB: steps 5 and 10 fit, step 15 does not"
  run full.log "${mpirun[@]}" -np 2 "$zt" --config "$cfg" --checkpoint-dir fs/ck --save-interval 5 --metrics m1.jsonl
  cat full.log | grep -E "error|HINT|removed|untouched|checkpoint" || true
  [ $rc -eq 1 ] || { cat full.log; fail "exit $rc, expected 1"; }
  grep -q "No space left on device" full.log || fail "the error does not say 'No space left on device'"
  grep -q "fs/ck/.step_00000015.tmp" full.log || fail "the error does not name the file being written"
  grep -q "was removed; every earlier checkpoint is untouched" full.log || fail "the error does not say the save was cleaned up"
  no_leftovers fs/ck
  [ ! -e fs/ck/step_00000015 ] || fail "a step_00000015 exists"
  [ "$(cat fs/ck/latest)" = step_00000010 ] || fail "latest is '$(cat fs/ck/latest)'"
  echo "== after removing step 5 (room for one more), --resume continues from step 10 exactly"
  rm -rf fs/ck/step_00000005
  run resume.log "${mpirun[@]}" -np 2 "$zt" --config "$cfg" --checkpoint-dir fs/ck --resume --metrics m2.jsonl
  [ $rc -eq 0 ] || { cat resume.log; fail "resume failed"; }
  grep -q "resumed from fs/ck/step_00000010 at step 10" resume.log || { cat resume.log; fail "did not resume from step 10"; }
  same_losses m2.jsonl 11 20
  ;;
latest)
  reference 1
  echo "== killed in the third save: step 5 and 10 complete, latest names step 10"
  run kill.log env ZERO_FAULT_KILL_DURING_SAVE=0:3 "$zt" --config "$cfg" --checkpoint-dir ck --save-interval 5 --metrics m1.jsonl
  [ $rc -ne 0 ] && grep -q "kills itself during save 3" kill.log || { cat kill.log; fail "the fault was not injected"; }
  [ "$(cat ck/latest)" = step_00000010 ] || fail "latest is '$(cat ck/latest)'"
  echo "== latest pinned by a bind mount: resuming from 10, the save of 15 cannot replace latest"
  cp ck/latest latest.pinned
  mount --bind latest.pinned ck/latest 2>/dev/null || skip "bind mounts are not permitted here"
  run fail.log "$zt" --config "$cfg" --checkpoint-dir ck --resume --save-interval 5 --metrics m2.jsonl
  umount ck/latest
  grep -E "error|HINT" fail.log || true
  [ $rc -eq 1 ] || { cat fail.log; fail "exit $rc, expected 1"; }
  grep -q "is complete, but 'ck/latest' could not be updated" fail.log || { cat fail.log; fail "no message about latest"; }
  grep -q "Device or resource busy" fail.log || { cat fail.log; fail "the system's error is not given"; }
  [ -e ck/step_00000015/COMPLETE ] || fail "step_00000015 is not complete"
  [ "$(cat ck/latest)" = step_00000010 ] || fail "latest is '$(cat ck/latest)', expected the stale step_00000010"
  no_leftovers ck
  echo "== export without --tag takes step 15, the newest complete checkpoint, and says why"
  run export.log "$zt" export --checkpoint ck --out model.safetensors
  [ $rc -eq 0 ] && grep -q "ck/step_00000015 -> model.safetensors" export.log || { cat export.log; fail "export did not take step 15"; }
  grep -q "taking 'step_00000015'" export.log || { cat export.log; fail "export did not say why"; }
  echo "== --resume takes step 15 too, and says why"
  run resume.log "$zt" --config "$cfg" --checkpoint-dir ck --resume --metrics m3.jsonl
  [ $rc -eq 0 ] || { cat resume.log; fail "resume failed"; }
  grep "taking 'step_00000015'" resume.log || { cat resume.log; fail "no note on the choice"; }
  grep -q "names 'step_00000010', but 'step_00000015' was committed after it" resume.log || fail "the note does not say why"
  grep -q "resumed from ck/step_00000015 at step 15" resume.log || fail "did not resume from step 15"
  same_losses m3.jsonl 16 20
  ;;
leftover)
  reference 2
  echo "== killed after rank 0 sealed the second save (before its rename)"
  run kill1.log "${mpirun[@]}" -np 2 -x ZERO_FAULT_KILL_DURING_SAVE=0:2:sealed "$zt" --config "$cfg" --checkpoint-dir ck --save-interval 5 --metrics m1.jsonl
  [ $rc -ne 0 ] && grep -q "kills itself during save 2, after sealing it" kill1.log || { cat kill1.log; fail "the fault was not injected"; }
  [ -e ck/.step_00000010.tmp/COMPLETE ] || fail "no sealed .step_00000010.tmp"
  echo "== the next start installs it, resumes from it, and is killed in its first save (unsealed)"
  run kill2.log "${mpirun[@]}" -np 2 -x ZERO_FAULT_KILL_DURING_SAVE=1:1 "$zt" --config "$cfg" --checkpoint-dir ck --resume --save-interval 5 --metrics m2.jsonl
  grep -q "checkpoint: installed 'ck/.step_00000010.tmp' as 'ck/step_00000010'" kill2.log || { cat kill2.log; fail "the sealed save was not installed (logged)"; }
  grep -q "resumed from ck/step_00000010 at step 10" kill2.log || { cat kill2.log; fail "did not resume from step 10"; }
  [ $rc -ne 0 ] && grep -q "kills itself during save 1" kill2.log || { cat kill2.log; fail "the second fault was not injected"; }
  [ -d ck/.step_00000015.tmp ] || fail "the killed save left no .step_00000015.tmp"
  echo "== the next start removes the unsealed one (logged) and resumes from step 10 exactly"
  run resume.log "${mpirun[@]}" -np 2 "$zt" --config "$cfg" --checkpoint-dir ck --resume --metrics m3.jsonl
  [ $rc -eq 0 ] || { cat resume.log; fail "resume failed"; }
  grep -q "checkpoint: removed 'ck/.step_00000015.tmp', left by an interrupted or failed save" resume.log || { cat resume.log; fail "the removal was not logged"; }
  grep -q "resumed from ck/step_00000010 at step 10" resume.log || fail "did not resume from step 10"
  no_leftovers ck
  same_losses m3.jsonl 11 20
  ;;
readonly)
  small_fs 64m
  mkdir -p fs/ck
  mount -o remount,ro fs
  run ro.log "${mpirun[@]}" -np 2 "$zt" --config "$cfg" --checkpoint-dir fs/ck --save-interval 5 --metrics m.jsonl
  cat ro.log | grep -E "error|HINT" || true
  [ $rc -eq 2 ] || { cat ro.log; fail "exit $rc, expected 2"; }
  grep -q "cannot create a file in the checkpoint directory 'fs/ck'" ro.log || fail "no message naming the directory"
  grep -q "Read-only file system" ro.log || fail "the system's error is not given"
  ! grep -q "^step 1/" ro.log || fail "training started"
  echo "== a directory it cannot create"
  run ro2.log "$zt" --config "$cfg" --checkpoint-dir fs/ck/sub/dir --metrics m.jsonl
  [ $rc -eq 2 ] && grep -q "cannot create the directory 'fs/ck/sub/dir'" ro2.log || { cat ro2.log; fail "exit $rc or no message"; }
  ;;
nearly)
  small_fs 3m
  run nearly.log "${mpirun[@]}" -np 2 "$zt" --config "$cfg" --checkpoint-dir fs/ck --save-interval 5 --metrics m.jsonl
  grep -E "error|HINT" nearly.log || true
  [ $rc -eq 2 ] || { cat nearly.log; fail "exit $rc, expected 2"; }
  grep -Eq "fs/ck has [0-9]+ bytes \(3\.00 MiB\) free, but one checkpoint of this run needs [0-9]+" nearly.log || fail "no message with the bytes"
  grep -q "HINT: free at least" nearly.log || fail "no hint"
  ! grep -q "^step 1/" nearly.log || fail "training started"
  echo "== --no-space-check: the run starts; its first save fails cleanly"
  run forced.log "$zt" --config "$cfg" --checkpoint-dir fs/ck --save-interval 5 --no-space-check --metrics m.jsonl
  grep -E "warning|error" forced.log || true
  [ $rc -eq 1 ] || { cat forced.log; fail "exit $rc, expected 1"; }
  grep -q "going on as --no-space-check asks" forced.log || fail "no warning"
  grep -q "No space left on device" forced.log || fail "the save's error is not given"
  no_leftovers fs/ck
  [ -z "$(ls -A fs/ck)" ] || fail "fs/ck is not empty: $(ls -A fs/ck)"
  ;;
*) fail "unknown case '$case_'" ;;
esac
echo "checkpoint_disk $case_: all checks passed"
