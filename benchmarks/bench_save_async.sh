#!/usr/bin/env bash
# The cost of checkpoints to the steps: the same run without checkpoints, with --save-every K written
# synchronously, and with --save-async. Each row: the mean wall time per step over steps 2..N (the
# log's elapsed_s: saves between steps count, the end's save does not), its overhead against the run
# without checkpoints, the time one checkpoint takes to write (a synchronous save's, from the gap it
# leaves; the background one's as the run reports it) and the step's wait per async save.
#
#   bash benchmarks/bench_save_async.sh [--avx2] [--nproc W] [--threads N] [--model gpt2] [--steps N]
#                                       [--every K] [--dir DIR]
#     defaults: 1 rank, 1 thread (the writer thread has the other core), gpt2 (124M parameters: 1.5 GB
#     of checkpoint with AdamW's states), batch 1 x seq 64, 60 steps, --save-every 20, checkpoints under
#     a fresh directory in /work (a real disk, not tmpfs) removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
nproc=1 threads=1 model=gpt2 steps=60 every=20 dir=""
while [ $# -gt 0 ]; do
  case $1 in
    --avx2) export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ;;
    --nproc) nproc=$2; shift ;;
    --threads) threads=$2; shift ;;
    --model) model=$2; shift ;;
    --steps) steps=$2; shift ;;
    --every) every=$2; shift ;;
    --dir) dir=$2; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench_save_async.sh: unknown option '$1' (--help)" >&2; exit 1 ;;
  esac
  shift
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d "${dir:-$PWD}/.bench-save-XXXXXX")
trap 'rm -rf "$work"' EXIT
run=(build/shardlab train --nproc "$nproc" --threads "$threads" --model "$model" --batch "$nproc" --seq 64
     --steps "$steps" --schedule constant --print-every 100000 --sgemm-ceiling off)
echo "# $model, $nproc rank(s) x $threads thread(s), $steps steps, checkpoints every $every; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '| %-22s | %12s | %9s | %16s | %18s |\n' run "ms/step" overhead "checkpoint write" "step's wait / save"
printf '|%s|%s|%s|%s|%s|\n' ------------------------ -------------- ----------- ------------------ --------------------
base=""
for mode in none sync async; do
  extra=()
  [ $mode = none ] || extra=(--save-dir "$work/ck-$mode" --save-every "$every")
  [ $mode = async ] && extra+=(--save-async)
  "${run[@]}" "${extra[@]}" --log "$work/$mode.log" >"$work/$mode.out" 2>&1 || { cat "$work/$mode.out"; exit 1; }
  read -r ms write wait < <(python3 - "$work/$mode.log" "$work/$mode.out" "$mode" "$every" <<'PY'
import json, re, sys
log, out, mode, every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
steps = [j for j in map(json.loads, open(log)) if "event" not in j]
e = {j["step"]: j["elapsed_s"] for j in steps}
ms = [j["ms"] for j in steps]
n = max(e)
per = (e[n] - e[1]) / (n - 1) * 1e3
text = open(out).read()
if mode == "async":
    write = [float(x) for x in re.findall(r"complete \(written in ([0-9.]+) s", text)]
    wait = [float(x) for x in re.findall(r"the step waited ([0-9.]+) ms", text)]
    print(f"{per:.1f} {sum(write) / len(write):.2f}s {sum(wait) / len(wait):.1f}ms")
elif mode == "sync":
    # A save's time: the gap after a saving step beyond that step's own time.
    gaps = [e[s + 1] - e[s] - ms[s] / 1e3 for s in range(every, n, every) if s + 1 in e]
    print(f"{per:.1f} {sum(gaps) / len(gaps):.2f}s -")
else:
    print(f"{per:.1f} - -")
PY
)
  [ -n "$base" ] || base=$ms
  over=$(python3 -c "print(f'{($ms / $base - 1) * 100:+.1f}%')")
  printf '| %-22s | %12s | %9s | %16s | %18s |\n' "$mode" "$ms" "$over" "$write" "$wait"
done
