"""What the peers of tz-train (bench/fsdp_peer.py, bench/ds_peer.py) share: the presets, a Hugging
Face config.json's shape (ds_peer.py only), the FLOP count, the common options, the Llama config,
the timed steps and the JSON result. Importing it imports no torch (tools/bench_table.py uses the
presets and the formula).

Model FLOP, exactly as tz-train counts them (trainer/run/metrics.h, tz_metrics_flops_per_token with
recompute 0): per token 6*N + 12*L*T*d, N the parameters a token uses (embedding included, a tied
head once; with experts, tz_model_n_active_params: every parameter less each layer's unused
experts, n_layer * (n_expert - n_expert_used) * 3 * moe_ffn_dim * d_model), L layers, T the
sequence length, d the hidden size; the 12*L*T*d term is attention's two matmuls (scores and
weighted sum, causal mask not subtracted). Recomputation is not counted: these are the FLOP the
model needs, not those done. model_tflops = flops_per_token * tokens / step_s / 1e12, tokens of
all ranks together.

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


# What changes a layer's parameter count in each of tz-train's families (trainer/model/family.c):
# qkv_bias, q/k/v biases; qk_norm, q and k norms one head wide ("head") or as wide as the
# projection ("all"); norms, RMSNorm weights a layer has (Gemma's four, pre and post); moe_width,
# the key of an expert's width (its presence: a mixture of experts); shared, Qwen2-MoE's shared
# expert with its 1-wide gate. Phi-3's fused qkv_proj and gate_up_proj hold what the others'
# separate projections hold.
FAMILIES = {
    "llama": {}, "mistral": {}, "qwen2": dict(qkv_bias=True), "qwen3": dict(qk_norm="head"),
    "olmo2": dict(qk_norm="all"), "phi3": {}, "gemma2": dict(norms=4, tie=True),
    "gemma3_text": dict(qk_norm="head", norms=4, tie=True),
    "qwen3_moe": dict(qk_norm="head", moe_width="moe_intermediate_size"),
    "mixtral": dict(moe_width="intermediate_size"),
    "olmoe": dict(qk_norm="all", moe_width="intermediate_size"),
    "qwen2_moe": dict(qkv_bias=True, moe_width="moe_intermediate_size", shared=True),
}


def n_params(s):
    """Parameters as tz_model_n_params counts them: the tied head once, no padding. s: a preset,
    or hf_model's shape of a config.json."""
    if "hf" in s:
        return s["n_params"]
    C, F, V = s["hidden"], s["intermediate"], s["vocab"]
    D = C // s["heads"]
    HD, KD = s["heads"] * D, s["kv_heads"] * D
    layer = 2 * C + HD * C + 2 * KD * C + C * HD + 3 * F * C
    return V * C + s["layers"] * layer + C + (0 if s["tie"] else V * C)


def n_active_params(s):
    """tz_model_n_active_params: a token's parameters (all of them without experts)."""
    return s["n_active_params"] if "hf" in s else n_params(s)


def flops_per_token(s, seq):
    """tz_metrics_flops_per_token(cfg, T, recompute=0): 6N + 12 L T d, N the active parameters."""
    return 6.0 * n_active_params(s) + 12.0 * s["layers"] * seq * s["hidden"]


