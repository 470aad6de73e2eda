#!/usr/bin/env python3
"""Where one traced step's time went, from the scheduler's Chrome/Perfetto trace (tz-train
--trace-step N --trace FILE; the format is in docs/scheduler.md, "The trace").

    tools/trace_summary.py FILE [--top N]

Prints, for the step's span (from the first to the last event of the trace):
  - each lane: the time it was busy (the union of its spans over all its slots), that share of
    the step, the bytes it moved and its rate while busy;
  - the compute lane's busy time by kind of phase (the name without its layer and micro-batch
    numbers: fwd, bwd, opt-layer, ...);
  - the home lane (the CPU's Adam at the homes, the track named "home"), where there is one: its
    busy time, its phases, when it ran, and the host link's rates while it ran and while it did
    not (the two share host memory: docs/training.md, "Host memory, shared");
  - the compute lane's stalls: their total, and the N phases that waited longest;
  - the compute lane's idle time that no stall names (between the step's first and last
    compute spans, neither computing nor stalled: a phase not yet entered, as when it waits for
    the home lane's update of its block), and the N phases that came after the longest gaps;
  - the time both directions of the host link were busy at once (lanes named "A->B" where A or
    B is the compute tier), and the time neither was, with the compute lane waiting.
Exit status 0; 1 when the file cannot be read or is not such a trace (the message says why).
Needs only the standard library.
"""
import argparse
import json
import re
import sys


def fail(msg):
    print(f"trace_summary: {msg}", file=sys.stderr)
    sys.exit(1)


def union(spans):
    """Merged, sorted (start, end) intervals."""
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def total(iv):
    return sum(e - s for s, e in iv)


