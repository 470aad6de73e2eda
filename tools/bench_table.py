#!/usr/bin/env python3
"""Training throughput of tz-train against its peers: FSDP2 (bench/fsdp_peer.py) and DeepSpeed
ZeRO-3 (bench/ds_peer.py).

  bench_table.py [table] [--dir results/bench]
      Reads every results/bench/*.json (one configuration each, written by tools/bench-train.sh)
      and prints one markdown table per sequence length and micro-batch: model | runner | step s |
      tokens/s | model TFLOP/s | vs fsdp2-offload | vs fsdp2-gpu | vs ds-offload | vs ds-gpu |
      bound s | efficiency | stalls | collectives. "vs X" is this row's tokens/s over X's for the
      same model (above 1: faster than X); efficiency is tz-train's predicted bound over its
      achieved step time; stalls and collectives are the compute lane's time waiting for data
      and in (or waiting for) the collectives, as shares of the step (medians over the timed
      steps). Below it, issue 25's pairs (DeepSpeed's step time over tz-train's, per model and
      regime), and the checks that the peers reproduce the issues' figures: the FSDP2 offload
      peer within 10%, each DeepSpeed runner within 15% (DS_REFERENCE; llama-7b's ds-offload
      by being killed for host memory). Until a peer does for a model, that model's ratios
      against it are marked († FSDP2, ‡ DeepSpeed) and do not count.

  bench_table.py run --runner R --model M --seq T --micro-batch B --warmup W --out FILE
                     [--steps N] [--timeout S] [--mem-floor G] [--metrics FILE.jsonl] [--log FILE]
                     -- COMMAND...
      Runs COMMAND (tz-train or the peer), its output to the terminal and to --log, sampling the
      GPU's memory with nvidia-smi where there is one. For a tz-* runner, summarises --metrics
      into FILE in the peer's schema (steps after the first W; bound_s and efficiency added).
      For any runner, when COMMAND ends without FILE written (a crash, a kill, a failure of
      tz-train), FILE gets the identifying keys and "error". With --timeout, COMMAND gets SIGTERM
      after S seconds (tz-train stops after the step it is in) and SIGKILL 30 s later; a tz-train
      that had done all its steps (W + N, --steps) before it was stopped or failed keeps its
      figures, with "ended" saying how it ended. The signals go to COMMAND's process group (its
      own with --timeout or --mem-floor): every process it started. A SIGTERM to the wrapper (a time
      limit around the harness) is passed on the same way, and the wrapper stays to record
      what COMMAND did. With --mem-floor G, COMMAND's process group is killed (SIGKILL) when
      the host's MemAvailable falls under G GiB, and the result's error says "killed for host
      memory" (with "killed_for_host_memory": what was seen). Exit status: COMMAND's.

  bench_table.py disk-ceiling --out FILE --metrics FILE.jsonl --nvme-dir DIR [--size SIZE]
      After a tz-* run whose steps used the disk (nvme_* keys in its metrics: tz-nvme, tz-auto
      when the plan put state there): runs tools/disk-ceiling.sh on DIR, one mixed fio job at the
      timed steps' read share with the run's request size and queue depth (aio.block_size,
      tierzero.queue_depth, tierzero.nvme_buffered from the metrics' config line), on a file of
      SIZE bytes (default: the state the run kept on the disk, its nvme arena's used bytes, at
      least 256 MiB), moving what a timed step moved (reads and writes together, at least the
      file once), and adds fio's rates and the step's over fio's to FILE (the disk_* and fio_*
      keys below); "disk_ceiling_error" when fio is missing or fails. Nothing for a run without
      the disk. Exit status 0, or 2.

Result schema (both sides): runner, model, seq, micro_batch, world_size, steps (timed), warmup,
step_s (median of the timed steps), tokens_per_step, tokens_per_s (tokens_per_step / step_s),
model_tflops (flops_per_token * tokens_per_s / 1e12, flops_per_token = 6N + 12*L*T*d as
trainer/run/metrics.h counts it), peak_mem_gib, ...; tz-* runs add bound_s and efficiency
(bound_s / step_s), setup_s and end_s (tz-train's time before its first step and after its
last); a failed configuration has "error" instead of the figures. tz-* runs that used the disk
add, over the timed steps: disk_read_bytes and disk_write_bytes (a step's, the mean),
disk_read_gbs and disk_write_gbs (their bytes over their wall time, GB/s), disk_read_share,
disk_busy_share (the nvme tier's busy time over the steps' time), disk_busy_read_gbs and
disk_busy_write_gbs (bytes over the busy time), disk_state_bytes (the nvme arena's used bytes at
the last step); and after disk-ceiling: fio_read_gbs,
fio_write_gbs, fio_read_share, fio_job (tools/disk-ceiling.sh's object), disk_read_vs_fio and
disk_write_vs_fio (the step's rate over fio's: issue 26 asks >= 0.9), disk_busy_read_vs_fio and
disk_busy_write_vs_fio (the same while the disk was busy).
"""
import argparse
import datetime
import glob
import json
import re
import os
import resource
import shutil
import socket
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peer_common  # noqa: E402  (the preset table and FLOP formula; imports no torch)

# The measurements of FSDP2 with CPUOffloadPolicy on one H200 (seq 2048, micro-batch 4):
# step s, tokens/s, model TFLOP/s.
REFERENCE = {
    "llama-1b": (1.73, 4700, 31),
    "llama-3b": (6.5, 1260, 29),
    "llama-7b": (11.4, 720, 31),
}
REFERENCE_SEQ, REFERENCE_MICRO = 2048, 4
TOLERANCE = 0.10

