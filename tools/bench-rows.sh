#!/usr/bin/env bash
# Benchmark rows one after the other on this machine, each through tools/bench-train.sh, so that
# every ratio in a table comes from runs made side by side. A row is
#   RUNNER:MODEL[:STEPS[:WARMUP[:TIMEOUT]]]     (defaults 6, 2, 300 s)
# for example ds-offload:llama-3b:8:4:420; MODEL may be a config.json, as bench-train.sh takes it
# (tz-*, ds-*). A row whose TIMEOUT no longer fits in what is left of
# --budget is not started (the summary says so), so a device call ends in time with what it ran.
#
#   tools/bench-rows.sh [--budget S] [--results DIR] [--set NAME] [ROW...] [-- BENCH-TRAIN-ARGS]
#
#   --budget S     seconds for all the rows (default 570: a 600 s device call less the summary)
#   --results DIR  bench-train.sh's --results (default results/rows)
#   --set NAME     a named list of rows, before any given ones:
#                    ds-a  ds-offload llama-1b and llama-3b, with tz-offload and fsdp2-offload
#                    ds-b  ds-gpu and ds-opt llama-7b, ds-offload llama-7b (stopped at set-up
#                          for host memory, as issue 25 found), tz-auto and tz-offload llama-7b
#                    ds-c  ds-nvme and tz-nvme llama-1b, fsdp2-gpu llama-7b, tz-auto llama-13b
#                    ds-d  ds-gpu and tz-auto llama-7b (their last runs were on two machines),
#                          then ds-offload and tz-offload llama-3b once more (about 400 s)
#                  (issue 25's table in docs/benchmarks-history.md, three device calls)
# Arguments after -- go to every bench-train.sh call (--bin DIR, --ds-site DIR, ...).
# Prints one line per row (step time, or why there is none) and, with $OUT set, copies the
# results and the summary to $OUT/rows.tgz.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
budget=570 results=$root/results/rows
rows=() pass=()
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage 0 ;;
    --budget | --results | --set)
      [ $# -ge 2 ] || { echo "bench-rows: $1 needs a value" >&2; exit 2; }
      case $1 in
        --budget) budget=$2 ;;
        --results) results=$2 ;;
        --set)
          case $2 in
            ds-a) rows+=(ds-offload:llama-1b:6:2:300 tz-offload:llama-1b fsdp2-offload:llama-1b
                         ds-offload:llama-3b:8:4:420 tz-offload:llama-3b fsdp2-offload:llama-3b) ;;
            ds-b) rows+=(ds-gpu:llama-7b:6:2:300 tz-auto:llama-7b ds-opt:llama-7b:6:2:420
                         tz-offload:llama-7b ds-offload:llama-7b:4:1:300) ;;
            ds-c) rows+=(ds-nvme:llama-1b:4:1:420 tz-nvme:llama-1b:4:1:300 fsdp2-gpu:llama-7b
                         tz-auto:llama-13b:4:1:300) ;;
            ds-d) rows+=(ds-gpu:llama-7b:6:2:170 tz-auto:llama-7b:6:2:120
                         ds-offload:llama-3b:8:4:200 tz-offload:llama-3b:6:2:80) ;;
            *) echo "bench-rows: unknown set '$2' (ds-a, ds-b, ds-c, ds-d)" >&2; exit 2 ;;
          esac ;;
      esac
      shift 2 ;;
    --) shift; pass=("$@"); break ;;
    -*) echo "bench-rows: unknown option '$1'" >&2; usage ;;
    *) rows+=("$1"); shift ;;
  esac
done
[[ $budget =~ ^[0-9]+$ ]] || { echo "bench-rows: --budget '$budget' is not seconds" >&2; exit 2; }
[ ${#rows[@]} -ge 1 ] || usage
# Every row is checked before any runs: a typo found after ten minutes of runs costs the call.
for row in "${rows[@]}"; do
  IFS=: read -r runner model steps warmup limit extra <<< "$row"
  for v in "${steps:-6}" "${warmup:-2}" "${limit:-300}"; do
    [[ $v =~ ^[0-9]+$ ]] || { echo "bench-rows: row '$row': '$v' is not a count" >&2; exit 2; }
  done
  if [ -z "$runner" ] || [ -z "$model" ] || [ -n "$extra" ]; then
    echo "bench-rows: row '$row' is not RUNNER:MODEL[:STEPS[:WARMUP[:TIMEOUT]]]" >&2
    exit 2
  fi
done
mkdir -p "$results" || exit 1
summary=$results/summary.txt
: > "$summary"
t0=$SECONDS
for row in "${rows[@]}"; do
  IFS=: read -r runner model steps warmup limit <<< "$row"
  steps=${steps:-6} warmup=${warmup:-2} limit=${limit:-300}
  left=$((budget - (SECONDS - t0)))
  if [ "$limit" -gt "$left" ]; then
    printf '%-28s not run: its %d s limit is over the %d s left\n' "$row" "$limit" "$left" |
      tee -a "$summary"
    continue
  fi
  r0=$SECONDS
  # a config.json's output is named as bench-train.sh names its result: the file, without .json
  o=$results/$runner-$(basename "$model" .json).out
  bash "$root/tools/bench-train.sh" "$runner" "$model" --steps "$steps" --warmup "$warmup" \
    --timeout "$limit" --results "$results" "${pass[@]}" > "$o" 2>&1
  rc=$?
  # tz-train's end summary says "step time" (with its bound and stalls); for a peer, the run
  # wrapper's "N s/step".
  line=$(grep -h 'step time' "$o" | tail -1)
  [ -n "$line" ] || line=$(grep -hE '^bench: .* s/step' "$o" | tail -1)
  [ -n "$line" ] || line="no step time (exit $rc; $o: $(tail -1 "$o"))"
  printf '%-28s %4d s  %s\n' "$row" $((SECONDS - r0)) "$line" | tee -a "$summary"
done
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  tar czf "$OUT/rows.tgz" -C "$results" . && echo "bench-rows: results in \$OUT/rows.tgz"
fi
exit 0
