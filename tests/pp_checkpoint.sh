#!/bin/sh
# A checkpoint written at pp 2 x dp 2 (zero3, GPT-2 tiny with its tied head, 2 micro-batches) resumes
# at pp 1 x dp 4, at pp 4 and at pp 2 x tp 2: the resumed steps' losses equal an uninterrupted
# single-rank run's (1e-6 relative); --save at pp 2 x tp 2 writes the same tensors as at pp 1.
set -e
B="$1"; D="$2"
rm -rf "$D"; mkdir -p "$D"
common="--model tiny --batch 8 --accum 2 --print-every 100 --threads 1"
"$B" train $common --steps 6 --log "$D/ref.jsonl" --save "$D/ref.safetensors" >/dev/null
"$B" train --nproc 4 --pp 2 --strategy zero3 $common --steps 4 --save-dir "$D/ck" --save-every 4 >/dev/null
i=0
for layout in "--nproc 4" "--nproc 4 --pp 4" "--nproc 4 --pp 2 --tp 2"; do
  i=$((i+1))
  "$B" train $layout $common --steps 6 --resume "$D/ck/step_00000004" --log "$D/r$i.jsonl" >/dev/null
done
"$B" train --nproc 4 --pp 2 --tp 2 $common --steps 6 --save "$D/pp.safetensors" >/dev/null
python3 - "$D" <<'PY'
import json, struct, sys
d = sys.argv[1]
def losses(f): return [json.loads(l)["loss"] for l in open(f) if "loss" in json.loads(l)]
ref = losses(f"{d}/ref.jsonl")[4:]
for i in (1, 2, 3):
    got = losses(f"{d}/r{i}.jsonl")
    assert len(got) == 2 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(got, ref)), (i, got, ref)
def tensors(f):
    raw = open(f, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]; out[k] = struct.unpack(f"<{(b - a) // 4}f", raw[8 + n + a:8 + n + b])
    return out
A, Bt = tensors(f"{d}/ref.safetensors"), tensors(f"{d}/pp.safetensors")
assert A.keys() == Bt.keys(), set(A) ^ set(Bt)
worst = max(abs(x - y) for k in A for x, y in zip(A[k], Bt[k]))
assert worst <= 2e-5, worst
print("pp checkpoint resumed at pp 1 x dp 4, pp 4, pp 2 x tp 2; --save under --pp equals pp 1 (max diff %.2g)" % worst)
PY
