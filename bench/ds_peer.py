#!/usr/bin/env python3
"""The DeepSpeed peer of tz-train: the same models trained with DeepSpeed ZeRO-3.

One configuration per call, as bench/fsdp_peer.py, with the same options and the same JSON result:
a preset of tz-train or a Hugging Face config.json (--model), DeepSpeed 0.19.8 ZeRO-3 with bf16
(fp32 master weights in the optimizer), the ds_config of configs/deepspeed/ chosen by --offload:

  --offload cpu   ds-offload.json: parameters and optimizer state offloaded to the CPU (runner
                  ds-offload)
  --offload opt   ds-opt.json: the optimizer state only (ZeRO-Offload; runner ds-opt)
  --offload none  ds-gpu.json: nothing offloaded (runner ds-gpu)
  --offload nvme  ds-nvme.json: the optimizer state on NVMe (--nvme-path), parameters on the CPU
                  (ZeRO-Infinity; runner ds-nvme)

The model is transformers' LlamaForCausalLM of the preset's shape, or for a config.json (the file,
or a directory holding one; one of tz-train's families, bench/peer_common.py FAMILIES) the class
its model_type picks (AutoConfig from the file's keys), random weights; built with from_config
under HfDeepSpeedConfig, so that deepspeed.zero.Init partitions it as it is constructed; sdpa
attention, bf16, gradient checkpointing on every decoder layer (use_reentrant=False: activations
recomputed in backward, as tz-train does). Its parameters must be those tz-train's layout counts
for the file. A mixture of experts keeps the file's output_router_logits (absent: false), so that
the router's load-balancing loss is in the loss exactly when tz-train adds it (its coefficient
router_aux_loss_coef with output_router_logits, trainer/model/hf_config.c); its sparse MoE blocks
(the modules whose class name ends in SparseMoeBlock) are ZeRO-3 leaf modules
(deepspeed.utils.set_z3_leaf_modules), each gathered whole before it runs. Without that ZeRO-3
gathers each expert as it is called, and the experts a step calls differ from rank to rank and
from step to step: ranks wait on different gathers (the hangs of DeepSpeed issues #4808 and #5008)
and the prefetch trace is thrown away every step. The optimizer is AdamW (lr 1e-4, betas
0.9/0.95, eps 1e-8, weight decay 0.1 on every tensor, as the FSDP2 peer): DeepSpeedCPUAdam when
the optimizer state is offloaded, else FusedAdam; the gradient norm is clipped by DeepSpeed
(gradient_clipping, --clip). Each step is engine(input_ids, labels).loss, engine.backward(loss),
engine.step(), once for each of its --accum micro-batches (DeepSpeed's
gradient_accumulation_steps: one update a step, checked by its global_steps).

    bench/ds_peer.py --model llama-1b --offload cpu --seq 2048 --micro-batch 4 \\
        --warmup 2 --steps 10 --out results/bench/ds-offload-llama-1b.json

One process, no launcher: the script sets MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK and
WORLD_SIZE for a world of one (unless a launcher set RANK and WORLD_SIZE) and calls
deepspeed.init_distributed. DeepSpeed comes from PYTHONPATH (tools/ds-install.sh; the harness
sources its env.sh). Ops not built into the install compile on first use (JIT; CPU Adam about
45 s, FusedAdam with TORCH_CUDA_ARCH_LIST, set to 9.0 unless given, its architecture-specific
entries such as 9.0a read as 9.0, which DeepSpeed's parser refuses): that is set-up time
("init_s"), not step time.

Step time, model FLOP and the result's fields: bench/peer_common.py and bench/fsdp_peer.py; added
here: "deepspeed" (its version), "ds_config" (the dict given to DeepSpeed), "ops_prebuilt" (the
ops the install had compiled); for a config.json, "model" is its name (the file's without .json),
with "model_config", "model_type", "n_active_params" (the FLOP count's N), "leaf_modules" (the
leaf classes' names, [] without experts) and "router_aux_loss_coef" (0 where the loss has none).
A CUDA out-of-memory is a result ("error", exit status 0). Exit status 3: torch, transformers,
deepspeed or a CUDA device is missing (nothing written).

--dry-run prints the ds_config and the optimizer this call would use, with the model's parameter
counts and FLOP per token, without torch or a GPU (the ds_config checked against DeepSpeed's own
config models when deepspeed imports). --device cpu runs a small model (tiny, or a small
config.json) on DeepSpeed's CPU accelerator with gloo: a check of the script, not a measurement.
"""
import argparse
import copy
import json
import os
import re
import socket
import sys
import time

import peer_common as pc
from peer_common import n_params

