#!/usr/bin/env python3
"""The example job's training step in PyTorch eager mode, timed like scripts/reference/jax_step.py.

Same model and sizes as examples/train_text_encoder.rs and jax_step.py (vocabulary 8192,
embedding 128, sequence 32, MLP 128-512-512-256 with exact GELU, 64 classes, batch 64, AdamW
with weight decay 0.01). Prints the median of --steps steps after 20 warm-up steps, each waited
for, as a table row (`| ... | X ms |`) that scripts/gpu-check reads. `--device xla` runs it as
PyTorch/XLA users do (torch_xla, `PJRT_DEVICE=CPU` by default: lazy tensors, one `sync` per
step, the loss read back), the nearest peer of neuron-pc's lazy device (`scripts/bench jax`
runs it when NEURON_PC_BENCH_TORCH_XLA names a Python with torch_xla).
"""
import argparse
import time

import torch
import torch.nn.functional as F

VOCAB, EMBED, SEQ, BATCH, CLASSES = 8192, 128, 32, 64, 64
MLP = [512, 512, 256]


class TextEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, EMBED)
        widths = [EMBED] + MLP
        self.mlp = torch.nn.ModuleList(
            torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.head = torch.nn.Linear(widths[-1], CLASSES)

    def forward(self, ids, mask):
        h = (self.emb(ids) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        for layer in self.mlp:
            h = F.gelu(layer(h))
        return self.head(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.device == "xla":
        import os
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        import torch_xla
        dev = torch_xla.device()
    else:
        dev = torch.device(args.device)
    torch.manual_seed(0)
    model = TextEncoder().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device=dev)
    mask = torch.ones(BATCH, SEQ, device=dev)
    labels = torch.randint(0, CLASSES, (BATCH,), device=dev)

    def sync(loss=None):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        elif dev.type == "xla":
            # cut the step's graph and run it; reading the loss waits for it
            torch_xla.sync()
            if loss is not None:
                loss.item()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(ids, mask), labels)
        loss.backward()
        opt.step()
        return loss

    for _ in range(20):
        sync(step())
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        sync(step())
        times.append(time.perf_counter() - start)
    times.sort()
    mode = "lazy (torch_xla)" if dev.type == "xla" else "eager"
    print(f"| PyTorch {torch.__version__} {mode} on {dev.type}, synced every step "
          f"| {times[len(times) // 2] * 1e3:.3f} ms |")


if __name__ == "__main__":
    main()
