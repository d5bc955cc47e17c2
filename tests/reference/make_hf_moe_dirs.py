#!/usr/bin/env python3
"""Writes hf_qwen3_moe_tiny/ and hf_mixtral_tiny/ (model directories as transformers' own
save_pretrained writes them) and, for each, <name>.safetensors: transformers' own step on the
first batch (its loss terms and every gradient, float64) and ten AdamW steps' losses.

Run by hand (not in CI), with transformers installed:
    /work/venv/bin/python tests/reference/make_hf_moe_dirs.py

The models: 2 layers of 32 channels, 4 query heads sharing 2 K/V heads, 4 experts of width 24,
2 per token, a byte vocabulary (256), 32 positions, untied. Qwen3-MoE with heads of 16 (not
hidden / heads = 8), its q/k norms, and norm_topk_prob false (its default); Mixtral (always
renormalised). Parameters random and non-trivial (norm weights 1 + 0.2 N(0, 1), matrices 0.3 N(0, 1),
routers N(0, 1) so that the top-k choices are clear and stay so for ten steps), stored in f32.

The objective is transformers' with output_router_logits: cross-entropy (mean over the B x T
positions, each position predicting the next token of a T + 1 window) + router_aux_loss_coef x
load_balancing_loss_func over all layers. Training: torch.optim.AdamW with shardlab's defaults
(betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on matrices only), constant lr 1e-3, no clipping, in
float64. Batches as shardlab's loader cuts them without --shuffle: sequence j is
tokens[j T : j T + T + 1], step t's batch sequences t B .. t B + B - 1.

Metadata: hf_config (config.json), tokens (the stream), batch {"B", "T", "steps", "lr"},
ce and aux (per step, step 1 first), and the first step's "loss_ce", "loss_aux"; tensors
"ref.grad.<name>" (every parameter's gradient of the first step's objective).
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
B, T, V, STEPS, LR = 4, 32, 256, 10, 1e-3
COMMON = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              num_experts_per_tok=2, max_position_embeddings=T, tie_word_embeddings=False, rope_theta=1e6,
              router_aux_loss_coef=0.02, output_router_logits=True, bos_token_id=None, eos_token_id=None)


def hub_names(model, mixtral):
    """Every parameter's gradient under the names save_pretrained writes: transformers 5 holds each
    layer's experts as two 3-D tensors (gate_up_proj (E, 2F, C): gate rows first; down_proj (E, C, F)),
    the hub files one matrix per expert (Mixtral: block_sparse_moe.experts.e.w1 / w3 / w2)."""
    out = {}
    for n, p in model.named_parameters():
        g = p.grad.detach().float()
        block = "block_sparse_moe." if mixtral else "mlp."
        if n.endswith("mlp.gate.weight"):
            out[n.replace("mlp.", block)] = g.contiguous()
        elif n.endswith("mlp.experts.gate_up_proj"):
            F = g.shape[1] // 2
            for e in range(g.shape[0]):
                base = n.replace("mlp.experts.gate_up_proj", f"{block}experts.{e}.")
                out[base + ("w1" if mixtral else "gate_proj") + ".weight"] = g[e, :F].contiguous()
                out[base + ("w3" if mixtral else "up_proj") + ".weight"] = g[e, F:].contiguous()
        elif n.endswith("mlp.experts.down_proj"):
            for e in range(g.shape[0]):
                base = n.replace("mlp.experts.down_proj", f"{block}experts.{e}.")
                out[base + ("w2" if mixtral else "down_proj") + ".weight"] = g[e].contiguous()
        else:
            out[n] = g.contiguous()
    return out


def make(name, cls, config, seed):
    mixtral = cls is MixtralForCausalLM
    torch.manual_seed(seed)
    model = cls(config)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif n.endswith("gate.weight"):  # the routers
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    out = os.path.join(here, name)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    os.remove(os.path.join(out, "generation_config.json"))

    model = cls.from_pretrained(out, dtype=torch.float64, experts_implementation="eager")  # grouped_mm is f32-only
    model.train()
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, V, (STEPS * B * T + 1,), generator=g)

    def batch(t):
        seqs = [tokens[j * T: j * T + T + 1] for j in range(t * B, t * B + B)]
        x = torch.stack(seqs)
        return x[:, :T], x[:, 1:]

    def objective(t):
        inputs, targets = batch(t)
        out = model(inputs, output_router_logits=True)
        ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), targets.reshape(-1))
        return ce, out.aux_loss

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    ces, auxes, grads = [], [], {}
    for t in range(STEPS):
        opt.zero_grad()
        ce, aux = objective(t)
        (ce + config.router_aux_loss_coef * aux).backward()
        if t == 0:
            grads = {"ref.grad." + k: v for k, v in hub_names(model, mixtral).items()}
        ces.append(ce.item())
        auxes.append(aux.item())
        opt.step()
    meta = {"hf_config": open(os.path.join(out, "config.json")).read(), "tokens": json.dumps(tokens.tolist()),
            "batch": json.dumps({"B": B, "T": T, "steps": STEPS, "lr": LR}), "ce": json.dumps(ces),
            "aux": json.dumps(auxes), "loss_ce": repr(ces[0]), "loss_aux": repr(auxes[0])}
    save_file(grads, os.path.join(here, name + ".safetensors"), metadata=meta)
    print(name, "ce", ces[0], "->", ces[-1], "aux", auxes[0], "->", auxes[-1])


make("hf_qwen3_moe_tiny", Qwen3MoeForCausalLM,
     Qwen3MoeConfig(**COMMON, head_dim=16, intermediate_size=64, moe_intermediate_size=24, num_experts=4,
                    norm_topk_prob=False, rms_norm_eps=1e-6), 20261126)
make("hf_mixtral_tiny", MixtralForCausalLM,
     MixtralConfig(**COMMON, intermediate_size=24, num_local_experts=4, rms_norm_eps=1e-5), 20261127)
