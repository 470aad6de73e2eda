#!/usr/bin/env python3
"""tools/attn_ab_table.py: the key tiles it counts (against a count by brute force over every
query and key) and the per-tile ratios it prints from an ab.txt of tools/attn-ab.sh's format."""
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(root, "tools"))
import attn_ab_table  # noqa: E402


def brute_tiles(t, window):
    """Tiles holding any (query, key) pair a query sees, by 64-row blocks and 64-key tiles."""
    seen = set()
    for q in range(t):
        lo = max(0, q - window + 1) if window else 0
        for kt in range(lo // 64, q // 64 + 1):
            seen.add((q // 64, kt))
    return len(seen)


def main():
    for t, w in ((2048, 0), (2048, 512), (1000, 0), (1000, 100), (8192, 4096), (256, 64),
                 (1000, 65)):
        got, want = attn_ab_table.tiles(t, w), brute_tiles(t, w)
        assert got == want, f"tiles({t}, {w}) = {got}, by brute force {want}"
    assert attn_ab_table.tiles(2048, 512) == 252 and attn_ab_table.tiles(2048, 0) == 528
    line = ("{p} {b} {c}: attention fwd+bwd: B {bb} T {t} H 32/32 D 128 window {w} softcap {s}, "
            "1.000 of the causal pairs; ms a round: 1 1 1; median {ms} ms, 1 TFLOP/s per computed pair\n")
    rows = []
    for p, extra in ((1, 0.0), (2, 0.2)):  # two passes: the table takes their mean
        rows.append(line.format(p=p, b="x", c="none", bb=4, t=2048, w=0, s=0, ms=2.0 + extra))
        rows.append(line.format(p=p, b="x", c="w512", bb=4, t=2048, w=512, s=0, ms=1.0 + extra))
        rows.append(line.format(p=p, b="x", c="cap50", bb=4, t=2048, w=0, s=50, ms=3.0 + extra))
    rows.append("1 x none: rc=77\n")  # a failed run's line is not a timing
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.writelines(rows)
    out = subprocess.run([sys.executable, os.path.join(root, "tools", "attn_ab_table.py"), f.name],
                         capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    # none 2.1 ms over 528 tiles; w512 1.1 ms over 252: (252 / 1.1) / (528 / 2.1) = 0.911
    want = f"w512 {(252 / 1.1) / (528 / 2.1):.3f}"
    assert "| x | 2.100 | 1.100 | 3.100 |" in out, out
    assert want in out and f"cap50 {2.1 / 3.1:.3f}" in out, out
    print("ok: tiles against brute force, the table's means and ratios")


if __name__ == "__main__":
    main()
