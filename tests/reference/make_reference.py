#!/usr/bin/python3
"""Writes gpt2_tiny_reference.safetensors: a GPT-2 forward and backward computed by PyTorch.

Run by hand (not in CI) with Debian's python3-torch:  /usr/bin/python3 tests/reference/make_reference.py

The model is written out here from Hugging Face's GPT-2 definition (Conv1D weights stored (in, out),
LayerNorm eps 1e-5, GELU tanh approximation, causal attention, lm head tied to wte, mean
cross-entropy), so the file needs no transformers package. Parameters are random f32 values (not a
trained model), every one non-trivial, so every gradient is exercised. The forward and backward
run in float64 from those f32 values: the reference is exact to f32 precision, and the C++ test's
errors are shardlab's own.

Contents: parameters under HF names with the "transformer." prefix, the causal-mask buffers
"transformer.h.{i}.attn.bias" that HF files carry (the loader must ignore them), "ref.logits"
(B*T, V), "ref.loss" (1,), "ref.grad.<name>" per parameter; metadata: config, tokens, targets.
"""
import json
import math
import os
import struct

import torch

L, C, H, T, V = 2, 32, 2, 32, 256  # the `tiny` preset
B = 2
torch.manual_seed(20241121)


def param_specs():
    specs = [("wte.weight", (V, C), "w"), ("wpe.weight", (T, C), "w")]
    for i in range(L):
        p = f"h.{i}."
        specs += [
            (p + "ln_1.weight", (C,), "ln"), (p + "ln_1.bias", (C,), "b"),
            (p + "attn.c_attn.weight", (C, 3 * C), "w"), (p + "attn.c_attn.bias", (3 * C,), "b"),
            (p + "attn.c_proj.weight", (C, C), "w"), (p + "attn.c_proj.bias", (C,), "b"),
            (p + "ln_2.weight", (C,), "ln"), (p + "ln_2.bias", (C,), "b"),
            (p + "mlp.c_fc.weight", (C, 4 * C), "w"), (p + "mlp.c_fc.bias", (4 * C,), "b"),
            (p + "mlp.c_proj.weight", (4 * C, C), "w"), (p + "mlp.c_proj.bias", (C,), "b"),
        ]
    specs += [("ln_f.weight", (C,), "ln"), ("ln_f.bias", (C,), "b")]
    return specs


def make_params():
    params = {}
    for name, shape, kind in param_specs():
        if kind == "w":
            t = torch.randn(shape) * 0.1
        elif kind == "ln":
            t = 1.0 + torch.randn(shape) * 0.1
        else:
            t = torch.randn(shape) * 0.05
        params[name] = t.float().double().requires_grad_(True)  # f32 values, f64 arithmetic
    return params


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def forward(p, tokens, targets):
    hs = C // H
    x = p["wte.weight"][tokens] + p["wpe.weight"][torch.arange(T)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        q = f"h.{i}."
        h = torch.nn.functional.layer_norm(x, (C,), p[q + "ln_1.weight"], p[q + "ln_1.bias"], eps=1e-5)
        qkv = h @ p[q + "attn.c_attn.weight"] + p[q + "attn.c_attn.bias"]
        qq, kk, vv = qkv.split(C, dim=2)
        qq = qq.view(B, T, H, hs).transpose(1, 2)
        kk = kk.view(B, T, H, hs).transpose(1, 2)
        vv = vv.view(B, T, H, hs).transpose(1, 2)
        att = (qq @ kk.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ vv).transpose(1, 2).contiguous().view(B, T, C)
        x = x + y @ p[q + "attn.c_proj.weight"] + p[q + "attn.c_proj.bias"]
        h = torch.nn.functional.layer_norm(x, (C,), p[q + "ln_2.weight"], p[q + "ln_2.bias"], eps=1e-5)
        h = gelu_tanh(h @ p[q + "mlp.c_fc.weight"] + p[q + "mlp.c_fc.bias"])
        x = x + h @ p[q + "mlp.c_proj.weight"] + p[q + "mlp.c_proj.bias"]
    x = torch.nn.functional.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5)
    logits = x @ p["wte.weight"].t()
    loss = torch.nn.functional.cross_entropy(logits.view(B * T, V), targets.view(B * T))
    return logits, loss


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, t in tensors:
        data = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    params = make_params()
    tokens = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    logits, loss = forward(params, tokens, targets)
    loss.backward()
    tensors = [("transformer." + n, params[n]) for n, _, _ in param_specs()]
    mask = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    tensors += [(f"transformer.h.{i}.attn.bias", mask) for i in range(L)]
    tensors += [("ref.logits", logits.reshape(B * T, V)), ("ref.loss", loss.reshape(1))]
    tensors += [("ref.grad." + n, params[n].grad) for n, _, _ in param_specs()]
    metadata = {
        "config": json.dumps({"layers": L, "dim": C, "heads": H, "seq": T, "vocab": V, "batch": B}),
        "tokens": json.dumps(tokens.flatten().tolist()),
        "targets": json.dumps(targets.flatten().tolist()),
        "generator": f"tests/reference/make_reference.py, torch {torch.__version__}, float64",
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2_tiny_reference.safetensors")
    write_safetensors(out, tensors, metadata)
    print(f"wrote {out}: loss {loss.item():.6f}, {sum(p.numel() for p in params.values())} parameters")


if __name__ == "__main__":
    main()
