#!/usr/bin/env bash
# Times a Hugging Face import beside `cat` of the same shards to /dev/null, alternated, and prints
# the best and the median wall time of each and their ratios (issue 22: the import at most 1.3x
# cat, both warm or both cold). The import is `tz-model-check --import CK --read-only`: the config,
# the index and every shard's header checked, then every block read into one buffer as floats
# (what an import does before it stores them). docs/benchmarks.md, "Hugging Face import", has the
# figures.
#
#   tools/bench-import.sh [options] DIR
#
# DIR holds the checkpoint: DIR itself when it has *.safetensors (any Hugging Face checkpoint of
# a family tz-model-check reads), else DIR/ck, made first when missing (a random bf16 Llama of
# the shape below, written by tz-model-check --config DIR/bench-config.json --export DIR/ck); a
# DIR/ck that is there is used whatever its shape.
# Options:
#   --layers N     the shape of docs/benchmarks-history.md (hidden 2048, ffn 8192, vocab 32000,
#                  16 heads)
#                  with N layers (default 20: 1.47 B parameters, 2.9 GB, shards of 1 GB)
#   --8b           Llama-3.1-8B's shape instead (hidden 4096, 32 layers, ffn 14336, 32 heads,
#                  8 kv heads, vocab 128256, llama3 RoPE): 8.03 B parameters, 16.1 GB, shards
#                  of 5 GB
#   --runs N       alternated runs of each (default 6)
#   --cold         drop the page cache (root: /proc/sys/vm/drop_caches) before every run; by
#                  default both are warm: one cat before the first run loads the cache
#   --bin PATH     tz-model-check, or the directory holding it (default: $TZ_BIN, else the
#                  newest of build*/bin and /tmp/tz-build/bin)
# Exit status: 0 when every run worked; the ratios are printed, not judged.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
say() { echo "bench-import: $*" >&2; }
need() { [ $# -ge 2 ] || { say "$1 needs a value"; exit 2; }; }
layers=20 big=0 runs=6 cold=0 bin=${TZ_BIN:-} dir=""
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage 0 ;;
    --layers) need "$@"; layers=$2; shift 2 ;;
    --8b) big=1; shift ;;
    --runs) need "$@"; runs=$2; shift 2 ;;
    --cold) cold=1; shift ;;
    --bin) need "$@"; bin=$2; shift 2 ;;
    -*) say "unknown option '$1'"; usage ;;
    *) [ -z "$dir" ] || { say "one DIR only ('$dir', then '$1')"; usage; }; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || usage
for v in "$layers" "$runs"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { say "'$v' is not a count of at least 1"; exit 2; }
done

# tz-model-check: --bin, $TZ_BIN, else the most recently built one.
if [ -n "$bin" ] && [ -d "$bin" ]; then bin=$bin/tz-model-check; fi
if [ -z "$bin" ]; then
  bin=$(ls -t "$root"/build*/bin/tz-model-check /tmp/tz-build/bin/tz-model-check 2> /dev/null |
        head -n 1)
fi
[ -n "$bin" ] && [ -x "$bin" ] || { say "no tz-model-check (build it, or --bin PATH)"; exit 2; }
if [ "$cold" = 1 ] && [ ! -w /proc/sys/vm/drop_caches ]; then
  say "--cold drops the page cache, which needs root"
  exit 2
fi

# The checkpoint: DIR's own shards, else DIR/ck, written when missing.
mkdir -p "$dir" || exit 1
if compgen -G "$dir/*.safetensors" > /dev/null; then
  ck=$dir
else
  ck=$dir/ck
fi
if ! compgen -G "$ck/*.safetensors" > /dev/null; then
  if [ "$big" = 1 ]; then
    params=8030261248 shard=5000000000
    cat > "$dir/bench-config.json" << 'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
 "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
 "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
 "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128001,
 "torch_dtype": "bfloat16"}
EOF
  else
    # embeddings and head 2 * 32000 * 2048, final norm 2048, a layer 4 * 2048^2 + 3 * 2048 * 8192
    # + 2 * 2048
    params=$((2 * 32000 * 2048 + 2048 + layers * (4 * 2048 * 2048 + 3 * 2048 * 8192 + 2 * 2048)))
    shard=1000000000
    cat > "$dir/bench-config.json" << EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
 "num_hidden_layers": $layers, "intermediate_size": 8192, "vocab_size": 32000,
 "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "hidden_act": "silu", "torch_dtype": "bfloat16"}
