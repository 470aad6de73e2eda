#!/usr/bin/env bash
# tests/bench_harness/CMakeLists.txt says what this checks (test_bench_ds).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v python3 > /dev/null || { echo "no python3: the DeepSpeed runners are not checked"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))" "$@"; }

# The committed ds_configs hold issue 25's settings, exactly.
python3 - "$root/configs/deepspeed" <<'PY' || fail "configs/deepspeed"
import json, sys
d = sys.argv[1]
zero = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
        "reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e8,
        "stage3_param_persistence_threshold": 1e6, "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9, "sub_group_size": 1e9}
cpu = {"device": "cpu", "pin_memory": True}
want = {"ds-offload": dict(zero, offload_param=cpu, offload_optimizer=cpu),
        "ds-opt": dict(zero, offload_optimizer=cpu),
        "ds-gpu": dict(zero),
        "ds-nvme": dict(zero, sub_group_size=1e8, offload_param=cpu,
                        offload_optimizer={"device": "nvme", "pin_memory": True,
                                           "nvme_path": "/var/tmp/ds-bench-nvme",
                                           "buffer_count": 4})}
for name, z in want.items():
    c = json.load(open("%s/%s.json" % (d, name)))
    top = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
           "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": z}
    if name == "ds-nvme":
        top["aio"] = {"block_size": 1048576, "queue_depth": 32}
    assert c == top, "%s.json: %s, expected %s" % (name, c, top)
PY

# The peer's --help and --dry-run need neither torch nor a GPU: the ds_config it would give
# DeepSpeed (this call's micro-batch, clipping and NVMe path) and its optimizer.
python3 "$root/bench/ds_peer.py" --help > /dev/null || fail "ds_peer.py --help"
python3 "$root/bench/ds_peer.py" --model llama-1b --offload nvme --nvme-path "$dir/nv" \
  --micro-batch 2 --clip 0.5 --dry-run > "$dir/nvme.json" 2> "$dir/dry.err" ||
  { cat "$dir/dry.err"; fail "ds_peer.py --dry-run"; }
TORCH_CUDA_ARCH_LIST="9.0a 8.0;10.0f+PTX" \
  python3 "$root/bench/ds_peer.py" --model llama-7b --offload none --accum 8 --dry-run > "$dir/gpu.json" \
  2>> "$dir/dry.err" || { cat "$dir/dry.err"; fail "ds_peer.py --dry-run --offload none"; }
python3 - "$dir" <<'PY' || fail "the dry runs' ds_config"
import json, sys
n = json.load(open(sys.argv[1] + "/nvme.json"))
c, z = n["ds_config"], n["ds_config"]["zero_optimization"]
assert n["runner"] == "ds-nvme" and n["optimizer"]["type"] == "DeepSpeedCPUAdam", n
assert c["train_micro_batch_size_per_gpu"] == 2 and c["gradient_clipping"] == 0.5, c
assert z["offload_optimizer"]["nvme_path"] == sys.argv[1] + "/nv" and z["sub_group_size"] == 1e8
assert n["optimizer"]["lr"] == 1e-4 and n["optimizer"]["betas"] == [0.9, 0.95], n
assert n["optimizer"]["weight_decay"] == 0.1 and n["optimizer"]["eps"] == 1e-8, n
g = json.load(open(sys.argv[1] + "/gpu.json"))
assert g["runner"] == "ds-gpu" and g["optimizer"]["type"] == "FusedAdam", g
# DeepSpeed's JIT parses "9.0a" as a number and fails: the suffix is dropped, +PTX kept.
assert g["cuda_arch_list"] == "9.0;8.0;10.0+PTX", g["cuda_arch_list"]
assert n["cuda_arch_list"] == "9.0", n["cuda_arch_list"]
assert "offload_optimizer" not in g["ds_config"]["zero_optimization"], g
assert g["ds_config"]["gradient_accumulation_steps"] == 8, g["ds_config"]
assert n["ds_config"]["gradient_accumulation_steps"] == 1, n["ds_config"]
PY
python3 "$root/bench/ds_peer.py" --model tiny --accum 0 --dry-run > /dev/null 2>&1 &&
  fail "ds_peer.py took --accum 0"

