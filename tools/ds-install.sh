#!/usr/bin/env bash
# Installs DeepSpeed 0.19.8 for bench/ds_peer.py from what tools/ds-stage.sh downloaded, without
# network (the GPU machine), into a directory that PYTHONPATH then names; nothing else on the
# machine changes.
#
#   tools/ds-install.sh [--build-ops] [--stage DIR] [--site DIR] [--python PY]
#
#   --stage DIR   the staged files (default .whl/ds in the repository)
#   --site DIR    where to install (default $TZ_DS_SITE, else /tmp/ds-site); replaced whole
#   --python PY   the interpreter that will run the peer (default python3): its torch builds
#                 DeepSpeed, and its version picks the wheels (cp311, cp312)
#   --build-ops   compile DeepSpeed's CPU Adam, FusedAdam and async I/O (libaio) once, into a
#                 wheel kept as STAGE/built/deepspeed-0.19.8-<python>-*.whl (at most 16 MiB; with
#                 $OUT set, also copied to $OUT/ds-built so it comes back from the device
#                 machine): later installs take it instead of the sdist and its ops need no JIT
#
# DeepSpeed itself: the built wheel when STAGE/built has one for this python and this torch,
# else the sdist with `pip install --no-build-isolation` and DS_BUILD_OPS=0 (its ops then compile
# on first use: CPU Adam about 45 s). Its dependencies: hjson, pydantic, pydantic-core,
# annotated-types, typing-inspection and typing-extensions always; einops, msgpack, psutil,
# py-cpuinfo, ninja, accelerate, setuptools and wheel only where the python lacks them. Debian's
# libaio (for the NVMe path) is unpacked under SITE/.libaio.
#
# Writes SITE/env.sh, which tools/bench-train.sh sources for its ds-* runners (and prints it):
# PYTHONPATH, PATH (ninja), CPATH, LIBRARY_PATH, LD_LIBRARY_PATH, CFLAGS and LDFLAGS for libaio,
# TORCH_CUDA_ARCH_LIST=9.0 unless set. Ends by importing deepspeed and DeepSpeedCPUAdam's module.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
stage=$root/.whl/ds site=${TZ_DS_SITE:-/tmp/ds-site} py=python3 build=0
die() { echo "ds-install: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case $1 in
    --build-ops) build=1; shift ;;
    --stage | --site | --python)
      [ $# -ge 2 ] || die "$1 needs a value"
      case $1 in --stage) stage=$2 ;; --site) site=$2 ;; --python) py=$2 ;; esac
      shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "ds-install: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
