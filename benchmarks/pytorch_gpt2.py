#!/usr/bin/python3
"""Times GPT-2 training steps in PyTorch on the CPU, for comparison with `shardlab bench-train`.

Same architecture as shardlab (HF GPT-2: Conv1D-style weights, LayerNorm eps 1e-5, GELU tanh,
causal attention, tied lm head), same step (forward, mean cross-entropy, backward, global-norm
clip 1.0, AdamW), same shape. Prints one line: "pytorch <ms/step> <tokens/s> ..." (median of steps).
With RANKS > 1 the step runs under DistributedDataParallel over gloo on RANKS local processes,
B is the global batch (B / RANKS sequences per rank), and rank 0 prints the global tokens/s.
Usage: OMP_NUM_THREADS=1 /usr/bin/python3 benchmarks/pytorch_gpt2.py L C H T V B STEPS WARMUP [RANKS]
"""
import math
import socket
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C, eps=1e-5), nn.LayerNorm(C, eps=1e-5)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        shape = (B, T, self.H, C // self.H)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, C, H, T, V):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def cpu_capability():
    """The vector ISA ATen's kernels run with (ATEN_CPU_CAPABILITY caps it)."""
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def run(rank, ranks, port, L, C, H, T, V, B, steps, warmup):
    if ranks > 1:
        torch.set_num_threads(1)  # one thread per rank, whatever OMP_NUM_THREADS says
    torch.manual_seed(0)
    model = GPT2(L, C, H, T, V)
    if ranks > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    torch.manual_seed(1 + rank)
    data = torch.randint(0, V, (B // ranks, T + 1))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        ms = sorted(times)[len(times) // 2] * 1e3
        print(f"pytorch {ms:.1f} {B * T / (ms / 1e3):.0f} torch={torch.__version__} threads={torch.get_num_threads()}"
              f" ranks={ranks} isa={cpu_capability()}",
              flush=True)
    if ranks > 1:
        torch.distributed.destroy_process_group()


def main():
    L, C, H, T, V, B, steps, warmup = (int(a) for a in sys.argv[1:9])
    ranks = int(sys.argv[9]) if len(sys.argv) > 9 else 1
    if B % ranks:
        sys.exit(f"batch {B} is not a multiple of {ranks} ranks")
    if ranks == 1:
        run(0, 1, 0, L, C, H, T, V, B, steps, warmup)
        return
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp
    mp.spawn(run, args=(ranks, port, L, C, H, T, V, B, steps, warmup), nprocs=ranks, join=True)


if __name__ == "__main__":
    main()