# A Hugging Face config.json as the model (issue 53): named after the file, or after the directory
# holding it, with the parameters tz-train's layout has and its FLOP count (6 N_active + 12 L T d).
# The counts below were worked out by hand from the two files, not by the code under test: per
# layer the attention's 4 * 2048 * 2048, two norms of 2048, the experts' 3 * E * F * 2048 and the
# router's E * 2048; OLMoE's q and k norms 2 * 2048; Qwen's q/k/v biases 3 * 2048, its shared
# expert 3 * 5632 * 2048 and that expert's gate 2048; then the layers, the embedding, the final
# norm and the untied head. They agree with the released models' 6.92 B (1.28 B active) and
# 14.3 B (2.7 B active).
#   OLMoE-1B-7B: 16 layers of 419,569,664 + 2 * 50304 * 2048 + 2048 = 6,919,161,856; the 56
#     unused experts of each layer, 16 * 56 * 3 * 1024 * 2048 = 5,637,144,576: 1,282,017,280 used.
#   Qwen1.5-MoE-A2.7B: 24 layers of 570,560,512 + 2 * 151936 * 2048 + 2048 = 14,315,784,192; less
#     24 * 56 * 3 * 1408 * 2048 = 11,626,610,688: 2,689,173,504 used.
hf=$root/tests/data/hf
mkdir -p "$dir/olmoe-dir"
cp "$hf/olmoe-1b-7b-0924.json" "$dir/olmoe-dir/config.json"
for m in "$hf/olmoe-1b-7b-0924.json" "$hf/qwen1.5-moe-a2.7b.json" "$dir/olmoe-dir"; do
  python3 "$root/bench/ds_peer.py" --model "$m" --seq 1024 --dry-run \
    > "$dir/m-$(basename "$m").json" 2>> "$dir/dry.err" ||
    { cat "$dir/dry.err"; fail "ds_peer.py --model $m --dry-run"; }
done
python3 - "$dir" "$hf" <<'PY' || fail "the config.json models' counts"
import json, sys
d, hf = sys.argv[1], sys.argv[2]
for f, name, mt, total, active, layers in (
        ("olmoe-1b-7b-0924.json", "olmoe-1b-7b-0924", "olmoe", 6919161856, 1282017280, 16),
        ("qwen1.5-moe-a2.7b.json", "qwen1.5-moe-a2.7b", "qwen2_moe", 14315784192, 2689173504, 24),
        ("olmoe-dir", "olmoe-dir", "olmoe", 6919161856, 1282017280, 16)):
    r = json.load(open("%s/m-%s.json" % (d, f)))
    assert r["model"] == name and r["model_type"] == mt, r
    assert r["n_params"] == total and r["n_active_params"] == active, (f, r["n_params"],
                                                                       r["n_active_params"])
    assert r["flops_per_token"] == 6 * active + 12 * layers * 1024 * 2048, (f, r["flops_per_token"])
    assert r["model_config"].endswith(f if f.endswith(".json") else f + "/config.json"), r
PY
echo '{"model_type": "gpt2", "n_embd": 64}' > "$dir/gpt2.json"
python3 "$root/bench/ds_peer.py" --model "$dir/gpt2.json" --dry-run > /dev/null \
  2> "$dir/gpt2.err" && fail "ds_peer.py took a gpt2 config"
grep -q "gpt2.json: \"model_type\" \"gpt2\" is not one of tz-train's families" "$dir/gpt2.err" ||
  { cat "$dir/gpt2.err"; fail "the refusal of a gpt2 config"; }
python3 "$root/bench/ds_peer.py" --model "$hf/olmoe-1b-7b-0924.json" --seq 4097 --dry-run \
  > /dev/null 2>&1 && fail "ds_peer.py took --seq 4097 past max_position_embeddings 4096"

# bench-train.sh's ds-* runners without torch here: the site's env.sh is sourced, the peer
# says it cannot run (status 3, nothing recorded), and ds-nvme removes DeepSpeed's swap files.
mkdir -p "$dir/site" "$dir/nvme/zero_stage_3/optimizer"
echo "touch '$dir/sourced'" > "$dir/site/env.sh"
if python3 -c "import torch, deepspeed" 2> /dev/null; then
  echo "torch and deepspeed import here: the runner's no-torch path is not checked"
