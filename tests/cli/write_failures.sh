#!/usr/bin/env bash
# Every file zero-train writes reports its failure (issue 16, item 5): the metrics file, the
# exported safetensors and the standard output. An unwritable --metrics path is a usage error
# before training (exit 2); a write that fails later ends the run on every rank (exit 1); both
# name the file and the system's reason. /dev/full fails every write with ENOSPC, as a full disk
# does.
# usage: write_failures.sh ZERO_TRAIN SOURCE_DIR WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
zt=$1 src=$2 work=$3
shift 3
mpirun=("$@")
cfg=$src/tests/data/configs/resume_stage2.json
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export OPENBLAS_NUM_THREADS=1

# expect RC REGEX [REJECT] -- command...: the exit code, a line matching REGEX, no crash, and
# nothing matching REJECT (when given).
expect() {
  local want=$1 regex=$2 reject=
  shift 2
  if [ "$1" != "--" ]; then reject=$1; shift; fi
  shift
  set +e
  timeout 150 "$@" > out.log 2>&1
  local got=$?
  set -e
  [ $got -ne 124 ] || { cat out.log; fail "hung: $*"; }
  [ $got -eq "$want" ] || { cat out.log; fail "exit $got, expected $want: $*"; }
  grep -Eq "$regex" out.log || { cat out.log; fail "no '$regex' in the output of: $*"; }
  if [ -n "$reject" ] && grep -Eq "$reject" out.log; then cat out.log; fail "'$reject' in the output of: $*"; fi
  grep -Eq "Segmentation|Aborted|terminate called|core dumped" out.log && { cat out.log; fail "crashed: $*"; }
  echo "ok: exit $got, '$regex': ${*: -2}"
}

echo "== the metrics file"
# Full: the first line fails; both ranks stop after step 1, exit 1.
expect 1 "writing the metrics file '/dev/full' failed: No space left on device" -- \
  "${mpirun[@]}" -np 2 "$zt" --config "$cfg" --metrics /dev/full
grep -q "step 1/20" out.log || fail "the run did not start before the write failed"
grep -q "step 2/20" out.log && fail "the run went on after the metrics write failed"
# Unwritable at start: exit 2 before the model is even built (no step, no ledger).
expect 2 "cannot open the metrics file 'no_such_dir/m.jsonl' for appending: No such file or directory" "step 1/|ledger" -- \
  "${mpirun[@]}" -np 2 "$zt" --config "$cfg" --metrics no_such_dir/m.jsonl
# A directory nobody may create files in, not even root (sysfs): EACCES.
expect 2 "cannot open the metrics file '/sys/zero-metrics-test.jsonl' for appending: Permission denied" "step 1/" -- \
  "$zt" --config "$cfg" --metrics /sys/zero-metrics-test.jsonl
mkdir -p a_directory
expect 2 "metrics file 'a_directory' for appending: Is a directory" "step 1/" -- \
  "$zt" --config "$cfg" --metrics a_directory
# A good run still writes every line, and closes the file cleanly.
"${mpirun[@]}" -np 2 "$zt" --config "$cfg" --checkpoint-dir ck --metrics ok.jsonl > ok.log 2>&1 || { cat ok.log; fail "a normal run failed"; }
[ "$(grep -c '"loss"' ok.jsonl)" = 20 ] || fail "ok.jsonl has $(grep -c '"loss"' ok.jsonl) step lines, not 20"

echo "== export"
# Through a symlink, so that a regression (a temporary file renamed over the target) replaces
# the link in this directory and never /dev/full itself.
ln -s /dev/full full.safetensors
expect 1 "full.safetensors' failed: No space left on device" -- "$zt" export --checkpoint ck --out full.safetensors
[ "$(readlink full.safetensors)" = /dev/full ] || fail "export replaced the symlink to /dev/full with a file"
expect 1 "no_such_dir/model.safetensors.*No such file or directory" -- "$zt" export --checkpoint ck --out no_such_dir/model.safetensors
expect 1 "'a_directory'.*it is a directory" -- "$zt" export --checkpoint ck --out a_directory
"$zt" export --checkpoint ck --out good.safetensors > export.log 2>&1 || { cat export.log; fail "a normal export failed"; }

echo "== the standard output"
expect 1 "writing the standard output failed: No space left on device" -- \
  sh -c "'$zt' --config '$cfg' --validate > /dev/full"
echo "write_failures: all checks passed"
