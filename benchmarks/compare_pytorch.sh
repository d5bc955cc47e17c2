#!/usr/bin/env bash
# shardlab against PyTorch (2.x from PyPI, CPU) on the same GPT-2 step, one thread per
# rank on each side, in one run: a single rank, then DDP on 2 ranks (shardlab over MPI, PyTorch's
# DistributedDataParallel over gloo, each at twice the batch), then shardlab's ZeRO-3 on 2 ranks
# against its own DDP. Prints every benchmark's output and one table at the end.
#
#   bash benchmarks/compare_pytorch.sh [--avx2] [--sweep] [--single] [L C H T V B]
#   bash benchmarks/compare_pytorch.sh --llama [--avx2] [--single] [L C H KV F T V B]
#   bash benchmarks/compare_pytorch.sh --tp [--avx2] [L C H KV F T V B]
#     L C H T V B  the shape (default 4 256 4 128 256 8: the benchmark shape)
#     --llama      the Llama family instead (benchmarks/pytorch_llama.py against shardlab's
#                  llama preset); its shape adds KV heads and the MLP width F (default
#                  4 512 8 2 1408 256 256 4)
#     --sweep      three shapes instead: 4 256 4 128 256 8, 4 512 8 256 256 4,
#                  2 768 12 512 1024 2
#     --single     one rank only (no DDP and ZeRO-3 rows)
#     --tp         tensor parallelism on 2 ranks, Llama shape as --llama (B default 8, the batch of
#                  the group): shardlab tp 1 x dp 2 (ddp), tp 2, tp 2 --sequence-parallel against
#                  PyTorch DDP and DTensor tensor parallelism (benchmarks/pytorch_tp.py).
#     --avx2       cap both sides to AVX2 on an AVX-512 host: ONEDNN_MAX_CPU_ISA=AVX2,
#                  OPENBLAS_CORETYPE=Haswell, ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2
#                  (PyTorch's PyPI wheels do their products in MKL, which ATen's cap does not reach)
#   STEPS (10) and WARMUP (2) in the environment set the timed and untimed steps.
#   PyTorch: $PYTHON when set, else the venv $SHARDLAB_VENV (default ~/.cache/shardlab/venv-torch),
#   created on first use from PyPI with benchmarks/requirements.txt (about 6 GB with PyTorch's CUDA
#   wheels; outside the repository).
# Ratios: "vs torch" is shardlab's tokens/s over PyTorch's in the same configuration; the ZeRO-3
# row's is its step time over shardlab DDP's. "%ceiling" is shardlab's GFLOP/s per rank (6N + 6LCT
# per token) over the best sgemm of the host on that step's products (bench-gemm's ceiling).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-10} WARMUP=${WARMUP:-2}
sweep=0 single=0 llama=0 tp=0 shape=()
while [ $# -gt 0 ]; do
  case $1 in
    --avx2) export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
    --sweep) sweep=1 ;;
    --single) single=1 ;;
    --llama) llama=1 ;;
    --tp) tp=1 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    -*) echo "compare_pytorch.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) shape+=("$1") ;;
  esac
  shift
