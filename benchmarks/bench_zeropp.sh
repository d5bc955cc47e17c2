#!/usr/bin/env bash
# ZeRO++ on this machine: zero3 on 4 ranks as 2 nodes x 2 (--ranks-per-node 2; --ranks, --per-node) with the link
# between the nodes emulated at a few GB/s (--inter-node-gbs: every collective over ranks on both
# nodes completes no sooner than its bus bytes at that rate), without ZeRO++ and with each lever and
# all three: ms/step, tokens/s, the bytes per rank per step inside and across nodes (the train log),
# and the final loss.
#
#   bash benchmarks/bench_zeropp.sh [--avx2] [--gbs "0.05 0.2"] [--block 256] [--ranks 4 --per-node 2]
#                                   [model flags ...]
#     default model: GPT-2 L4 C256 H4 T128 V512 (--model small --layers 4 --dim 256 --heads 4 --seq 128
#     --vocab 512), batch 8, one thread per rank; STEPS (6) in the environment, the first step excluded
#     from the medians. More ranks than cores share them: compare rows with each other. 0 GB/s: no emulated link.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-6}
gbs="0.05 0.2" block=256 ranks=4 per_node=2 model=()
while [ $# -gt 0 ]; do
  case $1 in
    --avx2) export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ;;
    --gbs) gbs=$2; shift ;;
    --block) block=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --per-node) per_node=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) model+=("$1") ;;
  esac
  shift
done
[ ${#model[@]} -eq 0 ] && model=(--model small --layers 4 --dim 256 --heads 4 --seq 128 --vocab 512 --batch 8)
exe=build/shardlab
[ -x "$exe" ] || { echo "bench_zeropp.sh: $exe is missing: run scripts/setup.sh first" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rows=()
for g in $gbs; do
  for levers in "none" "--quantize-weights int8" "--secondary-shard node" "--quantize-grads int4" "--zeropp"; do
    flags=()
    [ "$levers" != none ] && read -r -a flags <<< "$levers"
    "$exe" train --nproc "$ranks" --strategy zero3 --ranks-per-node "$per_node" --inter-node-gbs "$g" --quantize-block "$block" \
      "${flags[@]}" "${model[@]}" --threads 1 --steps "$STEPS" --warmup-steps 1 --sgemm-ceiling off \
      --log "$log" > /dev/null
    rows+=("$(python3 - "$log" "$g" "$levers" <<'PY'
import json, statistics, sys
path, g, levers = sys.argv[1], float(sys.argv[2]), sys.argv[3]
steps = [json.loads(l) for l in open(path) if '"loss"' in l]
ms = statistics.median(s["ms"] for s in steps[1:])
tok = statistics.median(s["tokens_per_s"] for s in steps[1:])
last = steps[-1]
intra, inter = last.get("intra_node_bytes", 0) / 2**20, last.get("inter_node_bytes", 0) / 2**20
print(f"{g:8.2f} {levers:26s} {ms:10.1f} {tok:10.0f} {intra:11.2f} {inter:11.2f} {last['loss']:10.4f}")
PY
)")
  done
done
echo
echo "# zero3, $ranks ranks as $((ranks / per_node)) nodes x $per_node, ${model[*]}, --quantize-block $block, one thread per rank on $(nproc) cores,"
echo "# ${ONEDNN_MAX_CPU_ISA:-native ISA}; medians of $STEPS steps after the first; bytes: rank 0's last step (bus bytes)"
printf "%8s %-26s %10s %10s %11s %11s %10s\n" "GB/s" levers "ms/step" "tok/s" "intra MiB" "inter MiB" "loss"
printf '%s\n' "${rows[@]}"
