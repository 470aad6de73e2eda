#!/usr/bin/env python3
"""Cross-check tierzero's model against Hugging Face transformers (needs torch, transformers,
safetensors; run where they are installed).

  hf_check.py run DIR --tokens 1,2,3,...  [--tz build/bin/tz-model-check]
      Loads DIR with LlamaForCausalLM (float32, eager attention), predicts tokens[1:] from
      tokens[:-1], prints the loss and a summary of the logits in the same format as
      tz-model-check. With --tz, also runs `tz-model-check --import DIR --tokens ...`, compares the
      two and exits 1 on a mismatch.

  hf_check.py make DIR [--hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 176 --vocab 256
                        --max-seq 128 --rope-theta 10000 --eps 1e-5 --tie --seed 0
                        --dtype float32|bfloat16]
      Creates a random LlamaForCausalLM (norm weights perturbed away from 1 too) and saves it with
      save_pretrained, for `tz-model-check --import DIR` to load.

Both directions:
  build/bin/tz-model-check --preset tiny --seed 1 --export /tmp/ours
  python3 tools/hf_check.py run /tmp/ours --tokens 72,101,108,108,111 --tz build/bin/tz-model-check
  python3 tools/hf_check.py make /tmp/theirs --kv-heads 2
  python3 tools/hf_check.py run /tmp/theirs --tokens 3,1,4,1,5,9,2,6 --tz build/bin/tz-model-check
"""
import argparse
import subprocess
import sys


def parse_tokens(s):
    toks = [int(t) for t in s.split(",") if t.strip()]
    if len(toks) < 2:
        raise SystemExit("--tokens: need at least two tokens")
    return toks


def summary(loss, logits):
    """The lines tz-model-check prints; logits is a (T, V) float tensor."""
    first = " ".join("%.6f" % float(x) for x in logits[0, :8])
    return ("tokens %d\nloss %.7f\nlogits_sum %.6f\nlogits_abs_sum %.6f\nlogits_first %s\n"
            % (logits.shape[0], loss, float(logits.double().sum()),
               float(logits.double().abs().sum()), first))


def parse_summary(text):
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        vals = [float(x) for x in parts[1:]]
        out[parts[0]] = vals if len(vals) > 1 else vals[0]
    return out


def run(args):
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    toks = parse_tokens(args.tokens)
    model = LlamaForCausalLM.from_pretrained(args.dir, torch_dtype=torch.float32,
                                             attn_implementation="eager")
    model.eval()
    ids = torch.tensor([toks[:-1]], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    loss = F.cross_entropy(logits, torch.tensor(toks[1:], dtype=torch.long)).item()
    ours_text = summary(loss, logits)
    sys.stdout.write("# transformers\n" + ours_text)
    if not args.tz:
        return 0
    res = subprocess.run([args.tz, "--import", args.dir, "--tokens", args.tokens],
                         capture_output=True, text=True)
    sys.stdout.write("# tierzero\n" + res.stdout)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        print("MISMATCH: tz-model-check failed")
        return 1
    a, b = parse_summary(ours_text), parse_summary(res.stdout)
    ok = a["tokens"] == b["tokens"]
    ok &= abs(a["loss"] - b["loss"]) <= 1e-5 * max(1.0, abs(a["loss"]))
    ok &= abs(a["logits_abs_sum"] - b["logits_abs_sum"]) <= 1e-4 * max(1.0, a["logits_abs_sum"])
    ok &= abs(a["logits_sum"] - b["logits_sum"]) <= 1e-4 * max(1.0, a["logits_abs_sum"])
    ok &= all(abs(x - y) <= 1e-4 * max(1.0, abs(x))
              for x, y in zip(a["logits_first"], b["logits_first"]))
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


def make(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.ffn,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                      max_position_embeddings=args.max_seq, rope_theta=args.rope_theta,
                      rms_norm_eps=args.eps, tie_word_embeddings=args.tie,
                      hidden_act="silu", attention_bias=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model.to(dtype).save_pretrained(args.dir, safe_serialization=True)
    print("saved a random LlamaForCausalLM (%d parameters, %s) to %s"
          % (sum(p.numel() for p in model.parameters()), args.dtype, args.dir))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--tokens", required=True)
    r.add_argument("--tz", help="path of tz-model-check, to compare with")
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--hidden", type=int, default=64)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--ffn", type=int, default=176)
    m.add_argument("--vocab", type=int, default=256)
    m.add_argument("--max-seq", type=int, default=128)
    m.add_argument("--rope-theta", type=float, default=10000.0)
    m.add_argument("--eps", type=float, default=1e-5)
    m.add_argument("--tie", action="store_true")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args()
    return run(args) if args.cmd == "run" else make(args)


if __name__ == "__main__":
    sys.exit(main())