done
[ $tp -eq 1 ] && llama=1
arity=6 names="L C H T V B"
[ $llama -eq 1 ] && arity=8 names="L C H KV F T V B"
if [ ${#shape[@]} -ne 0 ] && [ ${#shape[@]} -ne $arity ]; then
  echo "compare_pytorch.sh: a shape is $arity numbers $names, got '${shape[*]}'" >&2
  exit 2
fi
if [ $tp -eq 1 ] && [ $((sweep + single)) -ne 0 ]; then
  echo "compare_pytorch.sh: --tp runs its own rows on 2 ranks; it takes no --sweep or --single" >&2
  exit 2
fi
if [ $sweep -eq 1 ] && [ $llama -eq 1 ]; then
  echo "compare_pytorch.sh: --sweep is GPT-2's three shapes; give --llama one shape instead" >&2
  exit 2
fi
if [ $sweep -eq 1 ]; then
  shapes=("4 256 4 128 256 8" "4 512 8 256 256 4" "2 768 12 512 1024 2")
elif [ ${#shape[@]} -eq $arity ]; then
  shapes=("${shape[*]}")
elif [ $tp -eq 1 ]; then
  shapes=("4 512 8 2 1408 256 256 8")
elif [ $llama -eq 1 ]; then
  shapes=("4 512 8 2 1408 256 256 4")
else
  shapes=("4 256 4 128 256 8")
fi

[ -x build/shardlab ] || bash scripts/setup.sh
if [ -z "${PYTHON:-}" ]; then
  venv=${SHARDLAB_VENV:-$HOME/.cache/shardlab/venv-torch}
  PYTHON=$venv/bin/python
  if [ ! -x "$PYTHON" ]; then
    echo "creating $venv from PyPI with benchmarks/requirements.txt (about 6 GB with PyTorch's CUDA wheels)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r benchmarks/requirements.txt
  fi
fi
# DTensor's tensor parallelism and the peers' attention need PyTorch >= 2.3.
"$PYTHON" -c "import torch.distributed.tensor.parallel" 2>/dev/null || {
  echo "compare_pytorch.sh: $PYTHON has no torch.distributed.tensor.parallel (PyTorch >= 2.3 needed; pip install -r benchmarks/requirements.txt)" >&2
  exit 2
}

# "key=value" out of bench-train's "# result" line.
field() { sed -n "s/^# result .*$1=\([0-9.]*\).*/\1/p" <<< "$2"; }
# A bench-train output's GFLOP/s per rank as a share of its ceiling; a / b as "1.23x".
pct_of_ceiling() {
  awk -v g="$(field gflops_per_rank "$1")" -v c="$(field ceiling "$1")" 'BEGIN { printf "%.1f%%", 100 * g / c }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
ours() {  # ours RANKS STRATEGY L C H T V B (KV F in the Llama run's globals)
  local ranks=$1 strategy=$2 L=$3 C=$4 H=$5 T=$6 V=$7 B=$8 nproc=() family=()
  [ "$ranks" -gt 1 ] && nproc=(--nproc "$ranks")
  [ $llama -eq 1 ] && family=(--model llama-small --kv-heads "$KV" --ffn-dim "$F")
  build/shardlab bench-train "${nproc[@]}" "${family[@]}" --strategy "$strategy" --layers "$L" --dim "$C" \
    --heads "$H" --seq "$T" --vocab "$V" --batch "$B" --threads 1 --steps "$STEPS" --warmup "$WARMUP"
}
theirs() {  # theirs RANKS L C H T V B (KV F in the Llama run's globals)
  local ranks=$1 L=$2 C=$3 H=$4 T=$5 V=$6 B=$7
  if [ $llama -eq 1 ]; then
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$PYTHON" benchmarks/pytorch_llama.py "$L" "$C" "$H" "$KV" "$F" "$T" \
      "$V" "$B" "$STEPS" "$WARMUP" "$ranks"
  else
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$PYTHON" benchmarks/pytorch_gpt2.py "$L" "$C" "$H" "$T" "$V" "$B" \
      "$STEPS" "$WARMUP" "$ranks"
  fi
}

if [ $tp -eq 1 ]; then
  read -r L C H KV F T V B <<< "${shapes[0]}"
  label="llama L$L C$C H$H KV$KV F$F T$T V$V B$B"
  common=(--model llama-small --kv-heads "$KV" --ffn-dim "$F" --layers "$L" --dim "$C" --heads "$H" --seq "$T"
          --vocab "$V" --batch "$B" --threads 1 --steps "$STEPS" --warmup "$WARMUP" --strategy ddp)
  torch_env=(env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$PYTHON")
  rows=()
  # tp_row LABEL SHARDLAB_OUTPUT PYTORCH_LINE
  tp_row() {
    local p_ms p_tok
    read -r _ p_ms p_tok _ <<< "$3"
    rows+=("$(printf '%-44s %9s %9s %9s %9s %8s %9s %10s %8s' "$1" "$(field ms_per_step "$2")" \
      "$(field tokens_per_s "$2")" "$p_ms" "$p_tok" "$(ratio "$(field tokens_per_s "$2")" "$p_tok")" \
      "$(pct_of_ceiling "$2")" \
      "$(awk -v b="$(field tp_bytes "$2")" -v d="$(field dp_bytes "$2")" 'BEGIN { printf "%.1f MiB", (b + d) / 1048576 }')" \
      "$(awk -v e="$(field tp_est_ms "$2")" -v d="$(field dp_est_ms "$2")" -v m="$(field ms_per_step "$2")" \
          'BEGIN { printf "%.1f%%", 100 * (e + d) / m }')")")
  }
  out=$(build/shardlab bench-train --nproc 2 "${common[@]}")
  echo "$out"
  isa_ours=$(sed -n 's/^# shardlab train-step benchmark: .*, cpu (\(.*\))$/\1/p' <<< "$out")
  p=$("${torch_env[@]}" benchmarks/pytorch_llama.py "$L" "$C" "$H" "$KV" "$F" "$T" "$V" "$B" "$STEPS" "$WARMUP" 2)
  echo "# $p"
  isa_theirs=$(sed -n 's/.*torch=\([^ ]*\).*isa=\([^ ]*\).*/torch \1, ATen \2/p' <<< "$p")
  tp_row "tp 1 x dp 2 (ddp; torch DDP)" "$out" "$p"
  for sp in "" sp; do
    out=$(build/shardlab bench-train --nproc 2 --tp 2 ${sp:+--sequence-parallel} "${common[@]}")
    echo "$out"
    p=$("${torch_env[@]}" benchmarks/pytorch_tp.py "$L" "$C" "$H" "$KV" "$F" "$T" "$V" "$B" "$STEPS" "$WARMUP" 2 $sp)
    echo "# $p"
    tp_row "tp 2${sp:+ --sequence-parallel} (torch DTensor${sp:+ + SP})" "$out" "$p"
  done
  printf '\n# %s; shardlab: %s; pytorch: %s\n' "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)" \
    "$isa_ours" "$isa_theirs"
  printf '# %s, 2 ranks of one thread each (gloo on the PyTorch side), median of %s steps after %s%s\n' "$label" \
    "$STEPS" "$WARMUP" \
    "${ONEDNN_MAX_CPU_ISA:+, capped to AVX2 (ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY MKL_ENABLE_INSTRUCTIONS=$MKL_ENABLE_INSTRUCTIONS)}"
  printf '# comm: shardlab bus bytes per step and rank (tp and data-parallel axes), and their time estimated from an\n'
  printf '# isolated all-reduce of the mean call size (bench-train: the communicators keep no clock)\n'
  printf '%-44s %9s %9s %9s %9s %8s %9s %10s %8s\n' "config" "ms/step" "tokens/s" "torch ms" "torch t/s" "vs torch" \
    "%ceiling" "comm" "comm est"
  printf '%s\n' "${rows[@]}"
  exit 0
fi

rows=()
add_row() {  # add_row CONFIG S_MS S_TOK P_MS P_TOK RATIO PCT
  rows+=("$(printf '%-58s %9s %9s %9s %9s %8s %9s' "$@")")
}
isa_ours="" isa_theirs=""
for s in "${shapes[@]}"; do
  if [ $llama -eq 1 ]; then
    read -r L C H KV F T V B <<< "$s"
    label="llama L$L C$C H$H KV$KV F$F T$T V$V"
  else
    read -r L C H T V B <<< "$s"
    label="L$L C$C H$H T$T V$V"
  fi
  out=$(ours 1 ddp "$L" "$C" "$H" "$T" "$V" "$B")
  echo "$out"
  isa_ours=$(sed -n 's/^# shardlab train-step benchmark: .*, cpu (\(.*\))$/\1/p' <<< "$out")
  p=$(theirs 1 "$L" "$C" "$H" "$T" "$V" "$B")
  echo "# $p"
  isa_theirs=$(sed -n 's/.*isa=\([^ ]*\).*/\1/p' <<< "$p")
  read -r _ p_ms p_tok _ <<< "$p"
  s_ms=$(field ms_per_step "$out") s_tok=$(field tokens_per_s "$out")
  add_row "$label B$B, 1 rank" "$s_ms" "$s_tok" "$p_ms" "$p_tok" "$(ratio "$s_tok" "$p_tok")" "$(pct_of_ceiling "$out")"
  [ $single -eq 1 ] && continue
  B2=$((2 * B))
  ddp=$(ours 2 ddp "$L" "$C" "$H" "$T" "$V" "$B2")
  echo "$ddp"
  p=$(theirs 2 "$L" "$C" "$H" "$T" "$V" "$B2")
  echo "# $p"
  read -r _ p_ms p_tok _ <<< "$p"
  d_ms=$(field ms_per_step "$ddp") d_tok=$(field tokens_per_s "$ddp")
  add_row "$label B$B2, ddp x2" "$d_ms" "$d_tok" "$p_ms" "$p_tok" "$(ratio "$d_tok" "$p_tok")" "$(pct_of_ceiling "$ddp")"
  z3=$(ours 2 zero3 "$L" "$C" "$H" "$T" "$V" "$B2")
  echo "$z3"
  z_ms=$(field ms_per_step "$z3") z_tok=$(field tokens_per_s "$z3")
  add_row "$label B$B2, zero3 x2 (vs our ddp)" "$z_ms" "$z_tok" "-" "-" "$(ratio "$z_ms" "$d_ms")" "$(pct_of_ceiling "$z3")"
done

printf '\n# %s; shardlab: %s; pytorch: %s, BLAS %s\n' "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)" \
  "$isa_ours" "$isa_theirs" "$("$PYTHON" -c 'import torch; c = torch.__config__.show(); print("MKL" if "USE_MKL=ON" in c or "MKL" in c.split("BLAS_INFO=")[-1][:20] else c.split("BLAS_INFO=")[-1].split(",")[0] if "BLAS_INFO=" in c else "?")' 2>/dev/null || echo '?')"
printf '# one thread per rank on each side, median of %s steps after %s%s\n' "$STEPS" "$WARMUP" \
  "${ONEDNN_MAX_CPU_ISA:+, capped to AVX2 (ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY MKL_ENABLE_INSTRUCTIONS=$MKL_ENABLE_INSTRUCTIONS)}"
printf '%-58s %9s %9s %9s %9s %8s %9s\n' "config" "ms/step" "tokens/s" "torch ms" "torch t/s" "vs torch" "%ceiling"
printf '%s\n' "${rows[@]}"
