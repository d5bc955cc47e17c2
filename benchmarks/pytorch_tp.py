#!/usr/bin/env python3
"""Times Llama training steps under PyTorch's own tensor parallelism (DTensor) on the CPU, for
comparison with `shardlab bench-train --tp`.

The model, data and step are benchmarks/pytorch_llama.py's (its RMSNorm and RoPE; forward, mean
cross-entropy, backward, global-norm clip 1.0, AdamW lr 1e-4 betas (0.9, 0.95) weight decay 0.1),
split over TP gloo processes with torch.distributed.tensor.parallel as torchtitan's Llama plan
does: q/k/v and gate/up column-parallel, o and down row-parallel, the embedding row-parallel (by
vocabulary), the LM head column-parallel with loss_parallel (the cross-entropy on vocabulary-sharded
logits, never gathered). With "sp" the norms run under SequenceParallel (the activations between
the regions split along the sequence; all-gathers before the attention and the MLP, reduce-scatters
after). Every rank of the group sees the same B sequences. Needs PyTorch >= 2.3 (DTensor's tensor
parallelism; Debian's 1.13 has none). Prints one line as pytorch_llama.py does: "pytorch <ms/step>
<tokens/s> ..." (median of steps, the group's tokens/s).
Usage: OMP_NUM_THREADS=1 python benchmarks/pytorch_tp.py L C H KV F T V B STEPS WARMUP TP [sp]
"""
import math
import os
import socket
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_llama import RMSNorm, cpu_capability, rotate_half  # noqa: E402 (the same model)


# pytorch_llama.py's Block with the attention and the MLP as modules of their own, so that a plan
# can prepare each one's input once (one all-gather for q, k and v under sequence parallelism).
class Attention(nn.Module):
    def __init__(self, C, H, KV):
        super().__init__()
        self.hd, self.group = C // H, H // KV
        self.q_proj = nn.Linear(C, H * self.hd, bias=False)
        self.k_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.o_proj = nn.Linear(H * self.hd, C, bias=False)

    def forward(self, h, cos, sin, mask):
        B, T, _ = h.shape
        # -1: this rank's heads under tensor parallelism (the projections' outputs are local)
        q = self.q_proj(h).view(B, T, -1, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, -1, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, -1, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(self.group, dim=1), v.repeat_interleave(self.group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, C, Fd):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(C, Fd, bias=False), nn.Linear(C, Fd, bias=False)
        self.down_proj = nn.Linear(Fd, C, bias=False)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Block(nn.Module):
    def __init__(self, C, H, KV, Fd):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(C), RMSNorm(C)
        self.self_attn, self.mlp = Attention(C, H, KV), MLP(C, Fd)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


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
        self.cos, self.sin = emb.cos(), emb.sin()
        self.mask = torch.ones(T, T, dtype=torch.bool).tril()

    def forward(self, idx):  # the logits, vocabulary-sharded (a DTensor) under the plan below
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask[:T, :T]
        for b in self.layers:
            x = b(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


def replicate(module, mesh):
    """Without sequence parallelism the norms are whole on every rank; their weights become
    replicated DTensors all the same (plain tensors in and out), so that clip_grad_norm_ sees one
    kind of gradient. Their gradients are equal on every rank already: the column-parallel layers
    after them all-reduce their input's gradient."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module
    distribute_module(module, mesh,
                      input_fn=lambda _m, args, _mesh: tuple(DTensor.from_local(a, mesh, [Replicate()],
                                                                                run_check=False) for a in args),
                      output_fn=lambda _m, out, _mesh: out.to_local())


def parallelize(model, mesh, sp):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    between = Shard(1) if sp else Replicate()  # the activations between the regions
    parallelize_module(model, mesh, {
        "embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "lm_head": ColwiseParallel(input_layouts=between, output_layouts=Shard(-1), use_local_output=False),
        **({"norm": SequenceParallel()} if sp else {}),
    })
    if not sp:
        for norm in [model.norm] + [n for b in model.layers for n in (b.input_layernorm, b.post_attention_layernorm)]:
            replicate(norm, mesh)
    for block in model.layers:
        plan = {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=between),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=between),
        }
        if sp:
            plan.update({
                "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                                desired_input_layouts=(Replicate(), None, None, None)),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, mesh, plan)
    return model


def run(rank, tp, port, shape, B, steps, warmup, sp):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    L, C, H, KV, Fd, T, V = shape
    torch.set_num_threads(1)  # one thread per rank, whatever OMP_NUM_THREADS says
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp)
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = parallelize(Llama(L, C, H, KV, Fd, T, V), mesh, sp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    torch.manual_seed(1)  # the group's one batch: the same on every rank
    data = torch.randint(0, V, (B, T + 1))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with loss_parallel():
            logits = model(data[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), data[:, 1:].reshape(-1))
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        ms = sorted(times)[len(times) // 2] * 1e3
        print(f"pytorch {ms:.1f} {B * T / (ms / 1e3):.0f} torch={torch.__version__} threads={torch.get_num_threads()}"
              f" ranks={tp} tp={tp} sp={int(sp)} loss={loss.item():.4f} isa={cpu_capability()}", flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) < 12:
        sys.exit(__doc__.strip().splitlines()[-1])
    L, C, H, KV, Fd, T, V, B, steps, warmup, tp = (int(a) for a in sys.argv[1:12])
    sp = len(sys.argv) > 12 and sys.argv[12] == "sp"
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 3):
        sys.exit(f"pytorch_tp.py needs PyTorch >= 2.3 (DTensor tensor parallelism); this is {torch.__version__}")
    if C % H or H % KV or H % tp or KV % tp or Fd % tp or V % tp or (sp and T % tp):
        sys.exit(f"tp {tp} must divide H {H}, KV {KV}, F {Fd}, V {V} and, with sp, T {T}; C {C} must be a multiple of "
                 f"H, H of KV")
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp
    mp.spawn(run, args=(tp, port, (L, C, H, KV, Fd, T, V), B, steps, warmup, sp), nprocs=tp, join=True)


if __name__ == "__main__":
    main()