def hf_model(arg):
    """The shape of a Hugging Face config.json (arg: the file, or a directory holding one), with
    its parameters counted as tz-train's layout counts them (trainer/model/model.c,
    tz_model_block_layout): a dict with the presets' keys the peers use (hidden, layers, vocab,
    max_seq), name (the file's without .json, or the directory's: tools/bench-train.sh names the
    result so), path, hf (the file's dict), moe ((experts, experts a token, expert width) or None),
    n_params and n_active_params. ValueError naming the file and key where it is not a config of
    one of tz-train's families."""
    path = os.path.join(arg, "config.json") if os.path.isdir(arg) else arg
    name = os.path.basename(os.path.normpath(arg))
    if not os.path.isdir(arg) and name.endswith(".json"):
        name = name[:-len(".json")]
    try:
        with open(path) as f:
            c = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError("cannot read the config %s: %s" % (path, e))
    if not isinstance(c, dict):
        raise ValueError("%s: not a JSON object" % path)
    mt = c.get("model_type")
    if mt not in FAMILIES:
        raise ValueError("%s: \"model_type\" %s is not one of tz-train's families (%s)" %
                         (path, json.dumps(mt), ", ".join(sorted(FAMILIES))))
    fam = FAMILIES[mt]

    def num(key, default=None):
        v = c.get(key)
        if v is None and default is not None:
            return default
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError("%s: \"%s\" is %s, not a positive integer" %
                             (path, key, json.dumps(v)))
        return v

    C, L, V, H = num("hidden_size"), num("num_hidden_layers"), num("vocab_size"), \
        num("num_attention_heads")
    KV = num("num_key_value_heads", H)
    if c.get("head_dim") is None and C % H:
        raise ValueError("%s: \"hidden_size\" %d is not a multiple of \"num_attention_heads\" %d "
                         "and there is no \"head_dim\"" % (path, C, H))
    D = num("head_dim", C // H)
    HD, KD = H * D, KV * D
    # Experts: num_experts or num_local_experts, as tz-train reads either (hf_config.c).
    a, b = c.get("num_experts") or 0, c.get("num_local_experts") or 0
    if a and b and a != b:
        raise ValueError("%s: \"num_experts\" %s and \"num_local_experts\" %s disagree" %
                         (path, a, b))
    moe = None
    if "moe_width" in fam:
        if not a and not b:
            raise ValueError("%s: missing \"num_experts\" (or \"num_local_experts\"): model_type "
                             "%s has experts" % (path, mt))
        E = num("num_experts" if a else "num_local_experts")
        moe = (E, num("num_experts_per_tok"), num(fam["moe_width"]))
        if moe[1] > E:
            raise ValueError("%s: \"num_experts_per_tok\" %d is more than the %d experts" %
                             (path, moe[1], E))
    elif a or b:
        raise ValueError("%s: \"%s\" is %s: model_type %s has no experts in tz-train" %
                         (path, "num_experts" if a else "num_local_experts", a or b, mt))
    layer = fam.get("norms", 2) * C + 2 * HD * C + 2 * KD * C
    if fam.get("qkv_bias"):
        layer += HD + 2 * KD
    if fam.get("qk_norm") == "head":
        layer += 2 * D
    elif fam.get("qk_norm") == "all":
        layer += HD + KD
    if moe:
        E, _, F = moe
        layer += E * 3 * F * C + E * C  # the experts and the router
        if fam.get("shared"):
            Fs = num("shared_expert_intermediate_size")
            layer += 3 * Fs * C + C  # the shared expert and its gate (1 x C)
    else:
        layer += 3 * num("intermediate_size") * C
    # absent: the family's default, as tz-train reads it (family.c tie_default: Gemma's tie)
    tie = c.get("tie_word_embeddings", fam.get("tie", False))
    if not isinstance(tie, bool):
        raise ValueError("%s: \"tie_word_embeddings\" is %s, not true or false" %
                         (path, json.dumps(tie)))
    total = V * C + L * layer + C + (0 if tie else V * C)
    inactive = L * (moe[0] - moe[1]) * 3 * moe[2] * C if moe else 0
    return {"name": name, "path": path, "hf": c, "hidden": C, "layers": L, "vocab": V,
            "max_seq": c.get("max_position_embeddings"), "moe": moe, "n_params": total,
            "n_active_params": total - inactive}


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


def add_common_args(ap, configs=False):
    """The options every peer takes, with the harness's defaults. configs: --model also takes a
    Hugging Face config.json (check_common_args reads it)."""
    if configs:
        ap.add_argument("--model", required=True,
                        help="tz-train preset (%s; the shape table is trainer/model/model.c's), "
                             "or a Hugging Face config.json of one of tz-train's families (the "
                             "file, or a directory holding one): that shape, random weights"
                             % ", ".join(PRESETS))
    else:
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
    """Also resolves --model: a.spec is its shape (a preset, or hf_model's); for a config.json,
    a.model becomes its name (the results' "model")."""
    if a.model in PRESETS:
        a.spec = PRESETS[a.model]
    else:
        try:
            a.spec = hf_model(a.model)
        except ValueError as e:
            ap.error("--model %s" % e)
        a.model = a.spec["name"]
    s = a.spec
    if a.seq < 1 or (s["max_seq"] and a.seq > s["max_seq"]):
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
    s = a.spec
    res = {
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
    res.update(model_keys(a))
    return res


def model_keys(a):
    """A config.json model's keys in a result (none for a preset): where it came from, its
    model_type, and the active parameters its FLOP count uses."""
    s = a.spec
    if "hf" not in s:
        return {}
    return {"model_config": os.path.abspath(s["path"]), "model_type": s["hf"]["model_type"],
            "n_active_params": s["n_active_params"]}


def timed_steps(torch, a, device, rank, res, step, prog, state):
    """--warmup then --steps steps of step(tokens) -> loss (a tensor), each between two
    synchronisations; random tokens from the device's generator, seeded per rank (a peer with
    --accum gets them as (accum, micro-batch, seq), one micro-batch after the other). Fills
    state["times"], state["losses"] and state["phase"] as it goes, so that an exception leaves
    what was done."""
    s = a.spec
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
