#!/usr/bin/env bash
# Expert parallelism on this machine: a mixture-of-experts training step on a fixed world of ranks
# (--nproc W, one thread each unless --threads) at ep 1, 2, 4 (ep must divide W and the experts), the
# rest of the world data-parallel under the strategy (zero3 unless --strategy), the same global
# batch. Each row prints ms/step, tokens/s, rank 0's peak (the pool's: what the ledger holds; under
# --ep it follows the routing), its bus bytes per step, and the time rank 0 spent in the ep group's
# all-to-alls (the train log's ep_wait_ms) as a share of the step.
#
#   bash benchmarks/bench_ep.sh [--avx2] [--threads N] [--world W] [--eps "1 2 4"] [--strategy S]
#                               [--model qwen3-moe-small] [--batch B] [--seq T]
#     defaults: world 4, qwen3-moe-small (L4 C256, 16 experts of 128, top 4), batch 8, its seq 256;
#     STEPS (5) in the environment, the first step excluded from the medians. More ranks than cores
#     share them: such rows say so.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-5}
threads=1 world=4 eps="1 2 4" strategy=zero3 model=qwen3-moe-small batch=8 seq=""
while [ $# -gt 0 ]; do
  case $1 in
    --avx2) export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ;;
    --threads) threads=$2; shift ;;
    --world) world=$2; shift ;;
    --eps) eps=$2; shift ;;
    --strategy) strategy=$2; shift ;;
    --model) model=$2; shift ;;
    --batch) batch=$2; shift ;;
    --seq) seq=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "bench_ep.sh: unknown option '$1' (--help)" >&2; exit 1 ;;
  esac
  shift
done
exe=build/shardlab
[ -x "$exe" ] || { echo "bench_ep.sh: $exe is missing: run scripts/setup.sh first" >&2; exit 1; }
cores=$(nproc)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rows=()
for ep in $eps; do
  "$exe" train --nproc "$world" --ep "$ep" --strategy "$strategy" --model "$model" ${seq:+--seq "$seq"} \
    --batch "$batch" --threads "$threads" --steps "$STEPS" --warmup-steps 1 --sgemm-ceiling off --log "$log" > /dev/null
  rows+=("$(python3 - "$log" "$ep" "$world" "$threads" "$cores" <<'PY'
import json, statistics, sys
path, ep, world, threads, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
steps = [json.loads(l) for l in open(path) if '"loss"' in l][1:]
ms = statistics.median(s["ms"] for s in steps)
tok = statistics.median(s["tokens_per_s"] for s in steps)
wait = statistics.median(s.get("ep_wait_ms", 0.0) for s in steps)
comm = statistics.median(s["comm_bytes"] for s in steps) / 2**20
peak = max(s["peak_bytes"] for s in steps) / 2**20
load = statistics.median(s["expert_imbalance"] for s in steps)
note = " (shares cores)" if world * threads > cores else ""
print(f"{ep:4d} {world // ep:4d} {ms:10.1f} {tok:10.0f} {peak:10.1f} {comm:10.2f} {load:6.2f} {wait:10.1f} {100 * wait / ms:7.1f}%{note}")
PY
)")
done
echo
echo "# $model, batch $batch, $world ranks, $strategy over each ep rank's data-parallel ranks, ep from --eps;"
echo "# $threads thread(s) per rank on $cores cores, ${ONEDNN_MAX_CPU_ISA:-native ISA}; medians of $STEPS steps after the first"
printf "%4s %4s %10s %10s %10s %10s %6s %10s %8s\n" ep edp "ms/step" "tok/s" "peak MiB" "comm MiB" load "a2a ms" "share"
printf '%s\n' "${rows[@]}"
