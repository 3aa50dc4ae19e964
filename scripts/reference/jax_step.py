#!/usr/bin/env python3
"""The example job's training step written in JAX, timed the way JAX users run it.

Same model and sizes as examples/train_text_encoder.rs (vocabulary 8192, embedding 128,
sequence 32, MLP 128-512-512-256 with exact GELU, 64 classes, batch 64, AdamW with weight decay
0.01), one `jax.jit` step with donated parameters and optimizer state. Prints the median and
10th percentile of 200 steps after 20 warm-up steps (each waited for), then the per-step
time of 100 steps with one wait at the end, and with --export FILE writes the step's
StableHLO (to run it through neuron-pc's runtime with examples/hlo_steptime.rs).

Needs jax and numpy (not in the project's .venv): `scripts/bench` runs this when
NEURON_PC_BENCH_JAX names a Python that has them.
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_adamw import adamw, adamw_state

VOCAB, EMBED, SEQ, BATCH, CLASSES = 8192, 128, 32, 64, 64
MLP = [512, 512, 256]


def init(rng):
    def linear(fan_in, fan_out):
        bound = 1 / np.sqrt(fan_in)
        return (rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
                rng.uniform(-bound, bound, (fan_out,)).astype(np.float32))

    p = {"emb": rng.standard_normal((VOCAB, EMBED)).astype(np.float32)}
    width = EMBED
    for k, out in enumerate(MLP):
        p[f"w{k}"], p[f"b{k}"] = linear(width, out)
        width = out
    p["pw"], p["pb"] = linear(width, CLASSES)
    return p


def forward(p, ids, mask):
    e = p["emb"][ids]
    h = (e * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    for k in range(len(MLP)):
        h = jax.nn.gelu(h @ p[f"w{k}"].T + p[f"b{k}"], approximate=False)
    return h @ p["pw"].T + p["pb"]


def loss_fn(p, ids, mask, labels):
    logp = jax.nn.log_softmax(forward(p, ids, mask))
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], 1))


def step(p, m, v, t, ids, mask, labels, lr):
    loss, g = jax.value_and_grad(loss_fn)(p, ids, mask, labels)
    p, m, v, t = adamw(p, m, v, t, g, lr)
    return p, m, v, t, loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--export")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    p = jax.tree.map(jnp.asarray, init(rng))
    m, v, t = adamw_state(p)
    ids = jnp.asarray(rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32))
    mask = jnp.ones((BATCH, SEQ), jnp.float32)
    labels = jnp.asarray(rng.integers(0, CLASSES, (BATCH,)).astype(np.int32))
    lr = jnp.float32(1e-3)
    f = jax.jit(step, donate_argnums=(0, 1, 2))
    if args.export:
        with open(args.export, "w") as out:
            out.write(f.lower(p, m, v, t, ids, mask, labels, lr).as_text())
    for _ in range(20):
        p, m, v, t, loss = f(p, m, v, t, ids, mask, labels, lr)
    loss.block_until_ready()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        p, m, v, t, loss = f(p, m, v, t, ids, mask, labels, lr)
        loss.block_until_ready()
        times.append(time.perf_counter() - start)
    print(f"| JAX {jax.__version__} jit step, donated state, synced every step | {np.median(times) * 1e3:.2f} ms |")
    # Pipelined: 100 steps dispatched back to back, one wait at the end (what a training loop
    # that reads the loss only when logging gets); the median of 5 such runs, per step.
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(100):
            p, m, v, t, loss = f(p, m, v, t, ids, mask, labels, lr)
        loss.block_until_ready()
        runs.append((time.perf_counter() - start) / 100)
    print(f"| JAX {jax.__version__} jit step, pipelined (100 steps, one sync) | {np.median(runs) * 1e3:.2f} ms |")


if __name__ == "__main__":
    main()