# Issue 25's measurements of DeepSpeed 0.19.8 ZeRO-3 on one H200 (same batch), step s per
# (model, runner, accumulation steps); KILLED: killed at set-up for host memory, which a run
# reproduces by being killed for it (the harness's memory cap, or the kernel). A (low, high)
# pair is a range the issue measured (issue 26's 8 micro-batches a step): a run within 15% of
# the range reproduces it.
KILLED = "killed for host memory"
DS_REFERENCE = {
    ("llama-1b", "ds-offload", 1): 0.877,
    ("llama-3b", "ds-offload", 1): 2.363,
    ("llama-7b", "ds-offload", 1): KILLED,
    ("llama-7b", "ds-opt", 1): 6.657,
    ("llama-7b", "ds-gpu", 1): 1.190,
    ("llama-1b", "ds-nvme", 1): 18.26,
    ("llama-3b", "ds-offload", 8): (7.8, 8.4),
}
DS_TOLERANCE = 0.15
# The pairs: DeepSpeed's configuration beside the tz-train runner it is measured against.
DS_PAIRS = [("llama-1b", "ds-offload", "tz-offload"), ("llama-3b", "ds-offload", "tz-offload"),
            ("llama-7b", "ds-offload", "tz-offload"), ("llama-7b", "ds-opt", "tz-auto"),
            ("llama-7b", "ds-gpu", "tz-auto"), ("llama-1b", "ds-nvme", "tz-nvme"),
            ("llama-13b", "ds-offload", "tz-auto")]
PEERS = ["fsdp2-offload", "fsdp2-gpu", "ds-offload", "ds-gpu"]

RUNNER_ORDER = ["fsdp2-offload", "fsdp2-gpu", "ds-offload", "ds-opt", "ds-gpu", "ds-nvme",
                "tz-offload", "tz-auto", "tz-nvme"]
MODEL_ORDER = list(peer_common.PRESETS)


def load_results(d):
    out = []
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        if path.endswith(".trace.json"):  # a run's lane trace beside its result (bench-train.sh)
            continue
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            print("bench_table: skipping %s: %s" % (path, e), file=sys.stderr)
            continue
        if not isinstance(r, dict) or "runner" not in r or "model" not in r:
            print("bench_table: skipping %s: no runner or model" % path, file=sys.stderr)
            continue
        if "accum" in r and "accumulation" not in r:  # the peers' results before 2026-12-03
            r["accumulation"] = r["accum"]
        r["_file"] = os.path.basename(path)
        out.append(r)
    return out


def label(r):
    return r["runner"] + ("-" + r["tag"] if r.get("tag") else "")


def ok(r):
    return "error" not in r and isinstance(r.get("tokens_per_s"), (int, float)) \
        and r["tokens_per_s"] > 0


def sort_key(r):
    m = r["model"]
    run = r["runner"]
    return (MODEL_ORDER.index(m) if m in MODEL_ORDER else len(MODEL_ORDER), m,
            RUNNER_ORDER.index(run) if run in RUNNER_ORDER else len(RUNNER_ORDER), run,
            r.get("tag") or "")


def baseline(rows, model, runner):
    """The untagged result of runner for model (a tagged one when there is no untagged)."""
    c = [r for r in rows if r["model"] == model and r["runner"] == runner and ok(r)]
    c.sort(key=lambda r: (bool(r.get("tag")), r.get("tag") or ""))
    return c[0] if c else None


def reference_check(r):
    """(verdict, text) for an fsdp2-offload result against the issue's figures; verdict None
    when no reference applies."""
    ref = REFERENCE.get(r["model"])
    if not ref or not at_reference_shape(r):
        return None, None
    if not ok(r):
        return False, "%s: %s" % (r["model"], r.get("error", "no figures"))
    dev = r["step_s"] / ref[0] - 1.0
    good = abs(dev) <= TOLERANCE
    return good, "%s: %.3g s against %.3g s (%+.1f%%, %s)" % (
        r["model"], r["step_s"], ref[0], 100.0 * dev, "within 10%" if good else "NOT within 10%")


def at_reference_shape(r):
    """The issues' batch: sequence, micro-batch and one rank (any number of micro-batches)."""
    return r.get("seq") == REFERENCE_SEQ and r.get("micro_batch") == REFERENCE_MICRO \
        and r.get("world_size", 1) == 1


def ds_reference(model, runner, accumulation):
    return DS_REFERENCE.get((model, runner, accumulation))


def fmt_reference(ref):
    if isinstance(ref, tuple):
        return "%.4g-%.4g" % ref
    return "killed" if ref == KILLED else fmt(ref, "%.4g")


def killed_for_memory(r):
    e = str(r.get("error", ""))
    return "killed_for_host_memory" in r or "host memory" in e or "host's memory" in e


def ds_result(rows, model, runner):
    """The untagged result of a DeepSpeed runner for model, failed or not (a tagged one when
    there is no untagged); None when there is none."""
    c = [r for r in rows if r["model"] == model and r["runner"] == runner]
    c.sort(key=lambda r: (bool(r.get("tag")), not ok(r), r.get("tag") or ""))
    return c[0] if c else None


