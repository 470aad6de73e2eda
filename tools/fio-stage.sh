#!/usr/bin/env bash
# Builds the fio that tools/disk-ceiling.sh runs on the GPU machine, which has no fio and no
# network: fio 3.33 (Debian bookworm's source), linked statically with its io_uring engine and
# without the engines that need other libraries, into .deps/fio. Run it on a machine with Debian's
# archive and a C compiler, and carry .deps to the GPU machine: tools/disk-ceiling.sh (and so
# tools/bench-train.sh's disk ceiling) takes .deps/fio where no fio is on PATH.
#
#   tools/fio-stage.sh [--out PATH]      (default: .deps/fio in the repository, which git ignores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/.deps/fio
while [ $# -gt 0 ]; do
  case $1 in
    --out) [ $# -ge 2 ] || { echo "fio-stage: --out needs a value" >&2; exit 2; }; out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fio-stage: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
version=3.33
sum=d2410e13e0f379d061d077cc5ae325835bb7c6186aa7bafc1df954cbc9b014fc
url=http://deb.debian.org/debian/pool/main/f/fio/fio_$version.orig.tar.gz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsSL -o "$work/fio.tar.gz" "$url"
echo "$sum  $work/fio.tar.gz" | sha256sum -c --quiet - ||
  { echo "fio-stage: $url: checksum differs" >&2; exit 1; }
tar xzf "$work/fio.tar.gz" -C "$work"
cd "$work/fio-$version"
# Static: the GPU machine's libraries are not this machine's. The engines left out need
# libraries a static link would drag in (RDMA, Gluster, Ceph, HTTP, persistent memory, libnuma).
./configure --build-static --disable-numa --disable-rdma --disable-gfapi --disable-rbd \
  --disable-http --disable-pmem > "$work/configure.log"
make -j"$(nproc)" fio > "$work/make.log" 2>&1 || { tail -20 "$work/make.log" >&2; exit 1; }
./fio --enghelp | grep -qw io_uring || { echo "fio-stage: built without io_uring" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
strip -o "$out" fio
echo "fio-stage: $("$out" --version), static, at $out"
