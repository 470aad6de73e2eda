#!/usr/bin/env python3
"""Every model family end to end through tz-train (one family per run, named by the argument):
a tiny random checkpoint made here (a config.json with no weights, --steps 0, exported in f32),
imported and trained; a run checkpointed after 2 steps and resumed gives the losses and gradient
norms of the uninterrupted run bit for bit and the same exported bytes; the export names the
family (model_type, architectures) and imports again to the same bytes.

With FAMILY "table": every row of the family table (tz-model-check --families) has a case here,
the export's names of each case are its row's, and the table says what docs/model.md's checklist
needs of a row (a model_type, an architecture, JSON export keys).

Usage: test_families.py TZ_BIN FAMILY (llama, llama3, linear, dynamic, yarn, mistral,
mistral_window, qwen2, qwen3, qwen2_window, head_dim, olmo2, phi3, phi3_longrope, gemma2,
gemma3, qwen3_moe, mixtral, olmoe, qwen2_moe, table)"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

BIN, FAMILY = sys.argv[1], sys.argv[2]
TZ_TRAIN = os.path.join(BIN, "tz-train")
# what tz-train says for --backend cuda in a build without it (the cpu preset): the cuda
# backend's refusals are then not checked here (the release build, CI's, has the backend)
NO_CUDA = "no backend 'cuda' in this build"

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "initializer_range": 0.05, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2}
FAMILIES = {
    # Llama 2 shape, tied: what the importer took before the families.
    "llama": ("llama", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    # Llama 3.2: llama3 RoPE scaling and tied embeddings.
    "llama3": ("llama", "LlamaForCausalLM", {
        "tie_word_embeddings": True, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    # linear RoPE scaling (position interpolation), as long-context Llama 2 fine-tunes have it
    "linear": ("llama", "LlamaForCausalLM", {"rope_scaling": {"rope_type": "linear",
                                                              "factor": 4.0}}),
    "mistral": ("mistral", "MistralForCausalLM", {"sliding_window": None}),
    # dynamic NTK RoPE: the default rope up to max_position_embeddings, the type kept
    "dynamic": ("llama", "LlamaForCausalLM", {"rope_scaling": {"rope_type": "dynamic",
                                                               "factor": 2.0}}),
    # yarn RoPE (Qwen2.5's long-context configs): positions past original 8 of the 16 trained
    "yarn": ("qwen2", "Qwen2ForCausalLM", {
        "use_sliding_window": False, "rope_theta": 100.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 8}}),
    # Mistral 7B v0.1's window, shorter than the sequence (8 of 16): computed by the cpu backend,
    # refused at start on the cuda one at this length
    "mistral_window": ("mistral", "MistralForCausalLM", {"sliding_window": 8}),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", {"use_sliding_window": False,
                                             "sliding_window": 4096}),
    "qwen3": ("qwen3", "Qwen3ForCausalLM", {"head_dim": 16}),
    # Qwen with its window opted into: layer 0 full, layer 1 sliding (8 of the 16 tokens)
    "qwen2_window": ("qwen2", "Qwen2ForCausalLM", {"use_sliding_window": True,
                                                   "sliding_window": 8, "max_window_layers": 1}),
    # head_dim 24 with hidden 64 and 4 heads: q is 96 wide, o maps 96 back to 64.
    "head_dim": ("qwen3", "Qwen3ForCausalLM", {"head_dim": 24}),
    # OLMo 2: norms on the attention's and MLP's outputs, q/k norms over the whole projections.
    "olmo2": ("olmo2", "Olmo2ForCausalLM", {"attention_bias": False, "pad_token_id": 1}),
    # Phi-3: Llama's math with q, k, v fused into qkv_proj and gate, up into gate_up_proj (2 kv
    # heads of 4: rows 64 + 2 * 32).
    "phi3": ("phi3", "Phi3ForCausalLM", {"sliding_window": None, "resid_pdrop": 0.0,
                                         "embd_pdrop": 0.0}),
    # Phi-3.5's longrope: the long factors at the 16 tokens trained, above the original 8
    "phi3_longrope": ("phi3", "Phi3ForCausalLM", {
        "sliding_window": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "original_max_position_embeddings": 8,
        "rope_scaling": {"type": "longrope",
                         "short_factor": [1.0, 1.1, 1.3, 1.7, 2.0, 2.5, 3.0, 4.0],
                         "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]}}),
    # Phi-4-mini's partial rotary (int(16 * 0.75) = 12 of each head's 16 dims rotated) with its
    # longrope, whose factors are 12 / 2 of each kind
    "phi4_mini": ("phi3", "Phi3ForCausalLM", {
        "sliding_window": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "partial_rotary_factor": 0.75, "original_max_position_embeddings": 8,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.0],
                         "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0]}}),
    # Gemma 2: (1 + w) norms on both sides of each part, tanh-gelu gate, scaled embedding, a
    # query_pre_attn_scalar other than head_dim, both softcaps, and a window (8) shorter than the
    # sequence (16) on every other layer.
    "gemma2": ("gemma2", "Gemma2ForCausalLM", {
        "head_dim": 16, "query_pre_attn_scalar": 12, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_act": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "sliding_window": 8, "tie_word_embeddings": True,
        "layer_types": ["sliding_attention", "full_attention"], "pad_token_id": 0}),
    # Gemma 3 (text): q/k norms, no softcaps, the hub's keys for the pattern (every 2nd layer
    # full here) and the sliding layers' RoPE base, a window shorter than the sequence.
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM", {
        "head_dim": 16, "query_pre_attn_scalar": 16, "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 8, "sliding_window_pattern": 2, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "tie_word_embeddings": True, "pad_token_id": 0}),
    # Mixtures of experts: Qwen3-MoE (q/k norms, 4 experts of 32, 2 a token renormalised, the
    # load-balancing loss in the loss), Mixtral (block_sparse_moe's w1/w2/w3, always
    # renormalised) and OLMoE (q/k norms over the projections, not renormalised)
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", {
        "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "norm_topk_prob": True, "output_router_logits": True, "router_aux_loss_coef": 0.02,
        "decoder_sparse_step": 1, "mlp_only_layers": []}),
    "mixtral": ("mixtral", "MixtralForCausalLM", {
        "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}),
    "olmoe": ("olmoe", "OlmoeForCausalLM", {
        "num_experts": 3, "num_experts_per_tok": 1, "pad_token_id": 1}),
    # Qwen2-MoE (Qwen1.5-MoE): qwen2's biased attention, 4 experts of 24, 2 a token, and a shared
    # expert of 40 behind its sigmoid gate; transformers 5's sliding_window 0 with the window off
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeForCausalLM", {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 40, "norm_topk_prob": False, "qkv_bias": True,
        "use_sliding_window": False, "sliding_window": 0}),
}


def st_read(path):
    """A safetensors file as {name: (dtype, shape, bytes)} in file order, read by hand."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, e in sorted(((k, v) for k, v in head.items() if k != "__metadata__"),
                          key=lambda kv: kv[1]["data_offsets"][0]):
        a, b = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], raw[8 + n + a:8 + n + b])
    return out