stage=$(cd "$stage" 2> /dev/null && pwd) || die "no staged files in $stage (tools/ds-stage.sh)"
sdist=$stage/deepspeed-0.19.8.tar.gz
[ -f "$sdist" ] && [ -d "$stage/wheels" ] || die "$stage has no deepspeed-0.19.8.tar.gz or wheels/"
case $site in /*) ;; *) site=$PWD/$site ;; esac
[ "$site" != / ] || die "--site / is not a directory to replace"
# Everything the python sees comes from the machine, not from an earlier install's PYTHONPATH.
unset PYTHONPATH
tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])') || die "cannot run $py"
torchv=$("$py" -c 'import torch; print(torch.__version__)' 2> /dev/null) ||
  die "$py cannot import torch: DeepSpeed is built against it"
pip=("$py" -m pip install -q --disable-pip-version-check --no-index --no-deps
     --find-links "$stage/wheels")
export PIP_ROOT_USER_ACTION=ignore
echo "ds-install: $py ($tag, torch $torchv) -> $site" >&2

# A fresh tree beside the old one, swapped in at the end: a failed install leaves the old.
new=$site.new.$$
rm -rf "$new"
mkdir -p "$new"
trap 'rm -rf "$new"' EXIT
mapfile -t always < <(grep -v '^#' "$stage/wheels/always.txt")
mapfile -t maybe < <(grep -v '^#' "$stage/wheels/if-missing.txt")
want=("${always[@]}")
for spec in "${maybe[@]}"; do
  "$py" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "${spec%%==*}" \
    2> /dev/null || want+=("$spec")
done
echo "ds-install: wheels ${want[*]}" >&2
"${pip[@]}" --target "$new" "${want[@]}"

# libaio from Debian's packages, for the async I/O op (the NVMe offload).
aio=$new/.libaio
mkdir -p "$aio"
for deb in "$stage"/deb/libaio1_*.deb "$stage"/deb/libaio-dev_*.deb; do
  [ -f "$deb" ] || die "no $deb: tools/ds-stage.sh downloads libaio1 and libaio-dev"
  # dpkg-deb where the image is Debian's or Ubuntu's; else the archive's data member by hand.
  if command -v dpkg-deb > /dev/null; then
    dpkg-deb -x "$deb" "$aio"
  else
    (d=$(mktemp -d) && cd "$d" && ar x "$deb" && tar -xf data.tar.* -C "$aio" && rm -rf "$d")
  fi || die "cannot unpack $deb"
done
# The paths as they will be after the swap.
inc=$site/.libaio/usr/include lib=$site/.libaio/usr/lib/x86_64-linux-gnu
[ -f "$aio/usr/lib/x86_64-linux-gnu/libaio.so" ] || die "libaio.so is not where it was expected"
cat > "$new/env.sh" << EOF
# DeepSpeed for bench/ds_peer.py, installed by tools/ds-install.sh ($tag, torch $torchv).
export PYTHONPATH=$site\${PYTHONPATH:+:\$PYTHONPATH}
export PATH=$site/bin:\$PATH
export CPATH=$inc\${CPATH:+:\$CPATH}
export LIBRARY_PATH=$lib\${LIBRARY_PATH:+:\$LIBRARY_PATH}
export LD_LIBRARY_PATH=$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export CFLAGS="-I$inc\${CFLAGS:+ \$CFLAGS}"
export LDFLAGS="-L$lib -Wl,-rpath,$lib\${LDFLAGS:+ \$LDFLAGS}"
# FusedAdam's JIT: the H200's architecture, not every one torch knows; DeepSpeed's parser takes
# no architecture-specific entry (9.0a), so the suffix goes.
export TORCH_CUDA_ARCH_LIST=\$(echo "\${TORCH_CUDA_ARCH_LIST:-9.0}" | sed -E 's/([0-9]+\.[0-9]+)[a-z]/\\1/g')
EOF
# Builds see the new tree where the installed one will be: env.sh with $new for $site.
build_env() { sed "s|$site|$new|g" "$new/env.sh"; }

built_wheel() {  # the kept wheel for this python and torch, if any
  local w
  for w in "$stage"/built/deepspeed-0.19.8-"$tag"-*.whl; do
    [ -f "$w" ] && [ "$(cat "$w.torch" 2> /dev/null)" = "$torchv" ] && { echo "$w"; return 0; }
  done
  return 1
}

if [ "$build" = 1 ]; then
  mkdir -p "$stage/built"
  tmp=$(mktemp -d)
  echo "ds-install: building DeepSpeed's ops (cpu_adam, fused_adam, async_io) into a wheel" >&2
  (
    eval "$(build_env)"
    export DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_FUSED_ADAM=1 DS_BUILD_AIO=1
    # Without it DeepSpeed's setup compiles one file at a time.
    export DS_ENABLE_NINJA=1
    # DeepSpeed's setup refuses an nvcc whose CUDA differs from torch's by a minor version
    # (its table of compatible minors ends at 12.9), which its JIT never checks; CUDA keeps
    # minor versions of one major compatible. A different major is refused, as it should be.
    nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
    nv=$("$nvcc" --version 2> /dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    tc=$("$py" -c 'import torch; print((torch.version.cuda or "").split(".")[0])')
    if [ -n "$nv" ] && [ "$nv" = "$tc" ]; then export DS_SKIP_CUDA_CHECK=${DS_SKIP_CUDA_CHECK:-1}; fi
    export MAX_JOBS=${MAX_JOBS:-$(nproc)}
    "$py" -m pip wheel -q --disable-pip-version-check --no-index --no-deps \
      --no-build-isolation -w "$tmp" "$sdist"
  ) >&2 || { rm -rf "$tmp"; die "building the ops failed (output above)"; }
  w=$(ls "$tmp"/deepspeed-0.19.8-*.whl)
  # DeepSpeed compiles its ops with -g: their debug sections are nine tenths of the wheel (24
  # MiB with them). Stripped, and the wheel packed again (wheel pack rewrites its RECORD).
  (
    eval "$(build_env)"
    cd "$tmp" && "$py" -m wheel unpack -d un "$w" > /dev/null &&
      find un -name '*.so' -exec strip --strip-debug {} + &&
      rm -f "$w" && "$py" -m wheel pack -d . un/deepspeed-0.19.8 > /dev/null
  ) >&2 || { rm -rf "$tmp"; die "stripping the built wheel failed"; }
  w=$(ls "$tmp"/deepspeed-0.19.8-*.whl)
  size=$(stat -c %s "$w")
  if [ "$size" -gt $((16 << 20)) ]; then
    rm -rf "$stage/built-oversize" && mkdir -p "$stage/built-oversize" && mv "$w" "$stage/built-oversize/"
    rm -rf "$tmp"
    die "the built wheel is $((size >> 20)) MiB, over 16 MiB: not kept (in $stage/built-oversize)"
  fi
  "$py" - "$w" << 'PY' || { rm -rf "$tmp"; die "the built wheel lacks an op (above)"; }
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["deepspeed/ops/adam/cpu_adam_op", "deepspeed/ops/adam/fused_adam_op",
        "deepspeed/ops/aio/async_io_op"]
lack = [n for n in need if not any(x.startswith(n) and x.endswith(".so") for x in names)]
if lack:
    sys.exit("ds-install: no %s in %s" % (", ".join(lack), sys.argv[1]))
PY
  rm -f "$stage"/built/deepspeed-0.19.8-"$tag"-*.whl*
  mv "$w" "$stage/built/"
  w=$stage/built/$(basename "$w")
  echo "$torchv" > "$w.torch"
  rm -rf "$tmp"
  echo "ds-install: kept $w ($((size >> 10)) KiB)" >&2
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    mkdir -p "$OUT/ds-built" && cp -f "$w" "$w.torch" "$OUT/ds-built/"
    echo "ds-install: copied to $OUT/ds-built: put it in .whl/ds/built/ to keep it" >&2
  fi
fi

if w=$(built_wheel); then
  echo "ds-install: deepspeed from $w (ops built)" >&2
  "${pip[@]}" --target "$new" "$w"
else
  [ -n "$(ls "$stage"/built/*.whl 2> /dev/null)" ] &&
    echo "ds-install: the built wheels in $stage/built are for another python or torch" >&2
  echo "ds-install: deepspeed from $sdist (DS_BUILD_OPS=0: ops compile on first use)" >&2
  (
    eval "$(build_env)"
    DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation --target "$new" "$sdist"
  ) >&2 || die "pip install of $sdist failed"
fi

rm -rf "$site"
mv "$new" "$site"
trap - EXIT
# shellcheck disable=SC1091
. "$site/env.sh"
"$py" -c '
import deepspeed, deepspeed.ops.adam.cpu_adam, pydantic, hjson, accelerate
from transformers.integrations import HfDeepSpeedConfig
print("ds-install: deepspeed %s (%s), pydantic %s" % (deepspeed.__version__,
      deepspeed.__file__, pydantic.VERSION))' >&2 || die "deepspeed does not import from $site"
echo "ds-install: done; for a shell: . $site/env.sh" >&2
cat "$site/env.sh"
