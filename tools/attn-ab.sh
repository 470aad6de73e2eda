#!/usr/bin/env bash
# The attention kernels' A/B on a GPU machine (docs/cuda-kernels.md): this tree built once for
# each set of CUDA flags given (a new path's switch, -DTZ_ATTN_...=1, while it is off until its
# GPU tests ran; '' for the defaults), and with --base another tree (a `git archive`
# of a commit, gzipped: main beside a change); then tz-bench layer --attention-only on each build
# in turn, twice, at llama-7b's attention (4 x 2048, 32 heads of 128) causal, soft-capped (exact
# and approx), with a window of 512, and at 8192 x 1 causal and with Mistral's window of 4096.
# --tests: first the attention's GPU tests on the last build given (the one to land), the
# softcap's approx tanh too; --tests-all: on every build given, and on each a short tz-train run
# (llama-3.2-1b's config, 4,096 tokens, 3 steps) whose losses say whether the builds' bits agree
# (builds.txt). --long: also Llama-3.1-8B's attention (32 heads on 8) at one sequence of 32,768
# and of 131,072 tokens, one round of a few iterations (about 30 s a build and pass).
#   source .deps/setup.sh && bash tools/attn-ab.sh [--tests | --tests-all] [--long] [--base TGZ]
#     FLAGS...
# Results: $OUT/attn-ab (or /tmp/attn-ab): ab.txt (one line a run), table.md (tools/
# attn_ab_table.py: each build's ms a case and its per-tile ratios against its causal run),
# builds.txt, and logs.tgz (tests-*.log with the tests' summaries, the builds' logs).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp}/attn-ab
tests=0 base="" long=0
while [ $# -gt 0 ]; do
  case $1 in
    --tests) tests=1 ;;
    --tests-all) tests=2 ;;
    --long) long=1 ;;
    --base) base=$2; shift ;;
    *) break ;;
  esac
  shift
done
[ $# -gt 0 ] || set -- ""
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > "$out/gpu.txt" 2>&1
t0=$SECONDS
jobs=$(( $(nproc) / ($# + 1) > 1 ? $(nproc) / ($# + 1) : 1 ))
build() { # name, source dir, flags, target
  local d=/tmp/attn-ab-$1
  (cd "$2" && cmake --preset gpu -B "$d" -DCMAKE_CUDA_FLAGS="$3" \
    > "$out/$1-configure.log" 2>&1 &&
    cmake --build "$d" -j"$jobs" ${4:+--target "$4"} > "$out/$1-build.log" 2>&1)
  echo "$1 ($3): build rc=$? $((SECONDS - t0)) s" >> "$out/builds.txt"
}
names=()
if [ -n "$base" ]; then
  rm -rf /tmp/attn-ab-base-src && mkdir -p /tmp/attn-ab-base-src
  tar xzf "$base" -C /tmp/attn-ab-base-src
  build base /tmp/attn-ab-base-src "" tz-bench &
  names+=(base)
fi
i=0
for f in "$@"; do
  target=tz-bench # a build that runs the tests builds everything
  if [ $tests = 2 ] || { [ $tests = 1 ] && [ $((i + 1)) = $# ]; }; then target=""; fi
  build "t$i" "$root" "$f" "$target" &
  names+=("t$i")
  i=$((i + 1))
done
wait
if [ $tests -ge 1 ]; then
  for ((i = tests == 2 ? 0 : $# - 1; i < $#; i++)); do
    d=/tmp/attn-ab-t$i
    ctest --test-dir $d --output-on-failure -j4 --timeout 300 -R \
      '^(test_compute_cuda|test_wgmma|test_model_gpu|test_train_gpu.*|test_recompute|test_train_packed.cuda)$' \
      > "$out/tests-t$i.log" 2>&1
    echo "t$i: tests rc=$? $((SECONDS - t0)) s" >> "$out/builds.txt"
    TZ_CUDA_SOFTCAP_TANH=approx ctest --test-dir $d --output-on-failure -j4 --timeout 300 \
      -R '^(test_compute_cuda|test_model_gpu|test_train_gpu.*)$' > "$out/tests-t$i-approx.log" 2>&1
    echo "t$i: tests with softcap_tanh approx rc=$? $((SECONDS - t0)) s" >> "$out/builds.txt"
    if [ $tests = 2 ]; then
      timeout 120 $d/bin/tz-train --backend cuda --model "$root/tests/data/hf/llama-3.2-1b.json" \
        --seq 4096 --set train_micro_batch_size_per_gpu=1 --auto-placement --data synthetic \
        --steps 3 --metrics "$out/losses-t$i.jsonl" > "$out/train-t$i.log" 2>&1
      echo "t$i: losses $(grep -o '"loss":[^,]*' "$out/losses-t$i.jsonl" | tr '\n' ' ')" \
        >> "$out/builds.txt"
    fi
  done
fi
cases=("none:exact:" "cap50:exact:--softcap 50" "cap50a:approx:--softcap 50" "w512:exact:--window 512"
  "t8k:exact:--seq 8192 --batch 1" "t8k-w4096:exact:--seq 8192 --batch 1 --window 4096")
# the later --rounds, --iters and --warmup win over the defaults below
[ $long = 1 ] && cases+=("t32k:exact:--seq 32768 --batch 1 --kv-heads 8 --rounds 1 --iters 3 --warmup 1"
  "t128k:exact:--seq 131072 --batch 1 --kv-heads 8 --rounds 1 --iters 2 --warmup 1")
for pass in 1 2; do
  for n in "${names[@]}"; do
    for c in "${cases[@]}"; do
      IFS=: read -r name tanh args <<< "$c"
      printf '%s %s %s: ' "$pass" "$n" "$name" >> "$out/ab.txt"
      # shellcheck disable=SC2086 # the case's arguments split on purpose
      TZ_CUDA_SOFTCAP_TANH=$tanh timeout 120 /tmp/attn-ab-$n/bin/tz-bench layer --attention-only \
        --rounds 3 --iters 10 --warmup 3 $args >> "$out/ab.txt" 2>&1 || echo "rc=$?" >> "$out/ab.txt"
    done
  done
done
grep -H "tests passed" "$out"/tests-*.log >> "$out/builds.txt" 2> /dev/null
echo "done $((SECONDS - t0)) s" >> "$out/builds.txt"
(cd "$out" && tar czf logs.tgz ./*.log && rm -f ./*.log)
cat "$out/builds.txt"
sed 's/attention fwd+bwd: //' "$out/ab.txt"
python3 "$root/tools/attn_ab_table.py" "$out/ab.txt" | tee "$out/table.md"