else
  "$root/tools/bench-train.sh" ds-nvme tiny --seq 32 --steps 1 --warmup 0 --ds-site "$dir/site" \
    --nvme-dir "$dir/nvme" --results "$dir/res" > "$dir/bt.out" 2>&1
  rc=$?
  [ $rc = 3 ] || { cat "$dir/bt.out"; fail "bench-train.sh ds-nvme exited $rc, expected 3"; }
  [ -f "$dir/sourced" ] || fail "the site's env.sh was not sourced"
  [ -e "$dir/nvme/zero_stage_3" ] && fail "DeepSpeed's swap folder was left in the nvme dir"
  [ -e "$dir/res/ds-nvme-tiny.json" ] && fail "a result was written for a peer that cannot run"
  grep -q "cannot import" "$dir/bt.out" || { cat "$dir/bt.out"; fail "no reason given"; }
fi
"$root/tools/bench-train.sh" ds-bogus tiny > /dev/null 2>&1 && fail "an unknown ds runner ran"
# bench-train.sh gives a ds-* peer a config.json's path and names the result after the file: the
# peer's dry run (an extra argument) shows what it was given.
"$root/tools/bench-train.sh" ds-offload "$hf/olmoe-1b-7b-0924.json" --seq 1024 --steps 1 \
  --warmup 0 --ds-site "$dir/site" --results "$dir/res-moe" --dry-run > "$dir/btm.out" 2>&1
log=$dir/res-moe/ds-offload-olmoe-1b-7b-0924.log
grep -q '"model": "olmoe-1b-7b-0924"' "$log" 2> /dev/null ||
  { cat "$dir/btm.out"; fail "the peer's model"; }
grep -q "\"model_config\": \"$hf/olmoe-1b-7b-0924.json\"" "$log" ||
  { cat "$log"; fail "the peer was not given the config.json's path"; }

# The memory cap: a process that eats memory until the host's MemAvailable is under the floor
# is killed, and its result says so; nothing of it is left. The floor is set 1 GiB under what
# is available now, so the eater needs about 1 GiB (it stops at 4, and would then sleep).
avail=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
if [ -z "$avail" ] || [ "$avail" -lt $((6 << 20)) ]; then
  echo "under 6 GiB available (or no /proc/meminfo): the memory cap is not checked"
else
  floor=$(python3 -c "print(round($avail / 2**20 - 1.0, 2))")
  t0=$SECONDS
  python3 "$root/tools/bench_table.py" run --runner ds-offload --model llama-7b --seq 2048 \
    --micro-batch 4 --warmup 0 --out "$dir/eat.json" --log "$dir/eat.log" --mem-floor "$floor" \
    -- python3 -c '
import time
chunks = []
for i in range(16):  # 4 GiB at most, touched
    chunks.append(b"\x01" * (256 << 20))
    time.sleep(0.1)
time.sleep(60)
print("the eater was not stopped")
' > "$dir/eat.out" 2>&1
  [ $((SECONDS - t0)) -lt 20 ] || { cat "$dir/eat.out"; fail "the eater ran $((SECONDS - t0)) s"; }
  grep -q "killed for host memory" <<< "$(field "$dir/eat.json" error)" ||
    { cat "$dir/eat.out"; fail "error: $(field "$dir/eat.json" error)"; }
  [ "$(field "$dir/eat.json" killed_for_host_memory)" != None ] || fail "no killed_for_host_memory"
  pgrep -f "the eater was not stopped" > /dev/null && fail "the eater is still running"
  # The same command under a floor it never reaches runs to its end.
  python3 "$root/tools/bench_table.py" run --runner ds-offload --model tiny --seq 32 \
    --micro-batch 1 --warmup 0 --out "$dir/ok.json" --mem-floor 0.01 -- \
    python3 -c 'print("small")' > "$dir/ok.out" 2>&1
  grep -q "host memory" "$dir/ok.json" && fail "the cap fired under a floor of 0.01 GiB"
  grep -q "^small" "$dir/ok.out" || { cat "$dir/ok.out"; fail "the small command did not run"; }
fi

