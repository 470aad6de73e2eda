#!/usr/bin/env python3
"""A ds_config trains in tz-train as DeepSpeed 0.19 would train it: the learning rate at every
step, for every scheduler tz-train accepts and their edge cases; and the tensors weight decay
applies to (a ds_config's optimizer section: every tensor, DeepSpeed's one group; without one,
Hugging Face Trainer's groups: not biases and norms; tierzero.weight_decay_exclude wins either
way, and a resume keeps the run's choice).

The reference below is DeepSpeed 0.19's schedules and its engine's timing written out from
deepspeed/runtime/lr_schedules.py and runtime/engine.py (not imported: DeepSpeed needs a GPU
stack CI lacks):
- the engine builds the scheduler at last_batch_iteration -1, whose constructor sets the
  optimizer's rate to get_lr() there (WarmupLR, WarmupDecayLR: warmup_min_lr; WarmupCosineLR: 0);
  each optimizer step runs at the rate set, and the scheduler steps after each applied one;
- warmup_num_steps: refused when not a positive integer (0.19.3), else raised to 2;
- log warm-up: (1 / log(w)) * log(it + 1); linear: it / w; WarmupLR's peak defaults to the
  optimizer's lr, WarmupDecayLR's to 0.001; WarmupDecayLR's decay max(0, (T - it) / max(1, T - w));
- WarmupCosineLR: warmup_min_ratio + gamma * (1 - warmup_min_ratio) in the warm-up, then the
  cosine of min(1, (it - w + 1) / max(1, T - w)) between 1 and cos_min_ratio, so it holds at
  cos_min_ratio past total_num_steps; the rate is the optimizer's lr times the ratio.

Each case runs tz-train (the tiny model, synthetic data) and compares the metrics file's lr of
every step with the reference, to 1e-9 relative. Usage: test_deepspeed_compat.py TZ_BIN"""
import json
import math
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1]


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from ds_schedule import Schedule as Reference  # noqa: E402  DeepSpeed's schedules, written out