def st_write(path, tensors):
    """{name: (dtype, shape, bytes)} as a safetensors file."""
    head, at = {}, 0
    for name, (dt, shape, data) in tensors.items():
        head[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + len(data)]}
        at += len(data)
    text = json.dumps(head).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, data in tensors.values():
            f.write(data)


def unfuse_phi3(src, dst, cfg):
    """src, a phi3 export in f32, as the llama checkpoint it is by transformers' definition of
    Phi-3 (Phi3Attention: q, then k, then v rows of qkv_proj; Phi3MLP: gate, then up, of
    gate_up_proj's chunk(2)), written independently of tz-train's split."""
    os.makedirs(dst)
    C = cfg["hidden_size"]
    D = cfg.get("head_dim") or C // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D
    F = cfg["intermediate_size"]
    row = 4 * C  # f32
    out = {}
    for name, (dt, shape, data) in st_read(os.path.join(src, "model.safetensors")).items():
        assert dt == "F32", (name, dt)
        if name.endswith("self_attn.qkv_proj.weight"):
            assert shape == [q + 2 * kv, C], (name, shape)
            base = name[:-len("qkv_proj.weight")]
            out[base + "q_proj.weight"] = (dt, [q, C], data[:q * row])
            out[base + "k_proj.weight"] = (dt, [kv, C], data[q * row:(q + kv) * row])
            out[base + "v_proj.weight"] = (dt, [kv, C], data[(q + kv) * row:])
        elif name.endswith("mlp.gate_up_proj.weight"):
            assert shape == [2 * F, C], (name, shape)
            base = name[:-len("gate_up_proj.weight")]
            out[base + "gate_proj.weight"] = (dt, [F, C], data[:F * row])
            out[base + "up_proj.weight"] = (dt, [F, C], data[F * row:])
        else:
            out[name] = (dt, shape, data)
    st_write(os.path.join(dst, "model.safetensors"), out)
    llama = {k: v for k, v in cfg.items()
             if k not in ("resid_pdrop", "embd_pdrop", "sliding_window", "original_max_position_"
                          "embeddings")}
    llama.update(model_type="llama", architectures=["LlamaForCausalLM"])
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(llama, f)


