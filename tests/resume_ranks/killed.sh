#!/bin/bash
# killed.sh TZ_TRAIN "MPIRUN... -np"|nproc: SIGKILL to rank 1 of a 2-rank job mid-run: the job ends
# within seconds with a message naming rank 1, and --resume from the last complete checkpoint
# continues with the straight run's losses. While the job runs, a second run given its --ckpt-dir
# is refused at start naming rank 0 (which holds DIR/.lock); after the kill the resume, which saves
# into the same directory, is not blocked by the dead job's lock.
set -u
. "$(dirname "$0")/ranks.sh" "$@"
args=(--backend "$backend" --model tiny --seed 6 --seq 32 --data synthetic --set train_batch_size=4
      --set train_micro_batch_size_per_gpu=2 --steps 400)
launch_bg 2 "$bin" "${args[@]}" \
  --ckpt-dir "$dir/ck" --save-every 2 --metrics "$dir/run.jsonl" > "$dir/run.out" 2>&1 &
job=$!
for _ in $(seq 600); do
  [ -s "$dir/run.jsonl" ] && [ "$(wc -l < "$dir/run.jsonl")" -ge 5 ] && pid1=$(rank_pid 1) && [ -n "$pid1" ] && break
  sleep 0.05
done
[ -n "${pid1:-}" ] || { echo "FAIL: rank 1 never started"; cat "$dir/run.out"; kill $job; exit 1; }
pid0=$(rank_pid 0)
if "$bin" "${args[@]}" --ckpt-dir "$dir/ck" > "$dir/second.out" 2>&1; then
  echo "FAIL: a second run given the job's --ckpt-dir ran"; cat "$dir/second.out"; kill $job; exit 1
fi
grep -q -- "--ckpt-dir $dir/ck is in use by pid $pid0 on " "$dir/second.out" ||
  { echo "FAIL: the second writer's refusal does not name rank 0 ($pid0)"; cat "$dir/second.out"; kill $job; exit 1; }
grep -q 'step 1/' "$dir/second.out" && { echo "FAIL: the second writer took steps"; kill $job; exit 1; }
kill -KILL "$pid1"
start=$SECONDS
for _ in $(seq 300); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null; then
  echo "FAIL: the job still runs 30 s after rank 1 was killed"; kill $job; cat "$dir/run.out"; exit 1
fi
wait $job
rc=$?
echo "the job ended $((SECONDS - start)) s after the kill, status $rc"
[ $rc -ne 0 ] || { echo "FAIL: the job exited 0"; cat "$dir/run.out"; exit 1; }
grep -Eq "rank 1 .*(signal 9|Killed)" "$dir/run.out" ||
  { echo "FAIL: no message naming rank 1"; cat "$dir/run.out"; exit 1; }
[ -f "$dir/ck/latest" ] || { echo "FAIL: no checkpoint"; ls -la "$dir/ck"; exit 1; }
step=$(sed 's/[^0-9]//g; s/^0*//' "$dir/ck/latest")
[ -n "$step" ] || { echo "FAIL: latest: $(cat "$dir/ck/latest")"; exit 1; }
resume_3_more "$step"
echo "OK: a second writer was refused naming rank 0; rank 1 killed: the job ended naming it; resumed from step $step:"
echo "$got"
