# Sourced by the scripts here, with their arguments: TZ_TRAIN LAUNCHER. Sets bin and launcher,
# makes $dir (removed at exit) and the rates cache in it. LAUNCHER is either an mpirun prefix ending in its -np flag
# ("mpirun --oversubscribe -np"), or "nproc": tz-train --nproc N, one worker per GPU (the nccl
# comm), which needs N GPUs (else the script exits 77, skipped).
#   launch N BIN ARGS...       run a job of N ranks
#   resume_3_more STEP         resume $dir/ck at world 2 for 3 steps after STEP; the losses must
#                              be a straight run's (sets got)
#   rank_pid R                 the pid of rank R of the job started last in the background by
#                              launch_bg, once it runs (empty until then)
bin=$1
launcher=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/tz-$(basename "$0" .sh)-XXXXXX")
trap 'rm -rf "$dir"' EXIT
export XDG_CACHE_HOME=$dir/cache
losses() { grep -o '"step":[0-9]*,[^}]*"loss":[^,]*' "$1" | sed 's/"step":\([0-9]*\),.*"loss":/\1 /'; }
# The backend of every run, the single-process ones too (which would pick the GPU where there is
# one): cpu under mpirun, cuda with --nproc.
backend=cpu
if [ "$launcher" = nproc ]; then
  backend=cuda
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  [ "$gpus" -ge 2 ] || { echo "SKIP: --nproc 2 needs two GPUs, $gpus visible"; exit 77; }
fi
launch() {
  local n=$1 b=$2
  shift 2
  if [ "$launcher" = nproc ]; then "$b" --nproc "$n" "$@"; else $launcher "$n" "$b" "$@"; fi
}
# launch_bg N BIN ARGS... (with output redirected by the caller, and & after it, so that $! is the
# launcher: it execs the job): under mpirun
# each rank writes its pid to $dir/pid.R, then becomes BIN; under --nproc the launcher's workers
# are found by their TZ_RANK.
launch_bg() {
  local n=$1
  shift
  if [ "$launcher" = nproc ]; then
    local b=$1
    shift
    exec "$b" --nproc "$n" "$@"
  fi
  exec $launcher "$n" bash -c 'echo $$ > "$0/pid.$OMPI_COMM_WORLD_RANK"; exec "$@"' "$dir" "$@"
}
rank_pid() {
  if [ "$launcher" != nproc ]; then
    [ -s "$dir/pid.$1" ] && cat "$dir/pid.$1"
    return 0
  fi
  local p
  for p in $(pgrep -P "$job" 2>/dev/null); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "TZ_RANK=$1" && { echo "$p"; return 0; }
  done
  return 0
}

# The last element of args is the --steps value.
resume_3_more() {
  local step=$1
  args[${#args[@]}-1]=$((step + 3))
  launch 2 "$bin" "${args[@]}" --resume "$dir/ck" --metrics "$dir/resumed.jsonl" > "$dir/resumed.out" 2>&1 ||
    { echo "FAIL: resume"; cat "$dir/resumed.out"; exit 1; }
  grep -q "resumed from .* at step $step" "$dir/resumed.out" ||
    { echo "FAIL: did not resume at step $step"; cat "$dir/resumed.out"; exit 1; }
  "$bin" "${args[@]}" --metrics "$dir/straight.jsonl" > "$dir/straight.out" 2>&1 ||
    { echo "FAIL: straight run"; cat "$dir/straight.out"; exit 1; }
  local want
  want=$(losses "$dir/straight.jsonl" | tail -3)
  got=$(losses "$dir/resumed.jsonl")
  [ "$got" = "$want" ] ||
    { echo "FAIL: resumed after step $step:"; echo "$got"; echo "want:"; echo "$want"; exit 1; }
}