def intersect(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        fail(f"{path}: not JSON (line {e.lineno}, column {e.colno}: {e.msg})")
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail(f"{path}: no traceEvents list: not a tierzero trace")
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=5, help="phases listed by stall (default 5)")
    a = ap.parse_args()
    doc = load(a.trace)
    names = {}  # tid -> track name
    lanes = {}  # lane name -> {"spans": [], "bytes": 0}
    compute, stalls, home = [], [], []
    named = []  # the compute lane's spans, computing or stalled, with their phase's name
    kinds = {}  # phase name less its numbers -> [busy us, spans]
    for i, ev in enumerate(doc["traceEvents"]):
        if not isinstance(ev, dict):
            fail(f"{a.trace}: event {i} is not an object")
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[ev.get("tid")] = ev.get("args", {}).get("name", str(ev.get("tid")))
    for i, ev in enumerate(doc["traceEvents"]):
        if ev.get("ph") != "X":
            continue
        try:
            s, d = float(ev["ts"]), float(ev["dur"])
        except (KeyError, TypeError, ValueError):
            fail(f"{a.trace}: event {i} has no numeric ts and dur")
        tid, cat = ev.get("tid"), ev.get("cat")
        if cat == "compute" and names.get(tid) == "home":
            home.append((s, s + d))
        elif cat == "compute":
            compute.append((s, s + d))
            named.append((s, s + d, str(ev.get("name", "?"))))
            kind = re.sub(r"[0-9.]+$", "", str(ev.get("name", "?"))) or "?"
            k = kinds.setdefault(kind, [0.0, 0])
            k[0] += d
            k[1] += 1
        elif cat == "stall":
            name = ev.get("name", "?")
            stalls.append((s, s + d, name[6:] if name.startswith("stall ") else name))
            named.append((s, s + d, stalls[-1][2]))
        elif cat in ("fill", "flush"):
            # Transfer tracks are 100 * lane + slot, named "<lane> #<slot>".
            lane = names.get(tid, f"lane {tid // 100}").rsplit(" #", 1)[0]
            l = lanes.setdefault(lane, {"spans": [], "bytes": 0})
            l["spans"].append((s, s + d))
            l["bytes"] += int(ev.get("args", {}).get("bytes", 0))
            l.setdefault("moves", []).append((s, s + d, int(ev.get("args", {}).get("bytes", 0))))
    every = home + compute + [(s, e) for s, e, _ in stalls] + [x for l in lanes.values() for x in l["spans"]]
    if not every:
        fail(f"{a.trace}: no spans: the traced step recorded nothing")
    t0, t1 = min(s for s, _ in every), max(e for _, e in every)
    step = t1 - t0
    info = doc.get("otherData", {})
    print(f"step {info.get('step', '?')}: {step / 1e3:.3f} ms traced "
          f"(window {info.get('budget', 0) / 2**20:.1f} MiB, lookahead {info.get('lookahead', '?')})")
    busy_c = union(compute)
    print(f"  {'compute':<24} busy {total(busy_c) / 1e3:10.3f} ms  {100 * total(busy_c) / step:5.1f}%")
    for kind, (d, n) in sorted(kinds.items(), key=lambda x: -x[1][0]):
        print(f"    {kind:<22} {d / 1e3:10.3f} ms in {n} phases")
    for name in sorted(lanes):
        l = lanes[name]
        iv = union(l["spans"])
        b = total(iv)
        rate = l["bytes"] / (b * 1e-6) / 1e9 if b > 0 else 0.0
        print(f"  {name:<24} busy {b / 1e3:10.3f} ms  {100 * b / step:5.1f}%  "
              f"{l['bytes'] / 2**30:8.3f} GiB at {rate:7.2f} GB/s")
    if home:
        iv_h = union(home)
        print(f"  {'home':<24} busy {total(iv_h) / 1e3:10.3f} ms  {100 * total(iv_h) / step:5.1f}%  "
              f"{len(home)} phases, {(min(s for s, _ in home) - t0) / 1e3:.3f} to "
              f"{(max(e for _, e in home) - t0) / 1e3:.3f} ms")
        for name in sorted(lanes):
            # each move's bytes split over its time inside and outside the home lane's spans
            b_in = t_in = b_out = t_out = 0.0
            for s, e, nb in lanes[name]["moves"]:
                inside = total(intersect([[s, e]], iv_h))
                share = inside / (e - s) if e > s else 0.0
                b_in += nb * share
                b_out += nb * (1 - share)
            busy = union(lanes[name]["spans"])
            t_in = total(intersect(busy, iv_h))
            t_out = total(busy) - t_in
            r_in = b_in / (t_in * 1e-6) / 1e9 if t_in > 0 else 0.0
            r_out = b_out / (t_out * 1e-6) / 1e9 if t_out > 0 else 0.0
            print(f"    {name:<22} {r_in:7.2f} GB/s beside it ({t_in / 1e3:.3f} ms busy), "
                  f"{r_out:7.2f} GB/s without ({t_out / 1e3:.3f} ms)")
    st = union([(s, e) for s, e, _ in stalls])
    print(f"  stalls: {total(st) / 1e3:.3f} ms ({100 * total(st) / step:.1f}% of the step)")
    by_phase = {}
    for s, e, n in stalls:
        by_phase[n] = by_phase.get(n, 0.0) + (e - s)
    for n, d in [x for x in sorted(by_phase.items(), key=lambda x: -x[1]) if x[1] >= 1.0][: a.top]:
        print(f"    {n:<22} {d / 1e3:10.3f} ms")
    # Gaps on the compute lane, each named by the phase after it.
    gaps, end = {}, None
    for s, e, n in sorted(named):
        if end is not None and s > end + 1.0:
            gaps[n] = gaps.get(n, 0.0) + (s - end)
        end = e if end is None else max(end, e)
    idle = sum(gaps.values())
    print(f"  compute idle, no stall named: {idle / 1e3:.3f} ms ({100 * idle / step:.1f}% of the step)")
    for n, d in [x for x in sorted(gaps.items(), key=lambda x: -x[1]) if x[1] >= 1000.0][: a.top]:
        print(f"    before {n:<15} {d / 1e3:10.3f} ms")
    comp = info.get("compute_tier", "compute")
    into = [l for n, l in lanes.items() if n.endswith("->" + comp)]
    out = [l for n, l in lanes.items() if n.startswith(comp + "->")]
    if into or out:
        iv_in = union([x for l in into for x in l["spans"]])
        iv_out = union([x for l in out for x in l["spans"]])
        both = total(intersect(iv_in, iv_out))
        either = total(union(iv_in + iv_out))
        idle_waiting = total(st) - total(intersect(st, union(iv_in + iv_out)))
        print(f"  host link: both directions {both / 1e3:.3f} ms ({100 * both / step:.1f}%), "
              f"neither {(step - either) / 1e3:.3f} ms ({100 * (step - either) / step:.1f}%); "
              f"compute waiting with the link idle {idle_waiting / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
