#!/usr/bin/env bash
# Runs one training configuration, tz-train or a peer (FSDP2, DeepSpeed), and keeps the result in
# results/bench/<runner>-<model>[-<tag>].json (beside it: .log, and for tz-train its metrics
# .jsonl, the first timed step's lane trace .trace.json and its summary .trace.txt). tools/bench_table.py prints the table of every result. docs/benchmarks.md, "Training
# throughput against FSDP2 (harness)", says what each runner is.
#
#   tools/bench-train.sh RUNNER MODEL [options] [extra arguments for the runner]
#
# RUNNER: fsdp2-offload  bench/fsdp_peer.py --offload cpu (FSDP2 with CPUOffloadPolicy)
#         fsdp2-gpu      bench/fsdp_peer.py --offload none (FSDP2, everything on the GPU)
#         tz-offload     tz-train, configs/bench-offload.json: parameters and optimizer on the host
#         tz-auto        tz-train --auto-placement, configs/bench-auto.json (nvme allowed)
#         tz-nvme        tz-train, configs/bench-nvme.json: optimizer state on nvme, host capped
#         tz-stream      tz-train, configs/bench-stream.json: parameters on the host, optimizer
#                        state in GPU memory
#         ds-offload     bench/ds_peer.py --offload cpu (DeepSpeed ZeRO-3, parameters and
#                        optimizer on the CPU: configs/deepspeed/ds-offload.json)
#         ds-opt         bench/ds_peer.py --offload opt (the optimizer on the CPU: ZeRO-Offload)
#         ds-gpu         bench/ds_peer.py --offload none (ZeRO-3, nothing offloaded)
#         ds-nvme        bench/ds_peer.py --offload nvme (optimizer on nvme, parameters on the
#                        CPU: ZeRO-Infinity)
# MODEL: tiny, llama-1b, llama-3b, llama-7b, llama-13b, or for tz-* and ds-* runners a Hugging
#        Face config.json (a file, or a directory holding one: tz-train --model takes it,
#        initialised from the seed; ds_peer.py --model builds transformers' model of it, random
#        weights, its experts' blocks ZeRO-3 leaf modules; the result is named after the file, or
#        the directory, without .json)
# Options:
#   --steps N        timed steps (default 10)
#   --warmup N       steps before them, not timed (default 2): the runner runs steps + warmup
#   --seq N          tokens per sequence (default 2048)
#   --micro-batch N  sequences per step (default 4)
#   --tag TAG        appended to the result's name, to keep a variant beside the default
#   --backend B      tz-*: cpu or cuda (default cuda when nvidia-smi lists a GPU, else cpu)
#   --bin DIR        tz-*: where tz-train is (default $TZ_BIN, else /tmp/tz-build/bin, else
#                    build/bin; on a GPU machine without one, `cmake --preset gpu` builds it)
#   --results DIR    default results/bench
#   --timeout S      stop the run after S seconds (SIGTERM, then SIGKILL 30 s later; default
#                    none): a tz-train that had done its steps keeps its figures
#   --nvme-dir DIR   tz-nvme, tz-auto: nvme files (default /var/tmp/tz-bench-nvme); ds-nvme:
#                    DeepSpeed's swap files (default /var/tmp/ds-bench-nvme), removed after
#   --no-disk-ceiling  tz-nvme, tz-auto: no fio job after the run. By default, when the run's
#                    steps used the disk, tools/disk-ceiling.sh runs one mixed fio job on
#                    --nvme-dir at the timed steps' read share, with the run's request size and
#                    queue depth, and the result gets fio's rates and the step's over fio's
#                    (bench_table.py disk-ceiling; docs/benchmarks.md, "Disk rates during a step")
#   --plan-again     tz-*: after the run, tz-train with the same arguments and --plan: the plan
#                    made again with the rates the run left in the rates cache (its disk's, its
#                    homes'), printed to <name>.plan.txt beside the result
#   --disk-ceiling-size SIZE  that job's file (default: as large as the state the run kept on
#                    the disk, at least 256 MiB; it moves what a timed step moved); 4GiB, 512M
#   --ds-site DIR    ds-*: DeepSpeed's install (default $TZ_DS_SITE, else /tmp/ds-site), whose
#                    env.sh is sourced; installed there first by tools/ds-install.sh from
#                    .whl/ds when it has none
#   --mem-floor GIB  ds-*: kill the run when the host's MemAvailable falls under GIB (default
#                    $TZ_MEM_FLOOR_GIB, else 6; 0: no cap), so that the machine survives a
#                    configuration that exhausts its memory; the result says "killed for host
#                    memory"
# Anything else goes to the runner unchanged (tz-train: --set KEY=VALUE, --remeasure, ...;
# fsdp_peer.py: --optim-impl fused, --clip 0, ...; ds_peer.py: --ds-config FILE, ...). TZ_*
# variables reach tz-train as usual. The result's "commit" is `git rev-parse` of the tree, or
# $TZ_COMMIT where set (the device machine's copy of .git is the session's first commit).
# Exit status: the runner's. Every run leaves a result file, "error" in it when it failed
# (except the peer on a machine without torch or a GPU); with $OUT set (the device machine), the
# run's files are copied to $OUT/bench as well.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
[ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; } && usage 0
[ $# -ge 2 ] || usage
runner=$1 model=$2
shift 2
case $runner in
  fsdp2-offload | fsdp2-gpu | tz-offload | tz-auto | tz-nvme | tz-stream) ;;
  ds-offload | ds-opt | ds-gpu | ds-nvme) ;;
  *) echo "bench-train: unknown runner '$runner'" >&2; usage ;;
