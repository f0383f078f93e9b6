"""What `watch`'s other-load sampler (capture/loadsampler.py) costs the run it watches.

Two figures: a sweep's own cost (wall and this thread's CPU time, with the probe's hash apart:
hashlib releases the GIL for it, so only the rest can hold up the training thread), and the
throughput of a pure-Python loop in the main thread with the sampler sweeping beside it every
SAMPLE_S against without, rounds interleaved (the machine's drift hits both alike).

    python benchmarks/bench_load_sampler.py [--sweeps 400] [--rounds 12] [--round-s 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from stallscope.capture import loadsampler
from stallscope.capture.loadsampler import LoadSampler


def sweep_cost(n: int) -> tuple[float, float, float]:
    """Median wall us of a sweep, of its thread CPU, and of the probe alone."""
    sampler = LoadSampler(lambda: [("main", os.getpid(), None, None)])
    walls, cpus, probes = [], [], []
    for _ in range(n):
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        sampler.sweep()
        cpus.append((time.thread_time_ns() - c) / 1e3)
        walls.append((time.perf_counter_ns() - w) / 1e3)
        probes.append(sampler.probe_us)
        time.sleep(0.002)
    return statistics.median(walls), statistics.median(cpus), statistics.median(probes)


def loop_rate(seconds: float) -> float:
    """Iterations per second of a pure-Python loop (a training thread's Python work)."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    return n / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--round-s", type=float, default=2.0)
    args = ap.parse_args()
    wall, cpu, probe = sweep_cost(args.sweeps)
    print(f"a sweep: {wall:.0f} us wall, {cpu:.0f} us of CPU, of which the probe's hash "
          f"{probe:.0f} us (GIL released); every {loadsampler.SAMPLE_S:g} s: "
          f"{100 * cpu / (loadsampler.SAMPLE_S * 1e6):.3f}% of one core")
    ratios = []
    for k in range(args.rounds):  # A B B A: a drift within a pair hits both sides alike
        rates = {}
        for sampling in ((False, True) if k % 2 == 0 else (True, False)):
            sampler = LoadSampler(lambda: [("main", os.getpid(), None, None)])
            if sampling:
                sampler.start()
            try:
                rates[sampling] = loop_rate(args.round_s)
            finally:
                sampler.stop()
        ratios.append(rates[True] / rates[False])
    print(f"a Python loop beside the sampler: {statistics.median(ratios):.4f}x the rate without "
          f"(rounds: {', '.join(f'{r:.4f}' for r in ratios)})")


if __name__ == "__main__":
    main()
