#!/usr/bin/env bash
# The project's own Python environment: .venv at the project's root (git ignores it), made with
# the python3 on PATH and holding what tierzero's Python tools need that Debian does not package
# (tokenizers and jinja2, for tools/tz-data and its tests). Nothing is installed into the user's
# python3: pip runs in .venv only. Quiet when everything is there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.venv
# The versions tz-data was checked with (0.20.3 to 0.22.2); transformers 4.4x and 5 take these
# too, so the range is no reason for two installs where the user shares them.
tokenizers='tokenizers>=0.20.3,<0.23'
# jinja2 renders chat templates (tz-data's chat formats), as transformers does; 3.1.6 closed the
# sandbox escapes of older versions, and templates from the Hub are code of others.
jinja2='jinja2>=3.1.6,<4'
if [ ! -x "$venv/bin/python" ]; then
  echo "tierzero: making the project's Python environment in $venv" >&2
  python3 -m venv "$venv" || {
    echo "tierzero: python3 -m venv failed: install python3-venv (tools/deps.sh does)" >&2
    exit 1
  }
fi
# A machine without PyPI installs from the wheels tools/venv-stage.sh downloaded (.whl/py).
from=()
if compgen -G "$root/.whl/py/tokenizers-*.whl" > /dev/null; then
  from=(--no-index --find-links "$root/.whl/py")
fi
if ! "$venv/bin/python" -c "import tokenizers, jinja2" 2>/dev/null; then
  echo "tierzero: installing $tokenizers $jinja2 into $venv${from:+ from ${from[2]}}" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${from[@]}" "$tokenizers" \
    "$jinja2" >&2
fi
