#!/usr/bin/python3
"""Times Llama training steps in PyTorch on the CPU, for comparison with `shardlab bench-train`.

Same architecture as shardlab's Llama family (HF LlamaForCausalLM: RMSNorm eps 1e-5 in f32, RoPE
with theta 10000 in HF's rotate_half convention, grouped-query causal attention without biases, the
SwiGLU MLP, an untied lm head), same step (forward, mean cross-entropy, backward, global-norm clip
1.0, AdamW), same shape. Written with operations PyTorch 1.13 has (Debian's python3-torch): the
attention forms the (T, T) scores as shardlab does. Prints one line: "pytorch <ms/step>
<tokens/s> ..." (median of steps). With RANKS > 1 the step runs under DistributedDataParallel over
gloo on RANKS local processes, B is the global batch, and rank 0 prints the global tokens/s.
Usage: OMP_NUM_THREADS=1 /usr/bin/python3 benchmarks/pytorch_llama.py L C H KV F T V B STEPS WARMUP [RANKS]
"""
import math
import socket
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(C)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Block(nn.Module):
    def __init__(self, C, H, KV, Fd):
        super().__init__()
        self.H, self.KV, self.hd = H, KV, C // H
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(C), RMSNorm(C)
        self.q_proj = nn.Linear(C, H * self.hd, bias=False)
        self.k_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.o_proj = nn.Linear(H * self.hd, C, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(C, Fd, bias=False), nn.Linear(C, Fd, bias=False)
        self.down_proj = nn.Linear(Fd, C, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.H // self.KV
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, L, C, H, KV, Fd, T, V, theta=10000.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block(C, H, KV, Fd) for _ in range(L))
        self.norm = RMSNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        hd = C // H
        inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        freqs = torch.arange(T).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        # Plain attributes, not buffers: DDP would broadcast buffers, and gloo has no bool type.
        self.cos, self.sin = emb.cos(), emb.sin()
        self.mask = torch.ones(T, T, dtype=torch.bool).tril()

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask[:T, :T]
        for b in self.layers:
            x = b(x, cos, sin, mask)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def cpu_capability():
    """The vector ISA ATen's kernels run with (ATEN_CPU_CAPABILITY caps it)."""
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def run(rank, ranks, port, shape, B, steps, warmup):
    L, C, H, KV, Fd, T, V = shape
    if ranks > 1:
        torch.set_num_threads(1)  # one thread per rank, whatever OMP_NUM_THREADS says
    torch.manual_seed(0)
    model = Llama(L, C, H, KV, Fd, T, V)
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
    if len(sys.argv) < 11:
        sys.exit(__doc__.strip().splitlines()[-1])
    L, C, H, KV, Fd, T, V, B, steps, warmup = (int(a) for a in sys.argv[1:11])
    ranks = int(sys.argv[11]) if len(sys.argv) > 11 else 1
    if B % ranks or C % H or H % KV:
        sys.exit(f"batch {B} must be a multiple of {ranks} ranks, C {C} of H {H}, H of KV {KV}")
    shape = (L, C, H, KV, Fd, T, V)
    if ranks == 1:
        run(0, 1, 0, shape, B, steps, warmup)
        return
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp
    mp.spawn(run, args=(ranks, port, shape, B, steps, warmup), nprocs=ranks, join=True)


if __name__ == "__main__":
    main()
