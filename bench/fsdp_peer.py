#!/usr/bin/env python3
"""The PyTorch peer of tz-train: the same Llama shapes trained with FSDP2.

One configuration per call: a preset of tz-train (--model), FSDP2 (fully_shard) with bf16
compute and fp32 gradient reduction (MixedPrecisionPolicy), either with CPUOffloadPolicy (the
sharded fp32 parameters, their gradients and AdamW's state in pinned host memory, the optimizer
step on the CPU: --offload cpu) or with everything on the GPU (--offload none). The model is
transformers' LlamaForCausalLM built from a LlamaConfig with the preset's shape, attention through
scaled_dot_product_attention ("sdpa"), every decoder layer checkpointed (its activations are
recomputed in backward, as tz-train does). Tokens are random, the batch is --micro-batch
sequences of --seq tokens per rank, and each step is forward with labels, backward, gradient
clipping (--clip, 0: none), AdamW step, zero_grad.

    bench/fsdp_peer.py --model llama-7b --offload cpu --seq 2048 --micro-batch 4 \\
        --warmup 2 --steps 10 --out results/bench/fsdp2-offload-llama-7b.json

One process drives one GPU without torchrun (the script sets up a file:// rendezvous of world
size 1); under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set) each rank drives its LOCAL_RANK's GPU
and parameters are sharded over all ranks. Rank 0 writes the result.

Step time: torch.cuda.synchronize(), then time.perf_counter() around the whole step, then
synchronize again; --warmup steps are run first and not timed; step_s is the median of the
--steps timed steps.

Model FLOP, exactly as tz-train counts them (trainer/metrics.h, tz_metrics_flops_per_token with
recompute 0): per token 6*N + 12*L*T*d, N every parameter (embedding included, a tied head once),
L layers, T the sequence length, d the hidden size; the 12*L*T*d term is attention's two matmuls
(scores and weighted sum, causal mask not subtracted). Recomputation is not counted: these are
the FLOP the model needs, not those done. model_tflops = flops_per_token * tokens / step_s / 1e12,
tokens of all ranks together.

Output (--out FILE, written atomically; also printed):
  {"runner": "fsdp2-offload" | "fsdp2-gpu", "model", "seq", "micro_batch", "world_size", "steps",
   "warmup", "step_s", "step_s_mean", "step_s_min", "step_times", "tokens_per_step",
   "tokens_per_s", "model_tflops", "flops_per_token", "n_params", "peak_mem_gib" (the largest
   torch.cuda.max_memory_allocated), "peak_reserved_gib", "peak_host_gib" (largest RSS),
   "loss_first", "loss_last", "torch", "transformers", "device", ...}
A model that does not fit is a result: on CUDA out-of-memory the file holds the identifying keys
and "error": "out of memory ..." and the exit status is 0. Exit status 3: torch, transformers or a
CUDA device is missing (nothing written).

--device cpu runs the same code on the CPU with gloo, without offload: a check of the harness on a
machine without a GPU (the tiny model), not a measurement.
"""
import argparse
import datetime
import json
import math
import os
import resource
import shutil
import socket
import sys
import tempfile
import time

# The presets of trainer/model.c, field for field. vocab 256 with tied embeddings is the byte-level
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

RUNNERS = {"cpu": "fsdp2-offload", "none": "fsdp2-gpu"}


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


def missing(msg):
    print("fsdp_peer: %s" % msg, file=sys.stderr)
    sys.exit(3)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="FSDP2 peer of tz-train: one training configuration, one JSON result.",
        epilog="Runners: --offload cpu is fsdp2-offload, --offload none is fsdp2-gpu.")
    ap.add_argument("--model", required=True, choices=sorted(PRESETS),
                    help="tz-train preset (the shape table is trainer/model.c's)")
    ap.add_argument("--offload", choices=["cpu", "none"], default="cpu",
                    help="cpu: CPUOffloadPolicy (parameters, gradients, AdamW on the CPU); "
                         "none: everything on the GPU (default cpu)")
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
    ap.add_argument("--optim-impl", choices=["default", "foreach", "fused", "for-loop"],
                    default="foreach",
                    help="torch.optim.AdamW implementation: torch's own choice, foreach=True "
                         "(the default: it reproduces the reference figures with CPU offload, "
                         "where torch's own choice is the slower per-tensor loop), fused=True, "
                         "or foreach=False")
    ap.add_argument("--param-groups", choices=["one", "layer"], default="one",
                    help="AdamW's parameter groups: one for the model (default), or one per "
                         "decoder layer (and one for the rest), the same update; foreach's "
                         "temporaries (a copy of v for its square root) then take a layer's "
                         "size instead of the model's, which llama-7b's 108 GB of offloaded "
                         "state needs on a 128 GiB host")
    ap.add_argument("--pin-memory", choices=["on", "off"], default="on",
                    help="with --offload cpu: CPUOffloadPolicy's pin_memory (default on). Off "
                         "keeps the offloaded parameters and gradients in pageable memory: "
                         "torch's page-locked allocator rounds every block up to a power of two "
                         "(llama-7b's 172 MiB MLP matrices pin 256 MiB each, parameters and "
                         "gradients alike), which a 128 GiB host cannot hold for llama-7b")
    ap.add_argument("--ac", choices=["layer", "none"], default="layer",
                    help="activation checkpointing: every decoder layer (default) or none")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a check of the script without a GPU (--offload none only); "
                         "not a measurement")
    ap.add_argument("--runner", help="name recorded in the result (default from --offload)")
    ap.add_argument("--out", help="result file (JSON); printed in any case")
    a = ap.parse_args(argv)
    s = PRESETS[a.model]
    if a.seq < 1 or a.seq > s["max_seq"]:
        ap.error("--seq %d: %s takes 1..%d" % (a.seq, a.model, s["max_seq"]))
    if a.micro_batch < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--micro-batch and --steps must be positive, --warmup non-negative")
    if a.clip < 0:
        ap.error("--clip must not be negative")
    if a.device == "cpu" and a.offload != "none":
        ap.error("--device cpu runs with --offload none only")
    return a


