#!/usr/bin/env python3
"""Cross-check tierzero's model against Hugging Face transformers (needs torch, transformers,
safetensors; run where they are installed). Families: llama (Llama 2, Llama 3.x with rope_type
llama3), mistral, qwen2 (Qwen2, Qwen2.5: q/k/v biases), qwen3 (dense: q/k RMSNorm per head),
olmo2 (norms on the parts' outputs, q/k RMSNorm over the whole projections).

  hf_check.py run DIR --tokens 1,2,3,...  [--tz build/bin/tz-model-check]
                      [--dtype float32|bfloat16]
      Loads DIR with AutoModelForCausalLM (eager attention), predicts tokens[1:] from
      tokens[:-1], prints the loss and a summary of the logits in the same format as
      tz-model-check. With --tz, also runs `tz-model-check --import DIR --tokens ...`, compares the
      two and exits 1 on a mismatch:
        float32 (default): transformers in float32 on the CPU against tierzero's cpu backend
          (f32): loss relative difference <= 1e-5, logits within 1e-4 of the largest |logit|
          (every logit when tz-model-check has --logits, else its summary: the sums and the
          first logits);
        bfloat16: transformers in bfloat16 (on the GPU when there is one) against tierzero's cuda
          backend in bf16 (`--backend cuda --dtype bf16`): loss within 1e-2 relative.

  hf_check.py generate DIR --tokens 1,2,3 [--new 16] [--tz build/bin/tz-model-check]
      Greedy generation of --new tokens after the prompt, float32 on the CPU, stopping at the eos
      of DIR (generation_config.json, else config.json); with --tz also
      `tz-model-check --import DIR --tokens PROMPT --generate N`, and the two must be equal.

  hf_check.py make DIR [--family llama|mistral|qwen2|qwen3|olmo2] [--hidden 64 --layers 2 --heads 4
                        --kv-heads 2 --ffn 176 --vocab 256 --max-seq 128 --rope-theta 10000
                        --eps 1e-5 --tie --seed 0 --dtype float32|bfloat16]
                       [--head-dim D] [--rope-scaling llama3|linear --rope-factor 8 --rope-low 1
                        --rope-high 4 --rope-original 64] [--sliding-window N]
                       [--from-config CONFIG.json [--layers N]]
      Creates a random model of the family and saves it with save_pretrained, for
      `tz-model-check --import DIR` to load. qwen2 implies q/k/v biases, qwen3 q/k norms (as the
      families define them); --head-dim sets a head dim other than hidden / heads. With
      --from-config the shape is a released model's config.json (tests/data/hf/) with only
      num_hidden_layers replaced by --layers; its weights are transformers' own initialisation
      for the family (normal(0, initializer_range), norms 1, biases 0). Either way norm weights
      are then moved away from 1 and biases away from 0 (--no-perturb keeps them), so that a
      norm or bias read wrongly shows in the logits; without --from-config every matrix is
      normal(0, 0.05) as before.

Both directions:
  build/bin/tz-model-check --preset tiny --seed 1 --export /tmp/ours
  python3 tools/hf_check.py run /tmp/ours --tokens 72,101,108,108,111 --tz build/bin/tz-model-check
  python3 tools/hf_check.py make /tmp/theirs --kv-heads 2
  python3 tools/hf_check.py run /tmp/theirs --tokens 3,1,4,1,5,9,2,6 --tz build/bin/tz-model-check
  python3 tools/hf_check.py make /tmp/q3 --from-config tests/data/hf/qwen3-1.7b.json --layers 2
  python3 tools/hf_check.py generate /tmp/q3 --tokens 3,1,4,1,5 --tz build/bin/tz-model-check
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def family_table(tz=None):
    """The family table (trainer/model/family.c), as `tz-model-check --families` prints it: a dict by
    model_type. tz: the binary (default: $TZ_BIN/tz-model-check, else build/bin's)."""
    tz = tz or os.path.join(os.environ.get("TZ_BIN") or os.path.join(ROOT, "build", "bin"),
                            "tz-model-check")
    try:
        out = subprocess.run([tz, "--families"], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit("hf_check.py: cannot read the family table from %s --families (%s): "
                         "build tierzero first, or give --tz" % (tz, e))
    return {r["model_type"]: r for r in json.loads(out)}


def need_torch():
    """torch and transformers, or a clear exit naming what is missing."""
    missing = []
    try:
        import torch  # noqa: F401
    except ImportError:
        missing.append("torch")
    try:
        import transformers  # noqa: F401
    except ImportError:
        missing.append("transformers")
    if missing:
        raise SystemExit("hf_check.py: this command needs %s (pip install %s); the GPU machine "
                         "has them" % (" and ".join(missing), " ".join(missing)))


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
        try:
            vals = [float(x) for x in parts[1:]]
        except ValueError:
            continue
        out[parts[0]] = vals if len(vals) > 1 else (vals[0] if vals else None)
    return out


def tz_has_option(tz, option):
    """Whether tz-model-check's usage mentions option (older builds lack --logits, --generate)."""
    res = subprocess.run([tz, "--help"], capture_output=True, text=True)
    return option in res.stdout + res.stderr


def load_model(path, dtype_name):
    import torch
    from transformers import AutoModelForCausalLM

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    # transformers 4.56 renamed torch_dtype to dtype; an older one takes dtype for a config key
    # and loads float32, which the .to() below corrects
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    device = "cuda" if dtype_name == "bfloat16" and torch.cuda.is_available() else "cpu"
    model.to(device=device, dtype=dtype).eval()
    return model, device


def export_eos(path):
    """The eos ids of an export: generation_config.json's, else config.json's (int or list)."""
    for name in ("generation_config.json", "config.json"):
        f = os.path.join(path, name)
        if os.path.exists(f):
            with open(f) as fp:
                eos = json.load(fp).get("eos_token_id")
            if eos is not None:
                return [eos] if isinstance(eos, int) else list(eos)
    return []


def run(args):
    need_torch()
    import torch
    import torch.nn.functional as F

    toks = parse_tokens(args.tokens)
    model, device = load_model(args.dir, args.dtype)
    ids = torch.tensor([toks[:-1]], dtype=torch.long, device=device)
    with torch.no_grad():
        out = model(input_ids=ids)
        logits = out.logits[0].float().cpu()
    loss = F.cross_entropy(logits, torch.tensor(toks[1:], dtype=torch.long)).item()
    # experts with output_router_logits: transformers adds the load-balancing loss (its aux_loss)
    # times router_aux_loss_coef to the loss, as tierzero does
    if getattr(out, "aux_loss", None) is not None:
        loss += model.config.router_aux_loss_coef * float(out.aux_loss)
    ours_text = summary(loss, logits)
    sys.stdout.write("# transformers (%s, %s)\n" % (args.dtype, device) + ours_text)
    if not args.tz:
        return 0
    cmd = [args.tz, "--import", args.dir, "--tokens", args.tokens]
    if args.dtype == "bfloat16":
        cmd += ["--backend", "cuda", "--dtype", "bf16"]
    logits_file = None
    if args.dtype == "float32" and tz_has_option(args.tz, "--logits"):
        fd, logits_file = tempfile.mkstemp(prefix="tz-logits-", suffix=".f32")
        os.close(fd)
        cmd += ["--logits", logits_file]
    res = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write("# tierzero (%s)\n" % " ".join(cmd[3:]) + res.stdout)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        print("MISMATCH: tz-model-check failed")
        return 1
    a, b = parse_summary(ours_text), parse_summary(res.stdout)
    ok = a.get("tokens") == b.get("tokens")
    rel = abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), 1e-30)
    big = float(logits.abs().max())
    if args.dtype == "bfloat16":
        ok &= rel <= 1e-2
        print("loss relative difference %.3e (tolerance 1e-2)" % rel)
    else:
        ok &= rel <= args.loss_tol
        print("loss relative difference %.3e (tolerance %g)" % (rel, args.loss_tol))
        if logits_file:
            import numpy as np

            theirs = torch.from_numpy(np.fromfile(logits_file, dtype="<f4").copy())
            os.unlink(logits_file)
            if theirs.numel() != logits.numel():
                print("MISMATCH: tz-model-check wrote %d logits, expected %d"
                      % (theirs.numel(), logits.numel()))
                return 1
            worst = float((theirs.view_as(logits) - logits).abs().max())
            print("largest logit difference %.3e, %.3e of the largest |logit| %.3f "
                  "(tolerance 1e-4)" % (worst, worst / big, big))
            ok &= worst <= 1e-4 * big
        else:
            # Only the summary to compare: the first logits each within 1e-4 of the largest
            # |logit|, the sums within 1e-4 of the absolute sum.
            tol = 1e-4 * big
            ok &= all(abs(x - y) <= tol for x, y in zip(a["logits_first"], b["logits_first"]))
            ok &= abs(a["logits_sum"] - b["logits_sum"]) <= 1e-4 * a["logits_abs_sum"]
            ok &= abs(a["logits_abs_sum"] - b["logits_abs_sum"]) <= 1e-4 * a["logits_abs_sum"]
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


