#!/usr/bin/env bash
# Fetches GPT-2's tokenizer into DIR (default build/gpt2-tokenizer) as DIR/gpt2.tiktoken: GPT-2's
# BPE ranks in tiktoken's format, which the openai-whisper sdist on PyPI (0.8 MB) ships as
# whisper/assets/gpt2.tiktoken. Pinned by version and checked by SHA-256; not committed. Used by
# `--tokenizer DIR` (sample, train --sample-every) and the [tokenizer] tests.
set -euo pipefail
dir=${1:-build/gpt2-tokenizer}
sha=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
version=20250625
if [ -f "$dir/gpt2.tiktoken" ] && echo "$sha  $dir/gpt2.tiktoken" | sha256sum -c --quiet 2>/dev/null; then exit 0; fi
command -v pip3 >/dev/null || command -v pip >/dev/null || { echo "fetch-gpt2-tokenizer: pip is not installed" >&2; exit 1; }
pip=$(command -v pip3 || command -v pip)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
timeout 60 "$pip" download --quiet --timeout 10 --retries 1 --no-deps --no-binary :all: "openai-whisper==$version" -d "$tmp" >/dev/null 2>&1 ||
  { echo "fetch-gpt2-tokenizer: pip download openai-whisper==$version failed (is PyPI reachable?)" >&2; exit 1; }
tar xzf "$tmp"/openai_whisper-$version.tar.gz -C "$tmp" "openai_whisper-$version/whisper/assets/gpt2.tiktoken"
echo "$sha  $tmp/openai_whisper-$version/whisper/assets/gpt2.tiktoken" | sha256sum -c --quiet ||
  { echo "fetch-gpt2-tokenizer: gpt2.tiktoken does not have the expected SHA-256" >&2; exit 1; }
mkdir -p "$dir"
cp "$tmp/openai_whisper-$version/whisper/assets/gpt2.tiktoken" "$dir/"
echo "fetch-gpt2-tokenizer: gpt2.tiktoken in $dir"
