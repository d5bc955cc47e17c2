#!/usr/bin/env python3
"""PyTorch's side of the race in scripts/gpu-check.sh: transformers' own GPT2LMHeadModel or
LlamaForCausalLM, built from a config (nothing downloaded), trained for a few steps on random tokens
the way people train them on a GPU: f32 master weights under bf16 autocast, attention through
scaled_dot_product_attention ("sdpa"), fused AdamW, global-norm clip 1.0, eager and then
torch.compile. Prints one JSON line per mode:
  {"system": "pytorch eager", "model": ..., "device": ..., "batch": B, "seq": T, "ms_per_step": ...,
   "tokens_per_s": ..., "mfu_pct": ..., "flops_per_token": ..., "params": N, "torch": "2.x"}
ms_per_step is the median of the timed steps (after --warmup untimed ones; torch.compile's compile
happens in the warm-up). MFU uses shardlab's count of model FLOPs (6 N + the attention's term, as
`shardlab bench-train` prints it: src/model/gpt2/family.cpp, src/model/llama/family.cpp) over
--peak-tflops (default: an H200's or H100's dense bf16, 989.4).

  python3 benchmarks/race_pytorch.py --model gpt2 --batch 8 --seq 1024 [--device cuda] [--modes eager,compile]
  python3 benchmarks/race_pytorch.py --model llama3.2-1b --batch 4 --seq 2048
  python3 benchmarks/race_pytorch.py --model gpt2 --layers 2 --dim 64 --heads 4 --vocab 256 --device cpu  (a smoke run)
"""
import argparse
import json
import statistics
import sys
import time

import torch


def gpt2_config(a):
    from transformers import GPT2Config
    return GPT2Config(n_layer=a.layers or 12, n_embd=a.dim or 768, n_head=a.heads or 12,
                      n_positions=a.seq, vocab_size=a.vocab or 50257,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")


def llama32_1b_config(a):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=a.dim or 2048, intermediate_size=a.ffn or 8192, num_hidden_layers=a.layers or 16,
                       num_attention_heads=a.heads or 32, num_key_value_heads=a.kv_heads or 8,
                       vocab_size=a.vocab or 128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                       rope_theta=500000.0, tie_word_embeddings=True,
                       rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                       attn_implementation="sdpa")


def model_flops_per_token(model, cfg, family, seq):
    """shardlab's count: every parameter once (a tied head once; an untied embedding, a lookup, not
    at all for Llama), 6 per token, plus the attention's 6 L (heads x head size) T."""
    n = sum(p.numel() for p in model.parameters())  # tied parameters once
    if family == "gpt2":
        return 6.0 * n + 6.0 * cfg.n_layer * cfg.n_embd * seq, n
    if not cfg.tie_word_embeddings:
        n_products = n - cfg.vocab_size * cfg.hidden_size
    else:
        n_products = n
    hd = cfg.hidden_size // cfg.num_attention_heads
    return 6.0 * n_products + 6.0 * cfg.num_hidden_layers * cfg.num_attention_heads * hd * seq, n


def run(a):
    from transformers import GPT2LMHeadModel, LlamaForCausalLM
    torch.manual_seed(0)
    device = torch.device(a.device)
    family = "gpt2" if a.model == "gpt2" else "llama"
    cfg = gpt2_config(a) if family == "gpt2" else llama32_1b_config(a)
    model = (GPT2LMHeadModel if family == "gpt2" else LlamaForCausalLM)(cfg).to(device)
    model.train()
    flops_per_token, params = model_flops_per_token(model, cfg, family, a.seq)
    try:  # fused AdamW (one kernel per dtype group on a GPU; PyTorch 2.4+ has a fused CPU one too)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    vocab = cfg.vocab_size
    g = torch.Generator(device="cpu").manual_seed(1)
    tokens = torch.randint(0, vocab, (a.batch, a.seq + 1), generator=g).to(device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step(fwd):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            logits = fwd(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    out = []
    for mode in a.modes.split(","):
        if mode == "eager":
            fwd = model
        elif mode == "compile":
            fwd = torch.compile(model)
        else:
            sys.exit(f"race_pytorch: --modes {a.modes!r}: expected eager and/or compile")
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t_compile = time.perf_counter()
        for _ in range(a.warmup):
            step(fwd)
        sync()
        warm_s = time.perf_counter() - t_compile
        times = []
        loss = None
        for _ in range(a.steps):
            t0 = time.perf_counter()
            loss = step(fwd)
            sync()
            times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1e3
        tps = a.batch * a.seq / (ms / 1e3)
        row = {"system": f"pytorch {mode}", "model": a.model, "device": str(device),
               "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
               "batch": a.batch, "seq": a.seq, "ms_per_step": round(ms, 3), "tokens_per_s": round(tps, 1),
               "mfu_pct": round(100.0 * flops_per_token * tps / (a.peak_tflops * 1e12), 2),
               "flops_per_token": flops_per_token, "params": params, "warmup_s": round(warm_s, 1),
               "loss": float(loss.detach()), "torch": torch.__version__,
               "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["gpt2", "llama3.2-1b"], default="gpt2")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10, help="timed steps (the median is printed)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (torch.compile compiles in them)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 peak for the MFU (H100/H200: 989.4)")
    # A smaller model of the same family (smoke runs): 0 keeps the preset's.
    for name in ("layers", "dim", "heads", "kv_heads", "ffn", "vocab"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=0)
    a = p.parse_args()
    if a.batch < 1 or a.seq < 1 or a.steps < 1 or a.warmup < 0:
        sys.exit("race_pytorch: --batch, --seq and --steps must be positive, --warmup at least 0")
    run(a)


if __name__ == "__main__":
    main()