EOF
  fi
  bytes=$((2 * params))
  # the shards and their temporary files one at a time, and 1 GB to spare
  avail=$(($(df -Pk "$dir" | awk 'NR == 2 {print $4}') * 1024))
  if [ "$avail" -lt $((bytes + shard + (1 << 30))) ]; then
    say "$dir has $((avail >> 20)) MiB free; the checkpoint needs $((bytes >> 20)) MiB and one" \
        "shard ($((shard >> 20)) MiB) more while it is written"
    exit 1
  fi
  say "writing a random bf16 checkpoint of $params parameters ($((bytes >> 20)) MiB) to $ck" \
      "(minutes: it is initialised and cast on one core)"
  "$bin" --config "$dir/bench-config.json" --export "$ck" --dtype bf16 --shard-size "$shard" >&2 ||
    { say "writing the checkpoint failed"; exit 1; }
fi
shards=("$ck"/*.safetensors)
bytes=$(cat "${shards[@]}" | wc -c) # also loads the page cache for the warm runs
mem=$(($(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024))
if [ "$cold" = 0 ] && [ "${mem:-0}" -lt $((bytes + bytes / 4)) ]; then
  say "warning: $((bytes >> 20)) MiB of shards and $((mem >> 20)) MiB of memory available: the" \
      "page cache cannot hold them, so 'warm' runs read the disk too"
fi

# One timed command: "wall CPU others" into the array named $1, others being the CPU time the
# rest of the machine took meanwhile (from /proc/stat): a run beside other work is not a figure.
TIMEFORMAT='%R %U %S'
hz=$(getconf CLK_TCK)
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
timed() {
  local arr=$1 t b0 b1
  shift
  [ "$cold" = 1 ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
  b0=$(busy)
  t=$({ time "$@" > /dev/null 2> "$tmp/err"; } 2>&1) || {
    say "failed: $*"
    cat "$tmp/err" >&2
    exit 1
  }
  b1=$(busy)
  eval "$arr+=(\"$(awk -v b=$((b1 - b0)) -v hz="$hz" '{
    printf "%.3f %.3f %.2f", $1, $2 + $3, b / hz - $2 - $3}' <<< "$t")\")"
}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
cats=() imports=()
echo "checkpoint: $ck, ${#shards[@]} shards, $bytes bytes"
echo "tz-model-check: $bin"
echo "machine: $(nproc) CPUs online, $(uname -r); $(grep -m1 '^model name' /proc/cpuinfo |
      sed 's/.*: //')"
echo "$([ "$cold" = 1 ] && echo cold || echo warm), $runs runs of each, alternated;" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$runs"); do
  timed cats cat "${shards[@]}"
  timed imports "$bin" --import "$ck" --read-only
  printf '  run %d: cat %s, import %s (wall s, CPU s, CPU s of others)\n' "$i" "${cats[-1]}" \
    "${imports[-1]}"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
# best and median (the mean of the middle two of an even count) of column $1 of the lines read
stats() {
  sort -n -k"$1","$1" | awk -v c="$1" '{v[NR] = $c} END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f %.3f", v[1], m}'
}
read -r cb cm <<< "$(printf '%s\n' "${cats[@]}" | stats 1)"
read -r ib im <<< "$(printf '%s\n' "${imports[@]}" | stats 1)"
read -r _ ccpu <<< "$(printf '%s\n' "${cats[@]}" | stats 2)"
read -r _ icpu <<< "$(printf '%s\n' "${imports[@]}" | stats 2)"
read -r _ cot <<< "$(printf '%s\n' "${cats[@]}" | stats 3)"
read -r _ iot <<< "$(printf '%s\n' "${imports[@]}" | stats 3)"
printf '%-8s %10s %10s %14s %17s\n' "" "best (s)" "median (s)" "CPU median (s)" \
  "others' CPU (s)"
printf '%-8s %10s %10s %14s %17s\n' cat "$cb" "$cm" "$ccpu" "$cot" import "$ib" "$im" "$icpu" "$iot"
awk -v a="$ib" -v b="$cb" -v c="$im" -v d="$cm" -v e="$icpu" -v f="$ccpu" 'BEGIN {
  printf "%-8s %9.2fx %9.2fx %13.2fx\n", "ratio", a / b, c / d, (f > 0 ? e / f : 0)}'