def model_check(*args):
    p = subprocess.run([os.path.join(BIN, "tz-model-check"), *args], capture_output=True,
                       text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: tz-model-check {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n"
                 f"{p.stderr}")
    return p.stdout


def tz_train(*args):
    p = subprocess.run([TZ_TRAIN, "--progress", "plain", *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: tz-train {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout


def steps(path):
    """(step, loss, grad_norm) of every step line of a metrics file, as written (text compared:
    the file prints each float so that it reads back to the same bits)."""
    out = []
    with open(path) as f:
        for line in f:
            o = json.loads(line, parse_float=str)
            if "step" in o and "summary" not in o:  # not the header (the run's config)
                out.append((o["step"], o["loss"], o["grad_norm"]))
    return out


def same_bytes(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def table():
    """Each family of the table has a case, with the table's names."""
    out = subprocess.run([os.path.join(BIN, "tz-model-check"), "--families"], check=True,
                         capture_output=True, text=True).stdout
    rows = json.loads(out)
    failures = []
    cases = {m: a for m, a, _ in FAMILIES.values()}
    for r in rows:
        mt = r.get("model_type")
        if not mt or not r.get("architecture") or not isinstance(r.get("export_keys"), dict):
            failures.append(f"row {r} lacks a model_type, an architecture or export keys")
        elif mt not in cases:
            failures.append(f"family {mt} has no case in tests/test_families.py (FAMILIES)")
        elif cases[mt] != r["architecture"]:
            failures.append(f"family {mt}: the table's architecture {r['architecture']}, the "
                            f"case's {cases[mt]}")
    for mt in cases:
        if mt not in {r.get("model_type") for r in rows}:
            failures.append(f"case of {mt}: no such family in the table")
    for msg in failures:
        print(f"FAIL: table: {msg}", file=sys.stderr)
    print(f"test_families table: {len(rows)} families, "
          f"{'%d failed' % len(failures) if failures else 'passed'}")
    return 1 if failures else 0


def refused_by_name(cfg, cases, at, common):
    """Each (extra keys, key) of cases: cfg with the extra keys refused by tz-train at start, the
    key named in its message; the failures' texts."""
    failures = []
    for extra, key in cases:
        with open(at("refused.json"), "w") as f:
            json.dump(dict(cfg, **extra), f)
        p = subprocess.run([TZ_TRAIN, "--model", at("refused.json"), "--steps", "1", *common],
                           capture_output=True, text=True)
        if p.returncode == 0 or key not in p.stderr:
            failures.append(f"{key}: not refused by name (exit {p.returncode}): "
                            f"{p.stderr.strip()}")
    return failures


def main():
    if FAMILY == "table":
        return table()
    model_type, arch, extra = FAMILIES[FAMILY]
    tmp = tempfile.mkdtemp(prefix=f"tz-test-family-{FAMILY}-")
    try:
        cfg = dict(BASE, model_type=model_type, architectures=[arch], **extra)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        at = lambda *p: os.path.join(tmp, *p)
        common = ["--seq", "16", "--data", "synthetic", "--seed", "9"]
        # The random checkpoint: that shape initialised as transformers does, in f32.
        tz_train("--model", at("config.json"), "--steps", "0", *common,
                 "--export-safetensors", at("random"), "--export-dtype", "f32")
        with open(at("random", "config.json")) as f:
            exported = json.load(f)
        failures = []
        for key, want in (("model_type", model_type), ("architectures", [arch])):
            if exported.get(key) != want:
                failures.append(f"export's {key} {exported.get(key)!r}, not {want!r}")
        if "rope_scaling" in extra:  # the scaling survives the export, as transformers reads it
            got = exported.get("rope_scaling") or {}
            for k, v in extra["rope_scaling"].items():
                if got.get(k) != v:
                    failures.append(f"export's rope_scaling {got!r}, not {extra['rope_scaling']!r}")
                    break
        straight = ["--import-safetensors", at("random"), *common]
        tz_train(*straight, "--steps", "4", "--metrics", at("straight.jsonl"),
                 "--export-safetensors", at("straight"), "--export-dtype", "f32")
        tz_train(*straight, "--steps", "2", "--metrics", at("parts.jsonl"), "--ckpt-dir", at("ck"))
        tz_train(*straight, "--steps", "4", "--metrics", at("parts.jsonl"), "--resume", at("ck"),
                 "--export-safetensors", at("resumed"), "--export-dtype", "f32")
        a, b = steps(at("straight.jsonl")), steps(at("parts.jsonl"))
        if a != b or len(a) != 4:
            failures.append(f"resumed steps {b} are not the uninterrupted run's {a}")
        if a and a[0][1] == a[-1][1]:
            failures.append(f"the loss did not change over 4 steps: {a}")
        st = [f for f in os.listdir(at("straight")) if f.endswith(".safetensors")]
        if not st:
            failures.append("no safetensors in the export")
        for f in st:
            if not same_bytes(at("straight", f), at("resumed", f)):
                failures.append(f"{f}: the resumed run's export differs from the straight run's")
        # The export imports again, to the same bytes.
        tz_train("--import-safetensors", at("straight"), "--steps", "0", *common,
                 "--export-safetensors", at("again"), "--export-dtype", "f32")
        for f in st:
            if not same_bytes(at("straight", f), at("again", f)):
                failures.append(f"{f}: the re-imported export differs")
        if FAMILY == "phi4_mini":
            # the factor and the factors go out as transformers 4 and 5 read them; a factor
            # the rope object contradicts, one that rotates an odd count of dims, and longrope
            # factors that are not rotated dims / 2 (6) of them are refused by name
            rs = exported.get("rope_scaling") or {}
            if exported.get("partial_rotary_factor") != 0.75 or len(rs.get("short_factor", [])) != 6:
                failures.append(f"export's partial_rotary_factor "
                                f"{exported.get('partial_rotary_factor')!r}, rope_scaling {rs!r}")
            if (exported.get("rope_parameters") or {}).get("partial_rotary_factor") != 0.75:
                failures.append(f"export's rope_parameters {exported.get('rope_parameters')!r}")
            failures += refused_by_name(cfg, (
                ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                      "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
                ({"partial_rotary_factor": 0.7}, "partial_rotary_factor"),
                ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8,
                                   "long_factor": [1.0] * 8}}, "short_factor")), at, common)
        if FAMILY == "phi3":
            # longrope factors that are not head_dim / 2 (8) of them are refused, naming the key
            failures += refused_by_name(cfg, (
                ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 7,
                                   "long_factor": [1.0] * 8},
                  "original_max_position_embeddings": 8}, "short_factor"),
                ({"resid_pdrop": 0.1}, "resid_pdrop")), at, common)
            # The trained export split by transformers' rule computes what the fused one does:
            # every logit's bits equal through tz-model-check.
            with open(at("straight", "config.json")) as f:
                unfuse_phi3(at("straight"), at("llama"), json.load(f))
            toks = ["--tokens", "3,1,4,1,5,9,2,6,5,3,5,8,9,7,9", "--threads", "1"]
            a = model_check("--import", at("straight"), *toks, "--logits", at("phi3.f32"))
            b = model_check("--import", at("llama"), *toks, "--logits", at("llama.f32"))
            if not same_bytes(at("phi3.f32"), at("llama.f32")):
                failures.append("the fused checkpoint's logits differ from the split one's")
            if a.split("loss")[1].split()[0] != b.split("loss")[1].split()[0]:
                failures.append(f"the fused checkpoint's loss differs:\n{a}\n{b}")
        if FAMILY == "qwen2_window":
            want = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1,
                    "layer_types": ["full_attention", "sliding_attention"]}
            for k, v in want.items():
                if exported.get(k) != v:
                    failures.append(f"export's {k} {exported.get(k)!r}, not {v!r}")
        if FAMILY == "mistral_window":
            if exported.get("sliding_window") != 8:
                failures.append(f"export's sliding_window {exported.get('sliding_window')!r}")
            # the cuda backend with its variants turned off refuses the window at start
            p = subprocess.run([TZ_TRAIN, "--model", at("config.json"), "--backend", "cuda",
                                "--steps", "1", *common], capture_output=True, text=True,
                               env={**os.environ, "TZ_CUDA_VARIANTS": "0"})
            if NO_CUDA in p.stderr:
                print(f"{FAMILY}: the cuda refusal not checked: {NO_CUDA}")
            elif p.returncode != 2 or "sliding-window attention" not in p.stderr:
                failures.append(f"--backend cuda at 16 tokens: not refused at start (exit "
                                f"{p.returncode}): {p.stderr.strip()}")
        if FAMILY == "gemma3":
            # the pattern and both ropes go out as transformers 4 and 5 read them
            want = {"sliding_window_pattern": 2, "rope_local_base_freq": 10000.0,
                    "rope_theta": 1000000.0, "layer_types": ["sliding_attention", "full_attention"],
                    "rope_parameters": {"full_attention": {"rope_type": "default",
                                                           "rope_theta": 1000000.0},
                                        "sliding_attention": {"rope_type": "default",
                                                              "rope_theta": 10000.0}}}
            for k, v in want.items():
                if exported.get(k) != v:
                    failures.append(f"export's {k} {exported.get(k)!r}, not {v!r}")
            failures += refused_by_name(cfg, (
                ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
                ({"rope_parameters": {"full_attention": {"rope_type": "default"},
                                      "sliding_attention": {"rope_type": "linear",
                                                            "factor": 2.0}}},
                 "sliding_attention")), at, common)
        if FAMILY == "gemma2":
            # Gemma's keys go out as they came in; a pattern, an activation or a scalar it does
            # not implement is refused by name; so is the cuda backend, at start, with its
            # setting variants off (its kernels for Gemma's math; on by default).
            p = subprocess.run([TZ_TRAIN, "--model", at("config.json"), "--backend", "cuda",
                                "--steps", "1", *common], capture_output=True, text=True,
                               env={**os.environ, "TZ_CUDA_VARIANTS": "0"})
            if NO_CUDA in p.stderr:
                print(f"{FAMILY}: the cuda refusal not checked: {NO_CUDA}")
            elif p.returncode != 2 or "only with its setting variants on" not in p.stderr:
                failures.append(f"--backend cuda: not refused at start (exit {p.returncode}): "
                                f"{p.stderr.strip()}")
            for k in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                      "sliding_window", "layer_types", "hidden_activation"):
                if exported.get(k) != cfg[k]:
                    failures.append(f"export's {k} {exported.get(k)!r}, not {cfg[k]!r}")
            failures += refused_by_name(cfg, (
                ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
                ({"hidden_activation": "gelu"}, "hidden_activation"),
                ({"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
                ({"final_logit_softcapping": -1.0}, "final_logit_softcapping")), at, common)
        if FAMILY in ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe"):
            # each expert's projections by their checkpoint names; the routing keys go out
            names = set(st_read(at("straight", "model.safetensors")))
            mod, proj = (("block_sparse_moe", "w1") if FAMILY == "mixtral" else ("mlp", "gate_proj"))
            n_exp = extra.get("num_experts", extra.get("num_local_experts"))
            for e in range(n_exp):
                if f"model.layers.1.{mod}.experts.{e}.{proj}.weight" not in names:
                    failures.append(f"export lacks expert {e}'s {proj}: {sorted(names)[:8]}")
            if f"model.layers.0.{mod}.gate.weight" not in names:
                failures.append("export lacks the router")
            if FAMILY == "qwen2_moe":
                for t in ("shared_expert.gate_proj", "shared_expert.down_proj",
                          "shared_expert_gate"):
                    if f"model.layers.1.mlp.{t}.weight" not in names:
                        failures.append(f"export lacks the shared expert's {t}")
                if exported.get("shared_expert_intermediate_size") != 40:
                    failures.append("export's shared_expert_intermediate_size "
                                    f"{exported.get('shared_expert_intermediate_size')!r}")
                failures += refused_by_name(cfg, (({"qkv_bias": False}, "qkv_bias"),), at, common)
            for k in ("num_experts_per_tok", "norm_topk_prob", "output_router_logits",
                      "router_aux_loss_coef"):
                if k in extra and exported.get(k) != extra[k]:
                    failures.append(f"export's {k} {exported.get(k)!r}, not {extra[k]!r}")
            failures += refused_by_name(cfg, (
                ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
                ({"mlp_only_layers": [0]}, "mlp_only_layers"),
                ({"router_jitter_noise": 0.1}, "router_jitter_noise"),
                ({"n_group": 4}, "n_group"),
                ({"num_experts": 5, "num_local_experts": 4}, "num_local_experts"),
                ({"num_experts_per_tok": 9}, "num_experts_per_tok")), at, common)
        for msg in failures:
            print(f"FAIL: {FAMILY}: {msg}", file=sys.stderr)
        print(f"test_families {FAMILY}: {'%d failed' % len(failures) if failures else 'passed'}")
        return 1 if failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
