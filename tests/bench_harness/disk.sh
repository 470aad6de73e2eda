#!/usr/bin/env bash
# tests/bench_harness/CMakeLists.txt says what this checks. $1: the directory of tz-train.
set -uo pipefail
bin=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v python3 > /dev/null || { echo "no python3: the harness is not checked"; exit 77; }
dir=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir "$dir/nvme"
# No carry: each step reads the state from the disk again, whatever the machine's memory lets the
# window keep (a machine with 128 GiB kept all of it after the first step: no reads to check).
bt=("$root/tools/bench-train.sh" tz-nvme tiny --seq 32 --micro-batch 2 --backend cpu --bin "$bin"
    --results "$dir" --steps 3 --warmup 1 --nvme-dir "$dir/nvme" --set tierzero.window_carry=false)

# The step's disk figures are the timed steps' nvme_* keys of the metrics file.
check_disk() {
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps = [json.loads(x) for x in open(sys.argv[2]) if '"step"' in x and '"summary"' not in x]
timed = [o for o in steps if o["step"] > r["warmup"]]
assert len(timed) == 3, len(timed)
rd = sum(o["nvme_read_bytes"] for o in timed)
wr = sum(o["nvme_write_bytes"] for o in timed)
wall = sum(o["step_s"] for o in timed)
busy = sum(o["nvme_busy_s"] for o in timed)
near = lambda a, b: abs(a - b) <= 1e-6 * abs(b)
assert rd > 0 and wr > 0
assert near(r["disk_read_bytes"], rd / 3) and near(r["disk_write_bytes"], wr / 3), r
assert near(r["disk_read_gbs"], rd / wall / 1e9) and near(r["disk_write_gbs"], wr / wall / 1e9), r
assert near(r["disk_read_share"], rd / (rd + wr)), r
assert near(r["disk_busy_share"], busy / wall) and near(r["disk_busy_read_gbs"], rd / busy / 1e9), r
PY
}

# With fio: its mixed job on the run's directory at the step's read share, and the ratios. The
# parameters on the disk too, so that the step reads more than it writes (share 0.48, not 0.5).
if command -v fio > /dev/null; then
  "${bt[@]}" --set zero_optimization.offload_param.device=nvme > "$dir/a.out" 2>&1 ||
    { cat "$dir/a.out"; fail "the tz-nvme run failed"; }
  r=$dir/tz-nvme-tiny.json
  check_disk "$r" "$dir/tz-nvme-tiny.jsonl" || { cat "$dir/a.out"; fail "the step's disk figures in $r"; }
  python3 - "$r" "$dir/nvme" <<'PY' || { cat "$dir/a.out"; fail "fio's figures in $r"; }
import json, sys
r = json.load(open(sys.argv[1]))
assert "disk_ceiling_error" not in r, r["disk_ceiling_error"]
j = r["fio_job"]
assert abs(r["disk_read_share"] - 0.5) > 0.005, r["disk_read_share"]
assert j["dir"] == sys.argv[2] and j["rwmixread"] == round(100 * r["disk_read_share"]), j
assert abs(j["read_share_asked"] - r["disk_read_share"]) < 1e-4, j
assert (j["bs"], j["iodepth"], j["direct"]) == (1 << 20, 64, 1), j
# a tiny model's state is less than the smallest file, and a step moves less than it
assert j["size"] == j["io_size"] == 256 << 20, j
assert r["fio_read_gbs"] > 0 and r["fio_write_gbs"] > 0, r
for d in ("read", "write"):
    assert abs(r["disk_%s_vs_fio" % d] - r["disk_%s_gbs" % d] / r["fio_%s_gbs" % d]) < 1e-9, r
    assert abs(r["disk_busy_%s_vs_fio" % d]
               - r["disk_busy_%s_gbs" % d] / r["fio_%s_gbs" % d]) < 1e-9, r
PY
  grep -q "bench: disk during the step: read" "$dir/a.out" || fail "no disk line in the output"
  [ -z "$(ls -A "$dir/nvme")" ] || fail "files left in the nvme directory: $(ls -A "$dir/nvme")"
  # The size asked for.
  "${bt[@]}" --tag sized --disk-ceiling-size 64M > "$dir/s.out" 2>&1 || { cat "$dir/s.out"; fail "sized run"; }
  python3 -c "import json,sys; j = json.load(open(sys.argv[1]))['fio_job']; assert j['size'] == j['io_size'] == 64 << 20, j" \
    "$dir/tz-nvme-tiny-sized.json" || fail "--disk-ceiling-size 64M not the job's size"
