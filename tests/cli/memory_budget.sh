#!/usr/bin/env bash
# A model that does not fit the memory a rank really has is the ledger's error at start-up
# (exit 1, the budget and where it came from, the ledger table), before anything large is
# allocated: never the kernel's OOM killer (issue 16, item 3). Two ranks, no limit in the config.
#   physical   the budget from the host's physical RAM: a 10-billion-parameter model at stage 0
#              (160 GB of model state per rank); the largest process of the job must stay small.
#   cgroup     a real cgroup v2 child the test creates with memory.max 1 GiB, the job moved into
#              it, the cgroup removed afterwards: the budget comes from that limit, split between
#              the 2 ranks, and GPT-2 124M at stage 0 (2 GB per rank) is refused. Skipped (exit
#              77, with the reason) where the machine does not allow it: not root, no cgroup v2,
#              or a v2 hierarchy without the memory controller (a host with memory on cgroup v1).
# usage: memory_budget.sh physical|cgroup ZERO_TRAIN WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
mode=$1 zt=$2 work=$3
shift 3
mpirun=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export OPENBLAS_NUM_THREADS=1

# Runs a command, prints its output, its exit code and the largest resident set of any process
# it started (the ranks are waited for by mpirun, so RUSAGE_CHILDREN covers them).
cat > measure.py <<'PY'
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
sys.stdout.write(r.stdout)
print(f"== exit {r.returncode}, largest process {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024} MiB")
PY

check() {  # check LOG: exit 1, the ledger's error before allocating, the table, a small process
  local log=$1
  grep -q "^== exit 1," "$log" || { cat "$log"; fail "expected exit 1"; }
  grep -Eq "memory budget: [0-9.]+ [KMG]iB per rank = 90% of" "$log" || { cat "$log"; fail "no memory budget line"; }
  grep -q "checked before allocating any of it" "$log" || { cat "$log"; fail "not refused before allocating"; }
  grep -q "memory ledger of cpu:0" "$log" || { cat "$log"; fail "no ledger table"; }
  grep -q "shared capacity" "$log" || { cat "$log"; fail "the ledger shows no shared capacity"; }
  grep -Eq "Killed|Segmentation|core dumped|terminate called" "$log" && { cat "$log"; fail "crashed"; }
  local rss base
  rss=$(sed -n 's/^== exit .*largest process \([0-9]*\) MiB$/\1/p' "$log")
  # The job's largest process against the program doing nothing (--help: the libraries mapped
  # and touched): at most 256 MiB more, an eighth of the smallest model state refused here (2 GB
  # per rank) and far more than a model's description and MPI's buffers take.
  base=$(python3 measure.py "$zt" --help | sed -n 's/^== exit .*largest process \([0-9]*\) MiB$/\1/p')
  [ "$rss" -lt $((base + 256)) ] || { cat "$log"; fail "a process grew to $rss MiB (--help: $base MiB): something large was allocated"; }
  echo "ok: exit 1 before allocating; largest process $rss MiB (the program alone: $base MiB)"
}

if [ "$mode" = physical ]; then
  mem_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
  # 160 GB per rank must exceed 90% of RAM / 2: true below ~330 GiB of RAM.
  [ "$mem_kib" -lt $((330 * 1024 * 1024)) ] || skip "this host has $((mem_kib / 1048576)) GiB of RAM: the 10B model would fit"
  cat > too_big.json <<'EOF'
{
  "train_micro_batch_size_per_gpu": 1,
  "bf16": { "enabled": true },
  "zero_optimization": { "stage": 0 },
  "zero_train": { "device": "cpu", "steps": 1, "model": { "preset": "zero-offload-10b" } }
}
EOF
  python3 measure.py "${mpirun[@]}" -np 2 "$zt" --config too_big.json --metrics m.jsonl > run.log 2>&1
  check run.log
  grep -q "90% of physical memory" run.log || grep -q "90% of cgroup" run.log || { cat run.log; fail "the budget names no source"; }
  grep "memory budget" run.log
  exit 0
fi

[ "$mode" = cgroup ] || fail "mode must be physical or cgroup"
[ "$(id -u)" = 0 ] || skip "creating a cgroup needs root"
mnt=$(awk '$0 ~ / - cgroup2 / {print $5; exit}' /proc/self/mountinfo)
[ -n "$mnt" ] || skip "no cgroup v2 hierarchy is mounted here"
controllers=$(cat "$mnt/cgroup.controllers" 2>/dev/null || true)
echo " $controllers " | grep -q " memory " ||
  skip "the cgroup v2 hierarchy at $mnt has no memory controller (its controllers: '${controllers}'): memory is managed by cgroup v1 on this machine"
# The child goes right under the hierarchy's root, the one cgroup that may hold processes and
# still give controllers to its children; the test does not change what the root delegates.
echo " $(cat "$mnt/cgroup.subtree_control") " | grep -q " memory " ||
  skip "the root of $mnt does not delegate the memory controller to its children (cgroup.subtree_control)"
cg="$mnt/zero-test-memory-budget-$$"
mkdir "$cg" 2>/dev/null || skip "cannot create the cgroup $cg"
trap 'rmdir "$cg" 2>/dev/null || echo "warning: could not remove $cg" >&2' EXIT
echo $((1 << 30)) > "$cg/memory.max"
cat > too_big.json <<'EOF'
{
  "train_micro_batch_size_per_gpu": 1,
  "bf16": { "enabled": true },
  "zero_optimization": { "stage": 0 },
  "zero_train": { "device": "cpu", "steps": 1, "model": { "preset": "gpt2-124m" } }
}
EOF
# The job, and only it, in the cgroup: a shell moves itself there and becomes the measuring run.
set +e
bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$cg" \
  python3 measure.py "${mpirun[@]}" -np 2 "$zt" --config too_big.json --metrics m.jsonl > run.log 2>&1
set -e
check run.log
grep -q "90% of cgroup v2 memory.max 1.00 GiB (.*zero-test-memory-budget-$$/memory.max) / 2 ranks on this node under it" run.log ||
  { cat run.log; fail "the budget does not come from the test's cgroup"; }
grep "memory budget" run.log