PROG = "ds_peer"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(ROOT, "configs", "deepspeed")
RUNNERS = {"cpu": "ds-offload", "opt": "ds-opt", "none": "ds-gpu", "nvme": "ds-nvme"}


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="DeepSpeed ZeRO-3 peer of tz-train: one training configuration, one JSON "
                    "result.",
        epilog="Runners: --offload cpu is ds-offload, opt ds-opt, none ds-gpu, nvme ds-nvme.")
    pc.add_common_args(ap, configs=True)
    ap.add_argument("--offload", choices=sorted(RUNNERS), default="cpu",
                    help="cpu: parameters and optimizer on the CPU; opt: the optimizer only; "
                         "none: nothing; nvme: optimizer on NVMe, parameters on the CPU "
                         "(default cpu)")
    ap.add_argument("--ds-config",
                    help="the ds_config file (default configs/deepspeed/<runner>.json); the "
                         "micro-batch, clipping and NVMe path of this call replace its own")
    ap.add_argument("--nvme-path",
                    help="--offload nvme: the directory of DeepSpeed's swap files (default the "
                         "config's, /var/tmp/ds-bench-nvme)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a check of the script without a GPU (DeepSpeed's CPU "
                         "accelerator); not a measurement")
    ap.add_argument("--accum", type=int, default=1,
                    help="micro-batches a step (DeepSpeed's gradient_accumulation_steps): each "
                         "timed step runs forward and backward on this many, then one update "
                         "(default 1)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the ds_config and optimizer, and stop")
    pc.add_tail_args(ap)
    a = ap.parse_args(argv)
    pc.check_common_args(ap, a)
    if a.accum < 1:
        ap.error("--accum must be positive")
    if a.device == "cpu" and a.offload in ("opt", "none"):
        # FusedAdam is a CUDA kernel: on the CPU only the offloaded optimizer (CPU Adam) runs.
        ap.error("--device cpu runs with --offload cpu or nvme only")
    return a