esac
# A config.json: tz-train and ds_peer.py are given its path, the results its name.
model_arg=$model
case $model in
  tiny | llama-1b | llama-3b | llama-7b | llama-13b) ;;
  *)
    if [ -f "$model" ] || [ -f "$model/config.json" ]; then
      case $runner in
        tz-* | ds-*) ;;
        *) echo "bench-train: $runner builds the presets only, not '$model'" >&2; exit 2 ;;
      esac
      model_arg=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
      model=$(basename "$model" .json)
    else
      echo "bench-train: unknown model '$model' (a preset, or a config.json that is there)" >&2
      usage
    fi
    ;;
esac
steps=10 warmup=2 seq=2048 micro=4 tag="" backend="" bin=${TZ_BIN:-} results=$root/results/bench
limit=0
nvme_dir="" ds_site=${TZ_DS_SITE:-/tmp/ds-site} floor=${TZ_MEM_FLOOR_GIB:-6}
ceiling=1 ceiling_size="" plan_again=0
extra=()
need() { [ $# -ge 2 ] || { echo "bench-train: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case $1 in
    --steps) need "$@"; steps=$2; shift 2 ;;
    --warmup) need "$@"; warmup=$2; shift 2 ;;
    --seq) need "$@"; seq=$2; shift 2 ;;
    --micro-batch) need "$@"; micro=$2; shift 2 ;;
    --tag) need "$@"; tag=$2; shift 2 ;;
    --backend) need "$@"; backend=$2; shift 2 ;;
    --bin) need "$@"; bin=$2; shift 2 ;;
    --results) need "$@"; results=$2; shift 2 ;;
    --timeout) need "$@"; limit=$2; shift 2 ;;
    --nvme-dir) need "$@"; nvme_dir=$2; shift 2 ;;
    --ds-site) need "$@"; ds_site=$2; shift 2 ;;
    --mem-floor) need "$@"; floor=$2; shift 2 ;;
    --no-disk-ceiling) ceiling=0; shift ;;
    --plan-again) plan_again=1; shift ;;
    --disk-ceiling-size) need "$@"; ceiling_size=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
