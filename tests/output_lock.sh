#!/bin/sh
# Two live runs given one --log (or --json, --html, --trace): the second is refused before its first
# step, naming the first, and the first's log stays whole: its start record first, no NUL bytes
# (issue 62: the second run's truncation left the first's first ~49 steps as NULs).
set -u
B="$1"; D="$2"
rm -rf "$D"; mkdir -p "$D"
run="$B train --model tiny --batch 2 --threads 1 --sgemm-ceiling off"
$run --steps 1000000 --log "$D/a.jsonl" --json "$D/r.json" >"$D/a.out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q "^step" "$D/a.out" && break; sleep 0.1; done
$run --steps 2 --log "$D/a.jsonl" 2>&1 | grep -o "error: --log '[^']*' is in use by another run (pid $pid"
$run --steps 2 --log "$D/b.jsonl" --json "$D/r.json" 2>&1 | grep -o "error: --json '[^']*' is in use by another run (pid $pid"
kill $pid; wait $pid
python3 - "$D/a.jsonl" <<'PY'
import json, sys
data = open(sys.argv[1], "rb").read()
first = json.loads(data.split(b"\n", 1)[0])
print("first log whole:", first.get("event"), b"\0" not in data)
PY
