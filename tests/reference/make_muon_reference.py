#!/usr/bin/env python3
"""Writes muon_reference.json: ten steps of torch.optim.Muon (on the hidden matrices) with
torch.optim.AdamW (on everything else), training transformers' own GPT2LMHeadModel,
LlamaForCausalLM and Qwen3MoeForCausalLM from the committed directories hf_gpt2_tiny/,
hf_llama_tiny/ and hf_qwen3_moe_tiny/.

Run by hand (not in CI), with torch >= 2.9 and transformers installed:
    /work/venv/bin/python tests/reference/make_muon_reference.py

What torch.optim.Muon users configure: Muon (lr 5e-3, its defaults: momentum 0.95, Nesterov, five
quintic Newton-Schulz steps in bf16, adjust_lr_fn "original", weight decay 0.1) for every 2-D
parameter but the token and position embeddings and the LM head; AdamW (betas 0.9 / 0.95, eps
1e-8, weight decay 0.1 on the other 2-D tensors, 0 on 1-D ones, lr 5e-3) for the rest. No clipping,
a constant learning rate, the model in float64 and in eval mode (no dropout), the loss the mean
cross-entropy of each position predicting the next token.

Qwen3-MoE: transformers holds each layer's experts as two 3-D tensors (gate_up_proj (E, 2F, C), gate
rows first; down_proj (E, C, F)), which torch.optim.Muon refuses; each expert's gate, up and down
matrices (the hub's per-expert tensors) get torch's own Muon step (_single_tensor_muon) as views,
with a momentum buffer each. Its objective is transformers' with output_router_logits: cross-entropy
+ router_aux_loss_coef x the load-balancing loss; "losses" holds the cross-entropy.

Two cases per model:
  bf16  torch.optim.Muon exactly as shipped (its iteration runs in bfloat16);
  f32   the same optimizer with the iteration kept in float32 (torch's own function with the
        dtype changed; shardlab's --muon-ns-dtype f32 must match this one to 1e-5).

Batches as shardlab's loader cuts them without --shuffle: sequence j is tokens[j T : j T + T + 1],
step t's batch sequences t B .. t B + B - 1. B = 12 splits over 1, 2, 3 and 4 ranks.

Also the iteration alone: torch's _zeropower_via_newtonschulz (bf16, as shipped) and its f32 form on a
wide (16 x 28) and a tall (28 x 16) f32 matrix of N(0, 1) entries.

muon_reference.json: {"tokens", "B", "T", "steps", "lr", "generator", "losses": {model: {case: [per
step, step 1 first]}}, "muon_params": {model: [the names Muon updates]}, "iteration": [{"rows",
"cols", "input", "bf16", "f32"}: row-major values]}.
"""
import json
import os

import torch
import torch.optim._muon as torch_muon
import transformers
from transformers import AutoModelForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
B, T, V, STEPS, LR = 12, 32, 256, 10, 5e-3
EMBEDDINGS = ("wte.weight", "wpe.weight", "embed_tokens.weight", "lm_head.weight")


def zeropower_f32(grad, ns_coefficients, ns_steps, eps):
    """torch's _zeropower_via_newtonschulz with float32 in place of bfloat16."""
    a, b, c = ns_coefficients
    x = grad.to(dtype=torch.float32, copy=True)
    if grad.size(0) > grad.size(1):
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, update, x, beta=a)
    if grad.size(0) > grad.size(1):
        x = x.T
    return x


def expert_views(model):
    """(name, [(param view, grad view)]) of every expert matrix: the hub's per-expert tensors."""
    out = []
    for n, p in model.named_parameters():
        if n.endswith("mlp.experts.gate_up_proj"):
            F = p.shape[1] // 2
            for e in range(p.shape[0]):
                out.append((f"{n}.{e}.gate", lambda p=p, e=e, F=F: (p[e, :F], p.grad[e, :F])))
                out.append((f"{n}.{e}.up", lambda p=p, e=e, F=F: (p[e, F:], p.grad[e, F:])))
        elif n.endswith("mlp.experts.down_proj"):
            for e in range(p.shape[0]):
                out.append((f"{n}.{e}", lambda p=p, e=e: (p[e], p.grad[e])))
    return out


