#!/usr/bin/env python3
"""Writes hf_qwen3_tiny/ (a Qwen3 dense model directory as transformers' own save_pretrained writes
it) and hf_qwen3_tiny.safetensors: transformers' own step on the first batch (the loss and every
gradient, float64) and ten AdamW steps' losses.

Run by hand (not in CI), with transformers installed:
    /work/venv/bin/python tests/reference/make_hf_qwen3_dir.py

The model: Qwen3ForCausalLM (per-head RMSNorm of queries and keys before RoPE, no biases), 2 layers
of 32 channels, 4 query heads sharing 2 K/V heads of 16 (not hidden / heads = 8), an MLP of 64, a
byte vocabulary (256), 32 positions, rope_theta 1e6, untied. Parameters random and non-trivial
(norm weights 1 + 0.2 N(0, 1), matrices 0.3 N(0, 1)), stored in f32.

The objective is the mean cross-entropy of the B x T positions, each predicting the next token of a
T + 1 window. Training: torch.optim.AdamW with shardlab's defaults (betas 0.9 / 0.95, eps 1e-8,
weight decay 0.1 on matrices only), constant lr 1e-3, no clipping, in float64. Batches as shardlab's
loader cuts them without --shuffle: sequence j is tokens[j T : j T + T + 1], step t's batch
sequences t B .. t B + B - 1.

Metadata: hf_config (config.json), tokens (the stream), batch {"B", "T", "steps", "lr"}, ce (per
step, step 1 first), loss_ce (the first step's, in full); tensors "ref.grad.<name>" (every
parameter's gradient of the first step's loss).
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
B, T, V, STEPS, LR = 4, 32, 256, 10, 1e-3


def main():
    config = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=T,
                         tie_word_embeddings=False, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(20261128)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if n.endswith("norm.weight") else 0.3 * torch.randn_like(p))
    out = os.path.join(here, "hf_qwen3_tiny")
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    os.remove(os.path.join(out, "generation_config.json"))

    model = Qwen3ForCausalLM.from_pretrained(out, dtype=torch.float64)
    model.train()
    g = torch.Generator().manual_seed(20261129)
    tokens = torch.randint(0, V, (STEPS * B * T + 1,), generator=g)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    ces, grads = [], {}
    for t in range(STEPS):
        x = torch.stack([tokens[j * T: j * T + T + 1] for j in range(t * B, t * B + B)])
        opt.zero_grad()
        ce = torch.nn.functional.cross_entropy(model(x[:, :T]).logits.reshape(-1, V), x[:, 1:].reshape(-1))
        ce.backward()
        if t == 0:
            grads = {"ref.grad." + n: p.grad.detach().float().contiguous() for n, p in model.named_parameters()}
        ces.append(ce.item())
        opt.step()
    meta = {"hf_config": open(os.path.join(out, "config.json")).read(), "tokens": json.dumps(tokens.tolist()),
            "batch": json.dumps({"B": B, "T": T, "steps": STEPS, "lr": LR}), "ce": json.dumps(ces),
            "loss_ce": repr(ces[0])}
    save_file(grads, os.path.join(here, "hf_qwen3_tiny.safetensors"), metadata=meta)
    print("hf_qwen3_tiny ce", ces[0], "->", ces[-1], sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
