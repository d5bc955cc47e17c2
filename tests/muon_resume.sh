#!/bin/sh
# A Muon checkpoint written under zero3 x 4 (the momentum, AdamW's m and v, in the element shards of
# four ranks) resumes under ddp x 2 and at one rank: the resumed steps' losses equal an
# uninterrupted single-rank run's (1e-5 relative: the iteration in f32, as a bf16 one turns the
# summation order of four ranks' gradients into roundings 2^-8 apart; a lost momentum or second
# moment moves the loss by 1e-3 and more). A resume with another iteration is refused.
set -e
B="$1"; D="$2"
rm -rf "$D"; mkdir -p "$D"
common="--model tiny --batch 8 --optimizer muon --muon-ns-dtype f32 --lr 3e-3 --warmup-steps 2 --print-every 100 --threads 1"
"$B" train $common --steps 6 --log "$D/ref.jsonl" >/dev/null
"$B" train --nproc 4 --strategy zero3 $common --steps 3 --lr-decay-steps 6 --save-dir "$D/ck" >/dev/null
i=0
for layout in "--nproc 2 --strategy ddp" "--nproc 1"; do
  i=$((i+1))
  "$B" train $layout $common --steps 6 --resume "$D/ck/step_00000003" --log "$D/r$i.jsonl" >/dev/null
done
# Another iteration from the next step on is refused, named (the checkpoint records it).
if "$B" train --nproc 1 $common --steps 6 --muon-ns-steps 3 --resume "$D/ck/step_00000003" >"$D/changed.txt" 2>&1; then
  echo "a resume with another --muon-ns-steps ran"; exit 1
fi
grep -q -- "--muon-ns-steps 5 -> 3" "$D/changed.txt" || { cat "$D/changed.txt"; exit 1; }
python3 - "$D" <<'PY'
import json, sys
d = sys.argv[1]
def losses(f): return [json.loads(l)["loss"] for l in open(f) if "loss" in json.loads(l)]
ref = losses(f"{d}/ref.jsonl")
assert len(ref) == 6, ref
for i in (1, 2):
    got = losses(f"{d}/r{i}.jsonl")
    assert len(got) == 3 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, ref[3:])), (i, got, ref)
print("muon checkpoint of zero3 x 4 resumed under ddp x 2 and at one rank: losses", " ".join(f"{x:.6f}" for x in ref[3:]))
PY