def import_torch(want_cuda):
    try:
        import torch
    except ImportError as e:
        missing("cannot import torch (%s): run this on the GPU machine, whose python3 has "
                "PyTorch" % e)
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        missing("cannot import transformers (%s)" % e)
    if want_cuda and not torch.cuda.is_available():
        missing("torch %s sees no CUDA device" % torch.__version__)
    return torch


def setup_dist(torch, kind):
    """Process group and device: torchrun's environment when present, else a world of one with
    a file:// rendezvous in a temporary directory (returned, to be removed at the end)."""
    import torch.distributed as dist
    env = os.environ
    rdzv_dir = None
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", "0"))
        init = "env://"
    else:
        rank, world, local = 0, 1, 0
        rdzv_dir = tempfile.mkdtemp(prefix="fsdp-peer-")
        init = "file://" + os.path.join(rdzv_dir, "rendezvous")
    if kind == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        # gloo beside nccl: with CPU offload the gradient norm is reduced over host tensors.
        backend = "cpu:gloo,cuda:nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend, init_method=init, rank=rank, world_size=world)
    return dist, rank, world, device, rdzv_dir


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


def build_model(torch, a, s, mesh, device):
    """LlamaForCausalLM on the meta device, each decoder layer checkpointed and sharded, then the
    shards materialised (on the host with --offload cpu) and initialised from the GPU's random
    generator: N(0, 0.02) matrices, unit norm weights, as Hugging Face initialises Llama."""
    import functools
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy,
                                                        fully_shard)
    cfg = llama_config(s)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    attn = getattr(model.config, "_attn_implementation", None)
    if attn != "sdpa":
        raise RuntimeError("the model uses attention %r, not sdpa" % attn)
    if a.ac == "layer":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                    checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, LlamaDecoderLayer))
    kw = dict(mesh=mesh,
              mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                             reduce_dtype=torch.float32))
    if a.offload == "cpu":
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=a.pin_memory == "on")
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    model.to_empty(device="cpu" if a.offload == "cpu" else device)
    gen = torch.Generator(device=device)
    gen.manual_seed(a.seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if local.numel() == 0:
                continue
            if p.dim() == 1:
                local.fill_(1.0)
            else:
                r = torch.empty(local.shape, dtype=local.dtype, device=device)
                r.normal_(0.0, 0.02, generator=gen)
                local.copy_(r)
                del r
        # The rotary table is a buffer that to_empty left uninitialised: RoPE's default
        # frequencies, theta^(-2i/D), on the GPU where the forward uses them.
        D = s["hidden"] // s["heads"]
        inv = 1.0 / (s["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64,
                                                      device=device).float() / D))
        rotary = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
        if not rotary:
            raise RuntimeError("no rotary embedding module in the model")
        for rot in rotary:
            for name in ("inv_freq", "original_inv_freq"):
                if isinstance(getattr(rot, name, None), torch.Tensor):
                    setattr(rot, name, inv.clone())
    for name, b in model.named_buffers():
        if b.device.type == "meta":
            raise RuntimeError("buffer %s was not materialised" % name)
    counted = sum(p.numel() for p in model.parameters())
    if counted != n_params(s):
        raise RuntimeError("the model has %d parameters, tz-train's %s %d" %
                           (counted, a.model, n_params(s)))
    model.train()
    return model


