#!/usr/bin/env bash
# On the GPU machine (see ../shared/device/README.md): builds with CUDA, runs the tests, then the
# GPU benchmarks. Logs go to /tmp/tz-gpu-logs and, packed, to $OUT/logs.tgz. Each step runs even if
# an earlier one failed; the summary at the end says which did.
#   source .deps/setup.sh && bash tools/gpu-check.sh [STEP...]
# Steps: tests topo tiers adam collectives hf families layer prefetch train product (default: all,
# in that order; tests: carry .whl, whose py/ (tools/venv-stage.sh) makes .venv without the network
# for tz-data's tests; families: each model family against transformers, docs/model.md; product:
# the trainer's GPU checks of docs/training.md),
# and, only when named, trainbench: tools/bench-train.sh tz-offload llama-1b (docs/benchmarks.md);
# attention: the mma.sync attention (tierzero.cuda_attention two-pass: auto's kernels on GPUs
# other than sm_90 and for calls the warpgroup-MMA ones do not take, docs/cuda-kernels.md) in the
# model's and trainer's GPU tests, beside the kernel tests and tz-bench layer (whose two-pass row
# times it); attention7b: tz-auto llama-7b with it beside auto's kernels (recompute auto, then
# all), one run after the other;
# tiers3: issue 26's item 3, the 15.5 B model on HBM, host and the disk with its fio ceiling
# (about 380 s; .deps carries fio); wgmma: the warpgroup-MMA block (test_wgmma), the attention
# kernels on it (tierzero.cuda_attention wgmma) in the kernel, model and trainer tests, and
# tz-bench layer with auto's kernels, the two-pass ones (mma.sync only) and wgmma's;
# attnshapes: tz-bench layer at the other shapes of issue 24 (head dims 64, 80, 96, 128 with
# grouped-query ratios up to 7:1, sequences 128 and 8192), for docs/cuda-kernels.md's table; at
# head dims 64, 80 and 96 again with tierzero.cuda_attention wgmma (auto's kernels there too since
# they measured faster, 2026-12-05)
# acc8: issue 26's big batches, the three runs of its item 2 one after the other: tz-auto
# llama-7b at 8 micro-batches, tz-offload llama-7b without carry in a 120 GiB window, tz-auto
# llama-13b (docs/benchmarks-history.md, "Big batches: tz-offload llama-7b above tz-auto"; about
# 330 s)
# off3b: issue 26's item 1, tz-offload llama-3b with the CPU share searched, then also without
# carry in a 120 GiB window (twice: the second run's plan has the first's rate at the homes),
# then that with no CPU share and with 0.15 given (about 300 s); ds64k: its item 2's DeepSpeed pair at 64k tokens a step,
# ds-offload llama-3b at 8 micro-batches beside tz-offload llama-3b at 8 (searched; and without
# carry in 120 GiB), one after the other (DeepSpeed from .whl/ds: carry it; about 330 s)
# learn3b: issue 26's item 1 with the homes' rate learned: tz-offload llama-3b without carry in a
# 120 GiB window, the CPU share searched, three runs one after the other (the first plans on the
# probe's rate, the next on the rate the run before reached at the homes), then 0.15 given;
# then the homes at 0.3 given on the default threads and on 10 (about 260 s)
# share: tz-auto llama-7b at 8 micro-batches, then tz-offload llama-7b there without carry with
# the CPU's share of Adam searched and with none (about 280 s)
# fused: issue 24's layer ops (the residual in the projections' GEMM and in the norm's backward,
# the SwiGLU rebuilt in its backward, 16-byte elementwise, RoPE and RMSNorm kernels): the kernel
# tests, the model's and trainer's GPU tests, tz-bench layer in 3 rounds with PyTorch beside it
# (each op's GB/s beside the copy ceiling), then tz-auto llama-7b (about 200 s)
# variants: the windowed and soft-capped attention's speed beside the causal kernel's; packed:
# the layer with packed documents beside the same without; wgmasks: the masks (documents, windows,
# softcaps) on the warpgroup-MMA kernels by name, their tests and their speed beside auto's;
# sftpair: tz-train's packed fine-tuning beside pretraining, on auto's kernels and on wgmma;
# sft7b: the same at llama-7b; sft8b: an 8B-shaped fine-tuning run on packed conversations;
# softcap: the softcap's tanh approximated (tierzero.cuda_softcap_tanh approx), tests and speed;
# normbwd: tz-bench layer with RMSNorm's backward in two passes, then in one; moelayer: the
# experts' layer beside PyTorch's (OLMoE-1B-7B's and Mixtral's shapes); dsmoe: issue 53's pair,
# ds-offload then tz-auto on OLMoE-1B-7B's config.json, one after the other (DeepSpeed from .whl/ds:
# carry it; about 500 s);
# longmax: one step of Llama-3.1-8B's shape at 262,144 tokens (TZ_LONGMAX_SEQ; an H200);
# attnlong: the attention at 32k and 128k tokens beside PyTorch's; dslong: DeepSpeed with CPU offload
# at 32k and 128k tokens (issue 52);
# moe14b: the 14B-total MoE (Qwen1.5-MoE-A2.7B's config) over HBM, host and the disk (an H200);
# long8b: Llama-3.1-8B's shape (configs/models/llama-3.1-8b.json) with the plan's placement at
# 8,192 tokens in one sequence, then at 131,072, one after the other (issue 52's GPU rows; about
# 430 s on an H100, 2026-12-07: 61 s and 359 s, with 31 of the 33 GiB of layer inputs in HBM,
# most of the optimizer state on the host, 1 GiB on the disk, the plan's bound 69.2 s a step,
# the step 72.1 s; docs/benchmarks.md); its --fit seq on this machine with TZ_LONG8B_FIT=1;
# acts: issue 52's layer inputs in the tiers: llama-3.2-1b's config at one 65,536-token sequence
# with its layer inputs in HBM, then in host memory (tierzero.offload_activations none, cpu), one
# after the other (about 120 s; run it with gputests, whose test_train_gpu puts them on host and
# nvme);
# attnprof: Nsight Compute's full set on the warpgroup-MMA attention kernels, causal and each
# variant (issue 51);
# keepout: the attention's output kept while the rest of its part is recomputed
# (tierzero.recompute "attn-proj", the plan's choice at long sequences): one 131,072-token
# sequence of llama-3.2-1b's config with every part recomputed ("all") then with the plan's
# choice, one after the other (about 150 s; TZ_KEEPOUT_1B=0 leaves them out); with
# TZ_KEEPOUT_8B=1 also Llama-3.1-8B's shape, one timed step each (about 450 s more: a call of
# its own);
# widen: the plan's window search (tierzero.plan_widen_moves) A/B'd: tz-auto llama-7b at 4 x 2048,
# then llama-13b at 8 x 2048 (an H200's shape), each with the old search (0) then the default,
# one after the other (about 400 s; TZ_WIDEN_MODELS picks, default "llama-7b");
# mmstreams: the experts' products side by side (tz_compute_matmul_many on 4 streams in main): a
# second tree built with -DTZ_CUDA_MM_STREAMS=$TZ_MM_LANES (1 by default: one after the other),
# its GPU tests that run the experts (test_compute_cuda's test_matmul_many: the same bits as one
# by one; test_train_gpu's experts placement), then tz-bench layer at OLMoE-1B-7B's and Mixtral's
# experts on main's build and on it, one after the other, twice (about 200 s);
# headchunk: the head's chunk of tokens A/B'd (2^28 / V rows against 2^24 / V, below);
# gputests: only the tests that need a GPU (ctest -R), for a call that checks a fix
# (each step fits one device call).
set -uo pipefail
steps=${*:-tests topo tiers adam collectives hf families layer prefetch train product}
logs=/tmp/tz-gpu-logs
mkdir -p "$logs"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ -x .deps/fio ] && export PATH=$root/.deps:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
b=/tmp/tz-build
summary=()
# A step past TZ_GPU_DEADLINE seconds (unset: none) is not started, and says so: a call given more
# steps than its time limit holds ends with what ran, and the summary and logs are written after
# every step, so a call cut off by its limit still brings back what it did.
step() {
  local name=$1; shift
  local t0=$SECONDS
  if [ -n "${TZ_GPU_DEADLINE:-}" ] && [ "$SECONDS" -ge "$TZ_GPU_DEADLINE" ]; then
    summary+=("$(printf '%-14s not started: past TZ_GPU_DEADLINE (%ss)' "$name" "$TZ_GPU_DEADLINE")")
    return 124
  fi
  "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-14s rc=%-3d %4ds' "$name" "$rc" $((SECONDS - t0)))")
  printf '%s\n' "${summary[@]}" > "$logs/summary.txt"
  [ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$logs" . 2> /dev/null
  return $rc
}
has() { [[ " $steps " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$logs/gpu.txt" 2>&1
step configure cmake --preset gpu
step build cmake --build --preset gpu -j"$(nproc)" -- -k 0
if has tests; then
  step ctest ctest --test-dir $b --output-on-failure -j"$(( $(nproc) / 2 ))" --timeout 300
  grep -E "tests passed|Failed|Skipped|\*\*\*" "$logs/ctest.log" | tail -40 > "$logs/ctest-summary.txt"
fi
has topo && step topo $b/bin/tz-topo && step topo-json $b/bin/tz-topo --json
has tiers && step tiers $b/bin/tz-bench tiers --path /var/tmp --size 2G --reps 3
has adam && step adam $b/bin/tz-bench adam --gpu
# Collectives need two GPUs (the nvidia-h200-x2 machine); with one, tz-bench says so and skips.
has collectives && step collectives $b/bin/tz-bench collectives --backend nccl --nproc 2
if has hf && [ -x $b/bin/tz-model-check ]; then
  step hf-export $b/bin/tz-model-check --preset tiny --seed 1 --export /tmp/tz-ours
  step hf-ours python3 tools/hf_check.py run /tmp/tz-ours --tokens 72,101,108,108,111 --tz $b/bin/tz-model-check
  step hf-make python3 tools/hf_check.py make /tmp/tz-theirs --kv-heads 2
  step hf-theirs python3 tools/hf_check.py run /tmp/tz-theirs --tokens 3,1,4,1,5,9,2,6 --tz $b/bin/tz-model-check
fi
# The model families against transformers (docs/model.md): small random models of each family's
# features, then the released configs of tests/data/hf/ with num_hidden_layers reduced to about
# 1B parameters, random weights made by transformers. Each: the CPU backend in f32 against
# transformers in f32 (loss 1e-5 relative, logits 1e-4 of the largest), the CUDA backend in bf16
# against transformers in bf16 (loss 1e-2), greedy generation of 16 tokens.
if has families && [ -x $b/bin/tz-model-check ]; then
  export TZ_CUDA_VARIANTS=1
  hf="python3 tools/hf_check.py"
  fam_one() { # name, then make's arguments
    local name=$1; shift
    local d=/tmp/tz-fam-$name
    rm -rf "$d"
    step fam-$name-make $hf make "$d" "$@" --tz $b/bin/tz-model-check || return
    step fam-$name-f32 $hf run "$d" --tokens 3,1,4,1,5,9,2,6,5,3,5,8,9,7,9 --tz $b/bin/tz-model-check
    # the families' variants (Gemma's math, windows) on the cuda backend: its setting variants
    # on (TZ_CUDA_VARIANTS=1, the default since these checks passed); FAM_CPU_ONLY lists
    # families checked on the cpu backend alone
    [[ " ${FAM_CPU_ONLY-} " == *" $name "* ]] && local cpu=(--backend cpu) || local cpu=()
    [ ${#cpu[@]} -eq 0 ] &&
      step fam-$name-bf16 $hf run "$d" --tokens 3,1,4,1,5,9,2,6,5,3,5,8,9,7,9 --dtype bfloat16 \
        --tz $b/bin/tz-model-check
    step fam-$name-gen $hf generate "$d" --tokens 3,1,4,1,5 --new 16 --tz $b/bin/tz-model-check
    # 20 steps on text (byte tokens, valid in every vocabulary) on the GPU, the loss falling; the
    # export loaded back by transformers with equal logits, on text like the training's (on
    # tokens the trained model finds unlikely its loss is large and its relative difference
    # too: llama-3.2-1b's loss 18.2 on the digits of pi differed by 8e-5 with logits within 1e-6
    # of the largest). The logits are the test (1e-4 of the largest); the loss of a trained
    # model, whose softmax is sharper, gets 1e-4: the released shapes, trained 20 steps, came to
    # 1.3e-5 to 8.5e-5 with every logit within 1.5e-6 of the largest.
    step fam-$name-train $b/bin/tz-train "${cpu[@]}" --import-safetensors "$d" --auto-placement \
      --steps 20 \
      --seq 128 --data text:docs/training.md --metrics "$d.jsonl" --export-safetensors "$d-out" \
      --export-dtype f32 &&
      step fam-$name-falls python3 -c 'import json,sys
l=[json.loads(x) for x in open(sys.argv[1])]; l=[x["loss"] for x in l if "step" in x and "loss" in x]
print("loss %.4f -> %.4f" % (l[0], l[-1])); sys.exit(0 if l[-1] < l[0] else 1)' "$d.jsonl" &&
      step fam-$name-export $hf run "$d-out" --tokens 84,104,101,32,112,108,97,110,32,105,115,32,99,104,101,99,107,101,100,32,97,103,97,105,110,115,116,32,116,104,101,32,109,97,99,104,105,110,101 \
        --loss-tol 1e-4 --tz $b/bin/tz-model-check
    rm -rf "$d" "$d-out"
  }
  fams=${TZ_FAMILIES:-all}
  fam_check() { [ "$fams" = all ] || [[ " $fams " == *" $1 "* ]] || return 0; fam_one "$@"; }
  fam_check llama3-rope --family llama --rope-scaling llama3 --rope-original 8 --tie
  fam_check mistral --family mistral --sliding-window 4096
  fam_check qwen2 --family qwen2 --tie
  fam_check qwen3 --family qwen3 --head-dim 24
  fam_check llama-hd --family llama --head-dim 32 --kv-heads 1
  fam_check olmo2 --family olmo2
  fam_check phi3 --family phi3
  fam_check gemma2 --family gemma2 --head-dim 16 --sliding-window 8
  fam_check gemma3 --family gemma3_text --layers 6 --head-dim 16 --sliding-window 8
  fam_check qwen3_moe --family qwen3_moe --head-dim 16 --experts 8 --experts-used 2 --norm-topk \
    --router-aux 0.02
  fam_check mixtral --family mixtral --experts 4 --experts-used 2
  fam_check olmoe --family olmoe --experts 8 --experts-used 3
  fam_check llama-3.2-1b --from-config tests/data/hf/llama-3.2-1b.json --layers 12
  fam_check mistral-7b-v0.3 --from-config tests/data/hf/mistral-7b-v0.3.json --layers 3
  fam_check mistral-nemo --from-config tests/data/hf/mistral-nemo-base-2407.json --layers 1
  fam_check qwen2.5-1.5b --from-config tests/data/hf/qwen2.5-1.5b.json --layers 16
  fam_check qwen3-1.7b --from-config tests/data/hf/qwen3-1.7b.json --layers 14
  fam_check olmo-2-1b --from-config tests/data/hf/olmo-2-0425-1b.json --layers 8
  fam_check phi-3-mini --from-config tests/data/hf/phi-3-mini-4k-instruct.json --layers 8
  fam_check phi-3.5-mini --from-config tests/data/hf/phi-3.5-mini-instruct.json --layers 8
  fam_check phi-4-mini --from-config tests/data/hf/phi-4-mini-instruct.json --layers 4
  fam_check gemma-2-2b --from-config tests/data/hf/gemma-2-2b.json --layers 2
  fam_check gemma-3-1b --from-config tests/data/hf/gemma-3-1b-pt.json --layers 6
  fam_check olmoe-1b-7b --from-config tests/data/hf/olmoe-1b-7b-0924.json --layers 2
  fam_check qwen1.5-moe --from-config tests/data/hf/qwen1.5-moe-a2.7b.json --layers 1
  fam_check qwen2_moe --family qwen2_moe --experts 8 --experts-used 2
  rm -rf /tmp/tz-fam-*
fi
has layer && grep -q '"layer"' bench/tz-bench.c && step layer $b/bin/tz-bench layer
if has prefetch; then
  step prefetch-gpu $b/bin/tz-bench prefetch --layers 16 --block 8M --compute-ms 5 --steps 8 --lookahead 2
  step prefetch-gpu-xfer $b/bin/tz-bench prefetch --layers 16 --block 8M --compute-ms 0.2 --steps 8 --lookahead 2
  step prefetch-gpu-nvme $b/bin/tz-bench prefetch --lane gpu --home nvme --path /var/tmp --layers 16 --block 8M --compute-ms 5 --steps 8 --lookahead 2
  step prefetch-nvme $b/bin/tz-bench prefetch --lane cpu --home nvme --path /var/tmp --layers 16 --block 8M --compute-ms 8
  step prefetch-host $b/bin/tz-bench prefetch --lane cpu --home host --layers 16 --block 8M --compute-ms 5
fi
has train && step train-demo $b/bin/tz-train
if has product; then
  # DeepSpeed configs from configs/ as written, on the GPU: fp16 with dynamic loss scaling (cpu
  # offload), bf16 (nvme offload, its path moved to this machine's disk).
  step ds-fp16 $b/bin/tz-train --config configs/ds-zero-infinity-cpu.json --model llama-1b --seq 512 \
    --steps 12 --set scheduler.params.warmup_num_steps=4 --data synthetic
  mkdir -p /var/tmp/tz-ds-nvme
  step ds-bf16 $b/bin/tz-train --config configs/ds-zero-infinity-nvme.json --model tiny --seq 256 \
    --steps 12 --set train_batch_size=16 --set zero_optimization.offload_optimizer.nvme_path=/var/tmp/tz-ds-nvme \
    --set zero_optimization.offload_param.nvme_path=/var/tmp/tz-ds-nvme --set scheduler.params.warmup_num_steps=4
  # A model trained on the GPU, exported, loaded by transformers: its logits against ours.
  step gpu-export $b/bin/tz-train --model tiny --steps 20 --export-safetensors /tmp/tz-gpu-export
  step gpu-export-hf python3 tools/hf_check.py run /tmp/tz-gpu-export --tokens 72,101,108,108,111,33 \
    --tz $b/bin/tz-model-check
fi
has trainbench && step trainbench env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-1b
if has attention; then
  step attn-kernels ctest --test-dir $b --output-on-failure -R '^test_compute_cuda$'
  step attn-model env TZ_CUDA_ATTENTION=two-pass ctest --test-dir $b --output-on-failure \
    -R '^test_(model|train)_gpu'
  step attn-layer $b/bin/tz-bench layer
fi
if has wgmma; then
  # Hopper's warpgroup MMA: the building block, then the forward on it in the kernel tests, the
  # model's and trainer's GPU tests, and tz-bench layer with it beside auto's kernels
  step wgmma-block ctest --test-dir $b --output-on-failure -R '^test_wgmma$'
  step wgmma-kernels ctest --test-dir $b --output-on-failure -R '^test_compute_cuda$'
  step wgmma-model env TZ_CUDA_ATTENTION=wgmma ctest --test-dir $b --output-on-failure \
    -R '^test_(model|train)_gpu'
  step wgmma-layer-auto $b/bin/tz-bench layer --iters 5 --warmup 2
  step wgmma-layer-2p env TZ_CUDA_ATTENTION=two-pass $b/bin/tz-bench layer --iters 5 --warmup 2
  step wgmma-layer env TZ_CUDA_ATTENTION=wgmma $b/bin/tz-bench layer --iters 5 --warmup 2
fi
# variants: issue 51's speed check, the windowed and soft-capped attention's TFLOP/s per computed
# (query, key) pair against the plain causal kernel's (target >= 0.9), at Llama-7B's attention
# (2048 tokens x 4) and at 8192 x 1 with Mistral's 4096-token window (about 120 s)
if has variants; then
  lv=($b/bin/tz-bench layer --no-torch --rounds 1 --iters 5 --warmup 2)
  step var-none "${lv[@]}"
  step var-w512 "${lv[@]}" --window 512
  step var-cap50 "${lv[@]}" --softcap 50
  step var-w512-cap50 "${lv[@]}" --window 512 --softcap 50
  step var-t8k-none "${lv[@]}" --seq 8192 --batch 1
  step var-t8k-w4096 "${lv[@]}" --seq 8192 --batch 1 --window 4096
fi
# attnprof: Nsight Compute on the warpgroup-MMA attention (issue 51: what the soft-capped and
# windowed kernels wait on beside the causal ones): the forward, dq and dk/dv kernels of tz-bench
# layer's attention, causal, --softcap 50 exact and approx, --window 512, each profiled once with
# the full set (pipe utilization, stall reasons, the SASS with its samples); the reports, their
# details, raw metrics and source pages go to the logs (about 150 s)
if has attnprof; then
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2> /dev/null | head -1)
  echo "${ncu:-no ncu}" > "$logs/prof-ncu.txt"
  [ -n "$ncu" ] && "$ncu" --version >> "$logs/prof-ncu.txt" 2>&1
  lp=($b/bin/tz-bench layer --no-torch --rounds 1 --iters 1 --warmup 0)
  for m in none:0: cap50:2:--softcap,50 cap50a:3:--softcap,50 w512:1:--window,512; do
    IFS=: read -r name var args <<< "$m"
    IFS=, read -r -a extra <<< "$args"
    tanh=exact
    [ "$name" = cap50a ] && tanh=approx
    [ -n "$ncu" ] || break
    # the layer's own attention is causal (VAR false); the variants are the calls alone (VAR true)
    step "prof-$name" env TZ_CUDA_SOFTCAP_TANH=$tanh "$ncu" --clock-control none --set full \
      --import-source no --kernel-name-base demangled -k "regex:wgmma_kernel<.*\(int\)$var>\(" -c 3 \
      -f -o "$logs/prof-$name" "${lp[@]}" "${extra[@]}"
    "$ncu" -i "$logs/prof-$name.ncu-rep" --page details > "$logs/prof-$name.txt" 2>&1
    "$ncu" -i "$logs/prof-$name.ncu-rep" --page raw --csv > "$logs/prof-$name-raw.csv" 2>&1
    "$ncu" -i "$logs/prof-$name.ncu-rep" --page source --csv --print-source sass \
      > "$logs/prof-$name-sass.csv" 2>&1
  done
fi
# wgmasks: packed documents, windows and softcaps on the warpgroup-MMA kernels (by name:
# tierzero.cuda_attention wgmma; auto gives them the mma.sync kernels until measured): the model's
# and trainer's GPU tests with it (packed training included), then tz-bench layer at llama-7b's
# layer with each mask under auto and under wgmma, one after the other (about 150 s)
if has wgmasks; then
  step wgm-tests env TZ_CUDA_ATTENTION=wgmma ctest --test-dir $b --output-on-failure \
    -R '^test_(model_gpu|train_gpu|train_packed)'
  lw=($b/bin/tz-bench layer --no-torch --rounds 1 --iters 5 --warmup 2)
  for m in none: w512:--window,512 cap50:--softcap,50 docs512:--docs,512 docs128:--docs,128 \
    t8k-w4096:--seq,8192,--batch,1,--window,4096; do
    IFS=, read -r -a extra <<< "${m#*:}"
    for k in auto wgmma; do
      step "wgm-${m%%:*}-$k" env TZ_CUDA_ATTENTION=$k "${lw[@]}" "${extra[@]}"
    done
  done
fi
# softcap: tierzero.cuda_softcap_tanh approx (the softcap's
# tanh by tanh.approx.f32): the kernel,
# model and trainer GPU tests with it, then tz-bench layer's soft-capped attention exact and
# approx, one after the other, beside the causal kernel (issue 51's 0.9x; about 120 s)
if has softcap; then
  step softcap-tests env TZ_CUDA_SOFTCAP_TANH=approx ctest --test-dir $b --output-on-failure \
    -R '^test_(compute_cuda|model_gpu|train_gpu)'
  lc=($b/bin/tz-bench layer --no-torch --rounds 1 --iters 5 --warmup 2)
  step softcap-none "${lc[@]}"
  for t in exact approx; do
    step "softcap-cap50-$t" env TZ_CUDA_SOFTCAP_TANH=$t "${lc[@]}" --softcap 50
    step "softcap-w512-cap50-$t" env TZ_CUDA_SOFTCAP_TANH=$t "${lc[@]}" --window 512 --softcap 50
  done
fi
# sftpair: issue 50's packed fine-tuning against pretraining in tz-train (docs/benchmarks.md,
# "Fine-tuning"), tz-auto llama-1b at 4 x 2048: pretraining, then packed conversations
# (bench/sft_data.py) on auto's kernels and on the warpgroup-MMA ones by name
# (tierzero.cuda_attention wgmma), one after the other (about 150 s)
if has sftpair; then
  step sft-data python3 bench/sft_data.py /tmp/tz-sft --tokens 3000000
  bt=(env TZ_BIN=$b/bin tools/bench-train.sh tz-auto llama-1b --steps 6 --warmup 2)
  step sft-pre "${bt[@]}" --tag pre
  step sft-auto "${bt[@]}" --tag sft --data '/tmp/tz-sft/*.bin'
  step sft-wgmma env TZ_CUDA_ATTENTION=wgmma "${bt[@]}" --tag sft-wgmma --data '/tmp/tz-sft/*.bin'
fi
# sft7b: the same pair at llama-7b (the issue's shape; tz-auto llama-7b, 4 x 2048), pretraining
# then packed conversations, one after the other; sft8b: an 8B-shaped fine-tuning run
# (configs/models/llama-3.1-8b.json, the plan's placement, 4 x 2048) on those conversations, its
# packing ("targets ..% of the row tokens") and tokens per second in its log (about 400 s both)
if has sft7b || has sft8b; then
  [ -e /tmp/tz-sft/sft_train_000000.bin ] || step sft-data python3 bench/sft_data.py /tmp/tz-sft --tokens 3000000
fi
if has sft7b; then
  bt7=(env TZ_BIN=$b/bin tools/bench-train.sh tz-auto llama-7b --steps 6 --warmup 2)
  step sft7b-pre "${bt7[@]}" --tag pre
  step sft7b-sft "${bt7[@]}" --tag sft --data '/tmp/tz-sft/*.bin'
fi
if has sft8b; then
  step sft8b $b/bin/tz-train --model configs/models/llama-3.1-8b.json --config configs/bench-auto.json \
    --auto-placement --seq 2048 --data '/tmp/tz-sft/*.bin' --steps 6 --metrics "$logs/sft8b.jsonl"
fi
# packed: issue 50's packed fine-tuning in tz-bench layer, llama-7b's layer (2048 x 4) with rows of
# heavy-tailed documents (mean 512 and 128 tokens) beside the same without documents, one after
# the other: tokens per second counting every row token (target >= 1.0x; about 60 s)
if has packed; then
  lp=($b/bin/tz-bench layer --no-torch --rounds 1)
  step packed-none "${lp[@]}"
  step packed-512 "${lp[@]}" --docs 512
  step packed-128 "${lp[@]}" --docs 128
fi
# moelayer: tz-bench layer with the experts' MLP beside PyTorch's (transformers' loop over the
# experts), OLMoE-1B-7B's layer and Mixtral-8x7B's, 3 rounds each (issue 53)
if has moelayer; then
  step moelayer-olmoe $b/bin/tz-bench layer --rounds 3 --d-model 2048 --heads 16 --kv-heads 16 \
    --experts 64 --experts-used 8 --moe-ffn 1024
  step moelayer-mixtral $b/bin/tz-bench layer --rounds 3 --kv-heads 8 --experts 8 \
    --experts-used 2 --moe-ffn 14336 --norm-topk
fi
if has mmstreams; then
  bm=/tmp/tz-build-mm
  step mm-configure cmake --preset gpu -B $bm -DCMAKE_CUDA_FLAGS="-DTZ_CUDA_MM_STREAMS=${TZ_MM_LANES:-1}"
  step mm-build cmake --build $bm -j"$(nproc)" --target tz-bench test_compute_cuda test_train_gpu
  step mm-tests ctest --test-dir $bm --output-on-failure -j2 --timeout 300 \
    -R '^(test_compute_cuda|test_train_gpu.*)$'
  for r in 1 2; do
    for t in main mm; do
      d=$b
      [ $t = mm ] && d=$bm
      step mm-olmoe-$t-$r $d/bin/tz-bench layer --no-torch --rounds 3 --d-model 2048 --heads 16 \
        --kv-heads 16 --experts 64 --experts-used 8 --moe-ffn 1024
      step mm-mixtral-$t-$r $d/bin/tz-bench layer --no-torch --rounds 3 --kv-heads 8 --experts 8 \
        --experts-used 2 --moe-ffn 14336 --norm-topk
    done
  done
fi
# headchunk: the head's chunk of tokens (TZ_MODEL_HEAD_CHUNK_ELEMS 2^28 / V rows, 2^24 before): a
# second tree built with 2^24, then tz-train on llama-3.2-1b's config (Llama 3's 128,256-token
# vocabulary) at one sequence of 16,384 and of 65,536 tokens, main's build and that one in turn,
# twice at 16k, the step traced (its "head" line: the head's time on the compute lane); the GPU
# tests that run the head (test_train_gpu) on main's build (about 250 s)
if has headchunk; then
  bh=/tmp/tz-build-hc24
  step hc-configure cmake --preset gpu -B $bh -DCMAKE_C_FLAGS="-DTZ_MODEL_HEAD_CHUNK_ELEMS=16777216u"
  step hc-build cmake --build $bh -j"$(nproc)" --target tz-train
  hc() { # tag, build, tokens
    step hc-$1 timeout 150 $2/bin/tz-train --model tests/data/hf/llama-3.2-1b.json --seq $3 \
      --set train_micro_batch_size_per_gpu=1 --auto-placement --data synthetic --steps 4 \
      --trace-step 3 --trace /tmp/tz-hc-$1.json
    python3 tools/trace_summary.py /tmp/tz-hc-$1.json > $logs/hc-$1.trace.txt 2>&1
  }
  for r in 1 2; do
    hc main-16k-$r $b 16384
    hc old-16k-$r $bh 16384
  done
  hc main-64k $b 65536
  hc old-64k $bh 65536
  step hc-tests ctest --test-dir $b --output-on-failure -j2 --timeout 300 -R '^test_train_gpu'
  { grep -H "step time" $logs/hc-*.log; grep -H "^    head " $logs/hc-*.trace.txt; } \
    > $logs/hc-summary.txt 2> /dev/null
  cat $logs/hc-summary.txt
fi
# dsmoe: issue 53's pair on the 7B-total MoE (tests/data/hf/olmoe-1b-7b-0924.json, random
# weights): DeepSpeed ZeRO-3 with parameters and optimizer on the CPU and the experts' blocks as
# leaf modules, then tz-auto, one after the other. Where that DeepSpeed is killed for host memory
# (--mem-floor; an H100 with 126 GiB of host, 2026-12-07), its best placement that runs: nothing
# offloaded (ds-gpu: 16 bytes a parameter, 110 GB, in an H200's HBM), else the optimizer only
# (ds-opt); each failure is a result. No fio job after tz-auto (about 300-550 s).
if has dsmoe; then
  mo=tests/data/hf/olmoe-1b-7b-0924.json
  # DeepSpeed's placements in turn until one runs: a result without an error (bench-train.sh
  # exits 0 with the error as the result; TZ_DSMOE_PEERS: an H100's host memory kills ds-offload
  # and ds-opt, its HBM does not hold ds-gpu: 2026-12-07)
  for p in ${TZ_DSMOE_PEERS:-ds-offload ds-gpu ds-opt}; do
    step dsmoe-$p tools/bench-train.sh $p $mo --steps 4 --warmup 2 \
      --timeout $([ $p = ds-offload ] && echo 270 || echo 150) &&
      [ -s results/bench/$p-olmoe-1b-7b-0924.json ] &&
      ! grep -q '"error"' results/bench/$p-olmoe-1b-7b-0924.json && break
  done
  step dsmoe-tz env TZ_BIN=$b/bin tools/bench-train.sh tz-auto $mo --steps 4 --warmup 2 \
    --timeout 180 --no-disk-ceiling
  python3 tools/bench_table.py table > "$logs/dsmoe-table.md" 2>&1
fi
# moe14b: issue 53's 14B-total model (tests/data/hf/qwen1.5-moe-a2.7b.json, random weights, about
# 250 GiB of state) with the plan's placement over HBM, host and the disk, 4 timed steps (an H200:
# an H100's HBM and host hold too little for the plan; about 200 s)
if has moe14b; then
  step moe14b env TZ_BIN=$b/bin tools/bench-train.sh tz-auto tests/data/hf/qwen1.5-moe-a2.7b.json \
    --steps 4 --warmup 2 --timeout 300 --no-disk-ceiling
fi
# normbwd: RMSNorm's backward in its two kernels (tierzero.cuda_norm_bwd), tz-bench layer in 3
# rounds with PyTorch beside it for each, one after the other (docs/cuda-kernels.md)
if has normbwd; then
  TZ_CUDA_NORM_BWD=two-pass step normbwd-two $b/bin/tz-bench layer --rounds 3
  TZ_CUDA_NORM_BWD=one-pass step normbwd-one $b/bin/tz-bench layer --rounds 3
fi
# gputests: the tests that need a GPU, alone (the CPU ones run in CI), about 200 s
if has gputests; then
  step gputests ctest --test-dir $b --output-on-failure -j4 --timeout 300 -R \
    '^(test_compute_cuda|test_rates_cuda|test_cuda_choice|test_wgmma|test_model_gpu|test_train_gpu.*|test_recompute|test_hbm|test_adam_cuda|test_sched_gpu|test_tier_conformance.hbm|test_train_packed.cuda)$'
fi
if has keepout; then
  ko=(--seq 131072 --micro-batch 1 --warmup 1 --no-disk-ceiling --data synthetic)
  mkdir -p /var/tmp/tz-bench-nvme
  for m in all auto; do
    [ "${TZ_KEEPOUT_1B:-1}" = 1 ] || break
    step keepout-1b-$m env TZ_BIN=$b/bin tools/bench-train.sh tz-auto \
      tests/data/hf/llama-3.2-1b.json "${ko[@]}" --steps 2 --timeout 240 --tag 1b-$m \
      --set tierzero.recompute=$m
  done
  if [ "${TZ_KEEPOUT_8B:-0}" = 1 ]; then
    for m in all auto; do
      step keepout-8b-$m env TZ_BIN=$b/bin tools/bench-train.sh tz-auto \
        configs/models/llama-3.1-8b.json "${ko[@]}" --steps 1 --timeout 280 --tag 8b-$m \
        --set tierzero.recompute=$m
    done
  fi
fi
if has widen; then
  mkdir -p /var/tmp/tz-bench-nvme
  for m in ${TZ_WIDEN_MODELS:-llama-7b}; do
    mb=4
    [ "$m" = llama-13b ] && mb=8
    for w in 0 12; do
      step widen-$m-$w env TZ_BIN=$b/bin tools/bench-train.sh tz-auto $m --micro-batch $mb \
        --steps 4 --warmup 2 --no-disk-ceiling --timeout 240 --tag w$w \
        --set tierzero.plan_widen_moves=$w
    done
  done
fi
if has acts; then
  l1=(--model tests/data/hf/llama-3.2-1b.json --seq 65536 --set train_micro_batch_size_per_gpu=1
    --auto-placement --data synthetic --steps 4)
  step acts-hbm timeout 150 $b/bin/tz-train "${l1[@]}" --set tierzero.offload_activations=none
  step acts-host timeout 150 $b/bin/tz-train "${l1[@]}" --set tierzero.offload_activations=cpu
fi
# long8b: issue 52's rows. Its target counts attention's causal half (6N + 6LTd a token), where
# tz-train's model TFLOP/s count 6N + 12LTd: take the step time (T tokens / step_s x the
# formula, N 8.03e9, L 32, d 4096).
# The data: this repository's docs as byte text (740 KB of long English documents, one token a
# byte), so that the loss has something to fall on (synthetic tokens, uniform over the vocabulary,
# have not; the H100 rows of 2026-12-07 ran on them).
# The learning rate is a fine-tune's, 1e-5: at configs/bench-auto.json's 1e-4 with no warm-up the
# random 8B weights' loss rose over the first steps (H100, 2026-12-07: 12.52, 12.88, 18.50 at
# 131,072 tokens; 12.56, 14.52, 17.45 at 8,192). TZ_LONG8B_SEQS: the lengths (8192 131072).
if has long8b; then
  m8=configs/models/llama-3.1-8b.json
  cat docs/*.md README.md > /tmp/tz-long-docs.txt
  l8=(--micro-batch 1 --steps "${TZ_LONG8B_STEPS:-3}" --warmup 1 --no-disk-ceiling
    --data text:/tmp/tz-long-docs.txt --set optimizer.params.lr=1e-5)
  for s8 in ${TZ_LONG8B_SEQS:-8192 131072}; do
    step "long8b-$s8" env TZ_BIN=$b/bin tools/bench-train.sh tz-auto $m8 --seq "$s8" "${l8[@]}" \
      --timeout "$((s8 > 8192 ? 420 : 120))" --tag "$((s8 / 1024))k"
  done
  # configs/bench-auto.json's disk directory must exist for the rates' probe (about 140 s with it)
  mkdir -p /var/tmp/tz-bench-nvme
  [ "${TZ_LONG8B_FIT:-0}" = 1 ] && step long8b-fit timeout 200 $b/bin/tz-train --backend cuda \
    --model $m8 --seq 8192 --set train_micro_batch_size_per_gpu=1 --auto-placement \
    --config configs/bench-auto.json --plan --fit seq
fi
# attnlong: issue 52's attention at long sequences: tz-bench layer at Llama-3.1-8B's layer (32
# heads of 128, 8 key-value heads, ffn 14336), one sequence of 32,768 then of 131,072 tokens,
# PyTorch (flash attention) beside it in the same run, few iterations (about 120 s)
if has attnlong; then
  la=($b/bin/tz-bench layer --ffn 14336 --kv-heads 8 --batch 1 --rounds 1 --warmup 1)
  step attnlong-32k "${la[@]}" --seq 32768 --iters 3
  step attnlong-128k "${la[@]}" --seq 131072 --iters 2
fi
# dslong: issue 52's DeepSpeed rows: ZeRO-3 with parameters and optimizer on the CPU and gradient
# checkpointing (bench/ds_peer.py) on Llama-3.1-8B's shape, one sequence of 32,768 then of 131,072
# tokens; its step time, its CUDA out-of-memory or its kill for host memory is the result
# (DeepSpeed from .whl/ds: carry it; about 400 s at most)
if has dslong; then
  m8=configs/models/llama-3.1-8b.json
  dl=(--micro-batch 1 --steps 2 --warmup 1)
  step dslong-32k tools/bench-train.sh ds-offload $m8 --seq 32768 "${dl[@]}" --timeout 200 --tag 32k
  step dslong-128k tools/bench-train.sh ds-offload $m8 --seq 131072 "${dl[@]}" --timeout 200 \
    --tag 128k
fi
# longmax: issue 52's one step at the longest length: Llama-3.1-8B's shape with its
# max_position_embeddings raised to TZ_LONGMAX_SEQ (default 262,144; the plan's --fit seq on this
# machine first, printed), one step at that many tokens in one sequence, the plan's placement
# (an H200; about 400 s at 262,144)
if has longmax; then
  nmax=${TZ_LONGMAX_SEQ:-262144}
  mlong=/tmp/llama-3.1-8b-long.json
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["max_position_embeddings"] = int(sys.argv[2]); json.dump(c, open(sys.argv[3], "w"), indent=1)' \
    configs/models/llama-3.1-8b.json "$nmax" "$mlong"
  mkdir -p /var/tmp/tz-bench-nvme
  step longmax-fit timeout 200 $b/bin/tz-train --backend cuda --model $mlong --seq 8192 \
    --set train_micro_batch_size_per_gpu=1 --auto-placement --config configs/bench-auto.json \
    --plan --fit seq
  step longmax env TZ_BIN=$b/bin tools/bench-train.sh tz-auto $mlong --seq "$nmax" --micro-batch 1 \
    --steps 1 --warmup 0 --timeout 480 --no-disk-ceiling --tag max
fi
if has fused; then
  step fused-kernels ctest --test-dir $b --output-on-failure -R '^test_compute_cuda$'
  step fused-model ctest --test-dir $b --output-on-failure -R '^test_(model|train)_gpu|^test_recompute'
  step fused-layer $b/bin/tz-bench layer --rounds 3
  step fused-7b env TZ_BIN=$b/bin tools/bench-train.sh tz-auto llama-7b --steps 6 --warmup 2
fi
if has attnshapes; then
  # name, then tz-bench layer's shape arguments
  # (read from fd 3: the steps' own programs get this script's stdin, not the list)
  while read -r name shape <&3; do
    step attn-shape-$name $b/bin/tz-bench layer --iters 5 --warmup 2 $shape
    # head dims other than 128: the wgmma kernels by name too (auto's since 2026-12-05)
    [[ $name == d128* ]] || step attn-shape-$name-wgmma env TZ_CUDA_ATTENTION=wgmma \
      $b/bin/tz-bench layer --iters 5 --warmup 2 --no-torch $shape
  done 3<< 'SHAPES'
d64-gqa4 --d-model 2048 --ffn 8192 --heads 32 --kv-heads 8 --seq 2048 --batch 4
d80 --d-model 2560 --ffn 6912 --heads 32 --kv-heads 32 --seq 2048 --batch 4
d96-gqa4 --d-model 3072 --ffn 8192 --heads 32 --kv-heads 8 --seq 2048 --batch 4
d128-gqa7 --d-model 3584 --ffn 18944 --heads 28 --kv-heads 4 --seq 2048 --batch 4
d128-t8192 --d-model 4096 --ffn 11008 --heads 32 --kv-heads 32 --seq 8192 --batch 1
d128-t128 --d-model 4096 --ffn 11008 --heads 32 --kv-heads 32 --seq 128 --batch 64
SHAPES
fi
if has attention7b; then
  for r in auto all; do
    for a in auto two-pass; do
      step attn-7b-$r-$a env TZ_BIN=$b/bin TZ_RECOMPUTE=$r TZ_CUDA_ATTENTION=$a \
        tools/bench-train.sh tz-auto llama-7b --steps 6 --warmup 2 --tag "$a-$r"
    done
  done
fi
# Issue 26's runs: 8 micro-batches a step; the CPU's share of Adam searched; no carry in a 120 GiB
# window.
a8=(--steps 3 --warmup 1 --timeout 150 --set gradient_accumulation_steps=8)
off=(--set tierzero.cpu_adam_search=true)
nc=(--set tierzero.window_carry=false --set tierzero.hbm_budget=120GiB)
if has acc8; then
  step acc8-auto env TZ_BIN=$b/bin tools/bench-train.sh tz-auto llama-7b "${a8[@]}" --tag acc8
  step acc8-nc env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-7b "${a8[@]}" "${off[@]}" \
    "${nc[@]}" --tag acc8nc
  step acc8-13b env TZ_BIN=$b/bin tools/bench-train.sh tz-auto llama-13b --steps 2 --warmup 1 \
    --timeout 240 --set gradient_accumulation_steps=8 --tag acc8
  python3 tools/bench_table.py table > "$logs/acc8-table.md" 2>&1
fi
if has share; then
  # The CPU's share of Adam at 8 micro-batches without carry (docs/benchmarks-history.md, "Issue
  # 26 on the H200, 2026-12-03, third"): tz-auto llama-7b, then tz-offload llama-7b with the share
  # searched, then with none (every update on the GPU), one after the other
  step share-auto env TZ_BIN=$b/bin tools/bench-train.sh tz-auto llama-7b "${a8[@]}" --tag acc8
  step share-search env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-7b "${a8[@]}" \
    "${off[@]}" "${nc[@]}" --tag acc8nc
  step share-0 env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-7b "${a8[@]}" \
    --set tierzero.cpu_adam=0 "${nc[@]}" --tag acc8nc0
fi
if has tiers3; then
  step tiers3 env TZ_BIN=$b/bin tools/bench-train.sh tz-auto configs/models/llama-15b.json \
    --steps 3 --warmup 1 --data builtin --timeout 480 --set optimizer.params.lr=2e-5
fi
# disk15: issue 54's item 4, the 15.5 B model's plan made again from the disk's rate its run
# moved (no fio job: tiers3 has its ceiling; about 330 s)
if has disk15; then
  step disk15 env TZ_BIN=$b/bin tools/bench-train.sh tz-auto configs/models/llama-15b.json \
    --steps 3 --warmup 1 --data builtin --timeout 400 --set optimizer.params.lr=2e-5 \
    --no-disk-ceiling --plan-again --tag disk
  cp results/bench/tz-auto-llama-15b-disk.plan.txt "$logs/" 2> /dev/null
fi
if has off3b; then
  o3=(--steps 6 --warmup 2 --timeout 150)
  step off3b env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${o3[@]}" "${off[@]}" \
    --tag search
  # twice: the second plans with the rate the first reached at the homes (the rates cache)
  step off3b-nc env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${o3[@]}" "${off[@]}" \
    "${nc[@]}" --tag searchnc
  step off3b-nc2 env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${o3[@]}" "${off[@]}" \
    "${nc[@]}" --tag searchnc2
  step off3b-nc0 env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${o3[@]}" \
    --set tierzero.cpu_adam=0 "${nc[@]}" --tag nc0
  # the share that met the bound on one machine (docs/benchmarks-history.md, 2026-12-04), beside the
  # search's pick
  step off3b-nc15 env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${o3[@]}" \
    --set tierzero.cpu_adam=0.15 "${nc[@]}" --tag nc15
fi
if has learn3b; then
  o3=(--steps 6 --warmup 2 --timeout 150)
  rm -f "${XDG_CACHE_HOME:-$HOME/.cache}"/tierzero/rates-*.json # the first run probes
  for i in 1 2 3; do
    step learn3b-$i env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${o3[@]}" \
      "${off[@]}" "${nc[@]}" --tag learn$i
  done
  step learn3b-nc15 env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${o3[@]}" \
    --set tierzero.cpu_adam=0.15 "${nc[@]}" --tag learnnc15
  step learn3b-30 env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${o3[@]}" \
    --set tierzero.cpu_adam=0.3 "${nc[@]}" --tag learn30
  step learn3b-30t10 env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${o3[@]}" \
    --set tierzero.cpu_adam=0.3 --set tierzero.threads=10 "${nc[@]}" --tag learn30t10
fi
if has ds64k; then
  step ds64k-ds tools/bench-train.sh ds-offload llama-3b --steps 3 --warmup 1 --timeout 300 \
    --accum 8 --tag acc8
  step ds64k-tz env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${a8[@]}" "${off[@]}" \
    --tag acc8
  step ds64k-tznc env TZ_BIN=$b/bin tools/bench-train.sh tz-offload llama-3b "${a8[@]}" \
    "${off[@]}" "${nc[@]}" --tag acc8nc
fi
if has off3b || has ds64k || has learn3b; then
  python3 tools/bench_table.py table > "$logs/bench-table.md" 2>&1
fi
printf '%s\n' "${summary[@]}" | tee "$logs/summary.txt"
[ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$logs" .
exit 0
