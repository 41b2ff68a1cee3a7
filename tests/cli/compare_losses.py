#!/usr/bin/env python3
"""Compares the per-step losses of two zero-train metrics files (JSON lines).

usage: compare_losses.py REFERENCE OTHER FIRST LAST REL_BOUND
Every step FIRST..LAST must be in both files; |other - ref| <= REL_BOUND * |ref| (0: exactly
equal, the losses are written with 17 significant digits). Prints the largest relative gap."""
import json
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if "loss" in d:
                out[d["step"]] = d["loss"]  # a resumed file may repeat steps: the last wins
    return out


def main():
    ref_path, other_path, first, last, bound = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    ref, other = losses(ref_path), losses(other_path)
    worst = 0.0
    for step in range(first, last + 1):
        if step not in ref or step not in other:
            sys.exit(f"step {step} missing from {ref_path if step not in ref else other_path}")
        a, b = ref[step], other[step]
        gap = abs(b - a) / abs(a)
        worst = max(worst, gap)
        if (bound == 0 and a != b) or gap > bound:
            sys.exit(f"step {step}: loss {b!r} vs {a!r} (relative gap {gap:.3g}, bound {bound})")
    print(f"steps {first}-{last}: losses agree, largest relative gap {worst:.3g} (bound {bound})")


main()
