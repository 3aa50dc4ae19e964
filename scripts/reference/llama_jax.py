#!/usr/bin/env python3
"""The LLM benchmark's model in JAX: one `jax.jit` AdamW step with donated parameters and
optimizer state, the way JAX users run it.

The same Llama, batches, init statistics and AdamW as scripts/reference/llama_torch.py and
examples/bench_llama.rs (see there). Grouped-query attention through
`jax.nn.dot_product_attention` (kv heads not repeated in the program).

Prints `RESULT jax synced_ms=.. pipelined_ms=.. compile_ms=.. params=.. loss=.. tokens_per_s=..`:
the median step waited for (`block_until_ready`), the median per step of rounds with one wait at
the end, the step's `lower(...).compile()` time (tracing and lowering not included; the
persistent cache off), and the pipelined tokens per second. The size flags (`--hidden`,
`--layers`, ..., `--seq-len`, `--batch-size`) default to scripts/bench's small Llama; the GPU kit
(scripts/gpu-check) runs it at train_llama's size.
`--first-step` runs one step with JAX's persistent compilation cache in `--cache DIR` and prints
`FIRST_STEP_EPOCH <unix seconds>` once its loss is read, for the caller to time the process.

`--plugin PATH` runs on that PJRT cpu plugin library (registered with JAX's plugin mechanism,
with as many devices as the mesh) instead of jaxlib's own cpu client: `scripts/bench sharded`
passes the plugin neuron-pc uses, so both frontends run on the same XLA.

Sharded layouts, for comparing with neuron-pc's sharded Llama: `--fsdp F --tp T` (both 1 by
default) runs the same step over F*T of JAX's cpu devices (made to exist with
`jax_num_cpu_devices`), arranged as a mesh of shape (F, T) with axes ("data", "model"). The batch
is split by rows over "data". The weights take the Megatron tensor-parallel layout over "model":
q, k, v, gate and up split by output feature (dim 0 of the [out, in] weight), o and down by input
feature (dim 1), embedding and lm_head by vocabulary row (dim 0); on top of that FSDP splits each
weight's other dimension over "data", and the 1-D norm weights over "data" when F > 1 and it
divides the hidden size (otherwise the norms are replicated). The AdamW moments carry their
parameter's sharding, and the jitted step pins its input and output shardings so the state keeps
its layout step after step. Every dimension split must divide evenly; the script stops if not.
With F*T == 1 the run is the single-device one above, unchanged.

After the fields above, the RESULT line also carries `first_loss` (the first step's loss, to more
digits, for checking that layouts agree), `layout=fsdp{F}_tp{T}`, `device_bytes` (the bytes of
parameters and optimizer state held by one device: the sum over the state's arrays of the shard
on the first device, measured after the timed steps) and `temp_bytes` (XLA's scratch memory for
the compiled step, `memory_analysis().temp_size_in_bytes`; per device when sharded; -1 when the
backend does not report it).

Depth (`scripts/bench depth`): `--scan-layers` stacks each layer weight to `[layers, ...]` and
runs the blocks with `jax.lax.scan` (MaxText's `scan_layers`); the RESULT line also gives
`lower_ms` (tracing and lowering the step, `jit(..).lower`) and `program_bytes` (the lowered
StableHLO text).

Memory (`scripts/bench memory`): `--remat full` wraps each decoder block in `jax.checkpoint` (keep
its input, recompute the rest in the backward pass), `--remat dots` in `jax.checkpoint` with
`policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable` (keep the projections), as
examples/bench_llama.rs --remat does; the RESULT line ends with `remat=..` and `peak_rss_mib`,
the process's peak resident memory (`resource.getrusage(...).ru_maxrss`) after the last step.
`--rounds 0` skips the pipelined rounds (`pipelined_ms=n/a`, `tokens_per_s=n/a`) and the extra
step after them, for models whose step takes seconds.

Needs jax and numpy (not installed by scripts/setup): `scripts/bench` runs this when
NEURON_PC_BENCH_JAX names a Python that has them.
"""
import argparse
import resource
import statistics
import time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--first-step", action="store_true")
ap.add_argument("--cache", help="JAX persistent compilation cache directory")
# The model's size; the defaults are scripts/bench's small Llama (examples/bench_llama.rs).
ap.add_argument("--hidden", type=int, default=256)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--heads", type=int, default=8)
ap.add_argument("--kv-heads", type=int, default=4)
ap.add_argument("--intermediate", type=int, default=768)
ap.add_argument("--vocab", type=int, default=2048)
ap.add_argument("--seq-len", type=int, default=128)
ap.add_argument("--batch-size", type=int, default=4)
# Sharded layouts over cpu devices: a (fsdp, tp) mesh with axes ("data", "model").
ap.add_argument("--fsdp", type=int, default=1, help="devices along the mesh's 'data' axis")
ap.add_argument("--tp", type=int, default=1, help="devices along the mesh's 'model' axis")
ap.add_argument("--plugin", metavar="PATH",
                help="run on this PJRT cpu plugin library (the one neuron-pc uses) instead of "
                     "jaxlib's own cpu client, with as many devices as the mesh has")
