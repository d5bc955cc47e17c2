#!/bin/sh
# shardlab tokenize (issue 62): text files to llm.c shards that train reads as it reads the text.
#  - With no end-of-text token and no validation shard, the train shards hold exactly the tokens of
#    train's own text path (--data FILES --tokenizer T): the same losses, bit for bit, and the same
#    shards read 61 bytes at a time (every block cut where the tokenizer cuts anyway).
#  - With one: the validation shard is the stream's first --val-tokens, the end-of-text id opens each
#    document, and the rest is the same tokens.
#  - Shards already there are refused, named; --overwrite replaces them.
#  - A run on a pattern of shards that gains one resumes with --allow-data-growth (noted), and is
#    refused without it, naming the flag.
set -e
B="$1"; D="$2"; T="$3"
rm -rf "$D"; mkdir -p "$D"; cd "$D"
python3 - <<'PY'
import random
r = random.Random(7)
words = "the quick brown fox jumps over lazy dog shard rank gather scatter tensor pipeline 12 345".split()
for d in range(3):
    with open(f"doc{d}.txt", "w") as f:
        for l in range(300):
            f.write(" ".join(r.choice(words) for _ in range(r.randint(3, 12))) + (".\n" if l % 5 else "\n\n"))
PY
"$B" tokenize 'doc*.txt' --out plain --tokenizer "$T" --eot none --shard-tokens 3000 >plain.out
SHARDLAB_TOKENIZE_BLOCK_BYTES=61 "$B" tokenize 'doc*.txt' --out small --tokenizer "$T" --eot none --shard-tokens 3000 >small.out
for f in plain/*.bin; do cmp "$f" "small/$(basename "$f")"; done
[ "$(ls plain | wc -l)" = "$(ls small | wc -l)" ]
echo "the same shards read 61 bytes at a time: $(ls plain | wc -l) files"
base="--model tiny --vocab 701 --seq 32 --batch 4 --warmup-steps 1 --threads 1 --sgemm-ceiling off --print-every 100000"
run="$base --steps 3"
"$B" train $run --data 'doc*.txt' --tokenizer "$T" --log text.jsonl >/dev/null
"$B" train $run --data 'plain/data_train_*.bin' --log bin.jsonl >/dev/null
python3 - <<'PY'
import json
def losses(f): return [j["loss"] for j in map(json.loads, open(f)) if "loss" in j]
a, b = losses("text.jsonl"), losses("bin.jsonl")
assert len(a) == 3 and a == b, (a, b)
print("losses of the text and of its shards identical:", a)
PY
"$B" tokenize 'doc*.txt' --out eot --tokenizer "$T" --shard-tokens 3000 --val-tokens 1000 >eot.out
python3 - <<'PY'
import glob, struct
def read(f):
    b = open(f, "rb").read()
    magic, ver, n = struct.unpack("<3i", b[:12])
    assert magic == 20240520 and ver == 1 and len(b) == 1024 + 2 * n, (f, magic, ver, n, len(b))
    return list(struct.unpack(f"<{n}H", b[1024:]))
plain = [t for f in sorted(glob.glob("plain/data_train_*.bin")) for t in read(f)]
val = read("eot/data_val_000000.bin")
train = [t for f in sorted(glob.glob("eot/data_train_*.bin")) for t in read(f)]
assert not glob.glob("plain/data_val_*") and len(val) == 1000, len(val)
stream = val + train
eot = stream[0]
assert stream.count(eot) == 3 and [t for t in stream if t != eot] == plain, (eot, stream.count(eot))
print(f"validation shard: the first 1000 tokens; end-of-text id {eot} before each of 3 documents; the rest the same")
PY
if "$B" tokenize 'doc*.txt' --out eot --tokenizer "$T" >again.out 2>&1; then exit 1; fi
grep -q "tokenize --out eot: it holds 10 shard(s) of --prefix data already (data_train_000001.bin, ...)" again.out || { cat again.out; exit 1; }
"$B" tokenize 'doc*.txt' --out eot --tokenizer "$T" --overwrite --shard-tokens 100000 >over.out
[ "$(ls eot)" = "data_train_000001.bin" ] || { ls eot; exit 1; }
echo "earlier shards refused, then replaced with --overwrite"
# Growth: three shards, then a fourth.
mkdir grow && cp plain/data_train_00000[1-3].bin grow/
set -f  # the pattern in $common is shardlab's to expand
common="$base --lr-decay-steps 8 --data grow/data_train_*.bin --save-dir ck --save-every 2"
"$B" train $common --steps 2 >/dev/null
cp plain/data_train_000004.bin grow/
if "$B" train $common --steps 4 --resume auto >refused.out 2>&1; then exit 1; fi
grep -q "or --allow-data-growth: its 4 files are the checkpoint's followed by 1 new" refused.out || { cat refused.out; exit 1; }
"$B" train $common --steps 4 --resume auto --allow-data-growth >grown.out 2>&1 || { cat grown.out; exit 1; }
grep -q "note: --data grew (--allow-data-growth): 3 files, [0-9]* bytes -> 4 files" grown.out || { cat grown.out; exit 1; }
cp plain/data_train_000005.bin grow/data_train_000000.bin  # a file before the checkpoint's: not growth
if "$B" train $common --steps 6 --resume auto --allow-data-growth >front.out 2>&1; then exit 1; fi
grep -q "not those files, unchanged and first, with more after them" front.out || { cat front.out; exit 1; }
echo "a grown pattern resumes with --allow-data-growth (noted); refused without it, or when a file is not appended"
