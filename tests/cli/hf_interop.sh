#!/usr/bin/env bash
# Hugging Face GPT-2 interoperability of zero-train, end to end:
#   1. export --hf-config writes model.safetensors and the config.json GPT2LMHeadModel's
#      from_pretrained needs: the keys it reads, and a shape equal to the exported tensors' and to
#      the trained model's (transformers is not installed here, so its from_pretrained itself is
#      not run: tests/cli/hf_gpt2_file.py and docs/checkpoint-format.md say what is reproduced);
#   2. --init-from takes the file GPT2LMHeadModel.save_pretrained writes for that model
#      ("transformer." names, a tied lm_head.weight, BOOL attention masks and masked_bias
#      buffers) and trains exactly as from our own export (every loss equal, bit for bit);
#   3. what cannot be loaded faithfully is refused with the reason: an untied lm_head, one
#      parameter under two names, --n-head contradicting the checkpoint.
# usage: hf_interop.sh ZERO_TRAIN SOURCE_DIR WORK_DIR
set -euo pipefail
zt=$1 src=$2 work=$3
cfg=$src/tests/data/configs/train_short.json  # the tiny preset: 2 layers, 128 wide, 4 heads, vocab 64, 64 positions
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export OPENBLAS_NUM_THREADS=1

echo "== a short run to export (20 steps, one process)"
"$zt" --config "$cfg" --checkpoint-dir ck --metrics m0.jsonl > run0.log 2>&1 || { cat run0.log; fail "training failed"; }

echo "== 1. export --hf-config"
mkdir -p hf
"$zt" export --checkpoint ck --out hf/model.safetensors --hf-config > export.log 2>&1 || { cat export.log; fail "export --hf-config failed"; }
cat export.log
grep -q "hf/config.json: Hugging Face GPT2LMHeadModel config" export.log || fail "no config.json reported"
python3 "$src/tests/cli/check_safetensors.py" hf/model.safetensors 2 128 64 64
python3 - hf/config.json hf/model.safetensors <<'PY'
import json, struct, sys
cfg = json.load(open(sys.argv[1]))
with open(sys.argv[2], "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
layers = {k.split(".")[1] for k in header if k.startswith("h.")}
V, C = header["wte.weight"]["shape"]
T = header["wpe.weight"]["shape"][0]
# What from_pretrained reads to build GPT2LMHeadModel, and what makes it compute our GPT.
want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": len(layers),
        "n_embd": C, "vocab_size": V, "n_positions": T, "n_ctx": T, "n_head": 4,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "n_inner": None,
        "tie_word_embeddings": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "torch_dtype": "float32",
        "bos_token_id": None, "eos_token_id": None}
bad = {k: (cfg.get(k, "<missing>"), v) for k, v in want.items() if cfg.get(k, "<missing>") != v}
if bad:
    sys.exit(f"config.json: (found, expected): {bad}")
# The tiny preset's shape, as the training run printed it.
assert (len(layers), C, V, T) == (2, 128, 64, 64), (len(layers), C, V, T)
print(f"config.json: GPT2LMHeadModel, {len(layers)} layers, n_embd {C}, n_head 4, vocab {V}, {T} positions")
PY

echo "== 2. --init-from a Hugging Face save_pretrained file trains as from our export"
python3 "$src/tests/cli/hf_gpt2_file.py" hf/model.safetensors hf_saved.safetensors
"$zt" --config "$cfg" --init-from hf/model.safetensors --metrics ours.jsonl > ours.log 2>&1 || { cat ours.log; fail "--init-from our export failed"; }
"$zt" --config "$cfg" --init-from hf_saved.safetensors --metrics theirs.jsonl > theirs.log 2>&1 || { cat theirs.log; fail "--init-from the Hugging Face file failed"; }
grep -q "'lm_head.weight' equals 'wte.weight'" theirs.log || { cat theirs.log; fail "the tied head was not reported"; }
grep -q "ignoring 4 attention mask buffer(s)" theirs.log || { cat theirs.log; fail "the attention buffers were not reported"; }
python3 "$src/tests/cli/compare_losses.py" ours.jsonl theirs.jsonl 1 20 0

echo "== 3. refused with the reason"
expect() {  # expect RC REGEX -- command...
  local want=$1 regex=$2
  shift 3
  set +e
  "$@" > bad.log 2>&1
  local got=$?
  set -e
  [ $got -eq "$want" ] || { cat bad.log; fail "exit $got, expected $want: $*"; }
  grep -Eq -e "$regex" bad.log || { cat bad.log; fail "no '$regex' in the output of: $*"; }
  grep -Eq "Segmentation|Aborted|terminate called|core dumped" bad.log && { cat bad.log; fail "crashed: $*"; }
  echo "ok: exit $got, '$regex'"
}
python3 "$src/tests/cli/hf_gpt2_file.py" hf/model.safetensors untied.safetensors --untied
expect 2 "'lm_head.weight' differs from 'wte.weight' \(first at element 5: " -- "$zt" --config "$cfg" --init-from untied.safetensors
python3 "$src/tests/cli/hf_gpt2_file.py" hf/model.safetensors both.safetensors --both-names
expect 2 "has both 'transformer.wte.weight' and 'wte.weight'|has both 'wte.weight' and 'transformer.wte.weight'" -- "$zt" --config "$cfg" --init-from both.safetensors
mkdir -p refused
expect 1 "--n-head 8, but the checkpoint was trained with 4 heads" -- "$zt" export --checkpoint ck --out refused/model.safetensors --hf-config --n-head 8
[ -z "$(ls -A refused)" ] || fail "a refused export wrote $(ls -A refused)"
expect 2 "--n-head is for --hf-config" -- "$zt" export --checkpoint ck --out y.safetensors --n-head 4
echo "hf_interop: all checks passed"
