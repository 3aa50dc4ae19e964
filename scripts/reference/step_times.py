"""The step timing the PyTorch reference scripts share: the median of steps each waited for,
and the median per step of 3 rounds of `steps // 2` steps with one wait at the end of each."""
import statistics
import time


def step_times(step, steps, wait):
    """(synced ms, pipelined ms) of `step(i)`, `wait()` making the device finish."""
    synced = []
    for i in range(steps):
        t = time.perf_counter()
        step(i)
        wait()
        synced.append((time.perf_counter() - t) * 1e3)
    rnd = max(steps // 2, 1)
    pipelined = []
    for _ in range(3):
        t = time.perf_counter()
        for i in range(rnd):
            step(i)
        wait()
        pipelined.append((time.perf_counter() - t) * 1e3 / rnd)
    return statistics.median(synced), statistics.median(pipelined)
