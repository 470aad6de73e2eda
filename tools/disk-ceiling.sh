#!/usr/bin/env bash
# What the disk under a directory does reading and writing at once: one mixed fio job (reads and
# writes interleaved in one queue, in a given ratio) with the requests tierzero's nvme tier issues,
# printed as one JSON object. It is the ceiling a training step's disk rates are held against
# (issue 26, item 3; docs/benchmarks.md, "Disk rates during a step").
#
#   tools/disk-ceiling.sh DIR READ_SHARE SIZE [options]
#
# DIR         a directory on the disk (the run's tierzero.nvme_path); fio's file is made there,
#             tierzero-ceiling-<pid>.bin, and removed when the script ends, however it ends
# READ_SHARE  reads' share of the bytes, 0 to 1 (a step's nvme_read_share); fio takes it in whole
#             percent (rwmixread); 0 is a write-only job, 1 a read-only one
# SIZE        the file's size: 256M, 4GiB, 1073741824 (K, M, G, T are powers of 1024); rounded
#             down to the block size
# Options, as the nvme tier issues its requests (tiers/nvme.c, docs/config.md):
#   --bs BYTES     bytes a request (default 1048576: aio.block_size, the tier's stripe unit)
#   --iodepth N    requests in flight (default 64: tierzero.queue_depth, 0 there meaning 64)
#   --buffered     through the page cache (tierzero.nvme_buffered); default O_DIRECT (direct=1)
#   --random       random offsets (randrw); default sequential (rw), as the tier walks its blocks
#   --io-size SIZE the bytes moved, reads and writes together (default SIZE: the file once);
#                  more than SIZE goes over the file again from its start
#   --runtime S    run S seconds over the file (time_based) instead
#   --fio PATH     the fio to run (default $FIO, else fio on PATH, else the repository's
#                  .deps/fio, which tools/fio-stage.sh builds for the GPU machine)
# The job: ioengine io_uring, one job (the tier's one ring), fixed buffers and registered files
# (the tier registers both). The file is laid out (written) by fio first, so that the reads read
# the disk; the layout is not timed.
# Output (stdout): {"read_gbs", "write_gbs", "total_gbs" (GB/s, 1e9 bytes a second, fio's
# bw_bytes), "read_bytes", "write_bytes", "read_share" (what fio did), "runtime_s", and the job:
# "dir", "size", "io_size", "bs", "iodepth", "rw", "rwmixread", "read_share_asked", "direct",
# "ioengine", "fio"}. Exit status: 0; 2 for a wrong argument; 3 without fio; 1 when fio fails
# (its output on stderr).
set -uo pipefail
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
die() { echo "disk-ceiling: $*" >&2; exit 2; }
[ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; } && usage 0
[ $# -ge 3 ] || usage
dir=$1 share=$2 size_arg=$3
shift 3
bs=1048576 qd=64 direct=1 pattern=rw runtime=0 fio=${FIO:-} io_arg=""
need() { [ $# -ge 2 ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case $1 in
    --bs) need "$@"; bs=$2; shift 2 ;;
    --iodepth) need "$@"; qd=$2; shift 2 ;;
    --buffered) direct=0; shift ;;
    --random) pattern=randrw; shift ;;
    --io-size) need "$@"; io_arg=$2; shift 2 ;;
    --runtime) need "$@"; runtime=$2; shift 2 ;;
    --fio) need "$@"; fio=$2; shift 2 ;;
    *) die "unknown option '$1' (--help lists them)" ;;
  esac
done
command -v python3 > /dev/null || die "needs python3 (to read fio's JSON)"
[[ $bs =~ ^[0-9]+$ ]] && [ "$bs" -ge 512 ] && [ $((bs % 512)) = 0 ] ||
  die "--bs '$bs': a multiple of 512 bytes"
