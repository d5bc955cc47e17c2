#!/bin/sh
# A token set in two llm.c shards (the boundary inside a sequence), named as a list or as a pattern,
# trains at 4 ranks to the same losses as the concatenated file; the header says both shards are
# mapped (read in place: one copy per node in the page cache, not a vector per rank). Shuffled, with
# a validation tail cut off the second shard.
set -e
B="$1"; D="$2"
rm -rf "$D"; mkdir -p "$D"
python3 - "$D" <<'PY'
import struct, sys
d = sys.argv[1]
toks = [(i * 31 + (i // 7) * 5 + (i * i) % 13) % 256 for i in range(20011)]
def write(name, t):
    with open(f"{d}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(t), *([0] * 253)))
        f.write(struct.pack(f"<{len(t)}H", *t))
write("all.bin", toks)
write("part_0.bin", toks[:12345])  # 12345 = 385 * 32 + 25: a sequence of 32 straddles the boundary
write("part_1.bin", toks[12345:])
PY
common="--nproc 4 --model tiny --batch 8 --steps 4 --threads 1 --strategy zero3 --shuffle --val-fraction 0.1 --val-every 2 --sgemm-ceiling off"
"$B" train $common --data "$D/all.bin" --log "$D/whole.jsonl" >"$D/whole.out"
"$B" train $common --data "$D/part_0.bin,$D/part_1.bin" --log "$D/list.jsonl" >"$D/list.out"
"$B" train $common --data "$D/part_*.bin" --log "$D/glob.jsonl" >"$D/glob.out"
grep -q "18010 tokens mapped from 2 files" "$D/list.out" || { cat "$D/list.out"; exit 1; }
grep -q "18010 tokens mapped from 2 files" "$D/glob.out" || { cat "$D/glob.out"; exit 1; }
python3 - "$D" <<'PY'
import json, sys
d = sys.argv[1]
def losses(f): return [(j.get("loss"), j.get("val_loss")) for j in map(json.loads, open(f)) if "event" not in j]
whole = losses(f"{d}/whole.jsonl")
assert len(whole) == 4 and whole[1][1] is not None, whole
for name in ("list", "glob"):
    assert losses(f"{d}/{name}.jsonl") == whole, (name, losses(f"{d}/{name}.jsonl"), whole)
print("same losses over the shards as over the concatenated file:", whole)
PY