def ds_reference_check(r):
    """(verdict, text) for a ds-* result against issue 25's figure for its model and runner;
    verdict None when no figure applies."""
    accumulation = r.get("accumulation", 1)
    ref = ds_reference(r["model"], r["runner"], accumulation)
    if ref is None or not at_reference_shape(r):
        return None, None
    name = "%s %s" % (r["model"], r["runner"])
    if ref == KILLED:
        good = killed_for_memory(r)
        return good, "%s: %s (the issue's: killed at set-up for host memory)" % (
            name, "killed for host memory, as in the issue" if good else
            "%.3g s, NOT killed" % r["step_s"] if ok(r) else r.get("error", "no figures"))
    if not ok(r):
        return False, "%s: %s" % (name, r.get("error", "no figures"))
    lo, hi = ref if isinstance(ref, tuple) else (ref, ref)
    dev = r["step_s"] / hi - 1.0 if r["step_s"] > hi else min(r["step_s"] / lo - 1.0, 0.0)
    good = abs(dev) <= DS_TOLERANCE
    return good, "%s%s: %.3g s against %s s (%+.1f%%, %s)" % (
        name, " at %d micro-batches" % accumulation if accumulation != 1 else "", r["step_s"],
        fmt_reference(ref), 100.0 * dev, "within 15%" if good else "NOT within 15%")


def peer_verified(g, device, model, peer):
    """Whether the peer's baseline for model reproduces the issue's figure (None: not checked
    here, not on an H200)."""
    if "H200" not in device:
        return None
    if peer.startswith("fsdp2-"):
        b = baseline(g, model, "fsdp2-offload")
        return reference_check(b)[0] if b else None
    b = ds_result(g, model, peer)
    return ds_reference_check(b)[0] if b else None