else
  echo "no fio: its job is not run here (the result's error is checked below)"
fi

# fio missing or failing: the run's result keeps its figures and says why there is no ceiling.
FIO=$dir/no-fio "${bt[@]}" --tag nofio > "$dir/n.out" 2>&1 || { cat "$dir/n.out"; fail "a run without fio failed"; }
r=$dir/tz-nvme-tiny-nofio.json
check_disk "$r" "$dir/tz-nvme-tiny-nofio.jsonl" || fail "the step's disk figures without fio"
python3 - "$r" <<'PY' || fail "no disk_ceiling_error in $r"
import json, sys
r = json.load(open(sys.argv[1]))
assert "no-fio' is not an executable" in r["disk_ceiling_error"], r.get("disk_ceiling_error")
assert not any(k.startswith("fio_") for k in r), r
PY

# --no-disk-ceiling: the step's figures, no fio.
"${bt[@]}" --tag noceil --no-disk-ceiling > "$dir/c.out" 2>&1 || { cat "$dir/c.out"; fail "--no-disk-ceiling run"; }
r=$dir/tz-nvme-tiny-noceil.json
check_disk "$r" "$dir/tz-nvme-tiny-noceil.jsonl" || fail "the step's disk figures with --no-disk-ceiling"
grep -q "disk's ceiling" "$dir/c.out" && fail "--no-disk-ceiling ran fio"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert not [k for k in r if 'fio' in k or 'ceiling' in k], r" \
  "$r" || fail "fio keys with --no-disk-ceiling"

# A runner without the disk: no disk keys, no fio.
"$root/tools/bench-train.sh" tz-offload tiny --seq 32 --micro-batch 2 --backend cpu --bin "$bin" \
  --results "$dir" --steps 2 --warmup 1 > "$dir/o.out" 2>&1 || { cat "$dir/o.out"; fail "tz-offload run"; }
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert not [k for k in r if k.startswith(('disk', 'fio'))], r" \
  "$dir/tz-offload-tiny.json" || fail "disk keys in a tz-offload result"
grep -q "disk's ceiling" "$dir/o.out" && fail "tz-offload ran fio"

# The table's disk rows, from result files: the row with the disk, none for the one without.
mkdir "$dir/table"
python3 - "$dir/table" <<'PY'
import json, sys
base = dict(model="llama-7b", seq=2048, micro_batch=4, device="GPU X", step_s=30.0,
            tokens_per_s=273.0, model_tflops=1.0)
json.dump(dict(base, runner="tz-nvme", disk_read_bytes=40e9, disk_write_bytes=20e9,
               disk_read_gbs=1.3333, disk_write_gbs=0.6667, disk_read_share=0.6667,
               disk_busy_share=0.97, fio_read_gbs=1.4, fio_write_gbs=0.7,
               disk_read_vs_fio=0.9524, disk_write_vs_fio=0.9524),
          open(sys.argv[1] + "/a.json", "w"))
json.dump(dict(base, runner="tz-auto", disk_read_bytes=1e9, disk_write_bytes=1e9,
               disk_read_gbs=0.1, disk_write_gbs=0.1, disk_read_share=0.5,
               disk_ceiling_error="tools/disk-ceiling.sh: no fio on PATH"),
          open(sys.argv[1] + "/b.json", "w"))
json.dump(dict(base, runner="tz-offload"), open(sys.argv[1] + "/c.json", "w"))
PY
python3 "$root/tools/bench_table.py" table --dir "$dir/table" > "$dir/table.out" 2>&1 ||
  { cat "$dir/table.out"; fail "bench_table.py table failed"; }
grep -q "| llama-7b | tz-nvme | 40 + 20 | 0.67 | 1.333 | 0.667 | 1.400 | 0.700 | 0.95 | 0.95 | 97% |" \
  "$dir/table.out" || { cat "$dir/table.out"; fail "no disk row for tz-nvme"; }
grep -q "| llama-7b | tz-auto | 1 + 1 | 0.50 | 0.100 | 0.100 | fio: tools/disk-ceiling.sh: no fio on PATH | - | - | - | - |" \
  "$dir/table.out" || { cat "$dir/table.out"; fail "no disk row with fio's error for tz-auto"; }
[ "$(grep -c '^| llama-7b | tz-offload |' "$dir/table.out")" = 1 ] ||
  { cat "$dir/table.out"; fail "tz-offload has a disk row"; }
echo "ok: the step's disk rates and fio's in tz-nvme results, without fio, --no-disk-ceiling,"
echo "    a runner without the disk, the table's disk rows"