for v in "$steps" "$warmup" "$seq" "$micro" "$limit"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "bench-train: '$v' is not a count" >&2; exit 2; }
done
[[ $floor =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "bench-train: --mem-floor '$floor' is not GiB" >&2; exit 2; }
if [ -z "$nvme_dir" ]; then
  nvme_dir=/var/tmp/tz-bench-nvme
  [ "${runner%%-*}" = ds ] && nvme_dir=/var/tmp/ds-bench-nvme
fi
if [ "$steps" -lt 1 ] || [ "$seq" -lt 1 ] || [ "$micro" -lt 1 ]; then
  echo "bench-train: --steps, --seq and --micro-batch must be at least 1" >&2
  exit 2
fi
# NVLink multicast stays off on the shared GPU hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
mkdir -p "$results"
name=$runner-$model${tag:+-$tag}
out=$results/$name.json log=$results/$name.log
wrap=(python3 "$root/tools/bench_table.py" run --runner "$runner" --model "$model" --seq "$seq"
      --micro-batch "$micro" --warmup "$warmup" --steps "$steps" --timeout "$limit" --out "$out"
      --log "$log" ${tag:+--tag "$tag"})

# On the device machine only $OUT comes back, and at most eight files of it: this run's files
# (result, log, metrics, trace) go to $OUT/bench as one archive, $OUT/bench/NAME.tgz.
keep() {
  [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
  local f files=()
  for f in "$results/$name".*; do
    [ -f "$f" ] && [[ $f != *.tgz ]] && files+=("${f##*/}")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  mkdir -p "$OUT/bench" && tar czf "$OUT/bench/$name.tgz" -C "$results" "${files[@]}" 2> /dev/null
  return 0
}

has_gpu() { command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q '^GPU'; }

# A run measures the GPU alone: wait (up to 120 s) for processes still on it, a previous run that
# was stopped, say, which would otherwise hold memory the plan counts as taken.
gpu_idle() {
  has_gpu || return 0
  local i pids
  for i in $(seq 120); do
    pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2> /dev/null | tr -d ' ')
    [ -z "$pids" ] && return 0
    [ "$i" = 1 ] && echo "bench-train: waiting for processes on the GPU: $pids" >&2
    sleep 1
  done
  echo "bench-train: the GPU is still busy (processes $pids): not measuring beside them" >&2
  return 1
}
gpu_idle || exit 1

case $runner in
  ds-*)
    # DeepSpeed from its install's env.sh (PYTHONPATH, libaio's paths); installed first from the
    # staged files when there is none.
    if [ ! -f "$ds_site/env.sh" ]; then
      [ -d "$root/.whl/ds" ] || {
        echo "bench-train: no DeepSpeed in $ds_site and nothing staged in .whl/ds" \
          "(tools/ds-stage.sh, then tools/ds-install.sh --site $ds_site)" >&2
        exit 3
      }
      echo "bench-train: installing DeepSpeed into $ds_site (tools/ds-install.sh)" >&2
      "$root/tools/ds-install.sh" --site "$ds_site" > /dev/null || exit 3
    fi
    # shellcheck disable=SC1091
    . "$ds_site/env.sh"
    offload=${runner#ds-}
    case $offload in offload) offload=cpu ;; gpu) offload=none ;; esac
    dsargs=()
    if [ "$runner" = ds-nvme ]; then
      mkdir -p "$nvme_dir" || exit 1
      dsargs=(--nvme-path "$nvme_dir")
    fi
    "${wrap[@]}" --mem-floor "$floor" -- python3 "$root/bench/ds_peer.py" --model "$model_arg" \
      --offload "$offload" --seq "$seq" --micro-batch "$micro" --steps "$steps" \
      --warmup "$warmup" --runner "$runner" --out "$out" "${dsargs[@]}" "${extra[@]}"
    rc=$?
    # DeepSpeed leaves its swap files (the optimizer state: tens of GB) behind.
    [ "$runner" = ds-nvme ] && rm -rf "$nvme_dir/zero_stage_3"
    keep
    exit $rc
    ;;
  fsdp2-*)
    offload=cpu
    [ "$runner" = fsdp2-gpu ] && offload=none
    "${wrap[@]}" -- python3 "$root/bench/fsdp_peer.py" --model "$model" --offload "$offload" \
      --seq "$seq" --micro-batch "$micro" --steps "$steps" --warmup "$warmup" \
      --runner "$runner" --out "$out" "${extra[@]}"
    rc=$?
    keep
    exit $rc
    ;;
esac

