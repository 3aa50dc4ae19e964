"""The peer of examples/bench_collectives.rs: torch.distributed's gloo all-reduce between the
processes torchrun-style variables describe (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), of
f32 tensors of the given sizes. Warms up 3 times, times --reps all-reduces one by one and prints,
on rank 0, `RESULT <bytes> <median seconds>` per size, like the Rust side. With --op
reduce-scatter it times reduce_scatter_tensor instead (each process keeping its block)."""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes-mib", default="1,4,16,64,256")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--op", choices=["all-reduce", "reduce-scatter"], default="all-reduce")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for mib in [int(s) for s in a.sizes_mib.split(",")]:
        n = mib * (1 << 20) // 4
        x = torch.full((n,), float(rank + 1), dtype=torch.float32)
        times = []
        for i in range(a.reps + 3):
            if a.op == "all-reduce":
                y = x.clone()
                started = time.perf_counter()
                dist.all_reduce(y)
            else:
                y = torch.empty(n // world, dtype=torch.float32)
                started = time.perf_counter()
                dist.reduce_scatter_tensor(y, x)
            if i >= 3:
                times.append(time.perf_counter() - started)
            if i == 0:
                assert y[0].item() == world * (world + 1) / 2
        if rank == 0:
            print(f"RESULT {n * 4} {statistics.median(times):.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
