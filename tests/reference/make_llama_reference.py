#!/usr/bin/env python3
"""Writes llama_reference_{untied,tied,scaled}.safetensors: forward and backward of Hugging Face
transformers' own LlamaForCausalLM, the reference tests/test_llama_reference.cpp checks shardlab's
Llama against.

Run by hand (not in CI), with transformers, torch and safetensors installed:
    /work/venv-ref/bin/python tests/reference/make_llama_reference.py

Each case is a small Llama (2 layers of 24 channels, 4 query heads sharing 2 K/V heads of size 6,
so RoPE rotates 3 pairs, and an MLP of 40) with random, non-trivial f32 parameters, run on B=2
sequences of T=7 tokens (odd, to catch kernels that assume even lengths):
  untied  rope_theta 10000, its own lm_head
  tied    rope_theta 500000, lm_head tied to the token embedding
  scaled  rope_theta 10000 with Llama 3.1's rope_scaling (llama3; the three frequencies fall in
          its three bands: kept, interpolated, divided by the factor), untied
The model is converted to float64 and the forward and backward run there from the f32 values, so
the reference is exact to f32 precision and the C++ test's errors are shardlab's own. (HF computes
RoPE's cos and sin in f32 even then, as it always does.) The loss is the mean cross-entropy of
the logits against explicit targets (HF's labels= would shift them by one position).

Contents: parameters under HF's names (f32), "ref.logits" (B*T, V), "ref.loss" (1,),
"ref.grad.<name>" per parameter, "ref.inv_freq" (RoPE's inverse frequencies as HF computed them);
metadata: hf_config (the config.json transformers writes, with its rope_parameters form), tokens,
targets, batch, loss (float64, in full), generator.
"""
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

B, T = 2, 7
SHAPE = dict(vocab_size=64, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-5, pad_token_id=None)
CASES = {
    "untied": dict(max_position_embeddings=16, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "tied": dict(max_position_embeddings=16, tie_word_embeddings=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    # head size 6: wavelengths 2 pi x (1, 10000^(1/3), 10000^(2/3)) = 6.3, 135, 2917 against the
    # bands' edges 256 / 16 = 16 and 256 / 1 = 256.
    "scaled": dict(max_position_embeddings=512, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 16.0,
                                    "original_max_position_embeddings": 256}),
}


def randomise(model, seed):
    """Every parameter non-trivial: matrices N(0, 0.2^2), RMSNorm weights 1 + N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def make_case(name, extra, seed):
    config = LlamaConfig(**SHAPE, **extra)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config)
    randomise(model, seed)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}  # f32, tied ones once
    inv_freq = model.model.rotary_emb.inv_freq.detach().clone()
    model = model.double()
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, config.vocab_size, (B, T), generator=g)
    targets = torch.randint(0, config.vocab_size, (B, T), generator=g)
    logits = model(input_ids=tokens).logits  # (B, T, V), float64
    loss = torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert set(grads) == set(params), (sorted(grads), sorted(params))

    tensors = {n: p.float().contiguous() for n, p in params.items()}
    tensors["ref.logits"] = logits.detach().reshape(B * T, -1).float()
    tensors["ref.loss"] = loss.detach().reshape(1).float()
    tensors["ref.inv_freq"] = inv_freq.float()
    for n, gr in grads.items():
        tensors["ref.grad." + n] = gr.float().contiguous()
    metadata = {
        "hf_config": config.to_json_string(),  # as save_pretrained writes config.json
        "tokens": json.dumps(tokens.flatten().tolist()),
        "targets": json.dumps(targets.flatten().tolist()),
        "batch": json.dumps({"B": B, "T": T}),
        "loss": repr(loss.item()),  # float64, past ref.loss's f32
        "generator": f"tests/reference/make_llama_reference.py, transformers {transformers.__version__}, "
                     f"torch {torch.__version__}, float64",
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"llama_reference_{name}.safetensors")
    save_file(tensors, out, metadata=metadata)
    print(f"wrote {out}: loss {loss.item():.7f}, {sum(p.numel() for p in params.values())} parameters, "
          f"inv_freq {inv_freq.tolist()}")


def main():
    for i, (name, extra) in enumerate(CASES.items()):
        make_case(name, extra, 20260101 + 10 * i)


if __name__ == "__main__":
    main()
