#!/usr/bin/env bash
# Installs the Debian packages tierzero builds and tests with, those that are missing only, and
# the Python package tools/tz-data needs (tokenizers, pinned; Debian has no package of it) for the
# python3 on PATH, which the tests run. Runs apt-get as root, or through sudo; quiet when
# everything is there.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libnuma-dev liburing-dev libhwloc-dev hwloc libcmocka-dev
      libjansson-dev libopenblas-dev libopenmpi-dev openmpi-bin fio python3
      python3-matplotlib python3-pip)
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
# tools/tz-data's tokenizer library, at the version its tests were written against.
tokenizers=0.20.3
if ! python3 -c "import sys, tokenizers; sys.exit(tokenizers.__version__ != '$tokenizers')" \
    2>/dev/null; then
  echo "tierzero: installing tokenizers==$tokenizers for $(command -v python3)" >&2
  # Debian's python3 is marked externally managed; a user's own python3 (pyenv, venv) is not,
  # and ignores the variable.
  PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q \
    --disable-pip-version-check "tokenizers==$tokenizers" >&2
fi
