#!/usr/bin/env python3
"""Writes sdpa_reference.safetensors: PyTorch's scaled_dot_product_attention, forward and backward,
the reference tests/test_flash_attention.cpp checks shardlab's fused attention against.

Run by hand (not in CI), with torch and safetensors installed:
    /work/venv/bin/python tests/reference/make_sdpa_reference.py

One input, two cases: B=2 sequences of T=37 positions (a partial tile at every tile size), 4 query
heads sharing 2 K/V heads (enable_gqa) of 16 channels, random f32 q, k, v and an upstream gradient
dout; causal and not. SDPA runs in float64 from the f32 values (the math path), so the reference is
exact to f32 precision. The log-sum-exp of each query row's scaled scores is computed beside it
from the same float64 tensors (SDPA does not return it).

Contents, f32, PyTorch's layout (B, heads, T, hd): "q", "k", "v", "dout"; per case
("causal", "full"): "<case>.out", "<case>.dq", "<case>.dk", "<case>.dv", and "<case>.lse" (B, H, T).
Metadata: torch version, shape.
"""
import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

B, H, KV, T, HD = 2, 4, 2, 37, 16

g = torch.Generator().manual_seed(20261126)
q = torch.randn(B, H, T, HD, generator=g)
k = torch.randn(B, KV, T, HD, generator=g)
v = torch.randn(B, KV, T, HD, generator=g)
dout = torch.randn(B, H, T, HD, generator=g)
out = {"q": q, "k": k, "v": v, "dout": dout}

for case, causal in (("causal", True), ("full", False)):
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, enable_gqa=True)
    o.backward(dout.double())
    # lse from the same scores: K/V heads repeated for their query heads, scaled by 1/sqrt(hd).
    kr = k64.detach().repeat_interleave(H // KV, dim=1)
    s = q64.detach() @ kr.transpose(-1, -2) / HD ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out[f"{case}.out"] = o.detach().float()
    out[f"{case}.lse"] = torch.logsumexp(s, dim=-1).float()
    out[f"{case}.dq"], out[f"{case}.dk"], out[f"{case}.dv"] = (t.grad.float() for t in (q64, k64, v64))

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdpa_reference.safetensors")
save_file({n: t.contiguous() for n, t in out.items()}, path,
          metadata={"torch": torch.__version__, "shape": json.dumps(dict(B=B, H=H, KV=KV, T=T, hd=HD))})
print(f"wrote {path} ({os.path.getsize(path)} bytes) with torch {torch.__version__}")
