#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan, UBSan, coverage of the whole
# library) and runs each in turn for a while, starting from its seed corpus.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]      SECONDS per target (default 60); TARGET: config,
#                                            safetensors, checkpoint, hf_config, hf_dir, packed,
#                                            ... (default: all)
#
# Build directory: $TZ_FUZZ_BUILD (default build-fuzz/ in the repository). What each run finds is
# kept there: fuzz/corpus-<target>/ (inputs that reached new code; the seeds in tests/fuzz/corpus
# are only read) and fuzz/artifacts-<target>/ (inputs that crashed, leaked or hung; replay one
# with build-fuzz/tests/fuzz_<target>_replay FILE, or with the gcc build's binary of that name).
# Needs clang with its runtime libraries: apt-get install clang libclang-rt-14-dev (Debian 12).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
shift || true
build=${TZ_FUZZ_BUILD:-$root/build-fuzz}
cc=${CC:-clang}
command -v "$cc" >/dev/null || { echo "fuzz.sh: $cc not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$root"/tests/fuzz/fuzz_*.c; do
    t=$(basename "$f" .c)
    targets+=("${t#fuzz_}")
  done
fi

# Only the fuzz targets and the sources they reach are built (tests/fuzz/CMakeLists.txt). Warnings
# are not errors here: the gcc build is the warnings gate, and clang 14 does not know every gcc
# flag the build passes (-Wno-format-truncation).
CC=$cc cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTZ_FUZZ=ON \
  -DTZ_SANITIZE=ON -DTZ_WITH_CUDA=OFF -DTZ_WITH_MPI=OFF -DTZ_WERROR=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}") \
  $(printf 'fuzz_%s_replay ' "${targets[@]}") >/dev/null

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in "${targets[@]}"; do
  corpus=$build/fuzz/corpus-$t
  artifacts=$build/fuzz/artifacts-$t
  mkdir -p "$corpus" "$artifacts"
  max_len=4096
  [ "$t" = checkpoint ] && max_len=65536  # rank files hold 4096-byte aligned sections
  seeds=()
  if [ "$t" = hf_config ]; then  # the hub's config.json files the tests import; longrope's are 5 KB
    max_len=16384
    seeds=("$root/tests/data/hf")
  fi
  log=$build/fuzz/$t.log
  echo "fuzz_$t: ${secs}s, log $log"
  if "$build/fuzz/fuzz_$t" "$corpus" "$root/tests/fuzz/corpus/$t" "${seeds[@]}" -max_total_time="$secs" \
      -max_len=$max_len -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" >"$log" 2>&1; then
    result=ok
  else
    result="FAILED (see $log and $artifacts)"
    status=1
  fi
  # The last status line has the coverage; the final stats have the executions.
  cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+' || true)
  execs=$(grep -oE 'stat::number_of_executed_units: +[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  rate=$(grep -oE 'stat::average_exec_per_sec: +[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  echo "fuzz_$t: $result; $execs executions ($rate/s); $cov"
done
exit $status
