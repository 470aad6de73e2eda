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

Step time and model FLOP: bench/peer_common.py (the same for every peer); the step is forward
with labels, backward, clipping, AdamW step, zero_grad.

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
import os
import shutil
import sys
import tempfile
import time

import peer_common as pc
from peer_common import PRESETS, n_params

PROG = "fsdp_peer"
RUNNERS = {"cpu": "fsdp2-offload", "none": "fsdp2-gpu"}


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="FSDP2 peer of tz-train: one training configuration, one JSON result.",
        epilog="Runners: --offload cpu is fsdp2-offload, --offload none is fsdp2-gpu.")
    pc.add_common_args(ap)
    ap.add_argument("--offload", choices=["cpu", "none"], default="cpu",
                    help="cpu: CPUOffloadPolicy (parameters, gradients, AdamW on the CPU); "
                         "none: everything on the GPU (default cpu)")
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
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a check of the script without a GPU (--offload none only); "
                         "not a measurement")
    pc.add_tail_args(ap)
    a = ap.parse_args(argv)
    pc.check_common_args(ap, a)
    if a.device == "cpu" and a.offload != "none":
        ap.error("--device cpu runs with --offload none only")
    return a


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
    cfg = pc.llama_config(s)
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


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    s = PRESETS[a.model]
    pc.no_multicast()
    torch = pc.import_torch(PROG, a.device == "cuda")
    import atexit
    dist, rank, world, device, rdzv_dir = setup_dist(torch, a.device)
    if rdzv_dir:
        atexit.register(shutil.rmtree, rdzv_dir, True)
    res = pc.base_result(a, torch, a.runner or RUNNERS[a.offload], world, device)
    res.update({
        "optimizer": {"type": "AdamW", "impl": a.optim_impl, "lr": a.lr, "betas": a.betas,
                      "eps": a.eps, "weight_decay": a.weight_decay},
        "precision": "bf16 params and compute, fp32 master and reduce",
        "activation_checkpointing": a.ac, "attn_implementation": "sdpa",
        "param_groups": a.param_groups,
        "pin_memory": a.pin_memory if a.offload == "cpu" else None,
    })

    def finish(code):
        pc.emit(res, a.out, rank)
        if rdzv_dir:  # os._exit skips atexit
            shutil.rmtree(rdzv_dir, ignore_errors=True)
        return code

    state = {"phase": "building the model"}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.type, (world,))
        t0 = time.perf_counter()
        model = build_model(torch, a, s, mesh, device)
        opt = make_optimizer(torch, a, model)
        res["init_s"] = time.perf_counter() - t0

        def step(tok):
            loss = model(input_ids=tok, labels=tok, use_cache=False).loss
            loss.backward()
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        pc.timed_steps(torch, a, device, rank, res, step, PROG, state)
    except Exception as e:  # a model that does not fit is a result; anything else is not
        if not pc.is_oom(torch, e):
            raise
        pc.oom_result(torch, device, res, state["phase"], e)
        code = finish(0)
        # Other ranks may be waiting in a collective: leave without tearing the group down.
        os._exit(code)
    pc.figures(torch, device, res, state["times"], state["losses"])
    dist.destroy_process_group()
    return finish(0 if "error" not in res else 1)


if __name__ == "__main__":
    sys.exit(main())
