#!/usr/bin/env bash
# tests/bench_harness/CMakeLists.txt says what this checks. $1: tz-bench.
set -uo pipefail
command -v python3 > /dev/null || { echo "no python3: not checked"; exit 77; }
dir=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
trap 'rm -rf "$dir"' EXIT
"$1" tiers --path "$dir" --size 16M --reps 1 --min 1M --max 1M --json > "$dir/out" 2> "$dir/err"
rc=$?
# 77 after the nvme rows is the GPU rows' (no GPU here); before them, the nvme tier's.
if ! grep -q 'nvme' "$dir/out"; then
  [ $rc = 77 ] && { cat "$dir/err"; exit 77; }
  cat "$dir/out" "$dir/err"
  echo "FAIL: tz-bench tiers exited $rc with no nvme rows"
  exit 1
fi
if [ $rc != 0 ] && [ $rc != 77 ]; then
  cat "$dir/out" "$dir/err"
  echo "FAIL: tz-bench tiers exited $rc"
  exit 1
fi
python3 - "$dir/out" <<'PY'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1])
        if x.startswith('{"bench":"tiers"') and 'nvme' in x]
ops = {r["op"]: r for r in rows if r.get("block_bytes") == 1 << 20}
for op in ("write", "read", "read+write"):
    assert op in ops, "no %s row in %s" % (op, [r["op"] for r in rows])
    assert ops[op]["tier_gbps"] > 0, ops[op]
rw = ops["read+write"]
assert rw["tier_read_gbps"] > 0 and rw["tier_write_gbps"] > 0, rw
assert abs(rw["tier_read_gbps"] + rw["tier_write_gbps"] - rw["tier_gbps"]) < 1e-3, rw
print("ok:", {op: round(ops[op]["tier_gbps"], 3) for op in ops})
PY
[ $? = 0 ] || exit 1
# Large blocks at depth: r+w keeps a queue of each direction in host memory (2 x 8 MiB x 16), more
# than one direction's queue and the slack the host tier had (it failed at the default 8 MiB).
"$1" tiers --path "$dir" --size 128M --reps 1 --min 8M --max 8M --qd 16 > "$dir/out8" 2> "$dir/err8"
rc=$?
if { [ $rc != 0 ] && [ $rc != 77 ]; } || ! grep -q '^r+w *8192K' "$dir/out8"; then
  cat "$dir/out8" "$dir/err8"
  echo "FAIL: tz-bench tiers with 8 MiB blocks at depth 16 exited $rc without an r+w row"
  exit 1
fi
echo "ok: r+w at 8 MiB, depth 16"