def generate(args):
    need_torch()
    import torch

    toks = parse_tokens(args.tokens)
    model, device = load_model(args.dir, "float32")
    eos = export_eos(args.dir)
    ids = torch.tensor([toks], dtype=torch.long, device=device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=args.new, do_sample=False, num_beams=1,
                             eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
    ours = [int(t) for t in out[0, len(toks):]]
    if eos:  # generate pads after an eos when it stops early; the eos itself is kept
        for i, t in enumerate(ours):
            if t in eos:
                ours = ours[:i + 1]
                break
    print("# transformers (float32, greedy, eos %s)\ngenerated %s"
          % (eos, " ".join(map(str, ours))))
    if not args.tz:
        return 0
    if not tz_has_option(args.tz, "--generate"):
        print("MISMATCH: %s has no --generate option" % args.tz)
        return 1
    cmd = [args.tz, "--import", args.dir, "--tokens", args.tokens, "--generate", str(args.new)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write("# tierzero (%s)\n" % " ".join(cmd[3:]) + res.stdout)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        print("MISMATCH: tz-model-check failed")
        return 1
    theirs = None
    for line in res.stdout.splitlines():
        if line.startswith("generated"):
            theirs = [int(t) for t in line.split()[1:]]
    ok = theirs == ours
    print("MATCH" if ok else "MISMATCH: %s against %s" % (theirs, ours))
    return 0 if ok else 1


def family_config(args, table):
    """A config.json-shaped dict for make's options (the keys released configs use), with the
    family's own keys and window rule from the family table."""
    fam = args.family
    row = table[fam]
    if row.get("moe_module") and not args.experts:
        args.experts = 4
    d = {"model_type": fam, "hidden_size": args.hidden, "intermediate_size": args.ffn,
         "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
         "num_key_value_heads": args.kv_heads, "vocab_size": args.vocab,
         "max_position_embeddings": args.max_seq, "rope_theta": args.rope_theta,
         "rms_norm_eps": args.eps, "tie_word_embeddings": args.tie, "hidden_act": "silu",
         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    if args.head_dim:
        d["head_dim"] = args.head_dim
    if args.rope_scaling == "linear":
        d["rope_scaling"] = {"rope_type": "linear", "factor": args.rope_factor}
    if args.rope_scaling == "llama3":
        if fam != "llama":
            raise SystemExit("--rope-scaling llama3 is Llama 3's; --family is %s" % fam)
        d["rope_scaling"] = {"rope_type": "llama3", "factor": args.rope_factor,
                             "low_freq_factor": args.rope_low, "high_freq_factor": args.rope_high,
                             "original_max_position_embeddings": args.rope_original}
    d.update(row["export_keys"])
    if row["window"] == "always":
        d["sliding_window"] = args.sliding_window
    elif row["window"] == "opt-in":
        # a window value is written (as Qwen2.5 does) but not used
        d["use_sliding_window"] = False
        d["sliding_window"] = args.sliding_window or args.max_seq
        d["max_window_layers"] = args.layers
    elif row["window"] == "layers":
        # the family's pattern of sliding and full layers (transformers' default layer_types)
        d["sliding_window"] = args.sliding_window or row["window_default"]
    elif args.sliding_window:
        raise SystemExit("--sliding-window: family %s has no sliding window" % fam)
    if row.get("moe_module"):
        # experts: every layer sparse; the family's key for the experts' width
        d[row["n_expert_key"]] = args.experts
        d["num_experts_per_tok"] = args.experts_used
        d[row["moe_width_key"]] = args.expert_ffn
        if not row["topk_norm"]:
            d["norm_topk_prob"] = args.norm_topk
        d["output_router_logits"] = args.router_aux > 0
        d["router_aux_loss_coef"] = args.router_aux
        if row.get("shared_expert"):
            d["shared_expert_intermediate_size"] = args.shared_ffn
    elif args.experts:
        raise SystemExit("--experts: family %s has no experts" % fam)
    return d


def make(args):
    need_torch()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(args.seed)
    table = family_table(args.tz)
    if args.from_config:
        with open(args.from_config) as fp:
            d = json.load(fp)
        if d.get("model_type") not in table:
            raise SystemExit("%s: model_type %r is not one of %s"
                             % (args.from_config, d.get("model_type"), ", ".join(table)))
        if args.layers_set:
            d["num_hidden_layers"] = args.layers
            if isinstance(d.get("layer_types"), list):
                d["layer_types"] = d["layer_types"][:args.layers]
            if "max_window_layers" in d:
                d["max_window_layers"] = min(d["max_window_layers"], args.layers)
    else:
        if args.family not in table:
            raise SystemExit("--family %s: not one of %s" % (args.family, ", ".join(table)))
        d = family_config(args, table)
    # the dtype keys would make some transformers versions build the model in bf16: it is built
    # in float32 and saved in --dtype
    d = {k: v for k, v in d.items()
         if k not in ("architectures", "transformers_version", "torch_dtype", "dtype")}
    model_type = d.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **d)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = name.endswith("norm.weight")
            bias = name.endswith(".bias")
            if not args.from_config and not norm and not bias:
                p.copy_(0.05 * torch.randn_like(p))
            elif norm and not args.no_perturb:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif bias and not args.no_perturb:
                p.copy_(0.1 * torch.randn_like(p))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model.to(dtype).save_pretrained(args.dir, safe_serialization=True)
    print("saved a random %s (%s, %d layers, %d parameters, %s) to %s"
          % (type(model).__name__, model_type, cfg.num_hidden_layers,
             sum(p.numel() for p in model.parameters()), args.dtype, args.dir))
    return 0


class _LayersAction(argparse.Action):
    """--layers, remembering that it was given (--from-config keeps the config's otherwise)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.layers_set = True


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--tokens", required=True)
    r.add_argument("--tz", help="path of tz-model-check, to compare with")
    r.add_argument("--loss-tol", type=float, default=1e-5,
                   help="f32 loss relative tolerance (default 1e-5, for random weights; a trained "
                        "model's sharper softmax turns the same logit differences into more)")
    r.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16: transformers in bf16 against tierzero's cuda backend in bf16")
    g = sub.add_parser("generate")
    g.add_argument("dir")
    g.add_argument("--tokens", required=True, help="the prompt")
    g.add_argument("--new", type=int, default=16, help="tokens to generate (default 16)")
    g.add_argument("--tz", help="path of tz-model-check, to compare with")
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--family", default="llama",
                   help="a model_type of the family table (tz-model-check --families)")
    m.add_argument("--tz", help="path of tz-model-check, whose --families is the family table "
                                "(default: $TZ_BIN's or build/bin's)")
    m.add_argument("--from-config", metavar="CONFIG.json",
                   help="a released model's config.json; only --layers is applied to it")
    m.add_argument("--hidden", type=int, default=64)
    m.add_argument("--layers", type=int, default=2, action=_LayersAction)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--head-dim", type=int, default=0, help="default hidden / heads")
    m.add_argument("--ffn", type=int, default=176)
    m.add_argument("--vocab", type=int, default=256)
    m.add_argument("--max-seq", type=int, default=128)
    m.add_argument("--rope-theta", type=float, default=10000.0)
    m.add_argument("--rope-scaling", choices=["none", "llama3", "linear"], default="none")
    m.add_argument("--rope-factor", type=float, default=8.0)
    m.add_argument("--rope-low", type=float, default=1.0, help="low_freq_factor")
    m.add_argument("--rope-high", type=float, default=4.0, help="high_freq_factor")
    m.add_argument("--rope-original", type=int, default=64,
                   help="original_max_position_embeddings")
    m.add_argument("--sliding-window", type=int, default=None,
                   help="mistral: the window (at least the sequence); qwen2/qwen3: the value "
                        "written with use_sliding_window false")
    m.add_argument("--experts", type=int, default=0,
                   help="the experts of a family with them (num_experts; 0: 4 there)")
    m.add_argument("--experts-used", type=int, default=2, help="num_experts_per_tok")
    m.add_argument("--expert-ffn", type=int, default=48, help="each expert's width")
    m.add_argument("--norm-topk", action="store_true", help="norm_topk_prob true")
    m.add_argument("--shared-ffn", type=int, default=40,
                   help="the shared expert's width (shared_expert_intermediate_size, qwen2_moe)")
    m.add_argument("--router-aux", type=float, default=0.0,
                   help="router_aux_loss_coef with output_router_logits (0: neither)")
    m.add_argument("--eps", type=float, default=1e-5)
    m.add_argument("--tie", action="store_true")
    m.add_argument("--no-perturb", action="store_true",
                   help="keep norm weights 1 and biases 0")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    m.set_defaults(layers_set=False)
    args = ap.parse_args()
    return {"run": run, "generate": generate, "make": make}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
