#!/usr/bin/env bash
# Installs the dependencies and builds shardlab into build/ (Release, Ninja, CUDA when found).
# Re-running is cheap: packages present are skipped and the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${SHARDLAB_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
# GPT-2's tokenizer files for --tokenizer and its tests (not fatal: without them those tests skip).
bash scripts/fetch-gpt2-tokenizer.sh build/gpt2-tokenizer || echo "setup: GPT-2 tokenizer files not fetched; the [tokenizer] tests will be skipped"
