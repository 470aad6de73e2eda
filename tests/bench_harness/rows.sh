#!/usr/bin/env bash
# tests/bench_harness/CMakeLists.txt says what this checks (test_bench_rows).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$1
command -v python3 > /dev/null || { echo "no python3: bench-train.sh's results are not read"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
rows=$root/tools/bench-rows.sh

# Bad rows are refused before anything runs.
for bad in tz-offload tz-offload:tiny:x tz-offload:tiny:1:1:10:9; do
  out=$(bash "$rows" --results "$dir/bad" "$bad" 2>&1) && fail "row '$bad' accepted"
  [[ $out == *"row '$bad'"* ]] || fail "row '$bad': $out"
done
out=$(bash "$rows" --set nope 2>&1) && fail "--set nope accepted"
[[ $out == *"unknown set 'nope'"* ]] || fail "--set nope: $out"
[ ! -e "$dir/bad" ] || fail "a refused call left results"

# Two rows that fit run one after the other; one whose limit is over what is left does not.
bash "$rows" --budget 100 --results "$dir/r" tz-offload:tiny:2:1:60 tz-nvme:tiny:1:0:60 \
  tz-offload:tiny:1:0:500 -- --backend cpu --seq 32 --micro-batch 1 --bin "$bin" \
  --nvme-dir "$dir/nvme" > "$dir/out" 2>&1 || fail "bench-rows: $(cat "$dir/out")"
s=$dir/r/summary.txt
[ "$(wc -l < "$s")" -eq 3 ] || fail "summary: $(cat "$s")"
grep -q '^tz-offload:tiny:2:1:60 .*step time' "$s" || fail "first row: $(cat "$s")"
grep -q '^tz-nvme:tiny:1:0:60 .*step time' "$s" || fail "second row: $(cat "$s")"
grep -q '^tz-offload:tiny:1:0:500 .*not run: its 500 s limit' "$s" || fail "third row: $(cat "$s")"
python3 - "$dir/r" <<'PY' || fail "result files"
import glob, json, sys
runs = sorted((d["runner"], d["model"], d["steps"]) for d in
              (json.load(open(f)) for f in glob.glob(sys.argv[1] + "/*-tiny.json")))
assert runs == [("tz-nvme", "tiny", 1), ("tz-offload", "tiny", 2)], runs
PY
echo "bench-rows: refusals, two rows run, one not started"
