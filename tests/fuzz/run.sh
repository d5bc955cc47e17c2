#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (address + undefined-behaviour sanitizers) and runs each
# for FUZZ_SECONDS (default 20: CI's bounded run) from the seed corpus in tests/fuzz/corpus. A crash,
# a sanitizer report or a single allocation over 256 MiB fails the run.
# Longer run (documented): FUZZ_SECONDS=3600 bash tests/fuzz/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_TARGET=${FUZZ_SECONDS:-20}
OUT=build/fuzz
mkdir -p "$OUT"
FLAGS="-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. -DFMT_HEADER_ONLY"
COMMON="src/core/dtype.cpp src/core/check.cpp src/core/rng.cpp src/core/units.cpp src/model/safetensors.cpp"
clang++ $FLAGS tests/fuzz/fuzz_safetensors.cpp $COMMON -o "$OUT/fuzz_safetensors"
# The manifest names its model's family: the registry, every family's folder (src/model/<family>/),
# the HF-directory writer export uses, and the pool the units use; the units' tensor-parallel
# collectives, context parallelism's attention, expert parallelism's dispatch and the operation
# families as traps (tests/fuzz/tp_unreachable.cpp, cp_unreachable.cpp, ep_unreachable.cpp,
# ops_unreachable.cpp: no unit runs here).
MODEL="src/model/spec.cpp src/model/family.cpp src/model/unit.cpp src/model/hf_dir.cpp
$(ls src/model/*/*.cpp | grep -v -e src/model/parallel/cp_attention.cpp -e src/model/parallel/ep.cpp)
memory/pool.cpp memory/ledger.cpp
tests/fuzz/tp_unreachable.cpp tests/fuzz/cp_unreachable.cpp tests/fuzz/ep_unreachable.cpp tests/fuzz/ops_unreachable.cpp"
clang++ $FLAGS tests/fuzz/fuzz_manifest.cpp src/checkpoint/manifest.cpp src/checkpoint/pieces.cpp src/checkpoint/export.cpp $MODEL $COMMON -o "$OUT/fuzz_manifest"
for t in safetensors manifest; do
  mkdir -p "$OUT/corpus_$t"
  cp -n tests/fuzz/corpus/$t/* "$OUT/corpus_$t/" 2>/dev/null || true
  echo "fuzzing $t for ${SECONDS_PER_TARGET}s"
  "$OUT/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -malloc_limit_mb=256 -max_len=65536 \
    "$OUT/corpus_$t" 2>&1 | tail -3
done
echo "fuzzing: no crash"
