#!/usr/bin/env bash
# Training across two hosts of our own (scripts/hosts.sh: network namespaces, TCP over veths; root),
# 2 ranks each, with host 1's link uncapped and capped (tc tbf) at each rate given. Each row: the
# strategy, the cap, median tokens/s and ms/step (steps after the first), the bytes shardlab counts as
# inter-node per step for host 0's ranks (rank 0's inter_node_bytes x ranks per host: the ranks are
# symmetric), and the bytes host 0's veth carried per step each way (the difference between a run of
# STEPS and one of 2 steps, over STEPS - 2: start-up cancels).
#
#   bash benchmarks/bench_hosts.sh [--avx2] [--model small] [--caps "none 10gbit 1gbit"]
#                                  [--runs "ddp zero3 hybrid pp2"] [--batch 8]
#     STEPS (12) in the environment. hybrid = zero3 sharded inside each host (--dp-shard 2), replicated
#     across; pp2 = two pipeline stages, one per host, ddp inside each.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-12}
model=small caps="none 10gbit 1gbit" runs="ddp zero3 hybrid pp2" batch=8
while [ $# -gt 0 ]; do
  case $1 in
    --avx2) export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ;;
    --model) model=$2; shift ;;
    --caps) caps=$2; shift ;;
    --runs) runs=$2; shift ;;
    --batch) batch=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "bench_hosts.sh: unknown option '$1' (--help)" >&2; exit 1 ;;
  esac
  shift
done
export SHARDLAB_HOSTS_TAG=b$(($$ % 100000))
hosts=scripts/hosts.sh
work=$(mktemp -d)
trap '"$hosts" down; rm -rf "$work"' EXIT
"$hosts" up 2 2 >/dev/null
echo "# $model, batch $batch, 2 hosts x 2 ranks (1 thread each), $STEPS steps; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '| %-7s | %-7s | %9s | %9s | %20s | %20s | %20s |\n' run cap "tok/s" "ms/step" "counted inter-node" "veth sent / step" "veth received / step"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' --------- --------- ----------- ----------- ---------------------- ---------------------- ----------------------
for cap in $caps; do
  "$hosts" cap 1 "${cap/none/off}"
  for r in $runs; do
    case $r in
      ddp) flags=(--strategy ddp) ;;
      zero3) flags=(--strategy zero3) ;;
      hybrid) flags=(--strategy zero3 --dp-shard 2) ;;
      pp2) flags=(--strategy ddp --pp 2 --micro-batches 4) ;;
      *) echo "unknown run '$r'" >&2; exit 1 ;;
    esac
    run=(build/shardlab train --nproc 4 --threads 1 --model "$model" --batch "$batch" --print-every 100000
         --sgemm-ceiling off "${flags[@]}")
    read -r rx0 tx0 < <("$hosts" bytes 0)
    "$hosts" run "${run[@]}" --steps 2 --log "$work/short.log" >"$work/out" 2>&1 || { cat "$work/out"; exit 1; }
    read -r rx1 tx1 < <("$hosts" bytes 0)
    "$hosts" run "${run[@]}" --steps "$STEPS" --log "$work/long.log" >"$work/out" 2>&1 || { cat "$work/out"; exit 1; }
    read -r rx2 tx2 < <("$hosts" bytes 0)
    python3 - "$work/short.log" "$work/long.log" "$r" "$cap" $((tx2 - tx1 - tx1 + tx0)) $((rx2 - rx1 - rx1 + rx0)) "$STEPS" <<'PY'
import json, statistics, sys
short, long_, run, cap, sent, got, steps = sys.argv[1:8]
recs = lambda p: [j for j in map(json.loads, open(p)) if "event" not in j]
a, b = recs(short), recs(long_)
n = int(steps) - 2
counted = 2 * (sum(j.get("inter_node_bytes", 0) for j in b) - sum(j.get("inter_node_bytes", 0) for j in a)) / n
tok = statistics.median(j["tokens_per_s"] for j in b[1:])
ms = statistics.median(j["ms"] for j in b[1:])
mb = lambda x: f"{x / 2**20:.2f} MiB"
print(f"| {run:<7} | {cap:<7} | {tok:9.0f} | {ms:9.1f} | {mb(counted):>20} | "
      f"{mb(int(sent) / n) + f' ({int(sent) / n / counted:.3f}x)' if counted else mb(int(sent) / n):>20} | "
      f"{mb(int(got) / n) + f' ({int(got) / n / counted:.3f}x)' if counted else mb(int(got) / n):>20} |")
PY
  done
done
