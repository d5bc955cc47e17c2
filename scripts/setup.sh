#!/usr/bin/env bash
# Installs the dependencies and builds shardlab into build/ (Release, Ninja, CUDA when found).
# Re-running is cheap: packages present are skipped and the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${SHARDLAB_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
