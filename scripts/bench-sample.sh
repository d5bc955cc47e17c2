#!/bin/sh
# ms per sampled token of `shardlab sample`: (wall time for N tokens - wall time for 0) / N, the
# best of R runs each, so loading the model and printing are not counted. Usage:
#   scripts/bench-sample.sh BINARY N R SAMPLE-ARGS...   (e.g. --init m.safetensors --model small --threads 1)
# A binary built before the KV cache existed takes the same arguments; "--kv-cache false" in the
# arguments measures the whole-forward path of a newer one.
set -eu
bin=$1 n=$2 runs=$3
shift 3
best() {  # best wall time in ms of R runs of: sample --tokens $1 ARGS
  tokens=$1
  shift
  b=""
  i=0
  while [ "$i" -lt "$runs" ]; do
    t0=$(date +%s%N)
    "$bin" sample --tokens "$tokens" "$@" >/dev/null
    t=$((($(date +%s%N) - t0) / 1000))
    if [ -z "$b" ] || [ "$t" -lt "$b" ]; then b=$t; fi
    i=$((i + 1))
  done
  echo "$b"
}
t0=$(best 0 "$@")
tn=$(best "$n" "$@")
awk -v a="$t0" -v b="$tn" -v n="$n" 'BEGIN { printf "%.3f ms/token (%d tokens: %.1f ms, 0 tokens: %.1f ms)\n", (b - a) / 1000 / n, n, b / 1000, a / 1000 }'
