#!/usr/bin/env bash
# The main job on its built-in default: installs what is missing, builds, then runs the training
# demo (tz-train without arguments: a tiny Llama on the built-in corpus, parameters streaming from
# host memory, optimizer state on nvme files in a temporary directory).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/tools/build.sh"
exec "$root/build/bin/tz-train" "$@"
