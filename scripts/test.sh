#!/usr/bin/env bash
# Sets up (scripts/setup.sh, every target: tests, fuzzers, and the CUDA backend wherever nvcc is
# found) and runs every test: unit tests, multi-rank tests under mpirun with 1-4 ranks, CLI tests,
# and the [cuda] tests (reported as skipped where no GPU is visible).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARDLAB_SETUP_TARGET=all SHARDLAB_SETUP_CUDA=AUTO bash scripts/setup.sh
ctest --test-dir build --output-on-failure