CASES = [
    # name, scheduler section, steps
    ("constant", None, 4),
    ("warmup-log", {"type": "WarmupLR", "params": {
        "warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3, "warmup_num_steps": 5}}, 9),
    ("warmup-linear-1-no-max", {"type": "WarmupLR", "params": {
        "warmup_num_steps": 1, "warmup_type": "linear"}}, 6),
    ("decay-linear-past-total", {"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": 2e-5, "warmup_max_lr": 5e-4, "warmup_num_steps": 3,
        "warmup_type": "linear", "total_num_steps": 8}}, 12),
    ("decay-log-total-auto-no-max", {"type": "WarmupDecayLR", "params": {
        "warmup_num_steps": 4}}, 10),
    ("decay-warmup-over-total", {"type": "WarmupDecayLR", "params": {
        "warmup_max_lr": 1e-3, "warmup_num_steps": 6, "total_num_steps": 4}}, 9),
    ("cosine-linear-past-total", {"type": "WarmupCosineLR", "params": {
        "warmup_num_steps": 3, "warmup_type": "linear", "total_num_steps": 8,
        "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}}, 13),
    ("cosine-log-total-under-warmup", {"type": "WarmupCosineLR", "params": {
        "warmup_num_steps": 10, "total_num_steps": 6}}, 14),
    ("cosine-defaults-total-auto", {"type": "WarmupCosineLR", "params": {
        "warmup_num_steps": 2}}, 7),
]


def run(tmp, name, sched, steps, extra=(), optimizer=True):
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
    if optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}}
    if sched:
        cfg["scheduler"] = sched
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    metrics = os.path.join(tmp, name + ".jsonl")
    p = subprocess.run([os.path.join(BIN, "tz-train"), "--config", path, "--model", "tiny",
                        "--seq", "16", "--data", "synthetic", "--steps", str(steps),
                        "--metrics", metrics, "--progress", "plain", *extra],
                       capture_output=True, text=True)
    return p, metrics


def decay_of(metrics):
    """The run's tierzero.weight_decay_exclude, from the metrics file's config line."""
    with open(metrics) as f:
        for line in f:
            o = json.loads(line)
            if "config" in o:
                return o["config"].get("tierzero", {}).get("weight_decay_exclude")
    return None


def decay_groups(tmp, failures):
    cases = [  # name, optimizer section, --set, the exclusion, words of the start line
        ("ds-optimizer", True, (), ["none"], "on every tensor ("),
        ("no-optimizer", False, ("--set", "optimizer.params.weight_decay=0.1"),
         ["bias", "norm"], "but: bias, norm"),
        ("ds-optimizer-set", True, ("--set", "tierzero.weight_decay_exclude=norm"), ["norm"],
         "but: norm"),
    ]
    for name, opt, extra, want, words in cases:
        p, metrics = run(tmp, name, None, 2, extra, optimizer=opt)
        got = decay_of(metrics) if p.returncode == 0 else None
        if p.returncode != 0 or got != want or words not in p.stdout:
            failures.append(f"decay {name}: exit {p.returncode}, exclusion {got}, not {want}, "
                            f"or no start line with {words!r}: {p.stdout[-300:]}{p.stderr[-300:]}")
    # a resume keeps the run's choice, though this run's files give no optimizer section
    ck = os.path.join(tmp, "ck")
    p, _ = run(tmp, "resume-a", None, 2, ("--ckpt-dir", ck))
    p2, metrics = run(tmp, "resume-b", None, 3, ("--resume", ck), optimizer=False)
    got = decay_of(metrics) if p2.returncode == 0 else None
    if p.returncode != 0 or p2.returncode != 0 or got != ["none"]:
        failures.append(f"decay resume: exits {p.returncode} {p2.returncode}, exclusion {got}: "
                        f"{p2.stderr[-300:]}")
    print(f"decay groups: {len(cases) + 1} cases")


def lrs(metrics):
    out = []
    with open(metrics) as f:
        for line in f:
            o = json.loads(line)
            if "step" in o and "lr" in o and "summary" not in o:
                out.append((o["step"], o["lr"]))
    return out


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="tz-lr-") as tmp:
        for name, sched, steps in CASES:
            p, metrics = run(tmp, name, sched, steps)
            if p.returncode != 0:
                failures.append(f"{name}: tz-train exited {p.returncode}: {p.stderr[-400:]}")
                continue
            ref = Reference(sched, 3e-4, steps)
            got = lrs(metrics)
            if len(got) != steps:
                failures.append(f"{name}: {len(got)} step lines, not {steps}")
            for step, lr in got:
                want = ref.lr()
                ref.step()
                if abs(lr - want) > 1e-9 * max(abs(want), 1e-30):
                    failures.append(f"{name}: step {step}: lr {lr!r}, DeepSpeed's {want!r}")
            print(f"{name}: {' '.join('%.6g' % lr for _, lr in got)}")
        # --warmup-ratio (Hugging Face's warmup_ratio): the warm-up ceil(ratio * total) steps,
        # over the run's steps and over total_num_steps.
        for name, sched, steps, ratio in (
                ("ratio-decay-linear", {"type": "WarmupDecayLR", "params": {
                    "warmup_max_lr": 1e-3, "warmup_type": "linear"}}, 20, 0.25),
                ("ratio-cosine-total", {"type": "WarmupCosineLR", "params": {
                    "warmup_type": "linear", "total_num_steps": 30}}, 12, 0.1)):
            p, metrics = run(tmp, name, sched, steps, ("--warmup-ratio", str(ratio)))
            if p.returncode != 0:
                failures.append(f"{name}: tz-train exited {p.returncode}: {p.stderr[-400:]}")
                continue
            ref = Reference(sched, 3e-4, steps, ratio)
            for step, lr in lrs(metrics):
                want = ref.lr()
                ref.step()
                if abs(lr - want) > 1e-9 * max(abs(want), 1e-30):
                    failures.append(f"{name}: step {step}: lr {lr!r}, expected {want!r}")
            if "tierzero.warmup_ratio %s from --warmup-ratio" % ratio not in p.stdout:
                failures.append(f"{name}: the start does not say where the ratio came from")
            print(f"{name}: warm-up {ref.w} steps")
        # Both a ratio and steps: refused; a ratio without a schedule: refused.
        p, _ = run(tmp, "ratio-and-steps", {"type": "WarmupLR", "params": {}}, 2,
                   ("--warmup-ratio", "0.1", "--warmup-steps", "5"))
        if p.returncode != 2 or "both given" not in p.stderr:
            failures.append(f"ratio and steps: exit {p.returncode}: {p.stderr[-300:]}")
        p, _ = run(tmp, "ratio-constant", None, 2, ("--warmup-ratio", "0.1"))
        if p.returncode != 2 or "no scheduler" not in p.stderr:
            failures.append(f"ratio without a schedule: exit {p.returncode}: {p.stderr[-300:]}")
        # A warm-up of 0 steps: refused at start as DeepSpeed 0.19.3 refuses it, naming the key.
        p, _ = run(tmp, "warmup-0", {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}, 2)
        if p.returncode != 2 or "scheduler.params.warmup_num_steps" not in p.stderr:
            failures.append(f"warmup 0: exit {p.returncode}, not 2 naming the key: "
                            f"{p.stderr[-300:]}")
        decay_groups(tmp, failures)
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    print("test_deepspeed_compat: " + ("%d failed" % len(failures) if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
