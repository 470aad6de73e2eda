#!/usr/bin/env python3
"""tools/attn-ab.sh's ab.txt as a table: each build's forward + backward ms a case (the mean of
its passes' medians) and, per computed key tile, its rate against the same build's causal run at
the same length (64-key tiles for 64-row blocks, as the warpgroup-MMA kernels compute them), the
measure of issue 51's 0.9.

    python3 tools/attn_ab_table.py ab.txt
"""
import re
import sys
from collections import defaultdict

LINE = re.compile(r"^(\d+) (\S+) (\S+): .*?B (\d+) T (\d+) .*?window (\d+) softcap (\S+),"
                  r".*median ([\d.]+) ms")


def tiles(t, window):
    """Key tiles a sequence of t tokens computes, causal, with a window (0: none)."""
    n = (t + 63) // 64
    total = 0
    for i in range(n):
        first = max(0, i * 64 - window + 1) // 64 if window > 0 else 0
        total += i - first + 1
    return total


def main(path):
    runs = defaultdict(list)  # (build, case) -> medians
    shape = {}  # case -> (B, T, window)
    builds, cases = [], []
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            _, build, case, b, t, w = m.groups()[:6]
            runs[(build, case)].append(float(m.group(8)))
            shape[case] = (int(b), int(t), int(w))
            if build not in builds:
                builds.append(build)
            if case not in cases:
                cases.append(case)
    if not runs:
        sys.exit(f"attn_ab_table: no timed run in {path}")
    ms = {k: sum(v) / len(v) for k, v in runs.items()}
    causal = {}  # T -> the causal case at that length
    for c in cases:
        b, t, w = shape[c]
        if w == 0 and not c.startswith("cap"):
            causal.setdefault(t, c)
    print("| build | " + " | ".join(cases) + " | per tile against causal |")
    print("|---" * (len(cases) + 2) + "|")
    for bd in builds:
        row, ratios = [], []
        for c in cases:
            v = ms.get((bd, c))
            row.append(f"{v:.3f}" if v else "-")
            b, t, w = shape[c]
            base = causal.get(t)
            if v and base and base != c and (bd, base) in ms:
                rate = b * tiles(t, w) / v
                b0, t0, w0 = shape[base]
                ratios.append(f"{c} {rate / (b0 * tiles(t0, w0) / ms[(bd, base)]):.3f}")
        print(f"| {bd} | " + " | ".join(row) + " | " + ", ".join(ratios) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
