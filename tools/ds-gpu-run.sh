#!/usr/bin/env bash
# The DeepSpeed peer's first run on the GPU machine, in one call (a few minutes): installs
# DeepSpeed from .whl/ds (tools/ds-stage.sh put it there; the call carries .whl), building its
# ops into a wheel first when .whl/ds/built has none for this python and torch, then runs
# ds-offload llama-1b (2 warm-up steps, 4 timed) and prints its result and the 15% check against
# issue 25's 0.877 s.
#
#   tools/ds-gpu-run.sh [--no-build-ops] [--model M] [--runner R] [--steps N] [--timeout S]
#
#   --no-build-ops  install the sdist without building a wheel (the ops then compile on first
#                   use: CPU Adam about 45 s, counted in set-up, not in step time)
#   --model M       default llama-1b;  --runner R  default ds-offload (any ds-* runner)
#   --steps N       timed steps (default 4);  --timeout S  the run's limit (default 240 s)
#
# With $OUT set (the device machine), the log goes to $OUT/ds-gpu-run.log, the result to
# $OUT/bench/NAME.tgz (tools/bench-train.sh), and a newly built wheel to $OUT/ds-built: copy it to
# .whl/ds/built/ so that later calls install it instead of building.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
build=1 model=llama-1b runner=ds-offload steps=4 limit=240
while [ $# -gt 0 ]; do
  case $1 in
    --no-build-ops) build=0; shift ;;
    --model | --runner | --steps | --timeout)
      [ $# -ge 2 ] || { echo "ds-gpu-run: $1 needs a value" >&2; exit 2; }
      case $1 in --model) model=$2 ;; --runner) runner=$2 ;; --steps) steps=$2 ;;
        --timeout) limit=$2 ;; esac
      shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "ds-gpu-run: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
site=${TZ_DS_SITE:-/tmp/ds-site}
log=/dev/null
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then log=$OUT/ds-gpu-run.log; fi
t0=$SECONDS
say() { echo "ds-gpu-run: [$((SECONDS - t0)) s] $*" | tee -a "$log" >&2; }

py=$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
torchv=$(python3 -c 'import torch; print(torch.__version__)' 2> /dev/null)
have_built=0
for w in .whl/ds/built/deepspeed-0.19.8-"$py"-*.whl; do
  [ -f "$w" ] && [ "$(cat "$w.torch" 2> /dev/null)" = "$torchv" ] && have_built=1
done
say "python $py, torch ${torchv:-missing}, built wheel: $([ $have_built = 1 ] && echo yes || echo no)"
if [ $build = 1 ] && [ $have_built = 0 ]; then
  say "building DeepSpeed's ops (tools/ds-install.sh --build-ops)"
  if ! tools/ds-install.sh --build-ops --site "$site" >> "$log" 2>&1; then
    say "building the ops failed (the log above); installing the sdist, ops JIT-compiled"
    tools/ds-install.sh --site "$site" >> "$log" 2>&1 || { say "the install failed"; exit 1; }
  fi
else
  say "installing DeepSpeed (tools/ds-install.sh)"
  tools/ds-install.sh --site "$site" >> "$log" 2>&1 || { say "the install failed"; exit 1; }
fi
say "installed; running $runner $model ($steps timed steps after 2 warm-up)"
tools/bench-train.sh "$runner" "$model" --steps "$steps" --warmup 2 --timeout "$limit" \
  --ds-site "$site" >> "$log" 2>&1
rc=$?
r=results/bench/$runner-$model.json
say "bench-train.sh exited $rc"
grep -h "^bench: $runner $model" "results/bench/$runner-$model.log" 2> /dev/null | tail -1 >&2
if [ -f "$r" ]; then
  tmp=$(mktemp -d)
  cp "$r" "$tmp/"
  python3 tools/bench_table.py table --dir "$tmp" 2>&1 | grep -E "^\| $model|DeepSpeed 0.19.8" |
    tee -a "$log" >&2
  rm -rf "$tmp"
else
  say "no result file $r; the end of the run's log:"
  tail -25 "results/bench/$runner-$model.log" 2> /dev/null | tee -a "$log" >&2
fi
say "done"
exit $rc
