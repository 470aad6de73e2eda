#!/bin/bash
# sigstop.sh TZ_TRAIN "MPIRUN... -np"|nproc: SIGTERM to rank 1 alone of a 2-rank job: both ranks stop
# after the same step, save, and exit non-zero with the message, without MPI_Abort; --resume then
# continues with the straight run's losses.
set -u
. "$(dirname "$0")/ranks.sh" "$@"
args=(--backend "$backend" --model tiny --seed 4 --seq 32 --data synthetic --set train_batch_size=4
      --set train_micro_batch_size_per_gpu=2 --steps 400)
launch_bg 2 "$bin" "${args[@]}" \
  --ckpt-dir "$dir/ck" --metrics "$dir/stop.jsonl" > "$dir/stop.out" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ -s "$dir/stop.jsonl" ] && [ "$(wc -l < "$dir/stop.jsonl")" -ge 2 ] && pid1=$(rank_pid 1) && [ -n "$pid1" ] && break
  sleep 0.05
done
[ -n "${pid1:-}" ] || { echo "FAIL: rank 1 never started"; cat "$dir/stop.out"; kill $job; exit 1; }
kill -TERM "$pid1"
wait $job
rc=$?
[ $rc -ne 0 ] || { echo "FAIL: the stopped job exited 0"; cat "$dir/stop.out"; exit 1; }
for r in 0 1; do
  grep -q "rank $r: stopped by Terminated after step [0-9]*; checkpoint saved" "$dir/stop.out" ||
    { echo "FAIL: rank $r did not report the stop"; cat "$dir/stop.out"; exit 1; }
done
if grep -qi "MPI_ABORT\|comm mpi" "$dir/stop.out"; then
  echo "FAIL: the stop aborted the job"; cat "$dir/stop.out"; exit 1
fi
step=$(sed -n 's/.*rank 0: stopped by Terminated after step \([0-9]*\);.*/\1/p' "$dir/stop.out")
[ -n "$step" ] && [ "$step" -lt 400 ] || { echo "FAIL: no stop step"; cat "$dir/stop.out"; exit 1; }
[ -d "$dir/ck/step-$(printf %08d "$step")" ] || { echo "FAIL: no checkpoint of step $step"; ls "$dir/ck"; exit 1; }
resume_3_more "$step"
echo "OK: SIGTERM to rank 1: both ranks stopped after step $step without an abort; resumed:"
echo "$got"
