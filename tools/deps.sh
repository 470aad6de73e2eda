#!/usr/bin/env bash
# Installs the Debian packages tierzero builds and tests with, those that are missing only.
# Runs apt-get as root, or through sudo.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libnuma-dev liburing-dev libhwloc-dev hwloc libcmocka-dev
      libjansson-dev libopenblas-dev libopenmpi-dev openmpi-bin fio python3
      python3-matplotlib)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "tierzero: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
