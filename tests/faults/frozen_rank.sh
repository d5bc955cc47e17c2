#!/usr/bin/env bash
# A rank frozen with SIGSTOP mid-run: the job must end within --collective-timeout plus some
# seconds, with exit code 5 and one message naming that rank.
# usage: frozen_rank.sh SHARDLAB NP RANK [train options...]
set -u
bin=$1 np=$2 victim=$3
shift 3
timeout_s=3
out=$(mktemp)
"$bin" train --nproc "$np" --model tiny --batch $((2 * np)) --steps 1000000 --print-every 100000 --threads 1 \
  --collective-timeout "$timeout_s" "$@" >"$out" 2>&1 &
job=$!
# Wait until every rank has started stepping, then find the victim by its MPI rank.
pid=""
for _ in $(seq 1 600); do  # up to 60 s: a busy machine starts the ranks late
  sleep 0.1
  for p in $(pgrep -P "$(pgrep -P "$job")"); do  # the ranks: children of mpirun, the --nproc launcher's child
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim"; then pid=$p; fi
  done
  [ -n "$pid" ] && grep -q "^step" "$out" && break
done
[ -n "$pid" ] || { echo "FAIL: rank $victim never started"; cat "$out"; kill $job; exit 1; }
sleep 0.5
start=$(date +%s%N)
kill -STOP "$pid"
wait $job
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$out"
rm -f "$out"
echo "exit code $rc, job ended ${elapsed_ms} ms after SIGSTOP"
[ "$rc" -eq 5 ] || { echo "FAIL: expected exit code 5"; exit 1; }
# Bounded, not timed: the watchdog's 3 s, the launcher's 2 s after the report, the teardown, with room
# for a machine busy with other tests (8.3 s seen under the fuzz test's load; a hang is minutes).
[ "$elapsed_ms" -le $(( (timeout_s + 12) * 1000 )) ] || { echo "FAIL: took too long"; exit 1; }
echo "PASS"
