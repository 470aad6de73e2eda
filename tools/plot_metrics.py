#!/usr/bin/env python3
"""Plots a tz-train metrics file (JSONL, one object per step; docs/data.md) as PNG images:

  loss.png        training loss per step, and the evaluation loss where it was measured
  throughput.png  tokens/s and model TFLOP/s per step (MFU on the right axis when known)
  training.png    learning rate and gradient norm per step
  traffic.png     bytes moved per second by each tier and lane, per step
  memory.png      bytes in use in each tier at the end of each step, against its capacity

Usage: plot_metrics.py METRICS.jsonl [--out DIR] [--prefix NAME] [--series]
Needs matplotlib (pip install matplotlib, or apt-get install python3-matplotlib), except with
--series, which prints the curves the images would draw as JSON instead (for checks and for
other plotting tools).
"""
import argparse
import json
import os
import sys


def die(msg, code=1):
    print(f"plot_metrics: {msg}", file=sys.stderr)
    sys.exit(code)


def load(path):
    """The step objects of the file, in order; the summary line and blank lines are skipped."""
    steps = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        die(f"cannot open {path}: {e.strerror}")
    with f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                die(f"{path}:{lineno}: not JSON ({e.msg} at column {e.colno})")
            if not isinstance(obj, dict):
                die(f"{path}:{lineno}: expected a JSON object")
            # The summary, and each run's header ({"config": ..., "start_step": N}).
            if obj.get("summary") or "config" in obj:
                continue
            if not isinstance(obj.get("step"), int):
                die(f"{path}:{lineno}: no integer \"step\"")
            steps.append(obj)
    if not steps:
        die(f"{path}: no step records")
    # A resumed run appends: a step seen again replaces the earlier record from there on.
    by_step = {}
    for s in steps:
        by_step[s["step"]] = s
    return [by_step[k] for k in sorted(by_step)]


def series(steps, key):
    """(x, y) for the records where key holds a number."""
    xs, ys = [], []
    for s in steps:
        v = s.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(s["step"])
            ys.append(v)
    return xs, ys


def traffic_series(steps):
    """{"tier/lane": (steps, GB/s over the step)} for every tier and lane of the "bytes" objects."""
    lanes = {}
    for s in steps:
        bytes_ = s.get("bytes") or {}
        dt = s.get("step_s")
        if not isinstance(bytes_, dict) or not isinstance(dt, (int, float)) or dt <= 0:
            continue
        for tier, by_lane in bytes_.items():
            if not isinstance(by_lane, dict):
                continue
            for lane, b in by_lane.items():
                if isinstance(b, (int, float)):
                    xs, ys = lanes.setdefault(f"{tier}/{lane}", ([], []))
                    xs.append(s["step"])
                    ys.append(b / dt / 1e9)
    return lanes


def memory_series(steps):
    """{tier: (steps, GiB used, GiB capacity)} from the "memory" objects."""
    tiers = {}
    for s in steps:
        mem = s.get("memory") or {}
        if not isinstance(mem, dict):
            continue
        for tier, m in mem.items():
            if isinstance(m, dict) and isinstance(m.get("used"), int):
                xs, used, cap = tiers.setdefault(tier, ([], [], []))
                xs.append(s["step"])
                used.append(m["used"] / 2**30)
                cap.append(m.get("capacity", 0) / 2**30)
    return tiers


def all_series(steps):
    """Every curve the images draw, by image and name: what --series prints."""
    out = {"loss": {}, "throughput": {}, "training": {}, "traffic": {}, "memory": {}}
    for key, image in (("loss", "loss"), ("eval_loss", "loss"), ("tokens_per_s", "throughput"),
                       ("tflops", "throughput"), ("mfu", "throughput"), ("lr", "training"),
                       ("grad_norm", "training")):
        x, y = series(steps, key)
        out[image][key] = {"step": x, "value": y}
    for name, (x, y) in traffic_series(steps).items():
        out["traffic"][name] = {"step": x, "value": y}
    for tier, (x, used, cap) in memory_series(steps).items():
        out["memory"][tier] = {"step": x, "value": used, "capacity": cap}
    return out


def plot_loss(plt, steps, path):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x, y = series(steps, "loss")
    ax.plot(x, y, label="train", linewidth=1)
    x, y = series(steps, "eval_loss")
    if x:
        ax.plot(x, y, "o-", label="eval", markersize=4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_throughput(plt, steps, path):
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    x, y = series(steps, "tokens_per_s")
    a1.plot(x, y, linewidth=1)
    a1.set_ylabel("tokens/s")
    a1.set_title("throughput")
    a1.grid(alpha=0.3)
    x, y = series(steps, "tflops")
    a2.plot(x, y, linewidth=1, label="TFLOP/s")
    a2.set_ylabel("model TFLOP/s")
    a2.set_xlabel("step")
    a2.grid(alpha=0.3)
    # MFU is TFLOP/s over a fixed peak: a second scale on the same curve, not another curve.
    ratio = next((100 * s["mfu"] / s["tflops"] for s in steps
                  if isinstance(s.get("mfu"), (int, float))
                  and isinstance(s.get("tflops"), (int, float)) and s["tflops"] > 0), None)
    if ratio:
        sec = a2.secondary_yaxis("right", functions=(lambda t: t * ratio, lambda m: m / ratio))
        sec.set_ylabel("MFU (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_training(plt, steps, path):
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    x, y = series(steps, "lr")
    a1.plot(x, y, linewidth=1)
    a1.set_ylabel("learning rate")
    a1.set_title("learning rate and gradient norm")
    a1.grid(alpha=0.3)
    x, y = series(steps, "grad_norm")
    a2.plot(x, y, linewidth=1)
    a2.set_ylabel("gradient norm (before clipping)")
    a2.set_xlabel("step")
    a2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_memory(plt, steps, path):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    tiers = memory_series(steps)
    for tier in sorted(tiers):
        xs, used, cap = tiers[tier]
        line, = ax.plot(xs, used, label=f"{tier} used", linewidth=1)
        ax.plot(xs, cap, "--", color=line.get_color(), label=f"{tier} capacity", linewidth=0.8)
    if tiers:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no tier memory recorded", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("GiB")
    ax.set_title("memory per tier")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_traffic(plt, steps, path):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    lanes = traffic_series(steps)
    for name in sorted(lanes):
        xs, ys = lanes[name]
        ax.plot(xs, ys, label=name, linewidth=1)
    if lanes:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no tier traffic recorded", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("GB/s over the step")
    ax.set_title("tier traffic")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(description="Plot a tz-train metrics file as PNG images.")
    ap.add_argument("metrics", help="the JSONL file written by tz-train --metrics")
    ap.add_argument("--out", default=".", help="directory for the images (default: .)")
    ap.add_argument("--prefix", default="", help="prepended to each image's name")
    ap.add_argument("--series", action="store_true",
                    help="print the curves as JSON instead of drawing them (needs no matplotlib)")
    args = ap.parse_args(argv)
    steps = load(args.metrics)
    if args.series:
        json.dump(all_series(steps), sys.stdout)
        print()
        return 0
    # Imported only now, so --help and the file checks work without it.
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        die("matplotlib is not installed (pip install matplotlib, or apt-get install "
            "python3-matplotlib)", 2)
    os.makedirs(args.out, exist_ok=True)
    out = {}
    for name, fn in (("loss", plot_loss), ("throughput", plot_throughput),
                     ("training", plot_training), ("traffic", plot_traffic),
                     ("memory", plot_memory)):
        out[name] = os.path.join(args.out, f"{args.prefix}{name}.png")
        fn(plt, steps, out[name])
    for name in out:
        print(out[name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
