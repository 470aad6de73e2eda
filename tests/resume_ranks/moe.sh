#!/bin/bash
# moe.sh TZ_TRAIN "MPIRUN... -np"|nproc: a mixture-of-experts model (qwen3_moe: 8 experts, 1 a
# token, the load-balancing loss on) over one global batch at world 1 and 2 (2 sequences) and 1
# and 3 (3): the losses and gradient norms as printed (every float bit) are the same. With 8
# experts and one 8-token sequence a micro-batch, most micro-batches leave some expert without a
# token on their rank; the collectives go in the same order whatever the routing, so no rank
# waits on another. The experts are blocks of their own (docs/model.md): at world 2 with every
# block's parameters and optimizer state homed on the disk, streamed through the scheduler's
# window, the same bits again; and with the collectives overlapped.
set -u
. "$(dirname "$0")/ranks.sh" "$@"
cat > "$dir/moe.json" <<'JSON'
{"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
 "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 64,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "initializer_range": 0.05,
 "tie_word_embeddings": false, "num_experts": 8, "num_experts_per_tok": 1,
 "moe_intermediate_size": 32, "norm_topk_prob": true, "output_router_logits": true,
 "router_aux_loss_coef": 0.02}
JSON
norms() { grep -o '"step":[0-9]*,[^}]*"grad_norm":[^,]*' "$1" | sed 's/"step":\([0-9]*\),.*"grad_norm":/\1 /'; }
run() { # name, then the command
  local name=$1; shift
  if ! "$@" --metrics "$dir/$name.jsonl" > "$dir/$name.out" 2>&1; then
    echo "FAIL: $name: $*"; cat "$dir/$name.out"; exit 1
  fi
}
same() { # one-rank run, many-rank run
  local want wantn
  want=$(losses "$dir/$1.jsonl")
  wantn=$(norms "$dir/$1.jsonl")
  [ "$(echo "$want" | wc -l)" = 4 ] || { echo "FAIL: $1: $want"; cat "$dir/$1.out"; exit 1; }
  [ "$(losses "$dir/$2.jsonl")" = "$want" ] ||
    { echo "FAIL: $2's losses differ from $1's:"; losses "$dir/$2.jsonl"; echo "want:"; echo "$want"; exit 1; }
  [ "$(norms "$dir/$2.jsonl")" = "$wantn" ] ||
    { echo "FAIL: $2's gradient norms differ from $1's:"; norms "$dir/$2.jsonl"; echo "want:"; echo "$wantn"; exit 1; }
  echo "OK: $2 trains the experts to $1's losses and gradient norms:"
  echo "$want"
}
args=(--backend "$backend" --model "$dir/moe.json" --seed 5 --seq 8 --data synthetic
      --set train_micro_batch_size_per_gpu=1 --steps 4)
run w1b2 "$bin" "${args[@]}" --set train_batch_size=2
run w2 launch 2 "$bin" "${args[@]}" --set train_batch_size=2
same w1b2 w2
mkdir -p "$dir/nvme"
nvme=(--set zero_optimization.offload_param.device=nvme --set zero_optimization.offload_param.nvme_path="$dir/nvme"
      --set zero_optimization.offload_optimizer.device=nvme
      --set zero_optimization.offload_optimizer.nvme_path="$dir/nvme")
run w2nvme launch 2 "$bin" "${args[@]}" --set train_batch_size=2 "${nvme[@]}"
grep -Eq "^  param +compute 0  host 0  nvme [1-9]" "$dir/w2nvme.out" ||
  { echo "FAIL: the parameters are not all homed on the disk"; cat "$dir/w2nvme.out"; exit 1; }
same w1b2 w2nvme
# the collectives overlapped with the compute (each phase gathering the next block's weights,
# a layer's and its experts' blocks in turn, and reducing the previous one's gradient)
run w2ov launch 2 "$bin" "${args[@]}" --set train_batch_size=2 --set tierzero.overlap_collectives=true
same w1b2 w2ov
run w1b3 "$bin" "${args[@]}" --set train_batch_size=3
run w3 launch 3 "$bin" "${args[@]}" --set train_batch_size=3
same w1b3 w3
