#!/usr/bin/env python3
"""Writes hf_llama_tiny/ and hf_llama_tiny.json: a Llama model directory as transformers' own
save_pretrained writes it, and that model's logits and loss as transformers computes them.

Run by hand (not in CI), with transformers installed:
    /work/venv-ref/bin/python tests/reference/make_hf_llama_dir.py

As make_hf_dir.py does for GPT-2: config.json in the form this transformers version writes (its
"rope_parameters" with Llama 3.1's frequency scaling, "dtype", its defaults), bf16 tensors split
into shards with model.safetensors.index.json, grouped-query heads (H/KV = 2), an untied lm_head,
random non-trivial parameters; the reference forward runs in float64 from the stored bf16 values.

hf_llama_tiny.json: {"tokens": [T+1 ids], "logits": [T][V] for tokens[:T], "loss": mean
cross-entropy of tokens[1:] given tokens[:T]}.
"""
import json
import os
import shutil

import torch
from transformers import LlamaConfig, LlamaForCausalLM

L, C, H, KV, F, T, V = 2, 32, 4, 2, 88, 32, 256  # the `llama-tiny` preset's shape
here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "hf_llama_tiny")

torch.manual_seed(20251123)
config = LlamaConfig(num_hidden_layers=L, hidden_size=C, num_attention_heads=H, num_key_value_heads=KV,
                     intermediate_size=F, max_position_embeddings=T, vocab_size=V, rms_norm_eps=1e-5,
                     tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
                     rope_theta=500000.0)
model = LlamaForCausalLM(config)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1 + 0.2 * torch.randn_like(p))
        else:
            p.copy_(0.3 * torch.randn_like(p))
model = model.to(torch.bfloat16)
shutil.rmtree(out, ignore_errors=True)
model.save_pretrained(out, max_shard_size="40KB")
os.remove(os.path.join(out, "generation_config.json"))  # not the loader's business; keeps the fixture small

reference = LlamaForCausalLM.from_pretrained(out, dtype=torch.float64).eval()
g = torch.Generator().manual_seed(11)
tokens = torch.randint(0, V, (T + 1,), generator=g)
with torch.no_grad():
    logits = reference(tokens[:T].unsqueeze(0)).logits[0]
loss = torch.nn.functional.cross_entropy(logits, tokens[1:])
with open(os.path.join(here, "hf_llama_tiny.json"), "w") as f:
    json.dump({"tokens": tokens.tolist(), "logits": [[round(v, 7) for v in row] for row in logits.tolist()],
               "loss": loss.item()}, f)
    f.write("\n")
print("wrote", out, sorted(os.listdir(out)), "loss", loss.item())
