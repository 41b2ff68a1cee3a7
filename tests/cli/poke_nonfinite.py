#!/usr/bin/env python3
"""Writes a non-finite value into a file the way a diverged run or a damaged disk would leave it,
keeping every checksum valid, so that only a check of the values themselves can find it.

usage: poke_nonfinite.py safetensors FILE TENSOR INDEX VALUE
       poke_nonfinite.py checkpoint DIR ARRAY PARAM INDEX VALUE
VALUE is a float (nan, inf, -inf, 3e38, ...). safetensors: element INDEX (row-major) of the F32
tensor TENSOR. checkpoint: element INDEX of parameter PARAM in array ARRAY ("master", "exp_avg",
...) of the checkpoint directory DIR (docs/checkpoint-format.md): the rank file that holds it is
changed and its block CRC-32C, table CRC and header CRC written anew (the manifest holds no
checksum of the rank files). Prints the rank file's name."""
import json
import struct
import sys


def crc32c(data: bytes) -> int:
    # CRC-32C (Castagnoli), reflected polynomial 0x82F63B78, as docs/checkpoint-format.md says.
    table = getattr(crc32c, "table", None)
    if table is None:
        table = []
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            table.append(c)
        crc32c.table = table
    c = 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def poke_safetensors(path, name, index, value):
    with open(path, "rb") as f:
        blob = bytearray(f.read())
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    t = header[name]
    assert t["dtype"] == "F32", t
    begin = 8 + n + t["data_offsets"][0]
    struct.pack_into("<f", blob, begin + 4 * index, value)
    with open(path, "wb") as f:
        f.write(blob)
    print(f"{path}: {name}[{index}] = {value}")


def poke_rankfile(path, array, index, value):
    """Element `index` of array number `array` of one rank file."""
    with open(path, "rb") as f:
        blob = bytearray(f.read())
    assert blob[:8] == b"ZEROCKPT", "not a checkpoint rank file"
    pieces, arrays, block = struct.unpack_from("<III", blob, 24)
    numel, table_bytes, data_offset = struct.unpack_from("<QQQ", blob, 56)
    assert index < numel, f"element {index} of {numel}"
    # The table: pieces (24 bytes each), array names, padding to 4, then the block checksums.
    at = 128 + 24 * pieces
    for _ in range(arrays):
        (length,) = struct.unpack_from("<I", blob, at)
        at += 4 + length
    at = 128 + (at - 128 + 3) // 4 * 4
    blocks = (numel + block - 1) // block
    stride = (4 * numel + 63) // 64 * 64
    base = data_offset + array * stride
    struct.pack_into("<f", blob, base + 4 * index, value)
    b = index // block
    first, last = b * block, min((b + 1) * block, numel)
    struct.pack_into("<I", blob, at + 4 * (array * blocks + b), crc32c(bytes(blob[base + 4 * first:base + 4 * last])))
    struct.pack_into("<I", blob, 80, crc32c(bytes(blob[128:128 + table_bytes])))
    struct.pack_into("<I", blob, 124, crc32c(bytes(blob[0:124])))
    with open(path, "wb") as f:
        f.write(blob)


def poke_checkpoint(directory, array_name, param_name, element, value):
    manifest = json.load(open(f"{directory}/manifest.json"))
    param = [p["name"] for p in manifest["params"]].index(param_name)
    array = manifest["arrays"].index(array_name)
    for entry in manifest["files"]:
        start = 0
        for p, offset, count in entry["pieces"]:
            if p == param and offset <= element < offset + count:
                poke_rankfile(f"{directory}/{entry['file']}", array, start + element - offset, value)
                print(f"{directory}/{entry['file']}: {array_name} of {param_name}[{element}] = {value}")
                return
            start += count
    sys.exit(f"no rank file of {directory} holds {param_name}[{element}]")


def main():
    if sys.argv[1] == "safetensors":
        path, name, index, value = sys.argv[2:6]
        poke_safetensors(path, name, int(index), float(value))
    else:
        directory, array, name, index, value = sys.argv[2:7]
        poke_checkpoint(directory, array, name, int(index), float(value))


if __name__ == "__main__":
    main()
