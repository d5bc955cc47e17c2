#!/usr/bin/env python3
"""Writes hf_gpt2_tiny/ and hf_gpt2_tiny.json: a GPT-2 model directory as transformers' own
save_pretrained writes it, and that model's logits and loss as transformers computes them.

Run by hand (not in CI), with transformers installed:
    /work/venv-ref/bin/python tests/reference/make_hf_dir.py

The directory is what `--init DIR` must read from the outside world: config.json in the form this
transformers version writes (its "dtype" field, its defaults), bf16 tensors (converted to f32 on
load), split by max_shard_size into shards with model.safetensors.index.json, tensor names with
the "transformer." prefix and no lm_head (tied). Parameters are random and non-trivial (not
GPT-2's initialisation), so a tensor loaded wrongly moves the logits. The reference forward runs
in float64 from the stored bf16 values, so the C++ test's error is shardlab's own f32 arithmetic.

hf_gpt2_tiny.json: {"tokens": [T+1 ids], "logits": [T][V] for tokens[:T], "loss": mean
cross-entropy of tokens[1:] given tokens[:T]}.
"""
import json
import os
import shutil

import torch
from transformers import GPT2Config, GPT2LMHeadModel

L, C, H, T, V = 2, 32, 2, 32, 256  # the `tiny` preset's shape
here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "hf_gpt2_tiny")

torch.manual_seed(20250601)
config = GPT2Config(n_layer=L, n_embd=C, n_head=H, n_positions=T, n_ctx=T, vocab_size=V, bos_token_id=None,
                    eos_token_id=None)
model = GPT2LMHeadModel(config)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
            p.copy_(1 + 0.2 * torch.randn_like(p))
        elif p.dim() == 1:
            p.copy_(0.1 * torch.randn_like(p))
        else:
            p.copy_(0.3 * torch.randn_like(p))
model = model.to(torch.bfloat16)
shutil.rmtree(out, ignore_errors=True)
model.save_pretrained(out, max_shard_size="40KB")
os.remove(os.path.join(out, "generation_config.json"))  # not the loader's business; keeps the fixture small

reference = GPT2LMHeadModel.from_pretrained(out, dtype=torch.float64).eval()
g = torch.Generator().manual_seed(7)
tokens = torch.randint(0, V, (T + 1,), generator=g)
with torch.no_grad():
    logits = reference(tokens[:T].unsqueeze(0)).logits[0]
loss = torch.nn.functional.cross_entropy(logits, tokens[1:])
with open(os.path.join(here, "hf_gpt2_tiny.json"), "w") as f:
    json.dump({"tokens": tokens.tolist(), "logits": [[round(v, 7) for v in row] for row in logits.tolist()],
               "loss": loss.item()}, f)
    f.write("\n")
print("wrote", out, sorted(os.listdir(out)), "loss", loss.item())
