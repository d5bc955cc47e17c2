#!/usr/bin/env bash
# plan's time model (src/plan/plan_time.hpp) against Narayanan et al. 2021, Table 1 (Megatron-LM
# on Selene, A100 80GB): each row's predicted TFLOP/s per GPU beside the published one, the error,
# and the predicted time split; then the mean and worst |error|. A benchmark, not a test: it needs
# no GPU and runs in well under a second.
#
#   bash benchmarks/plan_validation.sh [--gpu a100-80gb] [--json FILE] [other bench-plan-validation flags]
#   SHARDLAB (build/shardlab) names the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SHARDLAB:-build/shardlab}
[[ -x $bin ]] || { echo "plan_validation.sh: $bin is missing: build first (README, 'Two commands')" >&2; exit 1; }
exec "$bin" bench-plan-validation "$@"
