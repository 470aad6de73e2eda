#!/usr/bin/env bash
# The main job on a built-in default: installs what is missing, builds, then runs
# tz-bench tiers (host<->nvme through the tier API beside fio) in /var/tmp.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/tools/build.sh"
exec "$root/build/bin/tz-bench" tiers --size 256M "$@"