def ds_pairs(g, device, accumulation):
    """Issue 25's table from this group's results: DeepSpeed's step beside tz-train's."""
    lines = []
    for model, ds, tz in DS_PAIRS:
        d, t = ds_result(g, model, ds), baseline(g, model, tz)
        if not d and not t:
            continue
        v = ds_reference_check(d)[0] if d and "H200" in device else None
        ref = ds_reference(model, ds, accumulation)
        if d and ok(d):
            ds_s = "%.3f" % d["step_s"]
        elif d:
            ds_s = "error: " + str(d.get("error", "no figures")).replace("|", "/")[:80]
        else:
            ds_s = "-"
        ratio = "-"
        if d and ok(d) and t:
            ratio = "%.2fx" % (d["step_s"] / t["step_s"]) + ("" if v is True else " ‡")
        elif d and killed_for_memory(d) and t:
            ratio = "DeepSpeed cannot" + ("" if v is True else " ‡")
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            model, ds, ds_s, fmt_reference(ref), tz,
            fmt(t["step_s"], "%.3f") if t else "-", ratio))
    if not lines:
        return
    print("DeepSpeed beside tz-train (issue 25's pairs; ratio: DeepSpeed's step time over "
          "tz-train's):\n")
    print("| model | DeepSpeed | step s | issue's step s | tz-train | step s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for line in lines:
        print(line)
    print()


def fmt(v, f):
    return f % v if isinstance(v, (int, float)) else "-"


def fmt_tflops(v):
    """One decimal, or three significant digits below 1 (the tiny model on a CPU)."""
    if not isinstance(v, (int, float)):
        return "-"
    return "%.1f" % v if v >= 1 else "%.3g" % v


def share(r, key):
    """r[key] (seconds in a step) as a share of r's step, or "-"."""
    v, step = r.get(key), r.get("step_s")
    if not isinstance(v, (int, float)) or not isinstance(step, (int, float)) or step <= 0:
        return "-"
    return "%.1f%%" % (100.0 * v / step)


def disk_table(g):
    """The disk during the step beside fio's mixed job, for the rows that used the disk."""
    rows = [r for r in g if ok(r) and isinstance(r.get("disk_read_gbs"), (int, float))]
    if not rows:
        return
    print("Disk during the step against one mixed fio job on the same directory at the step's "
          "read share (tools/disk-ceiling.sh; issue 26 asks step / fio >= 0.9 each way):\n")
    print("| model | runner | GB a step (read + write) | read share | step read GB/s | "
          "step write GB/s | fio read GB/s | fio write GB/s | read / fio | write / fio | "
          "disk busy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fio = "fio: " + str(r["disk_ceiling_error"]).replace("|", "/")[:60] \
            if "disk_ceiling_error" in r else None
        print("| %s | %s | %s + %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], label(r), fmt(r["disk_read_bytes"] / 1e9, "%.3g"),
            fmt(r["disk_write_bytes"] / 1e9, "%.3g"), fmt(r.get("disk_read_share"), "%.2f"),
            fmt(r["disk_read_gbs"], "%.3f"), fmt(r.get("disk_write_gbs"), "%.3f"),
            fio or fmt(r.get("fio_read_gbs"), "%.3f"), fmt(r.get("fio_write_gbs"), "%.3f"),
            fmt(r.get("disk_read_vs_fio"), "%.2f"), fmt(r.get("disk_write_vs_fio"), "%.2f"),
            "%.0f%%" % (100.0 * r["disk_busy_share"])
            if isinstance(r.get("disk_busy_share"), (int, float)) else "-"))
    print()


def scaling(rows):
    """Strong scaling: each run on W > 1 ranks beside the same runner's run on one rank that
    accumulates W micro-batches (the same global batch), same device, model, sequence and
    micro-batch; the untagged one, else the first by tag."""
    lines = []
    for r in sorted(rows, key=sort_key):
        w = r.get("world_size", 1)
        if w < 2 or r.get("accumulation", 1) != 1 or not ok(r):
            continue
        same = [b for b in rows if ok(b) and b.get("world_size", 1) == 1
                and b.get("accumulation", 1) == w and b["runner"] == r["runner"]
                and b["model"] == r["model"] and b.get("seq") == r.get("seq")
                and b.get("micro_batch") == r.get("micro_batch")
                and b.get("device") == r.get("device")]
        if not same:
            continue
        same.sort(key=lambda b: (bool(b.get("tag")), b.get("tag") or ""))
        b = same[0]
        speed = r["tokens_per_s"] / b["tokens_per_s"]
        tf = r.get("model_tflops")
        eff = r.get("efficiency")
        lines.append("| %s | %s | %d | %.0f | %s: %.0f | %.2fx | %.2f | %s | %s | %s |" % (
            r["model"], label(r), w, r["tokens_per_s"], label(b), b["tokens_per_s"], speed,
            speed / w, fmt_tflops(tf / w) if isinstance(tf, (int, float)) else "-",
            "%.0f%%" % (100.0 * eff) if isinstance(eff, (int, float)) else "-",
            share(r, "coll_s")))
    if not lines:
        return
    print("### Strong scaling: W ranks against one rank accumulating W micro-batches\n")
    print("| model | runner | ranks | tokens/s | one rank | speed-up | scaling efficiency | "
          "model TFLOP/s per rank | bound efficiency | collectives (of the step) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for line in lines:
        print(line)
    print()


def table(args):
    rows = load_results(args.dir)
    if not rows:
        print("bench_table: no results in %s (tools/bench-train.sh writes them)" % args.dir,
              file=sys.stderr)
        return 1
    groups = {}
    for r in rows:
        groups.setdefault((r.get("device") or "unknown device", r.get("seq"), r.get("micro_batch"),
                           r.get("world_size", 1), r.get("accumulation", 1)), []).append(r)
    reference = (REFERENCE_SEQ, REFERENCE_MICRO, 1, 1)
    for (device, seq, micro, world, accum), g in sorted(
            groups.items(), key=lambda kv: (kv[0][1:] != reference, kv[0][0] == "cpu",
                                            str(kv[0]))):
        g.sort(key=sort_key)
        verified = {(m, peer): peer_verified(g, device, m, peer)
                    for m in {r["model"] for r in g} for peer in PEERS}
        print("### %s: seq %s, micro-batch %s, %s rank%s%s\n" % (
            device, seq, micro, world, "" if world == 1 else "s",
            ", accumulation %s" % accum if accum != 1 else ""))
        print("| model | runner | step s | tokens/s | model TFLOP/s | vs fsdp2-offload | "
              "vs fsdp2-gpu | vs ds-offload | vs ds-gpu | bound s | efficiency | stalls | "
              "collectives |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        marked = set()
        for r in g:
            if not ok(r):
                err = str(r.get("error", "no figures")).replace("|", "/").splitlines()[0][:120]
                print("| %s | %s | %s | - | - | - | - | - | - | - | - | - | - |" % (
                    r["model"], label(r), "error: " + err))
                continue
            ratios = []
            for peer in PEERS:
                b = baseline(g, r["model"], peer)
                if not b or b is r:
                    ratios.append("-")
                    continue
                x = "%.2fx" % (r["tokens_per_s"] / b["tokens_per_s"])
                if verified.get((r["model"], peer)) is not True:
                    x += " †" if peer.startswith("fsdp2-") else " ‡"
                    marked.add("fsdp2" if peer.startswith("fsdp2-") else "ds")
                ratios.append(x)
            eff = r.get("efficiency")
            print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["model"], label(r), fmt(r.get("step_s"), "%.3f"),
                fmt(r.get("tokens_per_s"), "%.0f"), fmt_tflops(r.get("model_tflops")),
                ratios[0], ratios[1], ratios[2], ratios[3], fmt(r.get("bound_s"), "%.3f"),
                "%.0f%%" % (100.0 * eff) if isinstance(eff, (int, float)) else "-",
                share(r, "stall_s"), share(r, "coll_s") if r.get("world_size", 1) > 1 else "-"))
        print()
        disk_table(g)
        if "fsdp2" in marked:
            print("† the FSDP2 offload peer has not reproduced the reference figure for this "
                  "model within 10% (or there is no reference): the ratio does not count yet.\n")
        if "ds" in marked:
            print("‡ that DeepSpeed runner has not reproduced the issues' figure for this model "
                  "within 15% (or there is no figure): the ratio does not count yet.\n")
        if (seq, micro, world) == reference[:3]:
            ds_pairs(g, device, accum)
        checks = []
        for m in sorted({r["model"] for r in g}, key=lambda m: sort_key({"model": m,
                                                                          "runner": ""})):
            b = baseline(g, m, "fsdp2-offload")
            if b and "H200" in device:
                v, text = reference_check(b)
                if text:
                    checks.append(text)
        if (seq, micro, world, accum) == reference and "H200" in device:
            for m in REFERENCE:
                if not baseline(g, m, "fsdp2-offload"):
                    checks.append("%s: no fsdp2-offload result" % m)
            print("Reference check (FSDP2 with CPUOffloadPolicy, the issue's 1.73 / 6.5 / 11.4 s "
                  "for llama-1b / 3b / 7b, within 10%%): %s.\n" % "; ".join(checks))
        if (seq, micro, world) == reference[:3] and "H200" in device \
                and any(r["runner"].startswith("ds-") for r in g):
            ds_checks = []
            for (m, runner, acc) in DS_REFERENCE:
                if acc != accum:
                    continue
                d = ds_result(g, m, runner)
                ds_checks.append(ds_reference_check(d)[1] if d else
                                 "%s %s: no result" % (m, runner))
            print("Reference check (DeepSpeed 0.19.8 ZeRO-3, the issues' figures within 15%%): "
                  "%s.\n" % ("; ".join(ds_checks) or "no figure at %d micro-batches" % accum))
    scaling(rows)
    if not any(k[1:] == reference and "H200" in k[0] for k in groups):
        print("Reference check: no results on an H200 at seq %d, micro-batch %d, one rank, "
              "where the issue's FSDP2 figures were measured." % (REFERENCE_SEQ, REFERENCE_MICRO))
    return 0


# ---- run ----

def gpu_memory_used():
    """MiB used on each GPU, or None without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10).stdout
        v = [float(x) for x in out.split()]
        return v or None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def meminfo_gib():
    """(MemAvailable, MemTotal) of the host in GiB from /proc/meminfo, or (None, None)."""
    v = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, rest = line.partition(":")
                if k in ("MemAvailable", "MemTotal"):
                    v[k] = int(rest.split()[0]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return v.get("MemAvailable"), v.get("MemTotal")


def host_state():
    """What of the host's state can change a run's speed beside its own work, at the run's start:
    memory free, available, cached and dirty (GiB, /proc/meminfo), transparent huge pages'
    settings and the load average (issue 25's peers ran 38% slower at llama-3b on one machine
    than on another, tz-train not)."""
    out = {}
    keys = {"MemFree": "mem_free_gib", "MemAvailable": "mem_available_gib", "Cached": "cached_gib",
            "Dirty": "dirty_gib", "AnonHugePages": "anon_huge_gib"}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, rest = line.partition(":")
                if k in keys:
                    out[keys[k]] = round(int(rest.split()[0]) / 2**20, 2)
    except (OSError, ValueError, IndexError):
        pass
    for name in ("enabled", "defrag"):
        try:
            with open("/sys/kernel/mm/transparent_hugepage/" + name) as f:
                out["thp_" + name] = f.read().strip()
        except OSError:
            pass
    try:
        out["loadavg"] = [float(x) for x in os.getloadavg()]
    except OSError:
        pass
    return out


class MemoryWatchdog:
    """Kills the command (kill(), SIGKILL to its process group) when the host's MemAvailable falls
    under floor GiB, so that a run that would exhaust the host's memory ends before the kernel's
    OOM killer takes something else, or the machine. A cap on address space (prlimit --as) does
    not work for CUDA programs, whose virtual mappings are far larger than their memory; a
    cgroup is not writable everywhere. fired holds what it saw when it fired."""

    def __init__(self, floor, kill, interval=0.25):
        self.floor, self.kill, self.interval = floor, kill, interval
        self.fired = None
        self.low = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stop.wait(self.interval):
            avail, total = meminfo_gib()
            if avail is None:
                return
            self.low = avail if self.low is None else min(self.low, avail)
            if avail < self.floor:
                self.fired = {"mem_available_gib": round(avail, 2), "floor_gib": self.floor,
                              "mem_total_gib": round(total, 2) if total else None}
                self.kill()
                return

    def finish(self):
        self.stop.set()
        self.thread.join()
        return self.fired


class GpuSampler:
    """Largest rise of any GPU's used memory over its value before the run, every 0.5 s."""

    def __init__(self):
        self.base = gpu_memory_used()
        self.peak = 0.0
        self.stop = threading.Event()
        self.thread = None
        if self.base:
            self.thread = threading.Thread(target=self.loop, daemon=True)
            self.thread.start()

    def loop(self):
        while not self.stop.wait(0.5):
            v = gpu_memory_used()
            if v and len(v) == len(self.base):
                self.peak = max(self.peak, max(a - b for a, b in zip(v, self.base)))

    def finish(self):
        if not self.thread:
            return None
        self.stop.set()
        self.thread.join()
        return self.peak / 1024.0


def git_commit():
    # The device machine's copy of .git can be older than the tree it was sent (its commit is the
    # session's first): a command there can name the tree's commit in TZ_COMMIT.
    if os.environ.get("TZ_COMMIT"):
        return os.environ["TZ_COMMIT"]
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def median(v):
    return peer_common.median(v)


def run_shape(log):
    """(ranks, accumulation steps, set-up seconds) from tz-train's log: its "model ..." line and
    its "set up in" line; (None, 1, None) for what the log does not say (world size is then
    tokens per step over the micro-batch's)."""
    ranks, accum, setup = None, 1, None
    try:
        with open(log, errors="replace") as f:
            for line in f:
                if line.startswith("tz-train: model "):
                    m = re.search(r", (\d+) ranks?,", line)
                    if m:
                        ranks = int(m.group(1))
                    m = re.search(r"accumulation (\d+)", line)
                    if m:
                        accum = int(m.group(1))
                m = re.match(r"tz-train: set up in ([0-9.]+) s", line)
                if m:
                    setup = float(m.group(1))
                    break
    except (OSError, TypeError):
        pass
    return ranks, accum, setup


def end_seconds(log):
    """tz-train's "ended X s after its last step" from the log, else None."""
    try:
        with open(log, errors="replace") as f:
            for line in f:
                m = re.match(r"tz-train: ended ([0-9.]+) s after its last step", line)
                if m:
                    return float(m.group(1))
    except (OSError, TypeError):
        pass
    return None


def summarise_tz(a, res):
    """The timed steps of a tz-train metrics file, in the peer's schema."""
    steps = []
    with open(a.metrics) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            o = json.loads(line)
            if o.get("summary"):
                res["tz_summary"] = o
            elif "step" in o:  # not the run's header line ({"config": ...})
                steps.append(o)
    timed = [o for o in steps if o["step"] > a.warmup]
    if not timed:
        raise ValueError("%s: %d steps, none after the %d warm-up steps" %
                         (a.metrics, len(steps), a.warmup))
    times = [o["step_s"] for o in timed]
    step_s = median(times)
    tokens = timed[0]["tokens"]
    ranks, accum, setup = run_shape(a.log)
    o = timed[0]
    # tz-train's FLOP per token, from its own figures: tflops = fpt * tokens / step_s / 1e12.
    fpt = o["tflops"] * 1e12 * o["step_s"] / o["tokens"]
    s = peer_common.PRESETS.get(a.model)
    if s and abs(fpt / peer_common.flops_per_token(s, a.seq) - 1.0) > 1e-6:
        raise ValueError("tz-train counts %.6g FLOP per token, the peer's formula %.6g" %
                         (fpt, peer_common.flops_per_token(s, a.seq)))
    bounds = [o["bound_s"] for o in timed if isinstance(o.get("bound_s"), (int, float))]
    res.update({
        "steps": len(timed), "step_s": step_s, "step_s_mean": sum(times) / len(times),
        "step_s_min": min(times), "step_times": times, "tokens_per_step": tokens,
        "world_size": ranks if ranks else tokens // (a.seq * a.micro_batch * accum),
        "accumulation": accum, "setup_s": setup, "end_s": end_seconds(a.log),
        "tokens_per_s": tokens / step_s, "model_tflops": fpt * tokens / step_s / 1e12,
        "flops_per_token": fpt, "stall_s": median([o.get("stall_s") or 0.0 for o in timed]),
        "coll_s": median([o.get("coll_s") or 0.0 for o in timed]),
        "loss_first": steps[0].get("loss"), "loss_last": steps[-1].get("loss"),
    })
    if s:
        res["n_params"] = peer_common.n_params(s)
    if bounds:
        res["bound_s"] = median(bounds)
        res["efficiency"] = res["bound_s"] / step_s
    res.update(disk_figures(timed))


def disk_figures(timed):
    """The disk's figures over the timed steps (their nvme_* keys: docs/data.md), {} when the run
    had no nvme tier."""
    if not all(isinstance(o.get("nvme_read_bytes"), int) for o in timed):
        return {}
    n = len(timed)
    rd = sum(o["nvme_read_bytes"] for o in timed)
    wr = sum(o["nvme_write_bytes"] for o in timed)
    wall = sum(o["step_s"] for o in timed)
    busy = [o.get("nvme_busy_s") for o in timed]
    busy = sum(busy) if all(isinstance(b, (int, float)) for b in busy) else None
    d = {"disk_read_bytes": rd / n, "disk_write_bytes": wr / n,
         "disk_read_gbs": rd / wall / 1e9 if wall > 0 else None,
         "disk_write_gbs": wr / wall / 1e9 if wall > 0 else None,
         "disk_read_share": rd / (rd + wr) if rd + wr else None}
    used = ((timed[-1].get("memory") or {}).get("nvme") or {}).get("used")
    if isinstance(used, int):
        d["disk_state_bytes"] = used
    if busy:
        d.update({"disk_busy_s": busy / n, "disk_busy_share": busy / wall if wall > 0 else None,
                  "disk_busy_read_gbs": rd / busy / 1e9, "disk_busy_write_gbs": wr / busy / 1e9})
    return d


def steps_done(metrics):
    """Step records in a tz-train metrics file (0 when it cannot be read)."""
    try:
        with open(metrics) as f:
            return sum(1 for x in f if x.strip() and '"summary"' not in x
                       and not x.startswith('{"config"'))
    except (OSError, TypeError):
        return 0


def last_error_line(log):
    """The last line of the log that looks like a failure, else the last line."""
    try:
        with open(log, errors="replace") as f:
            lines = [x.rstrip() for x in f if x.strip()]
    except OSError:
        return ""
    for x in reversed(lines):
        if "rank 0:" in x or "error" in x.lower() or "Error" in x or "out of memory" in x:
            return x[:400]
    return lines[-1][:400] if lines else ""


def run(args):
    cmd = args.command
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("bench_table: run: no command after --", file=sys.stderr)
        return 2
    if args.metrics and os.path.exists(args.metrics):
        os.remove(args.metrics)
    started = time.time()
    res = {
        "runner": args.runner, "model": args.model, "seq": args.seq,
        "micro_batch": args.micro_batch, "warmup": args.warmup, "cmd": " ".join(cmd),
        "host": socket.gethostname(), "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if args.tag:
        res["tag"] = args.tag
    res["host_before"] = host_state()
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("TZ_") and k != "TZ_BIN"}
    if env:
        res["env"] = env
    dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.splitlines() \
        if shutil.which("nvidia-smi") and not args.device else []
    res["device"] = args.device or (dev[0].strip() if dev else "cpu")
    sampler = GpuSampler()
    log = open(args.log, "w") if args.log else None
    t0 = time.perf_counter()
    # Its own process group, so that a stop reaches every process it started (tz-train --nproc's
    # workers, a shell's children).
    own_group = bool(args.timeout or args.mem_floor)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=own_group)
    timers = []

    def send(sig):
        try:
            if own_group:
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)
        except ProcessLookupError:
            pass

    watchdog = None
    if args.mem_floor:
        def out_of_memory():
            print("bench: %s %s: the host's available memory fell under %g GiB: killing the "
                  "run" % (args.runner, args.model, args.mem_floor), file=sys.stderr, flush=True)
            send(signal.SIGKILL)
        watchdog = MemoryWatchdog(args.mem_floor, out_of_memory)

    def later(seconds, fn, *a):
        t = threading.Timer(seconds, fn, a)
        t.daemon = True
        t.start()
        timers.append(t)

    if args.timeout:
        def stop(sig):
            if p.poll() is None:
                res.setdefault("timed_out_s", args.timeout)
                print("bench: %s %s: past --timeout %g s: %s" % (
                    args.runner, args.model, args.timeout, signal.Signals(sig).name),
                    file=sys.stderr)
                send(sig)
        later(args.timeout, stop, signal.SIGTERM)
        later(args.timeout + 30, stop, signal.SIGKILL)

    # Stopped itself (SIGTERM: a time limit around the harness), the wrapper passes it on and
    # stays to record what the command did, killing it 30 s later if it has not ended.
    def on_term(signum, frame):
        res.setdefault("terminated", True)
        send(signal.SIGTERM)
        later(30, send, signal.SIGKILL)
    signal.signal(signal.SIGTERM, on_term)
    try:
        for chunk in iter(lambda: p.stdout.read1(65536), b""):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            if log:
                log.write(chunk.decode(errors="replace"))
                log.flush()
        rc = p.wait()
    except KeyboardInterrupt:
        # In a session of its own (--timeout), the command does not get the terminal's SIGINT.
        if own_group:
            os.killpg(p.pid, signal.SIGINT)
        raise
    for t in timers:
        t.cancel()
    if watchdog:
        fired = watchdog.finish()
        if watchdog.low is not None:
            res["mem_available_min_gib"] = round(watchdog.low, 2)
        if fired:
            res["killed_for_host_memory"] = fired
    killed = "killed for host memory (MemAvailable %.1f GiB, under the floor of %g GiB, of %s " \
        "GiB)" % (fired["mem_available_gib"], fired["floor_gib"], fired["mem_total_gib"]) \
        if watchdog and fired else None
    res["wall_s"] = time.perf_counter() - t0
    if log:
        log.close()
    peak_gpu = sampler.finish()
    peak_host = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    is_tz = args.runner.startswith("tz-")
    # A result the command wrote itself (the peer) is newer than its start; an older file is
    # a previous run's, kept when this one records nothing.
    fresh = os.path.exists(args.out) and os.path.getmtime(args.out) >= started - 1.0
    if is_tz:
        res["peak_mem_gib"] = peak_gpu
        res["peak_mem_source"] = "nvidia-smi every 0.5 s, less the memory used before the run"
        res["peak_host_gib"] = peak_host
        done = steps_done(args.metrics)
        why = "tz-train exited with status %d%s: %s" % (
            rc, " (%s)" % killed if killed else
            " (stopped past --timeout)" if "timed_out_s" in res else
            " (the harness was stopped)" if "terminated" in res else "",
            last_error_line(args.log) if args.log else "")
        if rc == 0 or (args.steps and done >= args.warmup + args.steps):
            try:
                summarise_tz(args, res)
                if rc != 0:
                    res["ended"] = "after its last step: " + why
            except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
                res["error"] = "cannot summarise %s: %s" % (args.metrics, e)
        else:
            res["error"] = why
            res["steps_done"] = done
        peer_common.write_json(args.out, res)
    elif rc == 3 and not fresh:
        # The peer's status for a machine without torch, transformers or a GPU: no result.
        print("bench: %s %s: nothing recorded (the peer cannot run here)" %
              (args.runner, args.model), file=sys.stderr)
        return rc
    elif not fresh:
        why = "killed by signal %d" % -rc if rc < 0 else "exit status %d" % rc
        if killed:
            why = killed
        elif rc in (-9, 137):
            why += " (the host's memory, most likely)"
        res["error"] = "%s ended without a result, %s: %s" % (
            os.path.basename(cmd[1] if cmd[0].startswith("python") and len(cmd) > 1 else cmd[0]),
            why, last_error_line(args.log) if args.log else "")
        res["peak_host_gib"] = peak_host
        peer_common.write_json(args.out, res)
    else:
        # The peer wrote its own result; add what only the wrapper knows.
        with open(args.out) as f:
            r = json.load(f)
        r["host_before"] = res["host_before"]
        if args.tag:
            r["tag"] = args.tag
        if peak_gpu is not None:
            r["peak_mem_sampled_gib"] = peak_gpu
        r.setdefault("cmd", res["cmd"])
        r.setdefault("commit", res["commit"])
        peer_common.write_json(args.out, r)
    with open(args.out) as f:
        r = json.load(f)
    print("bench: %s %s: %s -> %s" % (args.runner, args.model,
                                      "error: " + r["error"] if "error" in r else
                                      "%.3f s/step, %.0f tokens/s, %.3g TFLOP/s%s" % (
                                          r["step_s"], r["tokens_per_s"], r["model_tflops"],
                                          ", bound %.3f s (efficiency %.0f%%)" % (
                                              r["bound_s"], 100 * r["efficiency"])
                                          if "bound_s" in r else ""),
                                      args.out))
    return rc


