#!/usr/bin/env bash
# Installs what is missing, then configures and builds tierzero in build/ (Release).
# Extra arguments go to cmake's configure step.
# Where nvidia-smi lists no GPU, the CUDA code is compiled to be checked, not run
# (TZ_CUDA_CHECK_ONLY: unoptimized PTX, about a sixth of the CPU time); -DTZ_CUDA_CHECK_ONLY=OFF
# among the arguments builds it for running all the same.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/tools/deps.sh"
check=OFF
if ! { command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q '^GPU'; }; then
  check=ON
  command -v nvcc > /dev/null &&
    echo "tierzero: no GPU here: the CUDA code is compiled to be checked, not run (TZ_CUDA_CHECK_ONLY)"
fi
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DTZ_CUDA_CHECK_ONLY=$check "$@" >/dev/null
cmake --build "$root/build" -j"$(nproc)"
