#!/usr/bin/env python3
"""The PyTorch side of `tz-bench layer`: the same Llama layer (RMSNorm, q/k/v/o projections
without bias, half-split RoPE, causal attention, RMSNorm, SwiGLU MLP, two residuals), in bf16,
forward + backward timed with CUDA events; attention alone (scaled_dot_product_attention pinned
to its flash backend) forward + backward; and torch.matmul bf16 at N^3 (--gemm-size, default
8192). Prints one JSON line:

  {"torch": "2.x", "device": "...", "layer_ms": ..., "attn_ms": ..., "gemm_tflops": ...}

or {"error": "..."} with exit status 3 when torch or a CUDA device is missing. tz-bench layer runs
it in the same invocation with the same shape arguments:

  bench_layer_torch.py --d-model 4096 --ffn 11008 --heads 32 --kv-heads 32 --seq 2048 \\
      --batch 4 --iters 10 --warmup 3 --gemm-size 8192

With --experts E (and --experts-used k, --moe-ffn F, --norm-topk) the MLP is a mixture of
experts as transformers' Qwen3-MoE / OLMoE blocks compute it in training: a router (C -> E),
softmax in float, the k largest (renormalised with --norm-topk), then each expert's SwiGLU on
its tokens in a loop over the experts, its output times the routing weight added back with
index_add_ (the load-balancing loss left out, as tz-bench's layer leaves it).
"""
import argparse
import json
import sys


def fail(msg):
    print(json.dumps({"error": msg}))
    sys.stdout.flush()
    sys.exit(3)


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def timed(torch, fn, warmup, iters):
    """Median milliseconds of fn() over iters runs, each between two CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=11008)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--theta", type=float, default=10000.0)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--gemm-size", type=int, default=8192)
    ap.add_argument("--experts", type=int, default=0)
    ap.add_argument("--experts-used", type=int, default=0)
    ap.add_argument("--moe-ffn", type=int, default=0)
    ap.add_argument("--norm-topk", action="store_true")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        fail("cannot import torch: %s" % e)
    if not torch.cuda.is_available():
        fail("torch sees no CUDA device")

    dev, dt = "cuda", torch.bfloat16
    C, FF, H, Hkv, T, B = a.d_model, a.ffn, a.heads, a.kv_heads, a.seq, a.batch
    D = C // H
    torch.manual_seed(0)

    def param(*shape, std=0.02):
        return (torch.randn(*shape, device=dev, dtype=torch.float32) * std).to(dt).requires_grad_()

    w = {
        "attn_norm": torch.ones(C, device=dev, dtype=dt, requires_grad=True),
        "wq": param(H * D, C), "wk": param(Hkv * D, C), "wv": param(Hkv * D, C),
        "wo": param(C, H * D),
        "mlp_norm": torch.ones(C, device=dev, dtype=dt, requires_grad=True),
    }
    E, K, FE = a.experts, a.experts_used, a.moe_ffn
    if E:
        w["router"] = param(E, C)
        w["ewg"] = param(E, FE, C)
        w["ewu"] = param(E, FE, C)
        w["ewd"] = param(E, C, FE)
    else:
        w.update({"wg": param(FF, C), "wu": param(FF, C), "wd": param(C, FF)})

    # RoPE tables as the cuda backend builds them: angles in double, cos and sin in float.
    pos = torch.arange(T, device=dev, dtype=torch.float64)
    inv = a.theta ** (-2.0 * torch.arange(D // 2, device=dev, dtype=torch.float64) / D)
    ang = pos[:, None] * inv[None, :]
    cos = torch.cos(ang).to(torch.float32).to(dt)[None, :, None, :]  # (1, T, 1, D/2)
    sin = torch.sin(ang).to(torch.float32).to(dt)[None, :, None, :]

    def rope(x):  # (B, T, nh, D), half-split
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    if hasattr(F, "rms_norm"):
        def rmsnorm(x, weight):
            return F.rms_norm(x, (C,), weight, a.eps)
    else:
        def rmsnorm(x, weight):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + a.eps)).to(dt) * weight

    def attention(q, k, v):  # (B, nh, T, D)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            if Hkv != H:
                k = k.repeat_interleave(H // Hkv, dim=1)
                v = v.repeat_interleave(H // Hkv, dim=1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def moe(h2):  # (B, T, C) -> (B, T, C)
        hs = h2.reshape(-1, C)
        probs = F.softmax((hs @ w["router"].t()).float(), dim=-1)
        wt, idx = torch.topk(probs, K, dim=-1)
        if a.norm_topk:
            wt = wt / wt.sum(dim=-1, keepdim=True)
        wt = wt.to(dt)
        out = torch.zeros_like(hs)
        onehot = F.one_hot(idx, num_classes=E).permute(2, 1, 0)  # (E, K, N)
        for e in range(E):
            j, tok = torch.where(onehot[e])
            if tok.numel() == 0:
                continue
            xe = hs[tok]
            ye = (F.silu(xe @ w["ewg"][e].t()) * (xe @ w["ewu"][e].t())) @ w["ewd"][e].t()
            out.index_add_(0, tok, ye * wt[tok, j, None])
        return out.view(B, T, C)

    def layer(x):
        h = rmsnorm(x, w["attn_norm"])
        q = rope((h @ w["wq"].t()).view(B, T, H, D)).transpose(1, 2)
        k = rope((h @ w["wk"].t()).view(B, T, Hkv, D)).transpose(1, 2)
        v = (h @ w["wv"].t()).view(B, T, Hkv, D).transpose(1, 2)
        att = attention(q, k, v).transpose(1, 2).reshape(B, T, H * D)
        x2 = x + att @ w["wo"].t()
        h2 = rmsnorm(x2, w["mlp_norm"])
        if E:
            return x2 + moe(h2)
        return x2 + (F.silu(h2 @ w["wg"].t()) * (h2 @ w["wu"].t())) @ w["wd"].t()

    x = torch.randn(B, T, C, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn(B, T, C, device=dev, dtype=dt) * 1e-3

    def layer_step():
        for p in w.values():
            p.grad = None
        x.grad = None
        layer(x).backward(dy)

    q = torch.randn(B, H, T, D, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(B, Hkv, T, D, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(B, Hkv, T, D, device=dev, dtype=dt, requires_grad=True)
    do = torch.randn(B, H, T, D, device=dev, dtype=dt)

    def attn_step():
        q.grad = k.grad = v.grad = None
        attention(q, k, v).backward(do)

    G = a.gemm_size
    ga = torch.randn(G, G, device=dev, dtype=dt)
    gb = torch.randn(G, G, device=dev, dtype=dt)

    def gemm_step():
        torch.matmul(ga, gb)

    try:
        layer_ms = timed(torch, layer_step, a.warmup, a.iters)
        attn_ms = timed(torch, attn_step, a.warmup, a.iters)
        gemm_ms = timed(torch, gemm_step, 2, 5)
    except RuntimeError as e:
        fail("torch failed: %s" % str(e).splitlines()[0])
    print(json.dumps({
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "layer_ms": layer_ms,
        "attn_ms": attn_ms,
        "gemm_tflops": 2.0 * G ** 3 / (gemm_ms * 1e-3) / 1e12,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
