#!/usr/bin/env bash
# Cores no rank may use are named at start-up (issue 21, item 4): one rank bound to one core of
# a machine with more cores (what `mpirun -np 1` does by default with Open MPI) gets the warning
# and its advice; the same rank unbound does not. Skipped (exit 77) on a 1-core machine, where
# no core can be idle.
# usage: idle_cores.sh ZERO_TRAIN CONFIG WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
zt=$1 config=$2 work=$3
shift 3
mpirun=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }
cores=$(getconf _NPROCESSORS_ONLN)
[ "$cores" -ge 2 ] || { echo "SKIP: this machine has $cores core: nothing can be idle"; exit 77; }
rm -rf "$work"
mkdir -p "$work"

run() {  # run NAME BIND: one step on one rank with mpirun's --bind-to BIND
  local rc=0
  "${mpirun[@]}" -np 1 --bind-to "$2" "$zt" --config "$config" --steps 1 \
    --metrics "$work/$1.jsonl" > "$work/$1.log" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { cat "$work/$1.log"; fail "$1: exit $rc"; }
  cat "$work/$1.log"
}

run bound core
grep -q "^warning: the 1 rank on this node may run on 1 of its [0-9]* cores (their CPU affinity), so [0-9]* cores\? stays\? idle" "$work/bound.log" ||
  fail "bound to one core: no warning about the idle cores"
grep -q "HINT: .*mpirun --bind-to none" "$work/bound.log" || fail "bound to one core: no advice"
grep -q "host threads per rank: 1 (" "$work/bound.log" || fail "bound to one core: not 1 thread"

run unbound none
grep -q "stays\? idle" "$work/unbound.log" && fail "unbound: warned about idle cores"
grep -q "host threads per rank: [0-9]* (" "$work/unbound.log" || fail "unbound: no thread line"
echo "ok: the bound rank is told about the idle cores, the unbound one is not"
