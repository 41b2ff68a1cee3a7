#!/usr/bin/env bash
# A token shard truncated while a 2-rank run trains on it (issue 16, item 6): the run ends with
# a clear error naming the file and what to do, exit 1, within seconds; never SIGBUS ("Bus
# error") with a raw backtrace, never a hang.
# usage: shard_truncated.sh ZERO_TRAIN SOURCE_DIR WORK_DIR MPIRUN [MPIRUN ARGS...]
set -euo pipefail
zt=$1 src=$2 work=$3
shift 3
mpirun=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export OPENBLAS_NUM_THREADS=1

# An llm.c token shard (docs/data-formats.md): 256 int32 of header, then uint16 ids below the
# tiny preset's vocabulary of 64. 400,000 tokens: 800 KB, 6,249 windows of 64.
python3 - <<'PY'
import struct
n = 400_000
with open("train.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *[(i * 37 + 11) % 64 for i in range(n)]))
PY
# Many steps: the run must still be training when the file is cut.
cat > long.json <<'JSON'
{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 1e-3 } },
  "zero_optimization": { "stage": 2 },
  "zero_train": { "device": "cpu", "steps": 1000000, "model": { "preset": "tiny" } }
}
JSON

# timeout: a hang fails the test here instead of running into ctest's limit.
timeout 150 "${mpirun[@]}" -np 2 "$zt" --config long.json --data train.bin --metrics m.jsonl > run.log 2>&1 &
job=$!
for _ in $(seq 600); do
  [ -s m.jsonl ] && break
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
[ -s m.jsonl ] || { wait $job || true; cat run.log; fail "the run wrote no metrics line"; }
# Cut the shard to half its tokens under the running job (what an interrupted copy, a full disk
# or a re-download in place does).
size=$(stat -c %s train.bin)
truncate -s $(( 1024 + (size - 1024) / 4 * 2 )) train.bin
echo "truncated train.bin from $size to $(stat -c %s train.bin) bytes after $(wc -l < m.jsonl) metrics line(s)"
set +e
wait $job
rc=$?
set -e
echo "---- the run's last lines (exit $rc):"
tail -n 25 run.log
[ $rc -ne 124 ] || fail "the run hung after the shard was truncated (killed by timeout)"
[ $rc -eq 1 ] || fail "exit $rc, expected 1"
grep -q "token shard 'train.bin' changed while it was being read" run.log || fail "no message naming the changed file"
grep -q "(it was truncated)" run.log || fail "the message does not say the file was truncated"
grep -q "HINT: a run reads its token shards" run.log || fail "no HINT line"
if grep -Eiq "SIGBUS|Bus error|signal 7|backtrace|\[ *[0-9]+\] .*\.so|core dumped|Segmentation" run.log; then
  fail "a signal or a backtrace in the output"
fi
echo "shard_truncated: all checks passed"
