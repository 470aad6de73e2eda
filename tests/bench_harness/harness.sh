#!/usr/bin/env bash
# tests/bench_harness/CMakeLists.txt says what this checks. $1: the directory of tz-train.
set -uo pipefail
bin=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v python3 > /dev/null || { echo "no python3: the harness is not checked"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))" "$@"; }

bt=("$root/tools/bench-train.sh" tz-offload tiny --seq 32 --micro-batch 2 --backend cpu
    --bin "$bin" --results "$dir")
# A run that completes: its figures.
"${bt[@]}" --steps 2 --warmup 1 > "$dir/a.out" 2>&1 || { cat "$dir/a.out"; fail "the run failed"; }
r=$dir/tz-offload-tiny.json
[ "$(field "$r" steps)" = 2 ] || fail "steps: $(field "$r" steps), expected 2"
[ "$(field "$r" error)" = None ] || fail "error in a completed run: $(field "$r" error)"
python3 - "$r" <<'PY' || fail "no step time, tokens/s, set-up, end time or host state in $r"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["step_s"] > 0 and r["tokens_per_s"] > 0 and r["setup_s"] >= 0 and r["end_s"] >= 0
# the host's state at the start, beside the figures
assert r["host_before"]["mem_available_gib"] > 0 and "loadavg" in r["host_before"]
PY

# A model given as a config.json (tz-* and ds-* runners; ds.sh checks the DeepSpeed peer's):
# tz-train trains it, the result is named after the file; the FSDP2 peer refuses it by name.
cat > "$dir/small-llama.json" <<'JSON'
{"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4,
 "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": true}
JSON
"$root/tools/bench-train.sh" tz-offload "$dir/small-llama.json" --seq 32 --micro-batch 2 \
  --backend cpu --bin "$bin" --results "$dir" --steps 2 --warmup 1 > "$dir/m.out" 2>&1 ||
  { cat "$dir/m.out"; fail "the config.json run failed"; }
r=$dir/tz-offload-small-llama.json
[ "$(field "$r" steps)" = 2 ] || { cat "$dir/m.out"; fail "config.json run: steps $(field "$r" steps)"; }
grep -q "small-llama.json (" "$dir/tz-offload-small-llama.log" ||
  fail "tz-train was not given the config.json"
"$root/tools/bench-train.sh" fsdp2-gpu "$dir/small-llama.json" > "$dir/p.out" 2>&1 &&
  fail "a peer took a config.json"
grep -q "builds the presets only" "$dir/p.out" || { cat "$dir/p.out"; fail "the peer's refusal"; }

# A run longer than its --timeout: stopped after a step, within seconds, recorded as an error
# with the steps it did.
t0=$SECONDS
"${bt[@]}" --steps 1000000 --warmup 1 --tag long --timeout 3 > "$dir/b.out" 2>&1
rc=$?
[ $rc != 0 ] || fail "a stopped run exited 0"
[ $((SECONDS - t0)) -lt 30 ] || fail "the stopped run took $((SECONDS - t0)) s"
r=$dir/tz-offload-tiny-long.json
grep -q "stopped past --timeout" <<< "$(field "$r" error)" ||
  { cat "$dir/b.out"; fail "error: $(field "$r" error)"; }
[ "$(field "$r" timed_out_s)" = 3.0 ] || fail "timed_out_s: $(field "$r" timed_out_s)"
[ "$(field "$r" steps_done)" -ge 1 ] || fail "steps_done: $(field "$r" steps_done)"
pgrep -f "tz-offload-tiny-long" > /dev/null && fail "a process of the stopped run is still there"
# A time limit around the harness (GNU timeout signals its whole process group): the wrapper
# passes the SIGTERM on and records the run; nothing is left running.
timeout -s TERM 4 "${bt[@]}" --steps 1000000 --warmup 1 --tag outer > "$dir/c.out" 2>&1
r=$dir/tz-offload-tiny-outer.json
# timeout returns when bench-train.sh has gone; the wrapper writes the result just after.
for _ in $(seq 40); do
  [ -s "$r" ] && ! pgrep -f "tz-offload-tiny-outer" > /dev/null && break
  sleep 0.5
done
[ -s "$r" ] || { cat "$dir/c.out"; fail "no result after a SIGTERM to the harness"; }
grep -q "the harness was stopped" <<< "$(field "$r" error)" ||
  { cat "$dir/c.out"; fail "error: $(field "$r" error)"; }
pgrep -f "tz-offload-tiny-outer" > /dev/null &&
  fail "a process of the terminated run is still there"
# The table's strong scaling: two ranks beside one rank accumulating two micro-batches.
mkdir -p "$dir/scaling"
python3 - "$dir/scaling" <<'PY'
import json, sys
base = dict(runner="tz-auto", model="llama-7b", seq=2048, micro_batch=4, device="GPU X",
            step_s=1.0, efficiency=0.9)
for name, extra in (("one", dict(world_size=1, accumulation=2, tokens_per_s=1000.0, tag="acc2",
                                 model_tflops=100.0)),
                    ("two", dict(world_size=2, accumulation=1, tokens_per_s=1800.0, tag="2gpu",
                                 model_tflops=180.0, coll_s=0.05, stall_s=0.125))):
    json.dump(dict(base, **extra), open("%s/%s.json" % (sys.argv[1], name), "w"))
PY
python3 "$root/tools/bench_table.py" table --dir "$dir/scaling" > "$dir/table.out" 2>&1 ||
  { cat "$dir/table.out"; fail "bench_table.py table failed"; }
grep -q "| llama-7b | tz-auto-2gpu | 2 | 1800 | tz-auto-acc2: 1000 | 1.80x | 0.90 | 90.0 | 90% | 5.0% |" \
  "$dir/table.out" || { cat "$dir/table.out"; fail "no strong-scaling row"; }
# The main table's stalls and collectives (one rank: no collectives).
grep -q "| llama-7b | tz-auto-2gpu | 1.000 | 1800 | 180.0 | - | - | - | - | - | 90% | 12.5% | 5.0% |" \
  "$dir/table.out" || { cat "$dir/table.out"; fail "no stalls and collectives in the 2-rank row"; }
grep -q "| llama-7b | tz-auto-acc2 | 1.000 | 1000 | 100.0 | - | - | - | - | - | 90% | - | - |" \
  "$dir/table.out" || { cat "$dir/table.out"; fail "the 1-rank row"; }
echo "ok: a completed run's figures, a run stopped by --timeout, a harness stopped from outside,"
echo "    the table's strong scaling, stalls and collectives"