ap.add_argument("--remat", choices=("none", "full", "dots"), default="none",
                help="checkpoint each decoder block: none, full (jax.checkpoint) or dots "
                     "(policy dots_with_no_batch_dims_saveable)")
ap.add_argument("--scan-layers", action="store_true",
                help="stack the layers' weights and run the blocks with lax.scan")
ap.add_argument("--rounds", type=int, default=3,
                help="rounds of pipelined steps after the synced ones; 0: none")
args = ap.parse_args()
if args.steps < 1 or args.rounds < 0:
    ap.error("--steps must be at least 1 and --rounds at least 0")
if args.fsdp < 1 or args.tp < 1:
    ap.error("--fsdp and --tp must be at least 1")
N_DEVICES = args.fsdp * args.tp

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from jax_adamw import adamw, adamw_state  # noqa: E402

if args.plugin:
    from jax._src import xla_bridge  # noqa: E402

    # below jaxlib's cpu (priority 0), picked by name
    xla_bridge.register_plugin("plugin", priority=-10, library_path=args.plugin,
                               options={"cpu_device_count": N_DEVICES})
elif N_DEVICES > 1:
    # before any backend is initialised
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
PLATFORM = "plugin" if args.plugin else "cpu"
if args.scan_layers and N_DEVICES > 1:
    raise SystemExit("--scan-layers is for one device here (its layouts are per layer)")

