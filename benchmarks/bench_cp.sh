#!/usr/bin/env bash
# Context parallelism on this machine: a Llama training step at long sequences over cp 1, 2 and 4
# ranks (--nproc C --cp C, ZeRO-3 over the cp group, one thread per rank unless --threads), each
# printing ms/step, tokens/s, rank 0's peak (the pool's: what the ledger holds), and the time rank 0
# spent in the cp group's collectives (the train log's cp_wait_ms) as a share of the step.
#
#   bash benchmarks/bench_cp.sh [--avx2] [--threads N] [--seqs "4096 16384"] [--cps "1 2 4"]
#                               [--method allgather] [--balance head-tail] [L C H KV F V]
#     default shape L4 C512 H8 KV2 F1408 V256, batch 1; STEPS (4) in the environment, the first
#     step excluded from the medians. More ranks than cores share them: such rows say so.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-4}
threads=1 seqs="4096 16384" cps="1 2 4" method=allgather balance=head-tail shape=()
while [ $# -gt 0 ]; do
  case $1 in
    --avx2) export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ;;
    --threads) threads=$2; shift ;;
    --seqs) seqs=$2; shift ;;
    --cps) cps=$2; shift ;;
    --method) method=$2; shift ;;
    --balance) balance=$2; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) echo "bench_cp.sh: unknown option '$1' (--help)" >&2; exit 1 ;;
    *) shape+=("$1") ;;
  esac
  shift
done
[ ${#shape[@]} -eq 0 ] && shape=(4 512 8 2 1408 256)
[ ${#shape[@]} -eq 6 ] || { echo "bench_cp.sh: the shape is L C H KV F V (6 numbers), got ${#shape[@]}" >&2; exit 1; }
read -r L C H KV F V <<< "${shape[*]}"
exe=build/shardlab
[ -x "$exe" ] || { echo "bench_cp.sh: $exe is missing: run scripts/setup.sh first" >&2; exit 1; }
cores=$(nproc)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rows=()
for T in $seqs; do
  for cp in $cps; do
    cp_flags=(--cp "$cp")  # the method and balance apply from 2 ranks (one rank holds whole sequences)
    [ "$cp" -gt 1 ] && cp_flags+=(--cp-method "$method" --cp-balance "$balance")
    "$exe" train --nproc "$cp" "${cp_flags[@]}" --strategy zero3 \
      --model llama-small --layers "$L" --dim "$C" --heads "$H" --kv-heads "$KV" --ffn-dim "$F" --vocab "$V" \
      --seq "$T" --batch 1 --threads "$threads" --steps "$STEPS" --warmup-steps 1 --sgemm-ceiling off \
      --log "$log" > /dev/null
    rows+=("$(python3 - "$log" "$T" "$cp" "$threads" "$cores" <<'PY'
import json, statistics, sys
path, T, cp, threads, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
steps = [json.loads(l) for l in open(path) if '"loss"' in l][1:]
ms = statistics.median(s["ms"] for s in steps)
wait = statistics.median(s.get("cp_wait_ms", 0.0) for s in steps)
peak = max(s["peak_bytes"] for s in steps) / 2**20
note = " (shares cores)" if cp * threads > cores else ""
print(f"{T:7d} {cp:4d} {ms:10.1f} {T / (ms / 1e3):10.0f} {peak:10.1f} {wait:10.1f} {100 * wait / ms:7.1f}%{note}")
PY
)")
  done
done
echo
echo "# Llama L$L C$C H$H KV$KV F$F V$V, batch 1, zero3 over the cp group, --cp-method $method --cp-balance $balance,"
echo "# $threads thread(s) per rank on $cores cores, ${ONEDNN_MAX_CPU_ISA:-native ISA}; medians of $STEPS steps after the first"
printf "%7s %4s %10s %10s %10s %10s %8s\n" T cp "ms/step" "tok/s" "peak MiB" "cp wait ms" "share"
printf '%s\n' "${rows[@]}"
