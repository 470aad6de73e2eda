#!/usr/bin/env bash
# Downloads the wheels tools/venv.sh installs into the project's .venv (tokenizers, jinja2 and
# what they need; the versions venv.sh asks for) for CPython 3.10 to 3.13, manylinux x86_64, so
# that a machine without PyPI (the GPU machine) makes .venv from them: venv.sh installs from the
# folder, offline, where it exists. Run it on a machine with PyPI; carry .whl to the other.
#
#   tools/venv-stage.sh [--dir DIR]      (default: .whl/py in the repository, which git ignores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/.whl/py
while [ $# -gt 0 ]; do
  case $1 in
    --dir) [ $# -ge 2 ] || { echo "venv-stage: --dir needs a value" >&2; exit 2; }; dir=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "venv-stage: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
# the requirements as venv.sh states them, read from it so that the two cannot disagree
reqs=$(sed -n "s/^\(tokenizers\|jinja2\)='\(.*\)'$/\2/p" "$root/tools/venv.sh")
[ "$(echo "$reqs" | wc -l)" = 2 ] || { echo "venv-stage: tools/venv.sh's requirements not found" >&2; exit 1; }
mkdir -p "$dir"
for py in 3.10 3.11 3.12 3.13; do
  # shellcheck disable=SC2086 # one argument a requirement
  python3 -m pip download -q --disable-pip-version-check --only-binary :all: \
    --platform manylinux2014_x86_64 --python-version "$py" -d "$dir" $reqs
done
echo "venv-stage: $(ls "$dir" | wc -l) wheels, $(du -sh "$dir" | cut -f1), in $dir" >&2
