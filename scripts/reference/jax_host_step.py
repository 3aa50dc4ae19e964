#!/usr/bin/env python3
"""examples/bench_host.rs's step in JAX: the host's cost per step where the device has almost
nothing to do.

A 2-layer MLP (8 -> 8 -> 8, tanh), batch 1, squared error, AdamW (weight decay 0.01), one
`jax.jit` step with donated parameters and optimizer state. R rounds of N steps dispatched back
to back, one wait at the end of each; prints the median round's steps/s.

`scripts/bench host` runs it with NEURON_PC_BENCH_JAX (a Python with jax and numpy), beside
bench_host, processes alternating.
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_adamw import adamw, adamw_state


def init(rng):
    def linear(fan_in, fan_out):
        bound = 1 / np.sqrt(fan_in)
        return (rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
                rng.uniform(-bound, bound, (fan_out,)).astype(np.float32))

    w1, b1 = linear(8, 8)
    w2, b2 = linear(8, 8)
    return {"w1": w1, "b1": b1, "w2": w2, "b2": b2}


def loss_fn(p, x, y):
    h = jnp.tanh(x @ p["w1"].T + p["b1"])
    d = h @ p["w2"].T + p["b2"] - y
    return jnp.mean(d * d)


def step(p, m, v, t, x, y, lr):
    loss, g = jax.value_and_grad(loss_fn)(p, x, y)
    p, m, v, t = adamw(p, m, v, t, g, lr)
    return p, m, v, t, loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    p = jax.tree.map(jnp.asarray, init(rng))
    m, v, t = adamw_state(p)
    x = jnp.asarray([[0.5, -1.0, 0.25, 2.0, -0.5, 1.0, 0.0, -2.0]], jnp.float32)
    y = jnp.asarray([[1.0, 0.0, -1.0, 0.5, 0.25, -0.5, 2.0, 0.0]], jnp.float32)
    lr = jnp.float32(1e-3)
    f = jax.jit(step, donate_argnums=(0, 1, 2))
    for _ in range(10):
        p, m, v, t, loss = f(p, m, v, t, x, y, lr)
    first = float(loss)
    rates = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps):
            p, m, v, t, loss = f(p, m, v, t, x, y, lr)
        loss.block_until_ready()
        rates.append(args.steps / (time.perf_counter() - start))
    assert float(loss) < first, (first, float(loss))
    print(f"| JAX {jax.__version__} jit, donated state | {np.median(rates):.0f} |")
    # synced: the loss read after every step (a loop that logs it every step)
    rates = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps):
            p, m, v, t, loss = f(p, m, v, t, x, y, lr)
            float(loss)
        rates.append(args.steps / (time.perf_counter() - start))
    print(f"| JAX {jax.__version__} jit, donated state, loss read every step | "
          f"{np.median(rates):.0f} |")


if __name__ == "__main__":
    main()
