#!/usr/bin/env bash
# Downloads what the DeepSpeed peer (bench/ds_peer.py) needs on the GPU machine, which has no
# network: DeepSpeed 0.19.8's sdist, wheels of the packages it imports that the GPU image lacks
# or may lack (for CPython 3.10 to 3.13, manylinux x86_64), and Debian bookworm's libaio1 and
# libaio-dev for DeepSpeed's NVMe path. Run it on a machine with PyPI and Debian's archive;
# tools/ds-install.sh installs from the folder on the GPU machine.
#
#   tools/ds-stage.sh [--dir DIR]      (default: .whl/ds in the repository, which git ignores)
#
# Layout: DIR/deepspeed-0.19.8.tar.gz, DIR/wheels/*.whl, DIR/deb/*.deb, and later DIR/built/
# (the wheel with DeepSpeed's ops compiled, from tools/ds-install.sh --build-ops).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/.whl/ds
while [ $# -gt 0 ]; do
  case $1 in
    --dir) [ $# -ge 2 ] || { echo "ds-stage: --dir needs a value" >&2; exit 2; }; dir=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "ds-stage: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
# Any pip will do for downloading; the packages are chosen by the flags, not by this python.
pip=(python3 -m pip)
"${pip[@]}" --version > /dev/null 2>&1 || pip=(/work/pyref/bin/python -m pip)
"${pip[@]}" --version > /dev/null 2>&1 || { echo "ds-stage: no pip" >&2; exit 1; }
dl=("${pip[@]}" download -q --disable-pip-version-check --no-deps)

# Pinned, so that a later stage gets what was checked. DeepSpeed 0.19.8's requirements are
# einops hjson msgpack ninja numpy packaging psutil py-cpuinfo pydantic>=2 torch tqdm; numpy,
# packaging, tqdm and torch come with the GPU image's torch and transformers. transformers'
# HfDeepSpeedConfig needs accelerate. pydantic-core is pinned by pydantic 2.14.4 to 2.50.5.
# setuptools and wheel build the sdist (pip --no-build-isolation) where the image has none.
always="hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
        typing-inspection==0.4.5 typing-extensions==4.16.0"
if_missing="einops==0.8.2 msgpack==1.2.4 psutil==7.2.2 py-cpuinfo==9.0.0 ninja==1.13.2
            accelerate==1.15.0 setuptools==84.2.1 wheel==0.48.0"
mkdir -p "$dir/wheels" "$dir/deb"
echo "ds-stage: deepspeed 0.19.8 (sdist) into $dir" >&2
"${dl[@]}" --no-binary :all: -d "$dir" deepspeed==0.19.8
for py in 3.10 3.11 3.12 3.13; do
  abi=cp${py/./}
  echo "ds-stage: wheels for CPython $py" >&2
  # shellcheck disable=SC2086
  "${dl[@]}" --only-binary :all: --python-version "$py" --implementation cp --abi "$abi" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$dir/wheels" $always $if_missing
done
printf '%s\n' $always > "$dir/wheels/always.txt"
printf '%s\n' $if_missing > "$dir/wheels/if-missing.txt"
echo "ds-stage: libaio1, libaio-dev (Debian bookworm)" >&2
(cd "$dir/deb" && rm -f libaio*.deb && apt-get download libaio1 libaio-dev 2> /dev/null) ||
  { echo "ds-stage: apt-get download libaio1 libaio-dev failed (apt-get update first?)" >&2; exit 1; }
ls -1 "$dir" "$dir/wheels" "$dir/deb" >&2
du -sh "$dir" >&2
