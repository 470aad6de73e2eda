#!/usr/bin/env bash
# The README's commands leave the user's Python as it was (issue 49 item 5): with a fresh venv of
# the user's first on PATH, tools/deps.sh (which tools/demo.sh and tools/test.sh run) installs
# nothing into it, and tools/tz-data runs from the project's own .venv, not from it (the user's
# venv has no tokenizers). Before, deps.sh pip-installed tokenizers 0.20.3 into the python3 on
# PATH, which in a venv with transformers 5 downgraded huggingface_hub. $1: the project's root.
set -uo pipefail
root=$1
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 > /dev/null || { echo "SKIP: no python3"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/user" 2> /dev/null || { echo "SKIP: python3 -m venv is not installed"; exit 77; }
user=$tmp/user/bin/python
before=$("$user" -m pip freeze --all 2> /dev/null) || fail "pip freeze in the user's venv"
if ! PATH="$tmp/user/bin:$PATH" bash "$root/tools/deps.sh" > "$tmp/deps.out" 2>&1; then
  cat "$tmp/deps.out"
  # a machine without the network (the GPU machine) cannot fetch what deps.sh finds missing
  grep -q "Temporary failure resolving\|Could not resolve host\|Failed to establish a new connection" \
    "$tmp/deps.out" && { echo "SKIP: tools/deps.sh needs the network here, which this machine lacks"; exit 77; }
  fail "tools/deps.sh with the user's venv on PATH"
fi
after=$("$user" -m pip freeze --all 2> /dev/null)
[ "$before" = "$after" ] || fail "the user's venv changed: before [$before] after [$after]"
"$user" -c "import tokenizers" 2> /dev/null && fail "tokenizers was installed into the user's venv"
PATH="$tmp/user/bin:$PATH" "$root/tools/tz-data" --help > "$tmp/help.out" 2>&1 ||
  { cat "$tmp/help.out"; fail "tools/tz-data --help with the user's venv on PATH"; }
grep -q "tokenizer" "$tmp/help.out" || fail "tz-data's help: $(head -3 "$tmp/help.out")"
echo "ok: the user's venv is as it was ($(echo "$before" | wc -l) packages), tz-data runs from .venv"