# The table: DeepSpeed's columns, its 15% check against issue 25's figures, and its pairs.
mkdir -p "$dir/table"
python3 - "$dir/table" <<'PY'
import json, sys
base = dict(seq=2048, micro_batch=4, world_size=1, device="NVIDIA H200", tokens_per_step=8192)
rows = [("ds-offload", "llama-1b", 0.900), ("ds-offload", "llama-3b", 3.000),
        ("ds-opt", "llama-7b", 6.700), ("ds-gpu", "llama-7b", 1.200),
        ("tz-offload", "llama-1b", 0.334), ("tz-offload", "llama-3b", 1.230),
        ("tz-offload", "llama-7b", 2.352), ("tz-auto", "llama-7b", 0.964)]
for runner, model, step in rows:
    json.dump(dict(base, runner=runner, model=model, step_s=step, tokens_per_s=8192 / step,
                   model_tflops=100.0), open("%s/%s-%s.json" % (sys.argv[1], runner, model), "w"))
json.dump(dict(base, runner="ds-offload", model="llama-7b",
               error="ds_peer.py ended without a result, killed for host memory (MemAvailable "
                     "5.9 GiB, under the floor of 6 GiB, of 125 GiB)",
               killed_for_host_memory={"mem_available_gib": 5.9}),
          open(sys.argv[1] + "/ds-offload-llama-7b.json", "w"))
# Issue 26's 8 micro-batches a step: its own group, against its own figure (7.8-8.4 s).
acc = dict(base, accumulation=8, tokens_per_step=65536, model="llama-3b")
for runner, step in (("ds-offload", 9.418), ("tz-offload", 3.203)):
    json.dump(dict(acc, runner=runner, step_s=step, tokens_per_s=65536 / step, model_tflops=1.0),
              open("%s/%s-llama-3b-acc8.json" % (sys.argv[1], runner), "w"))
PY
python3 "$root/tools/bench_table.py" table --dir "$dir/table" > "$dir/table.out" 2>&1 ||
  { cat "$dir/table.out"; fail "bench_table.py table failed"; }
t=$dir/table.out
expect() { grep -qF -- "$1" "$t" || { cat "$t"; fail "no '$1' in the table"; }; }
# Reproduced (1b: +2.6%): its ratio counts; not reproduced (3b: +27%): marked.
expect "| llama-1b | tz-offload | 0.334 | 24527 | 100.0 | - | - | 2.69x | - |"
expect "| llama-3b | tz-offload | 1.230 | 6660 | 100.0 | - | - | 2.44x ‡ | - |"
expect "| llama-7b | tz-auto | 0.964 | 8498 | 100.0 | - | - | - | 1.24x |"
expect "‡ that DeepSpeed runner has not reproduced the issues' figure"
expect "llama-1b ds-offload: 0.9 s against 0.877 s (+2.6%, within 15%)"
expect "llama-3b ds-offload: 3 s against 2.363 s (+27.0%, NOT within 15%)"
expect "llama-7b ds-offload: killed for host memory, as in the issue"
expect "llama-1b ds-nvme: no result"
expect "| llama-1b | ds-offload | 0.900 | 0.877 | tz-offload | 0.334 | 2.69x |"
expect "| llama-3b | ds-offload | 3.000 | 2.363 | tz-offload | 1.230 | 2.44x ‡ |"
expect "| llama-7b | ds-opt | 6.700 | 6.657 | tz-auto | 0.964 | 6.95x |"
expect "| llama-7b | ds-gpu | 1.200 | 1.19 | tz-auto | 0.964 | 1.24x |"
expect "| llama-7b | ds-offload | error: ds_peer.py ended without a result, killed for host memory"
expect "| killed | tz-offload | 2.352 | DeepSpeed cannot |"
# The 8-micro-batch pair is not checked against issue 25's one-micro-batch figure.
expect "### NVIDIA H200: seq 2048, micro-batch 4, 1 rank, accumulation 8"
expect "| llama-3b | tz-offload | 3.203 | 20461 | 1.0 | - | - | 2.94x | - |"
expect "| llama-3b | ds-offload | 9.418 | 7.8-8.4 | tz-offload | 3.203 | 2.94x |"
expect "llama-3b ds-offload at 8 micro-batches: 9.42 s against 7.8-8.4 s (+12.1%, within 15%)"
echo "ok: the ds_configs, the peer's dry runs, the ds-* runners without torch, the memory cap,"
echo "    the table's DeepSpeed columns, reference check and pairs"
