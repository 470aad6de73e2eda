#!/usr/bin/env bash
# Installs the Debian packages tierzero builds and tests with, those that are missing only, and
# the project's own Python environment (.venv: tools/venv.sh) with the packages tools/tz-data
# needs (tokenizers, which Debian does not package, and jinja2). Runs apt-get as root, or through
# sudo; quiet when everything is there.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libnuma-dev liburing-dev libhwloc-dev hwloc libcmocka-dev
      libjansson-dev libopenblas-dev libopenmpi-dev openmpi-bin fio python3
      python3-matplotlib python3-pip python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "tierzero: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# The Python tools' packages go into the project's own environment (.venv), never into the
# python3 of the user's PATH. TZ_DEPS_SYSTEM_ONLY=1: the Debian packages only (.ci/run, which
# starts its builds before the environment's download).
[ "${TZ_DEPS_SYSTEM_ONLY:-0}" = 1 ] || bash "$(dirname "$0")/venv.sh"
