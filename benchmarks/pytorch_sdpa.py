#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention forward + backward alone, on the CPU: the peer of
`shardlab bench-attention` (benchmarks/compare_attention.sh runs both, one point per process).

    python3 benchmarks/pytorch_sdpa.py --seqs 512,2048 --heads 8 --head-dims 64 [--threads N]
        [--repeats 3] [--warmup 1] [--not-causal]

Batch 1, multi-head, f32, q, k, v (1, H, T, hd) with requires_grad, one upstream gradient. Prints,
per point, the best forward and backward times in a table shaped like bench-attention's, then the
growth of the process's peak resident memory.
"""
import argparse
import resource
import time

import torch
import torch.nn.functional as F


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqs", default="512,2048")
    p.add_argument("--heads", default="8")
    p.add_argument("--head-dims", default="64")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--not-causal", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    rss0 = peak_rss()
    causal = not a.not_causal
    print(f"# torch {torch.__version__} scaled_dot_product_attention, batch 1, f32, "
          f"{'causal' if causal else 'not causal'}, {torch.get_num_threads()} thread(s), "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}; best of {a.repeats} after {a.warmup} warm-up")
    print(f"#{'T':>7} {'heads':>6} {'hd':>5} {'kernel':<6} {'fwd ms':>10} {'bwd ms':>10} {'total ms':>10} {'GFLOP/s':>9}")
    for T in map(int, a.seqs.split(",")):
        for H in map(int, a.heads.split(",")):
            for hd in map(int, a.head_dims.split(",")):
                g = torch.Generator().manual_seed(7)
                q, k, v = (torch.rand(1, H, T, hd, generator=g) * 2 - 1 for _ in range(3))
                dout = torch.rand(1, H, T, hd, generator=g) * 2 - 1
                best_f = best_b = float("inf")
                for rep in range(a.warmup + a.repeats):
                    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                    t0 = time.perf_counter()
                    o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                    f = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    o.backward(dout)
                    b = time.perf_counter() - t0
                    if rep >= a.warmup:
                        best_f, best_b = min(best_f, f * 1e3), min(best_b, b * 1e3)
                flops = 4.0 * T * T * hd * H * (0.5 if causal else 1.0) * 3.5
                print(f" {T:>7} {H:>6} {hd:>5} {'sdpa':<6} {best_f:>10.2f} {best_b:>10.2f} {best_f + best_b:>10.2f} "
                      f"{flops / ((best_f + best_b) * 1e-3) / 1e9:>9.1f}", flush=True)
    print(f"# result peak_rss_growth_bytes={peak_rss() - rss0}")


if __name__ == "__main__":
    main()
