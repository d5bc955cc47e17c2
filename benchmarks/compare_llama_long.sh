#!/usr/bin/env bash
# A Llama training step at long sequences, shardlab (bench-train: the fused attention, the chunked
# loss when LOSS_CHUNK is set) against transformers' LlamaForCausalLM with attn_implementation="sdpa"
# (benchmarks/transformers_llama.py), one process each, the same shape, batch and thread count.
# Prints each side's ms/step, tokens/s and peak resident size (the whole process: /usr/bin/time on
# ours, getrusage in Python), then a table with the ratios.
#
#   bash benchmarks/compare_llama_long.sh [--avx2] [--threads N] [--seqs "2048 8192"] [L C H KV F V B]
#     default shape L4 C512 H8 KV2 F1408 V256, batch 1, one thread; --avx2 caps both sides to AVX2 on
#     an AVX-512 host (as compare_attention.sh --avx2). STEPS (3) and WARMUP (1) in the environment.
#   RUNS (1): the two sides in turn this many times per T, a row per pair; then, per T, the median of
#     the pairs' speed ratios with their range, and each side's fastest step (a shared machine moves
#     either side by tens of percent between runs: one pair's ratio says little).
#   PyTorch and transformers: $PYTHON when set, else the venv $SHARDLAB_VENV (default
#   ~/.cache/shardlab/venv-torch; pip install torch transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-3} WARMUP=${WARMUP:-1} RUNS=${RUNS:-1}
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "compare_llama_long.sh: RUNS '$RUNS': expected a positive integer" >&2; exit 1; }
threads=1 seqs="2048 8192" shape=()
while [ $# -gt 0 ]; do
  case $1 in
    --avx2) export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
    --threads) threads=$2; shift ;;
    --seqs) seqs=$2; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "compare_llama_long.sh: unknown option '$1' (--help)" >&2; exit 1 ;;
    *) shape+=("$1") ;;
  esac
  shift
done
[ ${#shape[@]} -eq 0 ] && shape=(4 512 8 2 1408 256 1)
[ ${#shape[@]} -eq 7 ] || { echo "compare_llama_long.sh: the shape is L C H KV F V B (7 numbers), got ${#shape[@]}" >&2; exit 1; }
read -r L C H KV F V B <<< "${shape[*]}"
exe=build/shardlab
[ -x /usr/bin/time ] || { echo "compare_llama_long.sh: /usr/bin/time measures our peak resident size: apt-get install time" >&2; exit 1; }
[ -x "$exe" ] || { echo "compare_llama_long.sh: $exe is missing: run scripts/setup.sh first" >&2; exit 1; }
py=${PYTHON:-${SHARDLAB_VENV:-$HOME/.cache/shardlab/venv-torch}/bin/python}
"$py" -c "import torch, transformers" 2>/dev/null ||
  { echo "compare_llama_long.sh: no Python with torch and transformers at '$py' (set PYTHON)" >&2; exit 1; }
chunk=()
[ -n "${LOSS_CHUNK:-}" ] && chunk=(--loss-chunk "$LOSS_CHUNK")
rows=() summary=()
for T in $seqs; do
  pairs=()
  for run in $(seq "$RUNS"); do
    rss=$(mktemp)
    s=$(/usr/bin/time -f "%M" -o "$rss" "$exe" bench-train --model llama-small --layers "$L" --dim "$C" --heads "$H" \
        --kv-heads "$KV" --ffn-dim "$F" --vocab "$V" --seq "$T" --batch "$B" --threads "$threads" --steps "$STEPS" \
        --warmup "$WARMUP" --strategy ddp "${chunk[@]}")
    ours_kb=$(tail -1 "$rss"); rm -f "$rss"
    p=$(OMP_NUM_THREADS=$threads "$py" benchmarks/transformers_llama.py "$L" "$C" "$H" "$KV" "$F" "$T" "$V" "$B" \
        "$STEPS" "$WARMUP" "$threads")
    echo "$s"; echo "$p"
    ms=$(sed -n 's/.*ms_per_step=\([0-9.]*\).*/\1/p' <<<"$s")
    read -r _ pms _ <<< "$(grep '^transformers ' <<<"$p")"
    prss=$(sed -n 's/.*peak_rss_bytes=\([0-9]*\).*/\1/p' <<<"$p")
    rows+=("$(awk -v T="$T" -v a="$ms" -v b="$pms" -v B="$B" -v r="$ours_kb" -v q="$prss" 'BEGIN {
      printf "%7d %10.1f %10.0f %10.1f %10.0f %8.2fx %9.0f %9.0f %7.2fx", T, a, B * T / (a / 1e3), b, B * T / (b / 1e3),
        b / a, r / 1024, q / 1048576, (r * 1024) / q }')")
    pairs+=("$ms $pms")
  done
  if [ "$RUNS" -gt 1 ]; then
    summary+=("$(printf '%s\n' "${pairs[@]}" | awk '{ printf "%.6f %s %s\n", $2 / $1, $1, $2 }' | sort -g |
      awk -v T="$T" '{ r[NR] = $1; if (NR == 1 || $2 < fa) fa = $2; if (NR == 1 || $3 < fb) fb = $3 }
      END { n = NR; med = n % 2 ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
        printf "# T %d, %d pairs: speed median %.3fx (%.2f-%.2fx); fastest step of each side %.1f / %.1f ms = %.2fx",
          T, n, med, r[1], r[n], fa, fb, fb / fa }')")
  fi
done
echo
echo "# Llama L$L C$C H$H KV$KV F$F V$V, batch $B, $threads thread(s), ${ONEDNN_MAX_CPU_ISA:-native ISA}; median of $STEPS steps after $WARMUP"
printf "%7s %10s %10s %10s %10s %9s %9s %9s %8s\n" T "ours ms" "ours tok/s" "hf ms" "hf tok/s" "speed" "MiB ours" "MiB hf" "memory"
printf '%s\n' "${rows[@]}"
[ ${#summary[@]} -eq 0 ] || printf '%s\n' "${summary[@]}"