[[ $qd =~ ^[0-9]+$ ]] || die "--iodepth '$qd': a count (0: the tier's default, 64)"
[ "$qd" = 0 ] && qd=64
[[ $runtime =~ ^[0-9]+$ ]] || die "--runtime '$runtime': whole seconds"
# The read share in whole percent, and the job's kind.
pct=$(python3 -c '
import sys
try:
    v = float(sys.argv[1])
except ValueError:
    sys.exit(1)
if not 0.0 <= v <= 1.0:
    sys.exit(1)
print(int(round(100 * v)))' "$share") || die "READ_SHARE '$share': a number from 0 to 1"
bytes_of() {
  python3 -c '
import re, sys
m = re.fullmatch(r"([0-9]+)\s*([KMGT]?)(i?B)?", sys.argv[1], re.I)
if not m:
    sys.exit(1)
print(int(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))' "$1"
}
size=$(bytes_of "$size_arg") ||
  die "SIZE '$size_arg': bytes, or a number with K, M, G or T (256M, 4GiB)"
size=$((size / bs * bs))
[ "$size" -gt 0 ] || die "SIZE '$size_arg' is less than one block of $bs bytes"
io=$size
if [ -n "$io_arg" ]; then
  io=$(bytes_of "$io_arg") || die "--io-size '$io_arg': bytes, or a number with K, M, G or T"
  io=$((io / bs * bs))
  [ "$io" -gt 0 ] || die "--io-size '$io_arg' is less than one block of $bs bytes"
fi
[ -d "$dir" ] && [ -w "$dir" ] || die "'$dir' is not a directory this user can write in"
avail=$(df -P -B1 "$dir" | awk 'NR == 2 { print $4 }')
[ -n "$avail" ] && [ "$avail" -lt "$size" ] &&
  die "$dir has $avail bytes free, less than the $size the job's file needs"
staged=$(cd "$(dirname "$0")/.." && pwd)/.deps/fio
if [ -z "$fio" ]; then
  fio=$(command -v fio) || { [ -x "$staged" ] && fio=$staged; } || {
    echo "disk-ceiling: no fio on PATH (and no \$FIO, no $staged): install it (apt-get" \
      "install fio, as tools/deps.sh does), build one (tools/fio-stage.sh) or give --fio PATH" >&2
    exit 3
  }
fi
[ -x "$fio" ] || { echo "disk-ceiling: fio '$fio' is not an executable" >&2; exit 3; }
case $pct in
  0) rw=write ;;
  100) rw=read ;;
  *) rw=$pattern ;;
esac
[ "$rw" = read ] && [ "$pattern" = randrw ] && rw=randread
[ "$rw" = write ] && [ "$pattern" = randrw ] && rw=randwrite

file=$dir/tierzero-ceiling-$$.bin
out=$(mktemp) err=$(mktemp)
cleanup() { rm -f "$file" "$out" "$err"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
job=(--name=ceiling "--filename=$file" --ioengine=io_uring "--direct=$direct" "--rw=$rw"
     "--bs=$bs" "--iodepth=$qd" "--size=$size" "--io_size=$io" --numjobs=1 --fixedbufs
     --registerfiles --output-format=json)
case $rw in *rw) job+=("--rwmixread=$pct") ;; esac
[ "$runtime" -gt 0 ] && job+=(--time_based "--runtime=$runtime")
"$fio" "${job[@]}" > "$out" 2> "$err"
rc=$?
if [ $rc != 0 ]; then
  echo "disk-ceiling: $fio ${job[*]} failed (status $rc):" >&2
  cat "$err" "$out" >&2
  exit 1
fi
python3 - "$out" "$dir" "$size" "$io" "$bs" "$qd" "$rw" "$pct" "$share" "$direct" <<'PY'
import json, sys
path, d, size, io, bs, qd, rw, pct, share, direct = sys.argv[1:]
text = open(path).read()
# fio may print notes before its JSON.
o = json.loads(text[text.index("{"):])
j = o["jobs"][0]
if j.get("error"):
    sys.exit("disk-ceiling: fio's job failed with error %s" % j["error"])
r, w = j["read"], j["write"]
rb, wb = r["io_bytes"], w["io_bytes"]
runtime_ms = j.get("job_runtime") or max(r["runtime"], w["runtime"])
res = {
    "read_gbs": r["bw_bytes"] / 1e9, "write_gbs": w["bw_bytes"] / 1e9,
    "total_gbs": (r["bw_bytes"] + w["bw_bytes"]) / 1e9,
    "read_bytes": rb, "write_bytes": wb,
    "read_share": rb / (rb + wb) if rb + wb else None,
    "runtime_s": runtime_ms / 1000.0,
    "dir": d, "size": int(size), "io_size": int(io), "bs": int(bs), "iodepth": int(qd), "rw": rw,
    "rwmixread": int(pct), "read_share_asked": float(share), "direct": int(direct),
    "ioengine": "io_uring", "fio": o.get("fio version"),
}
print(json.dumps(res))
PY