# ---- disk-ceiling ----

CEILING_MIN = 256 << 20


def run_config(metrics):
    """The resolved configuration from a metrics file's first line, {} when there is none."""
    try:
        with open(metrics) as f:
            o = json.loads(f.readline())
        return o.get("config") or {}
    except (OSError, ValueError, AttributeError):
        return {}


def parse_size(text):
    """Bytes from 256M, 4GiB, 1073741824 (K, M, G, T: powers of 1024)."""
    m = re.fullmatch(r"([0-9]+)\s*([KMGT]?)(i?B)?", str(text), re.I)
    if not m:
        raise ValueError("'%s' is not a size (256M, 4GiB, bytes)" % text)
    return int(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper())


def disk_ceiling(a):
    with open(a.out) as f:
        res = json.load(f)
    if "error" in res or not isinstance(res.get("disk_read_share"), (int, float)):
        return 0  # a failed run, or one that did not use the disk: nothing to compare
    cfg = run_config(a.metrics)
    tz = cfg.get("tierzero") or {}
    bs = (cfg.get("aio") or {}).get("block_size") or 1 << 20
    qd = tz.get("queue_depth") or 0
    # The file as large as the state the step read and wrote (so that a cache in front of the
    # disk holds as much of it as of the run's), the bytes a step's.
    try:
        size = parse_size(a.size) if a.size else \
            max(int(res.get("disk_state_bytes") or 0), CEILING_MIN)
    except ValueError as e:
        print("bench_table: disk-ceiling: --size %s" % e, file=sys.stderr)
        return 2
    io = max(int(res["disk_read_bytes"] + res["disk_write_bytes"]), size)
    cmd = [os.path.join(ROOT, "tools", "disk-ceiling.sh"), a.nvme_dir,
           "%.4f" % res["disk_read_share"], str(size), "--io-size", str(io), "--bs", str(bs),
           "--iodepth", str(qd)]
    if tz.get("nvme_buffered"):
        cmd.append("--buffered")
    print("bench: the disk's ceiling: %s" % " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    for k in [k for k in res if k.startswith("fio_") or k.endswith("_vs_fio")
              or k == "disk_ceiling_error"]:
        del res[k]  # a previous ceiling's
    try:
        if p.returncode != 0:
            raise ValueError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else
                             "exit status %d" % p.returncode)
        c = json.loads(p.stdout)
    except ValueError as e:
        res["disk_ceiling_error"] = "tools/disk-ceiling.sh: %s" % e
        print("bench: %s" % res["disk_ceiling_error"], file=sys.stderr)
        peer_common.write_json(a.out, res)
        return 0
    res.update({"fio_read_gbs": c["read_gbs"], "fio_write_gbs": c["write_gbs"],
                "fio_read_share": c["read_share"], "fio_job": c})

    def ratio(key, fio):
        v = res.get(key)
        return v / fio if isinstance(v, (int, float)) and fio > 0 else None
    for d in ("read", "write"):
        res["disk_%s_vs_fio" % d] = ratio("disk_%s_gbs" % d, c["%s_gbs" % d])
        res["disk_busy_%s_vs_fio" % d] = ratio("disk_busy_%s_gbs" % d, c["%s_gbs" % d])
    peer_common.write_json(a.out, res)
    print("bench: disk during the step: read %s GB/s, write %s GB/s; fio mixed (read share "
          "%.2f): read %.3f, write %.3f GB/s; step / fio: read %s, write %s" % (
              fmt(res.get("disk_read_gbs"), "%.3f"), fmt(res.get("disk_write_gbs"), "%.3f"),
              c["read_share"] or 0.0, c["read_gbs"], c["write_gbs"],
              fmt(res["disk_read_vs_fio"], "%.2f"), fmt(res["disk_write_vs_fio"], "%.2f")),
          file=sys.stderr)
    return 0