# tz-train
if [ -z "$backend" ]; then
  if has_gpu; then backend=cuda; else backend=cpu; fi
fi
if [ -z "$bin" ]; then
  for d in /tmp/tz-build/bin "$root/build/bin"; do
    [ -x "$d/tz-train" ] && { bin=$d; break; }
  done
fi
if [ -z "$bin" ] && [ "$backend" = cuda ]; then
  echo "bench-train: no tz-train; building it (cmake --preset gpu)" >&2
  (cd "$root" && cmake --preset gpu > /dev/null && cmake --build --preset gpu --target tz-train) >&2 \
    || { echo "bench-train: the build failed" >&2; exit 1; }
  bin=/tmp/tz-build/bin
fi
if [ -z "$bin" ] || [ ! -x "$bin/tz-train" ]; then
  echo "bench-train: no tz-train in ${bin:-/tmp/tz-build/bin or build/bin} (--bin DIR)" >&2
  exit 2
fi
# The first timed step is traced: its lanes summarised beside the result (tools/trace_summary.py).
args=(--model "$model_arg" --steps $((steps + warmup)) --seq "$seq" --data synthetic
      --set "train_micro_batch_size_per_gpu=$micro" --metrics "$results/$name.jsonl"
      --trace-step "$warmup" --trace "$results/$name.trace.json")
# The CPU backend is tz-train's default: the option is only given for the GPU.
[ "$backend" = cpu ] || args+=(--backend "$backend")
case $runner in
  tz-offload) args+=(--config "$root/configs/bench-offload.json") ;;
  tz-auto) args+=(--config "$root/configs/bench-auto.json" --auto-placement) ;;
  tz-nvme) args+=(--config "$root/configs/bench-nvme.json") ;;
  tz-stream) args+=(--config "$root/configs/bench-stream.json") ;;
esac
if [ "$runner" = tz-auto ] || [ "$runner" = tz-nvme ]; then
  # The nvme directory of the configs, or --nvme-dir; its budget, unless TZ_NVME_BUDGET says,
  # nine tenths of the free space there (tz-train's default is half).
  mkdir -p "$nvme_dir" || exit 1
  args+=(--set "tierzero.nvme_path=$nvme_dir")
  if [ -z "${TZ_NVME_BUDGET:-}" ]; then
    free=$(df -P -B1M "$nvme_dir" | awk 'NR == 2 { print $4 }')
    [ -n "$free" ] && args+=(--set "tierzero.nvme_budget=$((free * 9 / 10))MiB")
  fi
fi
dev=()
[ "$backend" = cpu ] && dev=(--device cpu)
"${wrap[@]}" "${dev[@]}" --metrics "$results/$name.jsonl" -- "$bin/tz-train" "${args[@]}" "${extra[@]}"
rc=$?
[ -s "$results/$name.trace.json" ] &&
  python3 "$root/tools/trace_summary.py" "$results/$name.trace.json" > "$results/$name.trace.txt" 2>&1
if [ "$runner" = tz-auto ] || [ "$runner" = tz-nvme ]; then
  # tz-train removes its nvme files when it ends; a crashed run leaves them (tens of GB).
  find "$nvme_dir" -maxdepth 1 -name 'tierzero-*.bin' -delete 2> /dev/null
  # The disk's ceiling on the same directory, once the run's files are gone; nothing when the
  # run failed or its steps did not use the disk.
  [ "$ceiling" = 1 ] && [ -s "$out" ] &&
    python3 "$root/tools/bench_table.py" disk-ceiling --out "$out" \
      --metrics "$results/$name.jsonl" --nvme-dir "$nvme_dir" ${ceiling_size:+--size "$ceiling_size"}
fi
# The plan again, from the rates the run just learned (docs/benchmarks.md, "The disk's term from
# the rate a run moved it"); the run's own status is the script's.
if [ "$plan_again" = 1 ]; then
  "$bin/tz-train" "${args[@]}" "${extra[@]}" --plan > "$results/$name.plan.txt" 2>&1 ||
    echo "bench-train: the plan after the run failed ($results/$name.plan.txt)" >&2
fi
keep
exit $rc
