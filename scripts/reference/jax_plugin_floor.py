#!/usr/bin/env python3
"""The runtime floor each CPU PJRT plugin puts under a step: JAX's own program, one process.

Runs the example job's training step (jax_step.py: one `jax.jit` step, parameters and optimizer
state donated, one device) through jaxlib's own CPU client and through each plugin library given
with `--plugin NAME=PATH`, registered with JAX's plugin mechanism
(`jax._src.xla_bridge.register_plugin`). All clients live in this one process and the steps
are interleaved (one step of each, round after round), so load that drifts over the run hits all
alike. Every client compiles the same jitted function for its own device; the program differs
only in what each plugin's XLA makes of it.

Prints per client the median and 10th percentile of synced steps (each waited for), the median
per step of pipelined rounds (10 steps back to back, one wait), and the synced median's ratio to
jaxlib's. Before timing, the first step's loss from every plugin is checked against jaxlib's (a
plugin that computes something else is reported and left out of the figures).

Needs jax and numpy (not in the project's .venv): `scripts/bench floor` runs this when
NEURON_PC_BENCH_JAX names a Python that has them, with every pinned cpu plugin it finds.
"""
import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import xla_bridge

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax_step  # noqa: E402  (the step and model, shared with jax_step.py)

ROUND = 10


class Runner:
    """One client's device, its jitted step and its state (updated in place by donation)."""

    def __init__(self, name, device, host):
        self.name = name
        self.device = device
        put = lambda x: jax.device_put(x, device)  # noqa: E731
        self.p = jax.tree.map(put, host["p"])
        self.m = jax.tree.map(lambda x: put(np.zeros_like(x)), host["p"])
        self.v = jax.tree.map(lambda x: put(np.zeros_like(x)), host["p"])
        self.t = put(np.float32(0))
        self.fixed = [put(host[k]) for k in ("ids", "mask", "labels", "lr")]
        self.f = jax.jit(jax_step.step, donate_argnums=(0, 1, 2))
        self.synced, self.pipelined = [], []

    def step(self):
        self.p, self.m, self.v, self.t, loss = self.f(self.p, self.m, self.v, self.t,
                                                      *self.fixed)
        return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", action="append", default=[], metavar="NAME=PATH",
                    help="a PJRT plugin library to register under NAME (repeatable)")
    ap.add_argument("--reps", type=int, default=300, help="synced steps per client")
    args = ap.parse_args()
    plugins = []
    for spec in args.plugin:
        name, sep, path = spec.partition("=")
        if not sep or not name.isidentifier() or not os.path.isfile(path):
            sys.exit(f"--plugin {spec}: want NAME=PATH with an existing library")
        # Below jaxlib's cpu (priority 0): the default backend stays jaxlib's own. One device,
        # as jaxlib's cpu client has by default (a cpu plugin's own default is 4).
        xla_bridge.register_plugin(name, priority=-10, library_path=path,
                                   options={"cpu_device_count": 1})
        plugins.append((name, path))

    rng = np.random.default_rng(0)
    host = {"p": jax_step.init(rng)}
    host["ids"] = rng.integers(0, jax_step.VOCAB, (jax_step.BATCH, jax_step.SEQ)).astype(np.int32)
    host["mask"] = np.ones((jax_step.BATCH, jax_step.SEQ), np.float32)
    host["labels"] = rng.integers(0, jax_step.CLASSES, (jax_step.BATCH,)).astype(np.int32)
    host["lr"] = np.float32(1e-3)

    runners = [Runner(f"jaxlib {jax.__version__} cpu", jax.devices("cpu")[0], host)]
    for name, path in plugins:
        try:
            device = jax.devices(name)[0]
        except Exception as e:  # a plugin JAX cannot start is reported, not fatal
            print(f"{name} ({path}): no device: {str(e).splitlines()[0]}", file=sys.stderr)
            continue
        if len(jax.devices(name)) != 1:
            print(f"{name}: {len(jax.devices(name))} devices, not 1", file=sys.stderr)
        runners.append(Runner(name, device, host))

    # The first step's loss (identical inputs), then warm-up; a plugin that errors or computes
    # a different loss is left out.
    ref = None
    kept = []
    for r in runners:
        try:
            loss = float(r.step())
            for _ in range(19):
                r.step()
            r.step().block_until_ready()
        except Exception as e:
            print(f"{r.name}: step failed: {str(e).splitlines()[0]}", file=sys.stderr)
            continue
        if ref is None:
            ref = loss
        elif not abs(loss - ref) <= 1e-5 * max(1.0, abs(ref)):
            print(f"{r.name}: first loss {loss!r}, jaxlib's {ref!r}; left out", file=sys.stderr)
            continue
        kept.append(r)
    runners = kept

    for _ in range(args.reps):
        for r in runners:
            start = time.perf_counter()
            r.step().block_until_ready()
            r.synced.append(time.perf_counter() - start)
    for _ in range(max(3, args.reps // ROUND)):
        for r in runners:
            start = time.perf_counter()
            for _ in range(ROUND):
                loss = r.step()
            loss.block_until_ready()
            r.pipelined.append((time.perf_counter() - start) / ROUND)

    base = np.median(runners[0].synced) if runners else 0
    print("| client (JAX's step, donated, one device) | synced median ms | synced p10 ms "
          "| pipelined median ms | synced vs jaxlib |")
    print("| --- | --- | --- | --- | --- |")
    for r in runners:
        med = np.median(r.synced)
        print(f"| {r.name} | {med * 1e3:.2f} | {np.percentile(r.synced, 10) * 1e3:.2f} "
              f"| {np.median(r.pipelined) * 1e3:.2f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