if args.first_step and args.cache:
    jax.config.update("jax_compilation_cache_dir", args.cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

VOCAB, HIDDEN, LAYERS = args.vocab, args.hidden, args.layers
HEADS, KV_HEADS, INTER = args.heads, args.kv_heads, args.intermediate
SEQ, BATCH, EPS, THETA, STD = args.seq_len, args.batch_size, 1e-5, 10000.0, 0.02
HEAD_DIM = HIDDEN // HEADS


def init(rng):
    # weights stored [out, in] as in PyTorch
    normal = lambda *shape: (rng.standard_normal(shape) * STD).astype(np.float32)  # noqa: E731
    ones = lambda: np.ones((HIDDEN,), np.float32)  # noqa: E731
    p = {"embed": normal(VOCAB, HIDDEN), "norm": ones(), "lm_head": normal(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p[f"l{i}"] = {
            "q": normal(HEADS * HEAD_DIM, HIDDEN), "k": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            "v": normal(KV_HEADS * HEAD_DIM, HIDDEN), "o": normal(HIDDEN, HEADS * HEAD_DIM),
            "gate": normal(INTER, HIDDEN), "up": normal(INTER, HIDDEN),
            "down": normal(HIDDEN, INTER), "ln1": ones(), "ln2": ones(),
        }
    if args.scan_layers:  # the same values, stacked [LAYERS, ...]
        layers = [p.pop(f"l{i}") for i in range(LAYERS)]
        p["layers"] = {k: np.stack([w[k] for w in layers]) for k in layers[0]}
    return p


def rms_norm(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + EPS) * w


def rotate_half(x):
    a, b = jnp.split(x, 2, axis=-1)
    return jnp.concatenate((-b, a), axis=-1)


def block(x, w, cos, sin):
    """One decoder layer: attention and SwiGLU, each with its residual."""
    b, s, _ = x.shape
    h = rms_norm(x, w["ln1"])
    q = (h @ w["q"].T).reshape(b, s, HEADS, HEAD_DIM)
    k = (h @ w["k"].T).reshape(b, s, KV_HEADS, HEAD_DIM)
    v = (h @ w["v"].T).reshape(b, s, KV_HEADS, HEAD_DIM)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    a = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    x = x + a.reshape(b, s, HIDDEN) @ w["o"].T
    h = rms_norm(x, w["ln2"])
    return x + (jax.nn.silu(h @ w["gate"].T) * (h @ w["up"].T)) @ w["down"].T


if args.remat == "full":
    block = jax.checkpoint(block)
elif args.remat == "dots":
    block = jax.checkpoint(block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)


def loss_fn(p, ids):
    _, s = ids.shape
    inv_freq = 1.0 / THETA ** (jnp.arange(0, HEAD_DIM, 2, dtype=jnp.float32) / HEAD_DIM)
    freqs = jnp.arange(s, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate((freqs, freqs), -1)[:, None, :]  # [s, 1, d]: heads broadcast
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    x = p["embed"][ids]
    if args.scan_layers:
        x, _ = jax.lax.scan(lambda x, w: (block(x, w, cos, sin), None), x, p["layers"])
    else:
        for i in range(LAYERS):
            x = block(x, p[f"l{i}"], cos, sin)
    logits = rms_norm(x, p["norm"]) @ p["lm_head"].T
    logp = jax.nn.log_softmax(logits[:, :-1], -1)
    return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], -1))


def make_mesh():
    devices = jax.devices(PLATFORM)
    if len(devices) < N_DEVICES:
        raise SystemExit(f"--fsdp {args.fsdp} --tp {args.tp} needs {N_DEVICES} cpu devices, "
                         f"JAX has {len(devices)}")
    return Mesh(np.array(devices[:N_DEVICES]).reshape(args.fsdp, args.tp), ("data", "model"))


def param_spec(path, shape):
    """The PartitionSpec of one parameter: Megatron over "model", FSDP over "data"."""
    if args.scan_layers:  # one device (see above): whole
        return P()
    name = path[-1]
    if len(shape) == 1:  # rms norm weights
        return P("data") if args.fsdp > 1 and shape[0] % args.fsdp == 0 else P()
    if name in ("q", "k", "v", "gate", "up", "embed", "lm_head"):
        spec = P("model", "data")  # output features (or vocabulary) over "model"
    elif name in ("o", "down"):
        spec = P("data", "model")  # input features over "model"
    else:
        raise SystemExit(f"no layout for parameter {'/'.join(path)}")
    for dim, axis in zip(shape, spec):
        n = args.fsdp if axis == "data" else args.tp
        if dim % n:
            raise SystemExit(f"{'/'.join(path)} {tuple(shape)}: dim {dim} does not split "
                             f"over {n} devices on mesh axis {axis!r}")
    return spec


def tree_path(kp):
    return tuple(str(getattr(k, "key", k)) for k in kp)


def step(p, m, v, t, ids, lr):
    loss, g = jax.value_and_grad(loss_fn)(p, ids)
    p, m, v, t = adamw(p, m, v, t, g, lr)
    return p, m, v, t, loss


def main():
    if N_DEVICES == 1 and not args.plugin:
        jstep = jax.jit(step, donate_argnums=(0, 1, 2, 3))
        p = jax.tree.map(jnp.asarray, init(np.random.default_rng(0)))
        m, v, t = adamw_state(p)
        lr = jnp.asarray(1e-3, jnp.float32)
        rng = np.random.default_rng(1)
        batches = [jnp.asarray(rng.integers(0, VOCAB, (BATCH, SEQ), dtype=np.int32))
                   for _ in range(4)]
        shardings = None
    else:
        mesh = make_mesh()
        if BATCH % args.fsdp:
            raise SystemExit(f"--batch-size {BATCH} does not split over --fsdp {args.fsdp}")
        host = init(np.random.default_rng(0))
        ps = jax.tree_util.tree_map_with_path(
            lambda kp, x: NamedSharding(mesh, param_spec(tree_path(kp), x.shape)), host)
        rep = NamedSharding(mesh, P())
        batch_sharding = NamedSharding(mesh, P("data", None))
        p = jax.tree.map(jax.device_put, host, ps)
        m = jax.tree.map(lambda x, s: jax.device_put(np.zeros_like(x), s), host, ps)
        v = jax.tree.map(lambda x, s: jax.device_put(np.zeros_like(x), s), host, ps)
        t = jax.device_put(np.zeros((), np.float32), rep)
        lr = jax.device_put(np.asarray(1e-3, np.float32), rep)
        rng = np.random.default_rng(1)
        batches = [jax.device_put(rng.integers(0, VOCAB, (BATCH, SEQ), dtype=np.int32),
                                  batch_sharding) for _ in range(4)]
        shardings = (ps, ps, ps, rep)
        jstep = jax.jit(step, donate_argnums=(0, 1, 2, 3),
                        in_shardings=(*shardings, batch_sharding, rep),
                        out_shardings=(*shardings, rep))
    if args.first_step:
        p, m, v, t, loss = jstep(p, m, v, t, batches[0], lr)
        float(loss)
        print(f"FIRST_STEP_EPOCH {time.time():.6f}", flush=True)
        return
    c0 = time.perf_counter()
    lowered = jstep.lower(p, m, v, t, batches[0], lr)
    lower_ms = (time.perf_counter() - c0) * 1e3
    program_bytes = len(lowered.as_text())
    c0 = time.perf_counter()
    compiled = lowered.compile()
    compile_ms = (time.perf_counter() - c0) * 1e3
    temp_bytes = -1
    try:
        mem = compiled.memory_analysis()
        if isinstance(mem, (list, tuple)):
            mem = mem[0] if mem else None
        if mem is not None:
            temp_bytes = int(mem.temp_size_in_bytes)
    except Exception:  # not every backend reports it
        pass
    del compiled
    state = (p, m, v, t)

    def run(i):
        nonlocal state
        *state, loss = jstep(*state, batches[i % len(batches)], lr)
        return loss

    first_loss = float(run(0))
    for i in range(1, args.warmup + 1):
        run(i).block_until_ready()
    synced = []
    for i in range(args.steps):
        c0 = time.perf_counter()
        loss = run(i)
        loss.block_until_ready()
        synced.append((time.perf_counter() - c0) * 1e3)
    rnd = max(args.steps // 2, 1)
    pipelined = []
    for _ in range(args.rounds):
        c0 = time.perf_counter()
        for i in range(rnd):
            loss = run(i)
        jax.block_until_ready((state, loss))
        pipelined.append((time.perf_counter() - c0) * 1e3 / rnd)
    # the loss after the pipelined rounds; without them, the last synced step's
    loss = float(run(0) if args.rounds else loss)
    n = sum(x.size for x in jax.tree.leaves(state[0]))
    if shardings is not None:  # the state kept its layout through the steps
        for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)):
            if not got.sharding.is_equivalent_to(want, got.ndim):
                raise SystemExit(f"state left its layout: {got.sharding} instead of {want}")
    device_bytes = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state))
    if pipelined:
        pipelined_ms = f"{statistics.median(pipelined):.3f}"
        tokens_per_s = f"{BATCH * SEQ * 1e3 / statistics.median(pipelined):.0f}"
    else:
        pipelined_ms = tokens_per_s = "n/a"
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"RESULT jax synced_ms={statistics.median(synced):.3f} "
          f"pipelined_ms={pipelined_ms} compile_ms={compile_ms:.1f} "
          f"params={n} loss={loss:.4f} "
          f"tokens_per_s={tokens_per_s} "
          f"first_loss={first_loss:.7f} layout=fsdp{args.fsdp}_tp{args.tp} "
          f"device_bytes={device_bytes} temp_bytes={temp_bytes} remat={args.remat} "
          f"scan_layers={args.scan_layers} lower_ms={lower_ms:.1f} "
          f"program_bytes={program_bytes} peak_rss_mib={peak_rss_mib:.1f}", flush=True)


if __name__ == "__main__":
    main()
