#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs every test: unit tests, multi-rank tests under mpirun with
# 1-4 ranks, CLI tests, and the [cuda] tests (reported as skipped where no GPU is visible).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure
