#!/usr/bin/env python3
"""Cross-check tz-train's training against a plain PyTorch loop, step by step (needs torch and
transformers; run where they are installed: exit 77 when either cannot be imported).

For each case, a tiny random Hugging Face checkpoint of the family (hf_check.py's `make`: 2
layers, hidden 64, 4 heads, 2 kv heads, vocabulary 256, float32 safetensors) is trained twice
from the same weights on the same token file:

  tz-train --import-safetensors DIR --config ds_config.json --data tokens.bin --seq T --seed S
           --steps N --backend cpu --metrics FILE       (float32, one rank)

  PyTorch: AutoModelForCausalLM (eager attention; float64 by default, --torch-dtype),
           torch.optim.AdamW over DeepSpeed's parameter groups (a ds_config `optimizer` section:
           one group, every tensor decays, as tz-train does then; docs/config.md "Weight decay
           per tensor"), Hugging Face's causal-LM loss (the cross-entropy of the model's
           loss_function summed over the step's targets and divided by their count,
           num_items_in_batch, over every micro-batch; in float64 without its rounding of the
           logits to float32), torch.nn.utils.clip_grad_norm_ (DeepSpeed's clip / (norm +
           1e-6)), and DeepSpeed 0.19's WarmupLR, WarmupDecayLR, WarmupCosineLR
           (deepspeed/runtime/lr_schedules.py) with its engine's timing: built at iteration -1
           (which sets the rate), stepped after each optimizer step.

The PyTorch side reads the windows tz-train reads, in its order (docs/data.md "Windows",
"Order", "Ranks"): window w is tokens [w*T, w*T + T] of the shard; micro-batch a of step s takes
the global samples ((s*A + a)*W + r)*B + b, sample i the window tz_data_permute(seed, i / n,
n, i mod n) (trainer/data/data.c's Feistel order, ported below and checked against
tests/test_data.c's pinned values before anything runs).

Every step's loss, gradient norm (before clipping) and learning rate of tz-train's metrics file
are compared with PyTorch's: the loss within --loss-tol (1e-4) relative, the gradient norm and the
learning rate within --norm-tol and --lr-tol (1e-6). A table gives the worst difference of each
case and its step; the exit status is 1 on any mismatch or tz-train failure, 2 when tz-train or
tz-model-check is not there.

  torch_check.py [--bin build/bin] [--family llama,qwen2,qwen3,mistral] [--steps 30]
                 [--long-steps 100] [--seq 32] [--torch-dtype float64|float32] [--with-pad]
                 [--keep DIR] [--verbose]

  /tmp/tfenv/bin/python tools/torch_check.py --bin build/bin     (a venv with torch, transformers)

The cases: per family, one of each scheduler over --steps steps, micro-batch 2 (WarmupLR with a
log warm-up, no accumulation, no clipping, weight decay 0.01; WarmupDecayLR with a linear
warm-up, 2 micro-batches, clipping at 0.5, weight decay 0.1, decaying to 0 before the run ends;
WarmupCosineLR with warmup_min_ratio 0.1 and cos_min_ratio 0.05, 2 micro-batches, clipping at 1,
weight decay 0.05, total_num_steps short of the run); one run of --long-steps (llama,
WarmupDecayLR as above); and qwen2's WarmupDecayLR again with tierzero.weight_decay_exclude
[bias, norm] against Hugging Face Trainer's two groups. qwen2 has q/k/v biases, qwen3 q/k norms
and its LM head tied to the embedding, mistral a sliding window (T / 2) shorter than the
sequence. The data holds 101 windows, so the runs cross epochs.

Two choices, each measured (docs/training.md, "Checked against PyTorch"):
- PyTorch runs in float64, the reference: PyTorch's own float32 run parts from its float64 one by
  up to 1.3e-6 in the gradient norm of an unclipped run by step 30, above the 1e-6 asked, while
  tz-train's float32 stays within 6.5e-7 of float64 (--torch-dtype float32 shows it).
- The data holds no token equal to the models' pad_token_id (0), unless --with-pad: Hugging
  Face's decoders build nn.Embedding(vocab, hidden, padding_idx=pad_token_id), whose backward
  gives that row no gradient. tz-train gave it one (6.4e-4 relative in the gradient norm at
  llama's first such step, the runs parting from there); it now skips it too
  (tz_model_embed_bwd), and --with-pad checks that.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import hf_check
from ds_schedule import Schedule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = 77  # the exit status of a check that cannot run here (ctest's SKIP_RETURN_CODE)

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
MAGIC = 20240520  # llm.c shards (docs/data.md)
VOCAB = 256
PAD = 0  # hf_check.py make's pad_token_id
M64 = (1 << 64) - 1


# ---- tz-train's data order (trainer/data/data.c, util/mix.h) ----

def mix_data(z):
    """util/mix.h's tz_mix_data: splitmix64 (the golden-ratio increment, then the finalizer)."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def feistel(key, half, x):
    mask = (1 << half) - 1
    left, right = x >> half, x & mask
    for rnd in range(6):
        f = mix_data(key ^ mix_data(((rnd << 56) & M64) ^ right)) & mask
        left, right = right, left ^ f
    return (left << half) | right


