#!/usr/bin/env python3
"""Writes hf_deepseek_v3_tiny/ and hf_deepseek_v3_tiny_nolora/ (DeepSeek-V3 model directories as
transformers' own save_pretrained writes them) and, for each, <name>.safetensors: transformers' own
step on the first batch (the loss and every gradient, float64) and ten AdamW steps' losses.

Run by hand (not in CI), with transformers installed (names: only those models):
    /work/venv/bin/python tests/reference/make_hf_deepseek_v3_dir.py [NAME ...]

The models: DeepseekV3ForCausalLM, 3 layers of 32 channels (layer 0 a dense MLP of 64,
first_k_dense_replace 1; layers 1 and 2 MoE: 8 routed experts of width 24 in 2 groups, topk_group 1,
2 per token, sigmoid scores, norm_topk_prob, routed_scaling_factor 2.5, one shared expert of 24),
multi-head latent attention with 4 heads (kv_lora_rank 16, qk_nope_head_dim 8, qk_rope_head_dim 4,
v_head_dim 6, not the q/k head's 12), interleaved RoPE (rope_theta 1e4, no yarn), a byte vocabulary
(256), 32 positions, untied, no MTP layer. hf_deepseek_v3_tiny has the low-rank query (q_lora_rank
16: q_a_proj, q_a_layernorm, q_b_proj); hf_deepseek_v3_tiny_nolora the same with q_lora_rank null
(one q_proj); hf_deepseek_v3_tiny_yarn the first with RoPE of type yarn (factor 4 over 8 original
positions, mscale = mscale_all_dim = 0.8: RoPE's cos and sin unscaled, the softmax scale times
(0.1 x 0.8 ln 4 + 1)^2). Parameters random and non-trivial (norm weights 1 + 0.2 N(0, 1), matrices and routers
0.3 N(0, 1)), stored in f32; each MoE layer's e_score_correction_bias (a buffer, saved with the
weights) 0.1 N(0, 1), so that the experts chosen differ from those of the unbiased scores. The bias
is no parameter: the optimizer never sees it and it has no gradient (fixed for the ten steps). The
seeds are such that, over the ten steps, no routing choice is close: the k-th and (k + 1)-th biased
scores of the chosen groups, and the chosen and next group's scores, are 1e-4 apart or more.

The objective is the mean cross-entropy of the B x T positions, each predicting the next token of a
T + 1 window (transformers adds no auxiliary loss to DeepSeek-V3). Training: torch.optim.AdamW with
shardlab's defaults (betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on matrices only), constant lr
1e-3, no clipping, in float64, except what transformers computes in f32 however loaded: the routers
(gate.weight is created f32 and stays so, and the router's logits, sigmoid and top-k weights are
computed in f32), the RMSNorms' normalisation and RoPE's angles. Batches as shardlab's loader cuts them without
--shuffle: sequence j is tokens[j T : j T + T + 1], step t's batch sequences t B .. t B + B - 1.

Metadata: hf_config (config.json), tokens (the stream), batch {"B", "T", "steps", "lr"}, ce (per
step, step 1 first), loss_ce (the first step's, in full); tensors "ref.grad.<name>" (every
parameter's gradient of the first step's loss, under the names of model.safetensors: transformers 5
holds each MoE layer's experts as two 3-D tensors, gate_up_proj (E, 2F, C), gate rows first, and
down_proj (E, C, F); the directory one matrix per expert, mlp.experts.e.gate_proj / up_proj /
down_proj.weight).
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
B, T, V, STEPS, LR = 4, 32, 256, 10, 1e-3
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=3,
              first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
              qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, n_routed_experts=8, n_shared_experts=1,
              num_experts_per_tok=2, n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
              rope_interleave=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
              max_position_embeddings=T, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
              eos_token_id=None, num_nextn_predict_layers=0)


def hub_names(model):
    """Every parameter's gradient under the name save_pretrained writes (the experts one matrix each)."""
    out = {}
    for n, p in model.named_parameters():
        g = p.grad.detach().float()
        if n.endswith("mlp.experts.gate_up_proj"):
            F = g.shape[1] // 2
            for e in range(g.shape[0]):
                base = n.replace("experts.gate_up_proj", f"experts.{e}.")
                out[base + "gate_proj.weight"] = g[e, :F].contiguous()
                out[base + "up_proj.weight"] = g[e, F:].contiguous()
        elif n.endswith("mlp.experts.down_proj"):
            for e in range(g.shape[0]):
                out[n.replace("experts.down_proj", f"experts.{e}.down_proj.weight")] = g[e].contiguous()
        else:
            out[n] = g.contiguous()
    return out


def make(name, config, seed):
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if n.endswith("norm.weight") else 0.3 * torch.randn_like(p))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    out = os.path.join(here, name)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    os.remove(os.path.join(out, "generation_config.json"))

    # grouped_mm is f32-only; the eager experts loop runs in f64
    model = DeepseekV3ForCausalLM.from_pretrained(out, dtype=torch.float64, experts_implementation="eager")
    model.train()
    g = torch.Generator().manual_seed(seed + 1)
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
            grads = {"ref.grad." + k: v for k, v in hub_names(model).items()}
        ces.append(ce.item())
        opt.step()
    meta = {"hf_config": open(os.path.join(out, "config.json")).read(), "tokens": json.dumps(tokens.tolist()),
            "batch": json.dumps({"B": B, "T": T, "steps": STEPS, "lr": LR}), "ce": json.dumps(ces),
            "loss_ce": repr(ces[0])}
    save_file(grads, os.path.join(here, name + ".safetensors"), metadata=meta)
    print(name, "ce", ces[0], "->", ces[-1], sorted(os.listdir(out)))


YARN = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.8, "mscale_all_dim": 0.8}


def main(names):
    models = {
        "hf_deepseek_v3_tiny": (DeepseekV3Config(**COMMON, q_lora_rank=16), 20261130),
        "hf_deepseek_v3_tiny_nolora": (DeepseekV3Config(**COMMON, q_lora_rank=None), 20261138),
        # YaRN: frequencies interpolated past 8 original positions (factor 4; of the two rope
        # frequencies one kept, one divided), softmax scale x (0.1 x 0.8 ln 4 + 1)^2.
        "hf_deepseek_v3_tiny_yarn": (DeepseekV3Config(**{**COMMON, "rope_parameters": YARN}, q_lora_rank=16),
                                     20261131),
    }
    for name in names or models:
        config, seed = models[name]
        make(name, config, seed)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
