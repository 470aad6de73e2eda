#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test. Tests that need what
# this machine lacks (a GPU, io_uring) report SKIP with the reason.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/tools/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "$root/build" --output-on-failure -j"$(nproc)" "$@"
