#!/bin/sh
# llm.c token files whose size disagrees with their header are refused (a header promising fewer
# tokens than the file holds, a file one byte too long), and a shard truncated under a running
# train ends it with exit 1 naming the file, not a raw SIGBUS (issue 62).
set -u
B="$1"; D="$2"
rm -rf "$D"; mkdir -p "$D"
python3 - "$D" <<'PY'
import struct, sys
d = sys.argv[1]
toks = [(i * 31 + (i // 7) * 5) % 256 for i in range(200000)]
def write(name, t, promised=None, extra=b""):
    with open(f"{d}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(t) if promised is None else promised, *([0] * 253)))
        f.write(struct.pack(f"<{len(t)}H", *t))
        f.write(extra)
write("ok.bin", toks)
write("fewer.bin", toks[:5000], promised=100)
write("long.bin", toks[:5000], extra=b"\0")
PY
common="--model tiny --batch 2 --threads 1 --sgemm-ceiling off"
for f in fewer long; do
  "$B" train $common --steps 1 --data "$D/$f.bin" >"$D/$f.out" 2>&1
  echo "$f: rc=$? $(grep -o "holds [0-9]* bytes past the [0-9]* tokens its header promises" "$D/$f.out")"
done
"$B" train $common --steps 1000000 --data "$D/ok.bin" >"$D/run.out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q "^step" "$D/run.out" && break; sleep 0.1; done
truncate -s 1024 "$D/ok.bin"
wait $pid
echo "truncated: rc=$? $(grep -o "token file '[^']*ok.bin' changed under the run" "$D/run.out")"
