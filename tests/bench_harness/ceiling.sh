#!/usr/bin/env bash
# tests/bench_harness/CMakeLists.txt says what this checks.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dc=$root/tools/disk-ceiling.sh
command -v python3 > /dev/null || { echo "no python3: not checked"; exit 77; }
command -v fio > /dev/null || { echo "no fio: the mixed job cannot run here"; exit 77; }
dir=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir "$dir/disk"

# A mixed job, 256 MiB at a read share of 0.3: both rates, the bytes moved, the job as asked.
"$dc" "$dir/disk" 0.3 256M > "$dir/out" 2> "$dir/err" || { cat "$dir/err"; fail "the job failed"; }
python3 - "$dir/out" "$dir/disk" <<'PY' || fail "the mixed job's result: $(cat "$dir/out")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["read_gbs"] > 0 and r["write_gbs"] > 0, r
assert abs(r["total_gbs"] - r["read_gbs"] - r["write_gbs"]) < 1e-9, r
assert r["read_bytes"] + r["write_bytes"] == 256 << 20, r
# fio draws each request's direction: 256 requests at 30% reads.
assert 0.15 < r["read_share"] < 0.45, r
assert (r["rw"], r["rwmixread"], r["bs"], r["iodepth"], r["direct"], r["ioengine"]) == \
    ("rw", 30, 1 << 20, 64, 1, "io_uring"), r
assert r["dir"] == sys.argv[2] and r["size"] == r["io_size"] == 256 << 20, r
assert r["runtime_s"] > 0, r
PY
[ -z "$(ls -A "$dir/disk")" ] || fail "files left: $(ls -A "$dir/disk")"

# The ends of the share: a write-only and a read-only job; the options given are the job's.
"$dc" "$dir/disk" 0 16M --bs 65536 --iodepth 8 > "$dir/w" 2> "$dir/err" || { cat "$dir/err"; fail "write job"; }
"$dc" "$dir/disk" 1 16M --random --io-size 40M > "$dir/r" 2> "$dir/err" || { cat "$dir/err"; fail "read job"; }
python3 - "$dir/w" "$dir/r" <<'PY' || fail "the one-way jobs: $(cat "$dir/w" "$dir/r")"
import json, sys
w, r = (json.load(open(p)) for p in sys.argv[1:])
assert w["rw"] == "write" and w["read_bytes"] == 0 and w["write_gbs"] > 0, w
assert (w["bs"], w["iodepth"]) == (65536, 8), w
assert r["rw"] == "randread" and r["write_bytes"] == 0 and r["read_gbs"] > 0, r
assert r["io_size"] == r["read_bytes"] == 40 << 20 and r["size"] == 16 << 20, r
PY

# Wrong arguments: status 2 and the argument named.
"$dc" "$dir/disk" 1.5 16M > /dev/null 2> "$dir/err"; [ $? = 2 ] || fail "share 1.5 accepted"
grep -q "READ_SHARE '1.5'" "$dir/err" || fail "share message: $(cat "$dir/err")"
"$dc" "$dir/disk" 0.5 12Q > /dev/null 2> "$dir/err"; [ $? = 2 ] || fail "size 12Q accepted"
"$dc" "$dir/nowhere" 0.5 16M > /dev/null 2> "$dir/err"; [ $? = 2 ] || fail "no directory accepted"
grep -q "nowhere' is not a directory" "$dir/err" || fail "directory message: $(cat "$dir/err")"

# No fio: status 3 and what to do. A PATH of the tools the script uses, fio not among them.
mkdir "$dir/bin"
ln -s "$(python3 -c 'import sys; print(sys.executable)')" "$dir/bin/python3"
for c in df awk mktemp rm sed cat; do ln -s "$(command -v $c)" "$dir/bin/$c"; done
env -u FIO PATH="$dir/bin" "$(command -v bash)" "$dc" "$dir/disk" 0.5 16M > /dev/null 2> "$dir/err"
[ $? = 3 ] || fail "without fio: not status 3: $(cat "$dir/err")"
grep -q "no fio on PATH" "$dir/err" || fail "without fio: $(cat "$dir/err")"

# Stopped while fio runs (a SIGTERM to its process group, its own), the file is removed all the
# same.
setsid "$dc" "$dir/disk" 0.5 64M --runtime 20 > /dev/null 2>&1 &
pid=$!
for _ in $(seq 50); do [ -n "$(ls -A "$dir/disk")" ] && break; sleep 0.1; done
[ -n "$(ls -A "$dir/disk")" ] || fail "no file made by the timed job"
sleep 0.5
t0=$SECONDS
kill -TERM -- -"$pid"
wait "$pid"
[ $((SECONDS - t0)) -lt 10 ] || fail "the stopped job took $((SECONDS - t0)) s to end"
[ -z "$(ls -A "$dir/disk")" ] || fail "files left after a SIGTERM: $(ls -A "$dir/disk")"
echo "ok: $(cat "$dir/out")"
