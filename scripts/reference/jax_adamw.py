"""AdamW as the reference scripts' JAX steps take it (PyTorch's defaults but weight decay 0.01):
one update of parameters `p` and moments `m`, `v` at step count `t` from gradients `g`, the
denominator `sqrt(v) / sqrt(bc2) + eps` as `torch.optim.AdamW` computes it."""
import jax
import jax.numpy as jnp

B1, B2, EPS, WD = 0.9, 0.999, 1e-8, 0.01


def adamw_state(p):
    """AdamW's state before the first step for parameters `p`: zero moments, step count 0."""
    zeros = jax.tree.map(jnp.zeros_like, p)
    return zeros, jax.tree.map(jnp.zeros_like, p), jnp.zeros((), jnp.float32)


def adamw(p, m, v, t, g, lr):
    """The new (p, m, v, t)."""
    t = t + 1
    m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, m, g)
    v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, v, g)
    bc1, bc2 = 1 - B1**t, 1 - B2**t
    p = jax.tree.map(
        lambda p, m, v: p * (1 - lr * WD) - lr / bc1 * m / (jnp.sqrt(v) / jnp.sqrt(bc2) + EPS),
        p, m, v)
    return p, m, v, t
