#!/usr/bin/env bash
# shardlab against PyTorch (Debian's python3-torch, CPU), same GPT-2 shape, same step, one thread
# each, in one run. Prints both benchmark outputs and a table with the ratio.
#   bash benchmarks/compare_pytorch.sh [L C H T V B]      (default: 4 256 4 128 256 8)
set -euo pipefail
cd "$(dirname "$0")/.."
L=${1:-4} C=${2:-256} H=${3:-4} T=${4:-128} V=${5:-256} B=${6:-8}
STEPS=${STEPS:-10} WARMUP=${WARMUP:-2}
[ -x build/shardlab ] || bash scripts/setup.sh
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "installing python3-torch (Debian) for the comparison"
  apt-get install -y -qq python3-torch > /dev/null
fi
ours=$(build/shardlab bench-train --layers "$L" --dim "$C" --heads "$H" --seq "$T" --vocab "$V" --batch "$B" \
       --threads 1 --steps "$STEPS" --warmup "$WARMUP")
echo "$ours"
theirs=$(OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 /usr/bin/python3 benchmarks/pytorch_gpt2.py "$L" "$C" "$H" "$T" "$V" "$B" \
         "$STEPS" "$WARMUP")
echo "# $theirs"
read -r s_ms s_tok s_gf s_pct <<<"$(echo "$ours" | tail -1 | awk '{print $2, $3, $4, $5}')"
read -r _ p_ms p_tok _ <<<"$theirs"
ceiling=$(echo "$ours" | sed -n 's/.*this model.s shapes: \([0-9.]*\) GFLOP.*/\1/p')
printf '\n# L=%s C=%s H=%s T=%s V=%s batch=%s, 1 thread each, median of %s steps\n' "$L" "$C" "$H" "$T" "$V" "$B" "$STEPS"
printf '%-10s %10s %10s %10s\n' "impl" "ms/step" "tokens/s" "vs torch"
printf '%-10s %10s %10s %9.2fx\n' "shardlab" "$s_ms" "$s_tok" "$(awk -v a="$s_tok" -v b="$p_tok" 'BEGIN { print a / b }')"
printf '%-10s %10s %10s %9.2fx\n' "pytorch" "$p_ms" "$p_tok" 1
printf '# shardlab: %s GFLOP/s = %s of the %s GFLOP/s sgemm ceiling measured above\n' "$s_gf" "$s_pct" "$ceiling"
