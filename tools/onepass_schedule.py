#!/usr/bin/env python3
"""How long the one-pass attention backward's blocks take under the GPU's list schedule, against
the ideal, before timing it (kernels/cuda/attention_onepass.cu, docs/cuda-kernels.md).

A block is one key tile of one kv head (all of its group's query heads) or, split, of one query
head; its work is its query chunks from the key tile's diagonal to the sequence's end, times its
heads. Blocks start in ticket order (the last key tile first, then heads, then batches), each on
the first slot that frees (SMs x blocks resident on each); the dq waits between blocks are left
out (the kernel's order makes them rare). Prints the makespan over the ideal (the work over the
slots): what a schedule loses to blocks that start late and run long.

  tools/onepass_schedule.py [--slots 132] [--bn 128] [--bm 64] [--batch 4]
"""
import argparse
import heapq


def makespan(T, BN, BM, H, Hkv, B, slots, split):
    n_kt = (T + BN - 1) // BN
    n_qc = (T + BM - 1) // BM
    per = (H // Hkv) // split  # query heads a block
    work = []
    for t in range(n_kt * Hkv * split * B):
        kt = n_kt - 1 - t % n_kt
        work.append(per * (n_qc - kt * BN // BM))
    free = [0.0] * min(slots, len(work))
    end = 0.0
    for w in work:
        s = heapq.heappop(free)
        end = max(end, s + w)
        heapq.heappush(free, s + w)
    return end, sum(work) / slots


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", type=int, default=132, help="SMs x resident blocks (H200, 8x64: 132)")
    ap.add_argument("--bn", type=int, default=128, help="keys a block (8x64 tiles: 128)")
    ap.add_argument("--bm", type=int, default=64, help="query rows a chunk (8x64 tiles: 64)")
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    shapes = (("llama-7b, 32/32", 32, 32), ("Llama-3-8B, 32/8", 32, 8), ("Qwen2-7B, 28/4", 28, 4))
    print(f"{'shape':18s} {'T':>6s} {'heads a block':>14s} {'makespan / ideal':>17s}")
    for name, H, Hkv in shapes:
        for T in (2048, 8192):
            for split in sorted({1, H // Hkv}):
                m, ideal = makespan(T, a.bn, a.bm, H, Hkv, a.batch, a.slots, split)
                print(f"{name:18s} {T:6d} {H // Hkv // split:14d} {m / ideal:17.2f}")


if __name__ == "__main__":
    main()
