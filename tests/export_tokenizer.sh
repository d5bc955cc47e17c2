#!/usr/bin/env bash
# export_tokenizer.sh BIN TOKENIZER_DIR TEXT WORKDIR — the cli_export_carries_tokenizer test: a
# checkpoint carries the tokenizer its run read, export carries it on (tokenizer.json,
# tokenizer_config.json, generation_config.json, the special ids in config.json), sample finds it
# in either with no --tokenizer and gives the same greedy text from both, and a tokenizer.json
# changed after the save is refused by name.
set -euo pipefail
bin=$1 tok=$2 text=$3 d=$4
rm -rf "$d"
"$bin" train --model tiny --vocab 808 --steps 2 --batch 2 --threads 1 --warmup-steps 0 --data "$text" \
  --tokenizer "$tok" --save-dir "$d/ck" > /dev/null
grep -q '"tokenizer"' "$d/ck/step_00000002/manifest.json"
"$bin" export "$d/ck/step_00000002" --out "$d/hf" > /dev/null
for f in tokenizer.json tokenizer_config.json generation_config.json; do test -s "$d/hf/$f"; done
# The llama3-style fixture's <|begin_of_text|> is 800 and <|end_of_text|> 801.
grep -q '"eos_token_id": 801' "$d/hf/config.json"
grep -q '"bos_token_id": 800' "$d/hf/generation_config.json"
a=$("$bin" sample --resume "$d/ck/step_00000002" --prompt 'Licensed under the' --tokens 5 --top-k 1)
b=$("$bin" sample --init "$d/hf" --prompt 'Licensed under the' --tokens 5 --top-k 1)
test "$a" = "$b"
echo "same: $a"
echo ' ' >> "$d/ck/step_00000002/tokenizer.json"
if "$bin" export "$d/ck/step_00000002" --out "$d/hf2" 2>&1; then echo "export took a changed tokenizer.json"; exit 1; fi