def make_optimizer(torch, a, model):
    kw = dict(lr=a.lr, betas=tuple(a.betas), eps=a.eps, weight_decay=a.weight_decay)
    if a.optim_impl == "foreach":
        kw["foreach"] = True
    elif a.optim_impl == "fused":
        kw["fused"] = True
    elif a.optim_impl == "for-loop":
        kw["foreach"] = False
    params = model.parameters()
    if a.param_groups == "layer":
        layers = [list(layer.parameters()) for layer in model.model.layers]
        inside = {id(p) for group in layers for p in group}
        params = [{"params": g} for g in layers]
        params.append({"params": [p for p in model.parameters() if id(p) not in inside]})
    return torch.optim.AdamW(params, **kw)


def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_gib(torch, device, reserved=False):
    if device.type != "cuda":
        return None
    f = torch.cuda.max_memory_reserved if reserved else torch.cuda.max_memory_allocated
    return f(device) / 2**30


def is_oom(torch, e):
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(e, oom) or (isinstance(e, RuntimeError) and "out of memory" in str(e))


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    s = PRESETS[a.model]
    # Never NVLink multicast on the shared GPU hosts (a program using it can take them down).
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    torch = import_torch(a.device == "cuda")
    import atexit
    import transformers
    dist, rank, world, device, rdzv_dir = setup_dist(torch, a.device)
    if rdzv_dir:
        atexit.register(shutil.rmtree, rdzv_dir, True)
    tokens_per_step = world * a.micro_batch * a.seq
    fpt = flops_per_token(s, a.seq)
    res = {
        "runner": a.runner or RUNNERS[a.offload], "model": a.model, "seq": a.seq,
        "micro_batch": a.micro_batch, "world_size": world, "steps": a.steps,
        "warmup": a.warmup, "tokens_per_step": tokens_per_step, "n_params": n_params(s),
        "flops_per_token": fpt, "offload": a.offload, "clip": a.clip,
        "optimizer": {"type": "AdamW", "impl": a.optim_impl, "lr": a.lr, "betas": a.betas,
                      "eps": a.eps, "weight_decay": a.weight_decay},
        "precision": "bf16 params and compute, fp32 master and reduce",
        "activation_checkpointing": a.ac, "attn_implementation": "sdpa",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "host": socket.gethostname(),
        "cpu_threads": torch.get_num_threads(),
        "alloc_conf": ",".join(x for x in (os.environ.get("PYTORCH_ALLOC_CONF", ""),
                                            os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")) if x),
        "param_groups": a.param_groups,
        "pin_memory": a.pin_memory if a.offload == "cpu" else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }

    def finish(code):
        if rank == 0:
            print(json.dumps(res))
            if a.out:
                write_json(a.out, res)
        sys.stdout.flush()
        if rdzv_dir:  # os._exit skips atexit
            shutil.rmtree(rdzv_dir, ignore_errors=True)
        return code

    phase = "building the model"
    try:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.type, (world,))
        t0 = time.perf_counter()
        model = build_model(torch, a, s, mesh, device)
        opt = make_optimizer(torch, a, model)
        res["init_s"] = time.perf_counter() - t0
        gen = torch.Generator(device=device)
        gen.manual_seed(a.seed + 1 + rank)
        times, losses = [], []
        for step in range(a.warmup + a.steps):
            phase = "step %d" % (step + 1)
            tok = torch.randint(0, s["vocab"], (a.micro_batch, a.seq), device=device,
                                generator=gen)
            sync(torch, device)
            t = time.perf_counter()
            loss = model(input_ids=tok, labels=tok, use_cache=False).loss
            loss.backward()
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(torch, device)
            dt = time.perf_counter() - t
            losses.append(float(loss.detach()))
            if step >= a.warmup:
                times.append(dt)
            if rank == 0:
                print("fsdp_peer: %s %s step %d/%d: %.3f s, loss %.4f%s" %
                      (res["runner"], a.model, step + 1, a.warmup + a.steps, dt, losses[-1],
                       " (warm-up)" if step < a.warmup else ""), file=sys.stderr, flush=True)
    except Exception as e:  # a model that does not fit is a result; anything else is not
        if not is_oom(torch, e):
            raise
        res["error"] = "out of memory while %s: %s" % (phase, str(e).splitlines()[0][:300])
        res["peak_mem_gib"] = memory_gib(torch, device)
        res["peak_host_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        code = finish(0)
        # Other ranks may be waiting in a collective: leave without tearing the group down.
        os._exit(code)
    step_s = median(times)
    res.update({
        "step_s": step_s, "step_s_mean": sum(times) / len(times), "step_s_min": min(times),
        "step_times": times, "tokens_per_s": tokens_per_step / step_s,
        "model_tflops": fpt * tokens_per_step / step_s / 1e12,
        "peak_mem_gib": memory_gib(torch, device),
        "peak_reserved_gib": memory_gib(torch, device, reserved=True),
        "peak_host_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "loss_first": losses[0], "loss_last": losses[-1],
    })
    if not all(math.isfinite(x) for x in losses):
        res["error"] = "loss not finite: %s" % losses
    dist.destroy_process_group()
    return finish(0 if "error" not in res else 1)


if __name__ == "__main__":
    sys.exit(main())
