#!/usr/bin/env python3
"""Times Llama training steps with transformers' own LlamaForCausalLM on the CPU, attention by
PyTorch's scaled_dot_product_attention (attn_implementation="sdpa", a flash kernel on the CPU): the
peer of shardlab's fused attention at long sequences (benchmarks/compare_llama_long.sh).

The step is shardlab's: forward, mean cross-entropy of next tokens, backward, global-norm clip 1.0,
AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1), on random tokens from a fixed seed.
Prints "transformers <ms/step> <tokens/s> peak_rss_bytes=<N>" (median of STEPS timed steps after
WARMUP; the peak resident size of the whole process, from getrusage).
Usage: OMP_NUM_THREADS=1 python benchmarks/transformers_llama.py L C H KV F T V B STEPS WARMUP [THREADS]
"""
import resource
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    if len(sys.argv) not in (11, 12):
        sys.exit(__doc__)
    L, C, H, KV, F, T, V, B, steps, warmup = (int(a) for a in sys.argv[1:11])
    threads = int(sys.argv[11]) if len(sys.argv) == 12 else 1
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=KV, max_position_embeddings=T, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    times = []
    for i in range(warmup + steps):
        tokens = torch.randint(0, V, (B, T + 1), generator=gen)
        t0 = time.perf_counter()
        logits = model(input_ids=tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    ms = 1e3 * statistics.median(times)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"# transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
          f"attention {model.config._attn_implementation}, {threads} thread(s), "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"transformers {ms:.1f} {B * T / (ms / 1e3):.0f} peak_rss_bytes={rss}")


if __name__ == "__main__":
    main()