def ds_config(a):
    """The dict DeepSpeed gets: the committed file with this call's micro-batch, clipping and
    NVMe path."""
    path = a.ds_config or os.path.join(CONFIG_DIR, RUNNERS[a.offload] + ".json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit("%s: cannot read the ds_config %s: %s" % (PROG, path, e))
    z = cfg.get("zero_optimization", {})
    if z.get("stage") != 3 or not cfg.get("bf16", {}).get("enabled"):
        raise SystemExit("%s: %s: the peer runs ZeRO stage 3 with bf16 (zero_optimization.stage"
                         " 3, bf16.enabled true)" % (PROG, path))
    cfg["train_micro_batch_size_per_gpu"] = a.micro_batch
    cfg["gradient_accumulation_steps"] = a.accum
    cfg["gradient_clipping"] = a.clip
    for key in ("offload_param", "offload_optimizer"):
        sec = z.get(key)
        if sec and sec.get("device") == "nvme":
            if a.nvme_path:
                sec["nvme_path"] = a.nvme_path
            if not sec.get("nvme_path"):
                raise SystemExit("%s: %s: %s.nvme_path is not set (--nvme-path DIR)" %
                                 (PROG, path, key))
    return path, cfg


def offloaded_optimizer(cfg):
    sec = cfg["zero_optimization"].get("offload_optimizer") or {}
    return sec.get("device") in ("cpu", "nvme")


def optimizer_spec(a, cfg):
    return {"type": "DeepSpeedCPUAdam" if offloaded_optimizer(cfg) else "FusedAdam",
            "adamw_mode": True, "lr": a.lr, "betas": a.betas, "eps": a.eps,
            "weight_decay": a.weight_decay}


def dist_env():
    """A world of one for deepspeed.init_distributed, unless a launcher set one; a free port."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port)), ("RANK", "0"),
                 ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        env.setdefault(k, v)


def validate(cfg):
    """DeepSpeed's own models of the zero and aio sections (pydantic, extra keys forbidden):
    "ok", or why not; "deepspeed not importable" where it is not installed."""
    import contextlib
    try:
        # deepspeed logs to stdout, which carries the dry run's JSON.
        with contextlib.redirect_stdout(sys.stderr):
            from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
            from deepspeed.runtime.swap_tensor.aio_config import get_aio_config
    except Exception as e:  # ImportError, or torch missing under it
        return "deepspeed not importable: %s" % str(e).splitlines()[0][:200]
    try:
        DeepSpeedZeroConfig(**cfg["zero_optimization"])
        get_aio_config(cfg)
    except Exception as e:
        return "rejected by DeepSpeed: %s" % e
    return "ok"


def cuda_arch_list(value):
    """TORCH_CUDA_ARCH_LIST as DeepSpeed's JIT can read it. Its builder parses every entry as
    numbers ("9.0", "9.0+PTX") and fails on an architecture-specific one ("9.0a", "10.0f"), which
    torch and some images set: the suffix is dropped (FusedAdam needs nothing of sm_90a), the
    order and "+PTX" kept; unset or empty gives the H200's "9.0"."""
    out = []
    for e in (value or "").replace(";", " ").split():
        base, plus, ptx = e.partition("+")
        m = re.fullmatch(r"(\d+)\.(\d+)[a-z]?", base)
        if not m:
            raise ValueError("TORCH_CUDA_ARCH_LIST entry %r is not MAJOR.MINOR[a|f][+PTX]" % e)
        cc = "%s.%s" % m.groups() + (plus + ptx if plus else "")
        if cc not in out:
            out.append(cc)
    return ";".join(out) or "9.0"


def dry_run(a, path, cfg):
    out = {"runner": a.runner or RUNNERS[a.offload], "model": a.model,
           "n_params": n_params(a.spec), "flops_per_token": pc.flops_per_token(a.spec, a.seq)}
    out.update(pc.model_keys(a))
    out.update({"cuda_arch_list": cuda_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST")),
                "ds_config_file": path, "ds_config": cfg, "optimizer": optimizer_spec(a, cfg),
                "deepspeed_check": validate(cfg)})
    print(json.dumps(out, indent=1))
    return 0


def import_deepspeed(prog):
    try:
        import deepspeed
    except ImportError as e:
        pc.missing(prog, "cannot import deepspeed (%s): tools/ds-install.sh installs it, and "
                   "PYTHONPATH must name its directory (tools/bench-train.sh sources its "
                   "env.sh)" % e)
    return deepspeed


def installed_ops():
    """The ops the DeepSpeed install has compiled (empty: every op is JIT-compiled)."""
    try:
        from deepspeed.git_version_info import installed_ops as ops
        return sorted(k for k, v in ops.items() if v)
    except Exception:
        return None


def hf_config(s):
    """transformers' config of a config.json model: the class its model_type picks, from the
    file's keys; no KV cache; output_router_logits as the file says (absent: false), so that the
    load-balancing loss is in the loss exactly when tz-train puts it there."""
    import transformers
    # The dtype keys are left out: the model is built in bf16, as the presets are.
    keys = {k: v for k, v in s["hf"].items()
            if k not in ("torch_dtype", "dtype", "transformers_version")}
    model_type = keys.pop("model_type")
    keys["use_cache"] = False
    if s["moe"]:
        keys["output_router_logits"] = bool(keys.get("output_router_logits", False))
    cfg = transformers.AutoConfig.for_model(model_type, **keys)
    cfg._attn_implementation = "sdpa"
    # RoPE's base where the file gives one and the config keeps one base (transformers 5 keeps
    # it in rope_parameters, per layer type for Gemma 3's).
    want = keys.get("rope_theta")
    rp = getattr(cfg, "rope_parameters", None)
    theta = rp.get("rope_theta") if isinstance(rp, dict) else getattr(cfg, "rope_theta", None)
    if want is not None and theta is not None and theta != want:
        raise RuntimeError("%s: transformers' %s kept rope theta %r, not the file's %r" %
                           (s["path"], type(cfg).__name__, theta, want))
    return cfg


def moe_leaves(model, s):
    """The sparse MoE blocks as ZeRO-3 leaf modules (set_z3_leaf_modules): the names of their
    classes, [] for a model without experts (a preset has none)."""
    if not s.get("moe"):
        return []
    classes = sorted({type(m) for m in model.modules()
                      if type(m).__name__.endswith("SparseMoeBlock")}, key=lambda c: c.__name__)
    if not classes:
        raise RuntimeError("%s: model_type %s has %d experts, but transformers' %s has no module "
                           "whose class ends in SparseMoeBlock to make a ZeRO-3 leaf (without "
                           "one, ranks can hang: DeepSpeed issues #4808, #5008)" %
                           (s["path"], s["hf"]["model_type"], s["moe"][0], type(model).__name__))
    from deepspeed.utils import set_z3_leaf_modules
    leaves = set_z3_leaf_modules(model, classes)
    # every layer sparse (tz-train refuses a config with dense layers among them)
    if len(leaves) != s["layers"]:
        raise RuntimeError("%s: %d leaf modules (%s) in %d layers" %
                           (s["path"], len(leaves), ", ".join(c.__name__ for c in classes),
                            s["layers"]))
    return [c.__name__ for c in classes]


def build(torch, deepspeed, a, s, cfg, device):
    """The model under HfDeepSpeedConfig (zero.Init partitions it at construction), its experts'
    blocks as leaf modules, checkpointed, its optimizer, and DeepSpeed's engine around both:
    (engine, the leaf classes' names)."""
    import transformers
    from transformers.integrations import HfDeepSpeedConfig
    # Kept alive while the model is built: transformers finds the config through a weak
    # reference to it.
    hf_ds = HfDeepSpeedConfig(copy.deepcopy(cfg))
    if not transformers.integrations.is_deepspeed_zero3_enabled():
        raise RuntimeError("transformers does not see ZeRO-3 under HfDeepSpeedConfig")
    model = transformers.AutoModelForCausalLM.from_config(
        hf_config(s) if "hf" in s else pc.llama_config(s), dtype=torch.bfloat16,
        attn_implementation="sdpa")
    attn = getattr(model.config, "_attn_implementation", None)
    if attn != "sdpa":
        raise RuntimeError("the model uses attention %r, not sdpa" % attn)
    # parameters() yields a tied head once, as tz-train counts it
    counted = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    if counted != n_params(s):
        raise RuntimeError("the model (%s) has %d parameters, tz-train's %s %d" %
                           (type(model).__name__, counted, s.get("path", a.model), n_params(s)))
    if not all(hasattr(p, "ds_id") for p in model.parameters()):
        raise RuntimeError("zero.Init did not partition every parameter")
    model.config.use_cache = False
    leaves = moe_leaves(model, s)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    spec = optimizer_spec(a, cfg)
    kw = dict(lr=a.lr, betas=tuple(a.betas), eps=a.eps, weight_decay=a.weight_decay)
    if spec["type"] == "DeepSpeedCPUAdam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        opt = DeepSpeedCPUAdam(model.parameters(), adamw_mode=True, **kw)
    else:
        from deepspeed.ops.adam import FusedAdam
        opt = FusedAdam(model.parameters(), adam_w_mode=True, **kw)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    del hf_ds
    return engine, leaves


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    s = a.spec
    path, cfg = ds_config(a)
    if a.dry_run:
        return dry_run(a, path, cfg)
    pc.no_multicast()
    try:
        os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST"))
    except ValueError as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 2
    if a.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    dist_env()
    torch = pc.import_torch(PROG, a.device == "cuda")
    deepspeed = import_deepspeed(PROG)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    for key in ("offload_param", "offload_optimizer"):
        sec = cfg["zero_optimization"].get(key) or {}
        if sec.get("device") == "nvme":
            os.makedirs(sec["nvme_path"], exist_ok=True)
    deepspeed.init_distributed(dist_backend="nccl" if a.device == "cuda" else "gloo")
    world = torch.distributed.get_world_size()
    res = pc.base_result(a, torch, a.runner or RUNNERS[a.offload], world, device)
    res.update({
        "deepspeed": deepspeed.__version__, "ds_config_file": os.path.relpath(path, ROOT),
        "ds_config": cfg, "optimizer": optimizer_spec(a, cfg), "ops_prebuilt": installed_ops(),
        "precision": "bf16 params and compute, fp32 master (DeepSpeed bf16)",
        "activation_checkpointing": "layer", "attn_implementation": "sdpa",
    })
    state = {"phase": "building the model"}
    try:
        t0 = time.perf_counter()
        engine, leaves = build(torch, deepspeed, a, s, cfg, device)
        res["init_s"] = time.perf_counter() - t0
        if "hf" in s:
            mc = engine.module.config
            res["leaf_modules"] = leaves
            res["router_aux_loss_coef"] = getattr(mc, "router_aux_loss_coef", 0.0) \
                if getattr(mc, "output_router_logits", False) else 0.0

        def step(tok):
            # tok: (accum, micro-batch, seq). DeepSpeed scales each micro-batch's loss by
            # 1/accum and updates at the last engine.step() (the accumulation boundary).
            total, updates = 0.0, engine.global_steps
            for mb in tok:
                loss = engine(input_ids=mb, labels=mb, use_cache=False).loss
                engine.backward(loss)
                engine.step()  # at the boundary: clipping, the optimizer's step, zero_grad
                total = total + loss.detach()
            if engine.global_steps != updates + 1:
                raise RuntimeError("DeepSpeed made %d updates in a step of %d micro-batches, "
                                   "not 1" % (engine.global_steps - updates, len(tok)))
            return total / len(tok)

        pc.timed_steps(torch, a, device, rank, res, step, PROG, state)
    except Exception as e:  # a model that does not fit is a result; anything else is not
        if not pc.is_oom(torch, e):
            raise
        pc.oom_result(torch, device, res, state["phase"], e)
        pc.emit(res, a.out, rank)
        os._exit(0)
    pc.figures(torch, device, res, state["times"], state["losses"])
    pc.emit(res, a.out, rank)
    code = 0 if "error" not in res else 1
    # DeepSpeed's threads and pinned buffers (and the process group) go with the process.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
