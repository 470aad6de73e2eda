"""What the peers of tz-train (bench/fsdp_peer.py, bench/ds_peer.py) share: the presets, the FLOP
count, the common options, the Llama config, the timed steps and the JSON result. Importing it
imports no torch (tools/bench_table.py uses the presets and the formula).

Model FLOP, exactly as tz-train counts them (trainer/run/metrics.h, tz_metrics_flops_per_token with
recompute 0): per token 6*N + 12*L*T*d, N every parameter (embedding included, a tied head once),
L layers, T the sequence length, d the hidden size; the 12*L*T*d term is attention's two matmuls
(scores and weighted sum, causal mask not subtracted). Recomputation is not counted: these are
the FLOP the model needs, not those done. model_tflops = flops_per_token * tokens / step_s / 1e12,
tokens of all ranks together.

Step time: torch.cuda.synchronize(), then time.perf_counter() around the whole step, then
synchronize again; --warmup steps are run first and not timed; step_s is the median of the
--steps timed steps.
"""
import datetime
import json
import math
import os
import resource
import socket
import sys
import tempfile
import time

# The presets of trainer/model/model.c, field for field. vocab 256 with tied embeddings is the byte-level
# "tiny" of the tests; the others are the Llama shapes tz-train knows.
PRESETS = {
    "tiny": dict(hidden=128, intermediate=352, layers=4, heads=4, kv_heads=2, vocab=256,
                 max_seq=256, rope_theta=10000.0, rms_eps=1e-5, tie=True),
    "llama-1b": dict(hidden=2048, intermediate=5632, layers=16, heads=16, kv_heads=16,
                     vocab=32000, max_seq=2048, rope_theta=10000.0, rms_eps=1e-5, tie=False),
    "llama-3b": dict(hidden=3200, intermediate=8640, layers=26, heads=32, kv_heads=32,
                     vocab=32000, max_seq=2048, rope_theta=10000.0, rms_eps=1e-6, tie=False),
    "llama-7b": dict(hidden=4096, intermediate=11008, layers=32, heads=32, kv_heads=32,
                     vocab=32000, max_seq=2048, rope_theta=10000.0, rms_eps=1e-5, tie=False),
    "llama-13b": dict(hidden=5120, intermediate=13824, layers=40, heads=40, kv_heads=40,
                      vocab=32000, max_seq=2048, rope_theta=10000.0, rms_eps=1e-5, tie=False),
}


def n_params(s):
    """Parameters as tz_model_n_params counts them: the tied head once, no padding."""
    C, F, V = s["hidden"], s["intermediate"], s["vocab"]
    D = C // s["heads"]
    HD, KD = s["heads"] * D, s["kv_heads"] * D
    layer = 2 * C + HD * C + 2 * KD * C + C * HD + 3 * F * C
    return V * C + s["layers"] * layer + C + (0 if s["tie"] else V * C)


def flops_per_token(s, seq):
    """tz_metrics_flops_per_token(cfg, T, recompute=0): 6N + 12 L T d."""
    return 6.0 * n_params(s) + 12.0 * s["layers"] * seq * s["hidden"]


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def write_json(path, obj):
    """Writes obj to path through a temporary file and a rename, so a reader never sees half."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def missing(prog, msg):
    """Exit status 3: what the peer needs is not on this machine (nothing is written)."""
    print("%s: %s" % (prog, msg), file=sys.stderr)
    sys.exit(3)


def add_common_args(ap):
    """The options every peer takes, with the harness's defaults."""
    ap.add_argument("--model", required=True, choices=sorted(PRESETS),
                    help="tz-train preset (the shape table is trainer/model/model.c's)")
    ap.add_argument("--seq", type=int, default=2048, help="tokens per sequence (default 2048)")
    ap.add_argument("--micro-batch", type=int, default=4,
                    help="sequences per step on each rank (default 4)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed steps before them (default 2)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.95])
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0,
                    help="clip the global gradient norm to this; 0: no clipping (default 1.0)")


def add_tail_args(ap):
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--runner", help="name recorded in the result (default from --offload)")
    ap.add_argument("--out", help="result file (JSON); printed in any case")


def check_common_args(ap, a):
    s = PRESETS[a.model]
    if a.seq < 1 or a.seq > s["max_seq"]:
        ap.error("--seq %d: %s takes 1..%d" % (a.seq, a.model, s["max_seq"]))
    if a.micro_batch < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--micro-batch and --steps must be positive, --warmup non-negative")
    if a.clip < 0:
        ap.error("--clip must not be negative")