def train(dirname, tokens, case):
    kwargs = {"experts_implementation": "eager"} if "moe" in dirname else {}  # grouped_mm is f32-only
    model = AutoModelForCausalLM.from_pretrained(os.path.join(here, dirname), dtype=torch.float64, **kwargs).eval()
    muon, adam_decay, adam_plain = [], [], []
    for name, p in model.named_parameters():
        if p.dim() == 3:
            continue  # experts: expert_views
        if p.dim() == 2 and not name.endswith(EMBEDDINGS):
            muon.append((name, p))
        elif p.dim() >= 2:
            adam_decay.append(p)
        else:
            adam_plain.append(p)
    experts = expert_views(model)
    expert_bufs = {}
    opt_muon = torch.optim.Muon([p for _, p in muon], lr=LR)
    opt_adam = torch.optim.AdamW([{"params": adam_decay, "weight_decay": 0.1},
                                  {"params": adam_plain, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95), eps=1e-8)
    original = torch_muon._zeropower_via_newtonschulz
    if case == "f32":
        torch_muon._zeropower_via_newtonschulz = zeropower_f32
    aux_coef = getattr(model.config, "router_aux_loss_coef", 0.0) if experts else 0.0
    losses = []
    try:
        for t in range(STEPS):
            seqs = torch.stack([tokens[j * T: j * T + T + 1] for j in range(t * B, t * B + B)])
            out = model(seqs[:, :T], output_router_logits=True) if experts else model(seqs[:, :T])
            loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), seqs[:, 1:].reshape(-1))
            opt_muon.zero_grad()
            opt_adam.zero_grad()
            for p in model.parameters():
                p.grad = None
            (loss + aux_coef * out.aux_loss if experts else loss).backward()
            losses.append(loss.item())
            opt_muon.step()
            opt_adam.step()
            with torch.no_grad():
                for name, view in experts:
                    param, grad = view()
                    buf = expert_bufs.setdefault(name, torch.zeros_like(grad))
                    group = opt_muon.param_groups[0]
                    torch_muon._single_tensor_muon(
                        [param], [grad], [buf], lr=group["lr"], weight_decay=group["weight_decay"],
                        momentum=group["momentum"], nesterov=group["nesterov"],
                        ns_coefficients=group["ns_coefficients"], ns_steps=group["ns_steps"], eps=group["eps"],
                        adjust_lr_fn=group["adjust_lr_fn"], has_complex=False)
    finally:
        torch_muon._zeropower_via_newtonschulz = original
    return losses, [n for n, _ in muon] + [n for n, _ in experts]


def main():
    g = torch.Generator().manual_seed(20261128)
    tokens = torch.randint(0, V, (STEPS * B * T + 1,), generator=g)
    out = {"tokens": tokens.tolist(), "B": B, "T": T, "steps": STEPS, "lr": LR,
           "generator": f"tests/reference/make_muon_reference.py, torch {torch.__version__}, "
                        f"transformers {transformers.__version__}, float64 model",
           "losses": {}, "muon_params": {}}
    for model, dirname in (("gpt2", "hf_gpt2_tiny"), ("llama", "hf_llama_tiny"), ("qwen3_moe", "hf_qwen3_moe_tiny")):
        out["losses"][model] = {}
        for case in ("bf16", "f32"):
            losses, names = train(dirname, tokens, case)
            out["losses"][model][case] = losses
            out["muon_params"][model] = names
            print(model, case, " ".join(f"{x:.6f}" for x in losses))
    out["iteration"] = []
    for rows, cols in ((16, 28), (28, 16)):
        x = torch.randn(rows, cols, generator=g)
        coefficients = (torch_muon.DEFAULT_A, torch_muon.DEFAULT_B, torch_muon.DEFAULT_C)
        bf16 = torch_muon._zeropower_via_newtonschulz(x, coefficients, 5, torch_muon.EPS).float()
        f32 = zeropower_f32(x, coefficients, 5, torch_muon.EPS)
        f32_text = lambda t: [float(f"{v:.9g}") for v in t.flatten().tolist()]  # round-trips an f32
        out["iteration"].append({"rows": rows, "cols": cols, "input": f32_text(x), "bf16": f32_text(bf16),
                                 "f32": f32_text(f32)})
    with open(os.path.join(here, "muon_reference.json"), "w") as f:
        json.dump(out, f)
        f.write("\n")


if __name__ == "__main__":
    main()