def permute(seed, epoch, n, i):
    """tz_data_permute: the window of sample i (mod n) of an epoch."""
    if n <= 1:
        return 0
    bits = max(2, (n - 1).bit_length())
    bits += bits & 1
    key = mix_data((seed ^ mix_data((epoch ^ 0x5EED0F0E0C0FFEE5) & M64)) & M64)
    x = i
    while True:
        x = feistel(key, bits // 2, x)
        if x < n:
            return x


def check_permute():
    """The port against tests/test_data.c's pinned tz_data_permute(2024, 1, 1000003, i)."""
    pinned = [172456, 145253, 73288, 788031, 77994, 755090, 952587, 72735]
    got = [permute(2024, 1, 1000003, i) for i in range(8)]
    if got != pinned:
        raise SystemExit("torch_check.py: the port of tz_data_permute gives %s, tests/test_data.c "
                         "pins %s: trainer/data/data.c's order changed; port it again" % (got, pinned))


# ---- the data ----

def write_shard(path, n_windows, T, seed, avoid):
    """An llm.c shard (version 1, uint16) of n_windows * T + 1 tokens below VOCAB, none equal to
    avoid (a token id, or None): a learnable pattern (a stride through the vocabulary) with 30%
    of the tokens random."""
    import numpy as np

    n = n_windows * T + 1
    rng = np.random.default_rng(seed)
    tokens = (np.arange(n) * 7 + 3) % VOCAB
    noisy = rng.random(n) < 0.3
    tokens[noisy] = rng.integers(0, VOCAB, int(noisy.sum()))
    if avoid is not None:
        tokens[tokens == avoid] = (avoid + 1) % VOCAB
    header = np.zeros(256, dtype="<i4")
    header[:3] = (MAGIC, 1, n)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def read_shard(path):
    """The tokens of an llm.c shard, read as tz-train reads it (trainer/data/data.c)."""
    import numpy as np

    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    if header[0] != MAGIC or header[1] not in (1, 7):
        raise SystemExit("%s: not an llm.c shard (magic %d, version %d)"
                         % (path, header[0], header[1]))
    dt = "<u2" if header[1] == 1 else "<u4"
    tokens = np.frombuffer(raw[1024:], dtype=dt).astype("int64")
    if len(tokens) != header[2]:
        raise SystemExit("%s: the header says %d tokens, the file holds %d"
                         % (path, header[2], len(tokens)))
    return tokens


class Batches:
    """The windows tz-train's rank 0 of a world of 1 reads: inputs and targets (B, T) of step s,
    micro-batch a."""

    def __init__(self, tokens, T, B, A, seed):
        self.tokens, self.T, self.B, self.A, self.seed = tokens, T, B, A, seed
        self.n = (len(tokens) - 1) // T  # every window is a training window (no --eval-every)

    def windows(self, s, a):
        first = (s * self.A + a) * self.B  # tz_data_sample_index(s, A, a, W=1, r=0, B)
        return [permute(self.seed, i // self.n, self.n, i % self.n)
                for i in range(first, first + self.B)]

    def get(self, s, a):
        import torch

        import numpy as np

        rows = np.stack([self.tokens[w * self.T:w * self.T + self.T + 1]
                         for w in self.windows(s, a)])
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


# ---- DeepSpeed 0.19's schedules (deepspeed/runtime/lr_schedules.py) and its engine's timing ----

class DeepSpeedLR:
    """The scheduler a ds_config's `scheduler` section makes (tools/ds_schedule.py), driving a
    torch optimizer's rate as DeepSpeed's engine does: constructed at last_batch_iteration -1,
    which writes the rate of iteration -1 into every group; step() after each applied optimizer
    step. Without a section the rate stays the optimizer's."""

    def __init__(self, optimizer, section):
        self.opt = optimizer
        self.sched = Schedule(section, optimizer.param_groups[0]["lr"])
        self.type = self.sched.type
        self._apply()

    def lr(self):
        return self.sched.lr()

    def _apply(self):
        if self.type is None:
            return
        lr = self.sched.lr()
        for g in self.opt.param_groups:
            g["lr"] = lr

    def step(self):
        if self.type is None:
            return
        self.sched.step()
        self._apply()


# ---- the cases ----

def cases(families, steps, long_steps):
    """(scheduler, family, ds_config, steps) of each run."""
    out = []
    scheds = [
        ("WarmupLR", {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1},
         {"lr": 2e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
         {"warmup_min_lr": 1e-4, "warmup_max_lr": 2e-3, "warmup_num_steps": 8,
          "warmup_type": "log"}),
        ("WarmupDecayLR", {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                           "gradient_clipping": 0.5},
         {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
         {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3, "warmup_num_steps": 5,
          "warmup_type": "linear", "total_num_steps": max(6, steps - 6)}),
        ("WarmupCosineLR", {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                            "gradient_clipping": 1.0},
         {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.05},
         {"warmup_num_steps": 6, "warmup_type": "linear", "warmup_min_ratio": 0.1,
          "cos_min_ratio": 0.05, "total_num_steps": max(7, steps - 4)}),
    ]
    for fam in families:
        for name, batch, opt, sched in scheds:
            cfg = dict(batch)
            cfg["optimizer"] = {"type": "AdamW", "params": dict(opt)}
            cfg["scheduler"] = {"type": name, "params": dict(sched)}
            out.append((name, fam, cfg, steps))
    if long_steps > 0 and "llama" in families:
        name, batch, opt, sched = scheds[1]
        cfg = dict(batch)
        cfg["optimizer"] = {"type": "AdamW", "params": dict(opt)}
        p = dict(sched)
        p["total_num_steps"] = long_steps - 20
        p["warmup_num_steps"] = 10
        cfg["scheduler"] = {"type": name, "params": p}
        out.append((name, "llama", cfg, long_steps))
    if "qwen2" in families:
        # Hugging Face Trainer's groups (biases and norms not decayed), which tz-train takes with
        # tierzero.weight_decay_exclude (its default without a ds_config optimizer section)
        name, batch, opt, sched = scheds[1]
        cfg = dict(batch)
        cfg["optimizer"] = {"type": "AdamW", "params": dict(opt)}
        cfg["scheduler"] = {"type": name, "params": dict(sched)}
        cfg["tierzero"] = {"weight_decay_exclude": ["bias", "norm"]}
        out.append((name, "qwen2", cfg, steps))
    return out


def make_model(family, path, seq, tz_model_check):
    """hf_check.py's `make` with its defaults (2 layers, hidden 64, 4 heads, 2 kv heads, ffn
    176, vocabulary 256), qwen3 tied, mistral with a window of seq / 2."""
    ns = argparse.Namespace(
        dir=path, family=family, tz=tz_model_check, from_config=None, hidden=64, layers=2,
        layers_set=False, heads=4, kv_heads=2, head_dim=0, ffn=176, vocab=VOCAB, max_seq=128,
        rope_theta=10000.0, rope_scaling="none", rope_factor=8.0, rope_low=1.0, rope_high=4.0,
        rope_original=64, sliding_window=seq // 2 if family == "mistral" else None, eps=1e-5,
        tie=family == "qwen3", no_perturb=False, seed=FAMILIES.index(family) + 1,
        dtype="float32", experts=0, experts_used=2, expert_ffn=48, norm_topk=False,
        router_aux=0.0)
    hf_check.make(ns)
    with open(os.path.join(path, "config.json")) as f:
        pad = json.load(f).get("pad_token_id")
    if pad != PAD:
        raise SystemExit("torch_check.py: %s has pad_token_id %r, the data was made without %d"
                         % (path, pad, PAD))


def run_tz(tz_train, model_dir, cfg, data, steps, seq, seed, work, tag, verbose):
    """tz-train's (loss, grad_norm, lr) per step, or raises RuntimeError with its output."""
    cfg_path = os.path.join(work, tag + ".json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    metrics = os.path.join(work, tag + ".jsonl")
    cmd = [tz_train, "--import-safetensors", model_dir, "--config", cfg_path, "--data", data,
           "--steps", str(steps), "--seq", str(seq), "--seed", str(seed), "--backend", "cpu",
           "--metrics", metrics, "--progress", "plain", "--rates", os.path.join(work, "rates.json")]
    if verbose:
        print("  $ " + " ".join(cmd))
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError("tz-train exited %d: %s\n%s" % (res.returncode, " ".join(cmd),
                                                            (res.stdout + res.stderr)[-2000:]))
    rows = []
    with open(metrics) as f:
        for line in f:
            o = json.loads(line)
            if "step" in o and not o.get("summary"):
                rows.append((o["loss"], o["grad_norm"], o["lr"]))
    if len(rows) != steps:
        raise RuntimeError("tz-train's metrics file %s has %d steps, not %d"
                           % (metrics, len(rows), steps))
    return rows


def exclusion(cfg):
    """tierzero.weight_decay_exclude of a case's config: None for DeepSpeed's one group."""
    ex = cfg.get("tierzero", {}).get("weight_decay_exclude")
    return None if ex in (None, "none", ["none"]) else ex


def decay_groups(model, cfg):
    """The optimizer's parameter groups (tied tensors once, as model.parameters() gives them):
    with a ds_config's optimizer section DeepSpeed's one group, every tensor decays; with
    tierzero.weight_decay_exclude ["bias", "norm"], Hugging Face Trainer's two (its
    get_decay_parameter_names: not biases, not the norms' weights)."""
    wd = cfg["optimizer"]["params"]["weight_decay"]
    ex = exclusion(cfg)
    if ex is None:
        return [{"params": list(model.parameters()), "weight_decay": wd}]
    if sorted(ex) != ["bias", "norm"]:
        raise SystemExit("weight_decay_exclude %s: only [bias, norm] is checked here" % ex)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        module = name.rsplit(".", 1)[0]
        (no_decay if name.endswith(".bias") or module.endswith("norm") else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def run_torch(model_dir, cfg, tokens, steps, seq, seed, dtype_name):
    """The PyTorch loop's (loss, grad_norm, lr) per step, the model, gradients and Adam state in
    dtype_name (float64: the reference to 1e-6; float32: PyTorch's own rounding beside
    tierzero's)."""
    import torch
    from transformers.loss.loss_utils import fixed_cross_entropy

    model, _ = hf_check.load_model(model_dir, "float32")
    dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
    model.to(dtype).train()
    op = cfg["optimizer"]["params"]
    opt = torch.optim.AdamW(decay_groups(model, cfg), lr=op["lr"],
                            betas=tuple(op["betas"]), eps=op["eps"],
                            weight_decay=op["weight_decay"])
    sched = DeepSpeedLR(opt, cfg.get("scheduler"))
    B = cfg["train_micro_batch_size_per_gpu"]
    A = cfg.get("gradient_accumulation_steps", 1)
    clip = cfg.get("gradient_clipping", 0.0)
    data = Batches(tokens, seq, B, A, seed)
    n_items = torch.tensor(A * B * seq)  # the step's targets: every token of every window
    vocab = model.config.vocab_size
    rows = []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for a in range(A):
            x, y = data.get(s, a)
            logits = model(input_ids=x).logits
            if dtype == torch.float32:
                loss = model.loss_function(logits=logits, labels=None, vocab_size=vocab,
                                           num_items_in_batch=n_items, shift_labels=y)
            else:
                # ForCausalLMLoss rounds the logits to float32 first: its cross-entropy without
                # that rounding (the sum over the targets / num_items_in_batch)
                loss = fixed_cross_entropy(logits.reshape(-1, vocab), y.reshape(-1),
                                           num_items_in_batch=n_items)
            loss.backward()
            loss_sum += loss.item()
        params = [p for p in model.parameters() if p.grad is not None]
        # clip_grad_norm_ returns the norm before clipping; max_norm inf scales by 1 (no clip)
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        rows.append((loss_sum, float(norm), lr))
    return rows


def rel(a, b):
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(b), 1e-30)


def compare(tz_rows, torch_rows):
    """Worst relative difference (value, step) of loss, grad norm and lr."""
    worst = []
    for k in range(3):
        w = (0.0, 0)
        for s, (t, p) in enumerate(zip(tz_rows, torch_rows)):
            if t[k] is None:
                w = (math.inf, s + 1)
                break
            d = rel(t[k], p[k])
            if d > w[0] or math.isnan(d):
                w = (d, s + 1)
        worst.append(w)
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("TZ_BIN") or os.path.join(ROOT, "build", "bin"),
                    help="the directory of tz-train and tz-model-check (default $TZ_BIN, else "
                         "build/bin)")
    ap.add_argument("--family", default=",".join(FAMILIES),
                    help="comma-separated families (default %s)" % ",".join(FAMILIES))
    ap.add_argument("--steps", type=int, default=30, help="steps of each case (default 30)")
    ap.add_argument("--long-steps", type=int, default=100,
                    help="steps of the one long run (llama, WarmupDecayLR); 0: none (default 100)")
    ap.add_argument("--seq", type=int, default=32, help="tokens per sequence (default 32)")
    ap.add_argument("--seed", type=int, default=5, help="tz-train's --seed: the data order")
    ap.add_argument("--loss-tol", type=float, default=1e-4)
    ap.add_argument("--norm-tol", type=float, default=1e-6)
    ap.add_argument("--lr-tol", type=float, default=1e-6)
    ap.add_argument("--keep", metavar="DIR",
                    help="work in DIR and keep it (the models, token file, configs and metrics "
                         "files); default a temporary directory")
    ap.add_argument("--torch-dtype", choices=["float64", "float32"], default="float64",
                    help="the PyTorch loop's precision (default float64: the reference; in "
                         "float32 PyTorch's own rounding drifts past 1e-6 in the grad norm of an "
                         "unclipped run by step 30)")
    ap.add_argument("--with-pad", action="store_true",
                    help="let the data hold the models' pad_token_id (0): Hugging Face's "
                         "nn.Embedding(padding_idx=0) gives its row no gradient, and so does "
                         "tz-train (tz_model_embed_bwd; when it gave the row one, the runs parted "
                         "at the first step that read it)")
    ap.add_argument("--verbose", action="store_true",
                    help="print tz-train's commands and every step of each case")
    args = ap.parse_args()

    missing = []
    for mod in ("torch", "transformers"):
        try:
            __import__(mod)
        except ImportError as e:
            missing.append("%s (%s)" % (mod, e))
    if missing:
        print("torch_check.py: SKIP: cannot import %s; run it with a Python that has torch and "
              "transformers (e.g. a venv: python -m venv V && V/bin/pip install torch "
              "transformers)" % " and ".join(missing))
        return SKIP
    import torch
    import transformers

    families = [f for f in args.family.split(",") if f]
    for f in families:
        if f not in FAMILIES:
            ap.error("--family %s: not one of %s" % (f, ", ".join(FAMILIES)))
    tz_train = os.path.join(args.bin, "tz-train")
    tz_model_check = os.path.join(args.bin, "tz-model-check")
    for exe in (tz_train, tz_model_check):
        if not os.access(exe, os.X_OK):
            print("torch_check.py: %s is not there: build tierzero (cmake --build build) or give "
                  "--bin" % exe, file=sys.stderr)
            return 2
    check_permute()
    torch.manual_seed(0)
    transformers.utils.logging.disable_progress_bar()

    work = args.keep or tempfile.mkdtemp(prefix="tz-torch-check-")
    os.makedirs(work, exist_ok=True)
    print("torch %s, transformers %s, %s; work in %s"
          % (torch.__version__, transformers.__version__, tz_train, work))
    data = os.path.join(work, "tokens.bin")
    write_shard(data, 101, args.seq, args.seed, None if args.with_pad else PAD)
    tokens = read_shard(data)

    results = []
    failed = False
    models = {}

    def within(worst):
        return (worst[0][0] <= args.loss_tol and worst[1][0] <= args.norm_tol
                and worst[2][0] <= args.lr_tol)

    for name, fam, cfg, steps in cases(families, args.steps, args.long_steps):
        if fam not in models:
            models[fam] = os.path.join(work, "model-" + fam)
            make_model(fam, models[fam], args.seq, tz_model_check)
        ex = exclusion(cfg)
        tag = "%s-%s-%d%s" % (fam, name, steps, "-hf-groups" if ex else "")
        # the run's setting in short: accumulation, clipping, weight decay and what it skips
        what = "x%d, %s, wd %g%s" % (
            cfg.get("gradient_accumulation_steps", 1),
            "clip %g" % cfg["gradient_clipping"] if cfg.get("gradient_clipping") else "no clip",
            cfg["optimizer"]["params"]["weight_decay"], " not " + "/".join(ex) if ex else "")
        print("%s: %d steps, micro-batch %d x %d tokens, accumulation %s"
              % (tag, steps, cfg["train_micro_batch_size_per_gpu"], args.seq, what))
        try:
            tz_rows = run_tz(tz_train, models[fam], cfg, data, steps, args.seq, args.seed, work,
                             tag, args.verbose)
        except RuntimeError as e:
            print("MISMATCH: %s: %s" % (tag, e))
            results.append((fam, name, steps, what, None))
            failed = True
            continue
        torch_rows = run_torch(models[fam], cfg, tokens, steps, args.seq, args.seed,
                               args.torch_dtype)
        worst = compare(tz_rows, torch_rows)
        ok = within(worst)
        failed |= not ok
        results.append((fam, name, steps, what, worst))
        if args.verbose or not ok:
            print("  step  loss tz     loss torch  grad norm tz  grad norm torch  lr tz"
                  "          lr torch")
            for s, (t, p) in enumerate(zip(tz_rows, torch_rows)):
                print("  %4d  %.7f  %.7f  %.8g  %.8g  %.8g  %.8g"
                      % (s + 1, t[0], p[0], t[1], p[1], t[2], p[2]))
        print("  worst: loss %.2e (step %d), grad norm %.2e (step %d), lr %.2e (step %d); "
              "loss %.4f to %.4f: %s"
              % (worst[0][0], worst[0][1], worst[1][0], worst[1][1], worst[2][0], worst[2][1],
                 tz_rows[0][0], tz_rows[-1][0], "ok" if ok else "MISMATCH"))

    print("\nworst relative differences, tz-train (float32) against PyTorch (%s), at step "
          "(tolerances: loss %g, grad norm %g, lr %g)"
          % (args.torch_dtype, args.loss_tol, args.norm_tol, args.lr_tol))
    print("%-8s %-15s %5s  %-34s %-16s %-16s %-16s"
          % ("family", "scheduler", "steps", "accumulation, clip, decay", "loss", "grad norm",
             "lr"))
    for fam, name, steps, what, worst in results:
        if worst is None:
            print("%-8s %-15s %5d  %-34s tz-train failed" % (fam, name, steps, what))
            continue
        print("%-8s %-15s %5d  %-34s %-16s %-16s %-16s %s"
              % (fam, name, steps, what, *("%.2e (%d)" % w for w in worst),
                 "ok" if within(worst) else "MISMATCH"))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if failed and args.with_pad:
        print("(--with-pad: transformers gives the pad token's embedding row no gradient "
              "(nn.Embedding's padding_idx), as tz-train's tz_model_embed_bwd should; a case "
              "that parts at the first step whose inputs hold it points there)")
    print("MISMATCH" if failed else "MATCH")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
