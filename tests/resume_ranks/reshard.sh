#!/bin/bash
# reshard.sh TZ_TRAIN "MPIRUN... -np"|nproc: resume across world sizes, losses compared as printed in
# the metrics (10 significant digits: every float bit).
set -u
. "$(dirname "$0")/ranks.sh" "$@"
args=(--backend "$backend" --model tiny --seed 3 --seq 32 --data synthetic --set train_batch_size=4
      --set train_micro_batch_size_per_gpu=2 --set gradient_clipping=1.0 --steps 6)
run() { # name, then the command
  local name=$1; shift
  if ! "$@" --metrics "$dir/$name.jsonl" > "$dir/$name.out" 2>&1; then
    echo "FAIL: $name: $*"; cat "$dir/$name.out"; exit 1
  fi
}
run straight "$bin" "${args[@]}"
run w2 launch 2 "$bin" "${args[@]}" --save-every 3 --ckpt-dir "$dir/w2"
run w1 "$bin" "${args[@]}" --save-every 3 --ckpt-dir "$dir/w1"
run w2to1 "$bin" "${args[@]}" --resume "$dir/w2/step-00000003"
run w1to2 launch 2 "$bin" "${args[@]}" --resume "$dir/w1/step-00000003"
want=$(losses "$dir/straight.jsonl")
[ "$(echo "$want" | wc -l)" = 6 ] || { echo "FAIL: straight run: $want"; exit 1; }
tail3=$(echo "$want" | tail -3)
for name in w2 w1; do
  [ "$(losses "$dir/$name.jsonl")" = "$want" ] || { echo "FAIL: $name differs:"; losses "$dir/$name.jsonl"; echo "want:"; echo "$want"; exit 1; }
done
for name in w2to1 w1to2; do
  got=$(losses "$dir/$name.jsonl")
  grep -q "resumed from" "$dir/$name.out" || { echo "FAIL: $name did not resume"; cat "$dir/$name.out"; exit 1; }
  [ "$got" = "$tail3" ] || { echo "FAIL: $name: steps 4-6"; echo "$got"; echo "want:"; echo "$tail3"; exit 1; }
done
echo "OK: world 2 -> 1 and 1 -> 2 continue with the straight run's losses:"
echo "$tail3"
# Consolidated export from a checkpoint at another world size: step 3 saved by 2 ranks exported
# by 1, and saved by 1 exported by 2, give the same bytes (the runs agree bit for bit).
run ex21 "$bin" --backend "$backend" --resume "$dir/w2/step-00000003" --steps 0 --export-safetensors "$dir/ex21"
run ex12 launch 2 "$bin" --backend "$backend" --resume "$dir/w1/step-00000003" --steps 0 --export-safetensors "$dir/ex12"
cmp "$dir/ex21/model.safetensors" "$dir/ex12/model.safetensors" ||
  { echo "FAIL: exports of step 3 from the world-2 and world-1 checkpoints differ"; exit 1; }
echo "OK: exports from checkpoints saved at world 2 and 1 (read at 1 and 2) are equal"
