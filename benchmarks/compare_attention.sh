#!/usr/bin/env bash
# shardlab's attention (forward + backward alone: the fused kernel, and the naive one) against
# PyTorch's scaled_dot_product_attention on the CPU, one point per process on each side, so each
# row's peak resident growth is that point's. Prints both tables, then one with the ratios.
#
#   bash benchmarks/compare_attention.sh [--avx2] [--threads "1 2"] [--seqs "512 2048 8192 16384"]
#                                        [--heads "8 32"] [--head-dims "64 128"]
#     --avx2   cap both sides to AVX2 on an AVX-512 host (ONEDNN_MAX_CPU_ISA=AVX2,
#              OPENBLAS_CORETYPE=Haswell, ATEN_CPU_CAPABILITY=avx2, and MKL_ENABLE_INSTRUCTIONS=AVX2:
#              PyTorch's wheels do their products in MKL, which ATen's cap does not reach)
#   REPEATS (3) and WARMUP (1) in the environment; batch 1, multi-head, f32, causal.
#   PyTorch: $PYTHON when set, else the venv $SHARDLAB_VENV (default ~/.cache/shardlab/venv-torch),
#   as benchmarks/compare_pytorch.sh makes it.
# "vs torch" is PyTorch's forward + backward time over shardlab's fused kernel's (above 1: faster);
# "mem" is shardlab's peak resident growth over PyTorch's.
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-3} WARMUP=${WARMUP:-1}
threads="1 2" seqs="512 2048 8192 16384" heads="8 32" dims="64 128"
while [ $# -gt 0 ]; do
  case $1 in
    --avx2) export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
    --threads) threads=$2; shift ;;
    --seqs) seqs=$2; shift ;;
    --heads) heads=$2; shift ;;
    --head-dims) dims=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "compare_attention.sh: unknown argument '$1' (--help)" >&2; exit 1 ;;
  esac
  shift
done
exe=build/shardlab
[ -x "$exe" ] || { echo "compare_attention.sh: $exe is missing: run scripts/setup.sh first" >&2; exit 1; }
py=${PYTHON:-${SHARDLAB_VENV:-$HOME/.cache/shardlab/venv-torch}/bin/python}
[ -x "$py" ] || { echo "compare_attention.sh: no Python with torch at '$py' (set PYTHON, or run benchmarks/compare_pytorch.sh once to make the venv)" >&2; exit 1; }
rows=()
for th in $threads; do for T in $seqs; do for H in $heads; do for d in $dims; do
  # The fused kernel alone in its process (its peak resident growth is its own), then the naive one.
  s=$("$exe" bench-attention --threads "$th" --seqs "$T" --heads "$H" --head-dims "$d" --kernels flash \
      --repeats "$REPEATS" --warmup "$WARMUP")
  n=$("$exe" bench-attention --threads "$th" --seqs "$T" --heads "$H" --head-dims "$d" --kernels naive \
      --repeats "$REPEATS" --warmup "$WARMUP")
  p=$(OMP_NUM_THREADS=$th "$py" benchmarks/pytorch_sdpa.py --threads "$th" --seqs "$T" --heads "$H" --head-dims "$d" \
      --repeats "$REPEATS" --warmup "$WARMUP")
  echo "$s"; echo "$n"; echo "$p"
  flash=$(awk '$4 == "flash" {print $7}' <<<"$s"); naive=$(awk '$4 == "naive" {print $7}' <<<"$n")
  torch=$(awk '$4 == "sdpa" {print $7}' <<<"$p")
  sm=$(sed -n 's/.*peak_rss_growth_bytes=\([0-9]*\).*/\1/p' <<<"$s"); pm=$(sed -n 's/.*peak_rss_growth_bytes=\([0-9]*\).*/\1/p' <<<"$p")
  rows+=("$(awk -v th="$th" -v T="$T" -v H="$H" -v d="$d" -v f="$flash" -v n="${naive:--}" -v t="$torch" -v sm="$sm" -v pm="$pm" \
    'BEGIN { printf "%7s %7s %6s %5s %10.2f %10s %10.2f %8.2fx %9.1f %9.1f %6.2fx", th, T, H, d, f, n, t, t / f, sm / 1048576, pm / 1048576, (pm > 0 ? sm / pm : 0) }')")
done; done; done; done
echo
echo "# attention forward + backward (ms), causal, f32, batch 1; ${ONEDNN_MAX_CPU_ISA:-native ISA}; best of $REPEATS"
printf "%7s %7s %6s %5s %10s %10s %10s %9s %9s %9s %7s\n" threads T heads hd flash naive torch "vs torch" "MiB ours" "MiB torch" mem
printf '%s\n' "${rows[@]}"