def main():
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("table", "run", "disk-ceiling", "-h", "--help"):
        argv = ["table"] + argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="print the table of results/bench/*.json")
    t.add_argument("--dir", default=os.path.join(ROOT, "results", "bench"))
    r = sub.add_parser("run", help="run one configuration and write its result")
    r.add_argument("--runner", required=True)
    r.add_argument("--model", required=True)
    r.add_argument("--seq", type=int, required=True)
    r.add_argument("--micro-batch", type=int, required=True)
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--tag")
    r.add_argument("--steps", type=int, default=0, help="timed steps the command runs")
    r.add_argument("--timeout", type=float, default=0,
                   help="seconds before the command is stopped (0: never)")
    r.add_argument("--out", required=True)
    r.add_argument("--mem-floor", type=float, default=0,
                   help="GiB: kill the command when the host's MemAvailable falls under this "
                        "(0: never); the result says \"killed for host memory\"")
    r.add_argument("--metrics", help="tz-train's --metrics file (tz-* runners)")
    r.add_argument("--log")
    r.add_argument("--device", help="what the command computes on, as recorded (default: the "
                                    "first GPU's name from nvidia-smi, else cpu)")
    r.add_argument("command", nargs=argparse.REMAINDER)
    c = sub.add_parser("disk-ceiling", help="fio's mixed job beside a run's disk rates")
    c.add_argument("--out", required=True, help="the run's result, added to")
    c.add_argument("--metrics", required=True, help="the run's tz-train --metrics file")
    c.add_argument("--nvme-dir", required=True, help="the run's tierzero.nvme_path")
    c.add_argument("--size", help="fio's file (default: the state the run kept on the disk, "
                                  "at least 256 MiB)")
    a = ap.parse_args(argv)
    if a.cmd == "table":
        return table(a)
    if a.cmd == "disk-ceiling":
        return disk_ceiling(a)
    if a.runner.startswith("tz-") and not a.metrics:
        ap.error("run: a tz-* runner needs --metrics")
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
