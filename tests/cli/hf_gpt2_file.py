#!/usr/bin/env python3
"""Writes the file Hugging Face's GPT2LMHeadModel.save_pretrained would write for the model of a
zero-train export, with nothing but the safetensors specification (8-byte little-endian header
size, a JSON header of name -> {dtype, shape, data_offsets}, the raw data). transformers is not
needed (nor installed in CI); the layout it writes is reproduced instead:

  - every body tensor named "transformer.<name>" (GPT2Model's names under the LM head model's
    "transformer" attribute), Conv1D weights as they are, [in, out];
  - "lm_head.weight", the tied head: the same matrix as transformer.wte.weight (what the file
    holds when saved without safetensors' deduplication of shared tensors);
  - the attention buffers older transformers releases saved: "transformer.h.<i>.attn.bias", the
    causal mask [1, 1, n_positions, n_positions] as BOOL, and "transformer.h.<i>.attn.masked_bias",
    the scalar -1e4 as F32;
  - tensors in name order, as safetensors' own writer lays them out, metadata {"format": "pt"}.

usage: hf_gpt2_file.py IN.safetensors OUT.safetensors [--untied | --both-names]
  --untied      lm_head.weight differs from wte.weight in one element (an untied head)
  --both-names  also keep the unprefixed "wte.weight" beside "transformer.wte.weight"
"""
import json
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    header.pop("__metadata__", None)
    tensors = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        tensors[name] = (t["dtype"], t["shape"], data[a:b])
    return tensors


def write(path, tensors):
    header = {"__metadata__": {"format": "pt"}}
    offset, chunks = 0, []
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        chunks.append(raw)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode("utf-8"))
        for c in chunks:
            f.write(c)


def main():
    src, dst, *flags = sys.argv[1:]
    ours = read(src)
    out = {"transformer." + name: t for name, t in ours.items()}
    dtype, shape, raw = ours["wte.weight"]
    if "--untied" in flags:
        (x,) = struct.unpack_from("<f", raw, 4 * 5)
        raw = raw[:4 * 5] + struct.pack("<f", x + 0.25) + raw[4 * 6:]
    out["lm_head.weight"] = (dtype, shape, raw)
    if "--both-names" in flags:
        out["wte.weight"] = ours["wte.weight"]
    positions = ours["wpe.weight"][1][0]
    mask = bytes(1 if j <= i else 0 for i in range(positions) for j in range(positions))
    layers = sorted({int(name.split(".")[1]) for name in ours if name.startswith("h.")})
    for layer in layers:
        out[f"transformer.h.{layer}.attn.bias"] = ("BOOL", [1, 1, positions, positions], mask)
        out[f"transformer.h.{layer}.attn.masked_bias"] = ("F32", [], struct.pack("<f", -1e4))
    write(dst, out)
    print(f"{dst}: {len(out)} tensors in Hugging Face GPT2LMHeadModel layout ({len(layers)} layers)")


main()
