#!/usr/bin/env bash
# Training across two hosts over TCP keeps moving (zero-train; docs/collectives.md): a job of NP
# ranks on two hosts made of network namespaces (tests/cli/netns_hosts.sh; NP/2 ranks each,
# TCP between them, shared memory within, mpirun on a third like a login node) trains STEPS
# steps of each config under a 6 s watchdog and must end with exit code 0. A transport that
# leaves a message waiting for seconds (as a ring all-gather waited for by polling did over
# Open MPI's TCP transport: steps stalled 4-240 s) lets the watchdog end the job with exit
# code 3, and the test fails. This is a liveness check, not a speed one: any step that finishes
# within the watchdog's limit passes. Exit 77 (skipped) where namespaces are not allowed.
# usage: tcp_hosts.sh NP ZERO_TRAIN SOURCE_DIR WORK_DIR STEPS CONFIG... -- MPIRUN [MPIRUN ARGS...]
set -uo pipefail
np=$1 zt=$2 src=$3 work=$4 steps=$5
shift 5
configs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do configs+=("$1"); shift; done
[ $# -gt 0 ] || { echo "FAIL: usage: no -- before the mpirun command" >&2; exit 1; }
shift
mpirun=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$src/tests/cli/netns_lib.sh"
rm -rf "$work"
mkdir -p "$work"
cd "$work" || exit 1
export OPENBLAS_NUM_THREADS=1

netns_begin zt

for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .json)
  netns_mpirun "$np" "${mpirun[@]}" -- \
    "$zt" --config "$cfg" --steps "$steps" --watchdog-timeout 6 --metrics "$name.jsonl" \
    > "$name.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    tail -30 "$name.log"
    fail "$name: exit code $rc (3: the watchdog ended a job that stopped moving over TCP)"
  fi
  grep -q "step $steps/$steps " "$name.log" || { tail -30 "$name.log"; fail "$name: no step $steps"; }
  grep -q "^zero-train: $np rank(s)" "$name.log" || { head -5 "$name.log"; fail "$name: not $np ranks"; }
  n=$(grep -c '"loss"' "$name.jsonl")
  [ "$n" -eq "$steps" ] || fail "$name: $n metrics lines for $steps steps"
  echo "$name: $steps steps on $np ranks across hosts h1 and h2, exit 0"
done
