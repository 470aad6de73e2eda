#!/usr/bin/env bash
# On the GPU machine (see ../shared/device/README.md): builds with CUDA, runs every test, then the
# GPU benchmarks, writing logs under $OUT (or /tmp/tz-gpu-out). Each step runs even if an earlier
# one failed; the summary at the end says which did.
#   source .deps/setup.sh && bash tools/gpu-check.sh [tests|bench|all]
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/tz-gpu-out}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ -x .deps/fio ] && export PATH=$root/.deps:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
b=/tmp/tz-build
summary=()
step() {
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-14s rc=%-3d %4ds' "$name" "$rc" $((SECONDS - t0)))")
  return $rc
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
step configure cmake --preset gpu
step build cmake --build --preset gpu -j"$(nproc)"
if [ "$what" != bench ]; then
  step ctest ctest --test-dir $b --output-on-failure -j4 --timeout 300
  grep -E "tests passed|Failed|Skipped|\*\*\*" "$out/ctest.log" | tail -40 > "$out/ctest-summary.txt"
fi
if [ "$what" != tests ]; then
  [ -x $b/bin/tz-topo ] && step topo $b/bin/tz-topo && step topo-json $b/bin/tz-topo --json
  step tiers $b/bin/tz-bench tiers --path /var/tmp --size 2G --reps 3
  step adam $b/bin/tz-bench adam --gpu
  # Collectives need two GPUs (the nvidia-h200-x2 machine); with one, tz-bench says so and skips.
  step collectives $b/bin/tz-bench collectives --backend nccl --nproc 2
  [ -x $b/bin/tz-model-check ] && {
    step hf-export $b/bin/tz-model-check --preset tiny --seed 1 --export /tmp/tz-ours
    step hf-ours python3 tools/hf_check.py run /tmp/tz-ours --tokens 72,101,108,108,111 --tz $b/bin/tz-model-check
    step hf-make python3 tools/hf_check.py make /tmp/tz-theirs --kv-heads 2
    step hf-theirs python3 tools/hf_check.py run /tmp/tz-theirs --tokens 3,1,4,1,5,9,2,6 --tz $b/bin/tz-model-check
  }
  grep -q '"layer"' bench/tz-bench.c && step layer $b/bin/tz-bench layer
fi
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
