#!/usr/bin/env python3
"""The LLM benchmark's model in PyTorch: eager on the CPU, or PyTorch/XLA on its CPU PJRT device
(`--xla`: `PJRT_DEVICE=CPU`, lazy tensors, one `torch_xla.sync()` per step).

The same Llama as examples/bench_llama.rs (hidden 256, 4 layers, 8 heads over 4 kv heads,
SwiGLU 768, vocabulary 2048, RMSNorm eps 1e-5, rotary theta 10000, untied head, fp32), the
same init statistics (`transformers`' Llama init: normal std 0.02 for projections and
embeddings, ones for the norms), four batches of 4 x 128 uniform random tokens uploaded once,
the next-token loss, `torch.optim.AdamW(lr=1e-3, weight_decay=0.01)`.

Prints `RESULT <name> synced_ms=.. pipelined_ms=.. compile_ms=..`: the median step waited for,
the median per step of rounds with one wait at the end, and (XLA) the compile time of every
graph compiled until the steady state (torch_xla's CompileTime metric). `--first-step` runs one
step (with `--cache DIR`: PyTorch/XLA's persistent cache) and prints `FIRST_STEP_EPOCH <unix
seconds>` once its loss is read, for the caller to time the whole process.

Needs torch (and torch_xla for --xla), not installed by scripts/setup: `scripts/bench` runs this
when NEURON_PC_BENCH_TORCH / NEURON_PC_BENCH_TORCH_XLA name Pythons that have them.
"""
import argparse
import os
import time

ap = argparse.ArgumentParser()
ap.add_argument("--xla", action="store_true")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--first-step", action="store_true")
ap.add_argument("--cache", help="PyTorch/XLA persistent compilation cache directory")
args = ap.parse_args()
if args.xla:
    os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from step_times import step_times  # noqa: E402

if args.xla:
    import torch_xla  # noqa: E402
    import torch_xla.core.xla_model as xm  # noqa: E402
    import torch_xla.debug.metrics as met  # noqa: E402
    import torch_xla.runtime as xr  # noqa: E402

    if args.cache:
        xr.initialize_cache(args.cache, readonly=False)

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, INTER = 2048, 256, 4, 8, 4, 768
SEQ, BATCH, EPS, THETA, STD = 128, 4, 1e-5, 10000.0, 0.02
HEAD_DIM = HIDDEN // HEADS


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        lin = lambda i, o: nn.Linear(i, o, bias=False)  # noqa: E731
        self.q_proj, self.o_proj = lin(HIDDEN, HEADS * HEAD_DIM), lin(HEADS * HEAD_DIM, HIDDEN)
        self.k_proj, self.v_proj = lin(HIDDEN, KV_HEADS * HEAD_DIM), lin(HIDDEN, KV_HEADS * HEAD_DIM)
        self.gate_proj, self.up_proj = lin(HIDDEN, INTER), lin(HIDDEN, INTER)
        self.down_proj = lin(INTER, HIDDEN)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(h).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(h).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # grouped-query heads as transformers' sdpa path runs them: repeat the kv heads
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, s, HIDDEN))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = RMSNorm()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=STD)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device, dtype=torch.float32)
        inv_freq = 1.0 / THETA ** (
            torch.arange(0, HEAD_DIM, 2, device=ids.device, dtype=torch.float32) / HEAD_DIM)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def main():
    torch.manual_seed(0)
    device = torch_xla.device() if args.xla else torch.device("cpu")
    model = Llama().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen).to(device) for _ in range(4)]

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = model(batches[i % len(batches)])
        loss.backward()
        opt.step()
        if args.xla:
            torch_xla.sync()
        return loss

    def wait():
        if args.xla:
            xm.wait_device_ops()

    if args.first_step:
        loss = step(0).item()
        print(f"FIRST_STEP_EPOCH {time.time():.6f}", flush=True)
        return
    step(0).item()
    for i in range(1, args.warmup + 1):
        step(i)
        wait()
    compile_ms = 0.0
    if args.xla:
        data = met.metric_data("CompileTime")
        compile_ms = data[1] / 1e6 if data else 0.0
        compiles = data[0] if data else 0
    synced, pipelined = step_times(step, args.steps, wait)
    loss = step(0).item()
    name = "pytorch-xla" if args.xla else "pytorch-eager"
    extra = f" compile_ms={compile_ms:.1f} graphs={compiles}" if args.xla else ""
    print(f"RESULT {name} synced_ms={synced:.3f} pipelined_ms={pipelined:.3f}{extra} "
          f"params={sum(p.numel() for p in model.parameters())} loss={loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
