#!/bin/sh
# Export writes back the config.json the model came with (issue 62), changed only where the trained
# model differs, each change said: a Llama from transformers' directory trained at --seq 16 (its
# max_position_embeddings 32 kept: RoPE has no weights of positions), resumed once (the checkpoint
# carries the file), exported as bf16, is transformers' config.json to the byte-for-byte JSON value;
# as f32 (train --save) only its dtype differs, said; a mixture of experts trained without its
# auxiliary loss says output_router_logits true -> false.
set -e
B="$1"; D="$2"; R="$3"
rm -rf "$D"; mkdir -p "$D"; cd "$D"
run="--batch 4 --threads 1 --print-every 100 --save-dir ck --lr-decay-steps 4"
"$B" train --init "$R/hf_llama_tiny" --seq 16 --steps 2 $run >a.out 2>&1 || { cat a.out; exit 1; }
"$B" train --steps 4 --resume auto --save out_f32 $run >b.out 2>&1 || { cat b.out; exit 1; }
grep -q "^saved out_f32; config.json: $R/hf_llama_tiny/config.json's, changed: dtype \"bfloat16\" -> \"float32\"$" b.out ||
  { cat b.out; exit 1; }
"$B" export ck/step_00000004 --out out_bf16 --dtype bf16 >c.out
grep -q "^wrote out_bf16; config.json: $R/hf_llama_tiny/config.json's as it was$" c.out || { cat c.out; exit 1; }
python3 - "$R/hf_llama_tiny/config.json" <<'PY'
import json, sys
orig = json.load(open(sys.argv[1]))
bf16, f32 = json.load(open("out_bf16/config.json")), json.load(open("out_f32/config.json"))
assert bf16 == orig, sorted(set(bf16.items()) ^ set(orig.items()) if False else [k for k in set(bf16) | set(orig) if bf16.get(k) != orig.get(k)])
assert {k for k in set(f32) | set(orig) if f32.get(k) != orig.get(k)} == {"dtype"} and f32["dtype"] == "float32", f32
print("the exported config.json is transformers' own (max_position_embeddings", bf16["max_position_embeddings"], "kept)")
PY
"$B" train --init "$R/hf_qwen3_moe_tiny" --seq 16 --steps 1 --moe-aux-loss off --batch 4 --threads 1 --save-dir ckm \
  >m.out 2>&1 || { cat m.out; exit 1; }
"$B" export ckm/step_00000001 --out moe >e.out
grep -q "changed: output_router_logits true -> false$" e.out || { cat e.out; exit 1; }
echo "MoE: $(cat e.out)"
