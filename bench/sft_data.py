#!/usr/bin/env python3
"""Fine-tuning data for benchmarks: a token shard and its mask file (tools/tz-data's formats,
docs/data.md) of conversations whose lengths are heavy-tailed as chat data's are (log-normal:
median 350 tokens, one in 20 past 2300, cut at 16384), each a prompt (about 40 % of it, never a
target) then an answer (targets). Random tokens below the vocabulary: the speed of a step does not
depend on which tokens they are. Deterministic for a seed.

    python3 bench/sft_data.py OUT_DIR [--tokens N] [--vocab V] [--seed S]

writes OUT_DIR/sft_train_000000.bin and .bin.mask, and prints the conversations' count."""
import argparse
import array
import math
import os
import random
import struct
import sys
import zlib

SHARD_MAGIC, MASK_MAGIC = 20240520, 20261205
TARGET, START = 1, 2


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--tokens", type=int, default=2_000_000)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if not 2 <= a.vocab <= 65536:
        sys.exit("sft_data: --vocab must be in [2, 65536] (uint16 tokens)")
    rng = random.Random(a.seed)
    tok = array.array("H")
    mask = bytearray()
    docs = 0
    while len(tok) < a.tokens:
        n = min(16384, max(8, int(math.exp(rng.gauss(math.log(350), 1.15)))))
        n = min(n, a.tokens - len(tok)) if a.tokens - len(tok) >= 8 else a.tokens - len(tok)
        prompt = max(1, int(n * rng.uniform(0.2, 0.6)))
        tok.extend(rng.randrange(a.vocab) for _ in range(n))
        mask.append(START)
        mask.extend(b"\x00" * (prompt - 1))
        mask.extend(bytes([TARGET]) * (n - prompt))
        docs += 1
    if sys.byteorder != "little":
        tok.byteswap()
    body = tok.tobytes()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "sft_train_000000.bin")
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", SHARD_MAGIC, 1, len(tok)) + b"\0" * (1024 - 12))
        f.write(body)
    targets = sum(1 for m in mask if m & TARGET)
    hdr = struct.pack("<7I", MASK_MAGIC, 1, len(tok), zlib.crc32(body), zlib.crc32(bytes(mask)),
                      targets, docs)
    with open(path + ".mask", "wb") as f:
        f.write(hdr + b"\0" * (1024 - len(hdr)))
        f.write(mask)
    print(f"sft_data: {docs} conversations, {len(tok)} tokens, {targets} targets in {path}")


if __name__ == "__main__":
    main()