def no_multicast():
    """Never NVLink multicast on the shared GPU hosts (a program using it can take them down)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


def import_torch(prog, want_cuda):
    try:
        import torch
    except ImportError as e:
        missing(prog, "cannot import torch (%s): run this on the GPU machine, whose python3 has "
                "PyTorch" % e)
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        missing(prog, "cannot import transformers (%s)" % e)
    if want_cuda and not torch.cuda.is_available():
        missing(prog, "torch %s sees no CUDA device" % torch.__version__)
    return torch


def llama_config(s):
    import transformers
    from transformers import LlamaConfig
    kw = dict(vocab_size=s["vocab"], hidden_size=s["hidden"],
              intermediate_size=s["intermediate"], num_hidden_layers=s["layers"],
              num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
              max_position_embeddings=s["max_seq"], rms_norm_eps=s["rms_eps"],
              tie_word_embeddings=s["tie"], hidden_act="silu", attention_bias=False,
              mlp_bias=False, use_cache=False, initializer_range=0.02)
    major = int(transformers.__version__.split(".")[0])
    # transformers 5 keeps RoPE's base in rope_parameters; 4.x in rope_theta.
    if major >= 5:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": s["rope_theta"]}
    else:
        kw["rope_theta"] = s["rope_theta"]
    cfg = LlamaConfig(**kw)
    cfg._attn_implementation = "sdpa"
    rp = getattr(cfg, "rope_parameters", None)
    theta = rp.get("rope_theta") if isinstance(rp, dict) else getattr(cfg, "rope_theta", None)
    if theta != s["rope_theta"]:
        raise RuntimeError("LlamaConfig kept rope theta %r, not %r" % (theta, s["rope_theta"]))
    return cfg


def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_gib(torch, device, reserved=False):
    if device.type != "cuda":
        return None
    f = torch.cuda.max_memory_reserved if reserved else torch.cuda.max_memory_allocated
    return f(device) / 2**30


def host_peak_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def is_oom(torch, e):
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(e, oom) or (isinstance(e, RuntimeError) and "out of memory" in str(e))


def base_result(a, torch, runner, world, device):
    """The identifying keys of a result, and how it was run; the figures come later."""
    import transformers
    s = PRESETS[a.model]
    return {
        "runner": runner, "model": a.model, "seq": a.seq,
        "micro_batch": a.micro_batch, "world_size": world, "steps": a.steps,
        "warmup": a.warmup, "accumulation": getattr(a, "accum", 1),
        "tokens_per_step": world * a.micro_batch * a.seq * getattr(a, "accum", 1),
        "n_params": n_params(s), "flops_per_token": flops_per_token(s, a.seq),
        "offload": a.offload, "clip": a.clip,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "host": socket.gethostname(),
        "cpu_threads": torch.get_num_threads(),
        "alloc_conf": ",".join(x for x in (os.environ.get("PYTORCH_ALLOC_CONF", ""),
                                            os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")) if x),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def timed_steps(torch, a, device, rank, res, step, prog, state):
    """--warmup then --steps steps of step(tokens) -> loss (a tensor), each between two
    synchronisations; random tokens from the device's generator, seeded per rank (a peer with
    --accum gets them as (accum, micro-batch, seq), one micro-batch after the other). Fills
    state["times"], state["losses"] and state["phase"] as it goes, so that an exception leaves
    what was done."""
    s = PRESETS[a.model]
    gen = torch.Generator(device=device)
    gen.manual_seed(a.seed + 1 + rank)
    times, losses = state.setdefault("times", []), state.setdefault("losses", [])
    for i in range(a.warmup + a.steps):
        state["phase"] = "step %d" % (i + 1)
        shape = (a.micro_batch, a.seq) if not hasattr(a, "accum") else (a.accum, a.micro_batch, a.seq)
        tok = torch.randint(0, s["vocab"], shape, device=device, generator=gen)
        sync(torch, device)
        t = time.perf_counter()
        loss = step(tok)
        sync(torch, device)
        dt = time.perf_counter() - t
        losses.append(float(loss.detach()))
        if i >= a.warmup:
            times.append(dt)
        if rank == 0:
            print("%s: %s %s step %d/%d: %.3f s, loss %.4f%s" %
                  (prog, res["runner"], a.model, i + 1, a.warmup + a.steps, dt, losses[-1],
                   " (warm-up)" if i < a.warmup else ""), file=sys.stderr, flush=True)


def oom_result(torch, device, res, phase, e):
    res["error"] = "out of memory while %s: %s" % (phase, str(e).splitlines()[0][:300])
    res["peak_mem_gib"] = memory_gib(torch, device)
    res["peak_host_gib"] = host_peak_gib()


def figures(torch, device, res, times, losses):
    """The result's figures from the timed steps; "error" when a loss is not finite."""
    tokens_per_step, fpt = res["tokens_per_step"], res["flops_per_token"]
    step_s = median(times)
    res.update({
        "step_s": step_s, "step_s_mean": sum(times) / len(times), "step_s_min": min(times),
        "step_times": times, "tokens_per_s": tokens_per_step / step_s,
        "model_tflops": fpt * tokens_per_step / step_s / 1e12,
        "peak_mem_gib": memory_gib(torch, device),
        "peak_reserved_gib": memory_gib(torch, device, reserved=True),
        "peak_host_gib": host_peak_gib(),
        "loss_first": losses[0], "loss_last": losses[-1],
    })
    if not all(math.isfinite(x) for x in losses):
        res["error"] = "loss not finite: %s" % losses


def emit(res, out, rank):
    """Rank 0 prints the result and writes it to out (when given)."""
    if rank == 0:
        print(json.dumps(res))
        if out:
            write_json(out, res)
    sys.stdout.flush()
