#!/usr/bin/env python3
"""Reads a safetensors file with nothing but the format's specification (8-byte little-endian
header size, a JSON header of name -> {dtype, shape, data_offsets}, then the raw data) and checks
it holds a GPT-2 of the given shape under Hugging Face GPT-2 names, fp32, finite.

usage: check_safetensors.py FILE N_LAYER N_EMBD VOCAB SEQ_LEN"""
import json
import math
import struct
import sys


def main():
    path, L, C, V, T = sys.argv[1], *map(int, sys.argv[2:6])
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    header.pop("__metadata__", None)
    want = {"wte.weight": [V, C], "wpe.weight": [T, C], "ln_f.weight": [C], "ln_f.bias": [C]}
    for l in range(L):
        h = f"h.{l}."
        want.update({h + "ln_1.weight": [C], h + "ln_1.bias": [C],
                     h + "attn.c_attn.weight": [C, 3 * C], h + "attn.c_attn.bias": [3 * C],
                     h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
                     h + "ln_2.weight": [C], h + "ln_2.bias": [C],
                     h + "mlp.c_fc.weight": [C, 4 * C], h + "mlp.c_fc.bias": [4 * C],
                     h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C]})
    if set(header) != set(want):
        sys.exit(f"names differ: missing {sorted(set(want) - set(header))}, extra {sorted(set(header) - set(want))}")
    ends = []
    for name, t in header.items():
        if t["dtype"] != "F32" or t["shape"] != want[name]:
            sys.exit(f"{name}: {t['dtype']} {t['shape']}, expected F32 {want[name]}")
        a, b = t["data_offsets"]
        count = math.prod(t["shape"])
        if b - a != 4 * count or b > len(data):
            sys.exit(f"{name}: data_offsets {a}..{b} do not hold {count} fp32 values")
        values = struct.unpack_from(f"<{count}f", data, a)
        if not all(math.isfinite(x) for x in values):
            sys.exit(f"{name}: non-finite values")
        if name.endswith("ln_1.weight") and all(x == 1.0 for x in values):
            sys.exit(f"{name}: still the initial ones: the trained weights were not exported")
        ends.append((a, b))
    ends.sort()
    if ends[0][0] != 0 or any(x[1] != y[0] for x, y in zip(ends, ends[1:])) or ends[-1][1] != len(data):
        sys.exit("the tensors do not tile the data section")
    print(f"{path}: {len(header)} tensors, {sum(math.prod(t['shape']) for t in header.values())} fp32 parameters, GPT-2 names and shapes")


main()
