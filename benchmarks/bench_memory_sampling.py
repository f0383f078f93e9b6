"""What `run`'s memory sampling costs (capture/memory.py): one smaps_rollup read against the size
of the process read, and a training loop's step time with the sampler running against without,
in paired, alternating rounds.

The read walks the process's page tables, so its cost grows with the resident size; the sampler
spaces its sweeps so that they take at most `DUTY` of one core. The paired rounds run the same
loop (a small model, a DataLoader with 2 workers) with the sampler on and off in alternating
order, each round's median step kept; the difference of the medians is the cost per step, and
the spread of the "off" rounds the noise floor of the machine. On a busy machine that floor
swamps the difference, so each sampled round also reports the sampler's own time (the wall
time of its sweeps, summed) against the loop's: the cost measured directly, whatever the
neighbours do.

    python benchmarks/bench_memory_sampling.py [--rounds 8] [--steps 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stallscope.capture import memory


def read_cost(mb: int, reads: int = 20) -> dict[str, float]:
    """Median microseconds of one smaps_rollup read of a child holding `mb` MB resident."""
    ready = multiprocessing.Event()
    done = multiprocessing.Event()

    def hold() -> None:
        buf = bytearray(mb << 20)
        for i in range(0, len(buf), 4096):
            buf[i] = 1
        ready.set()
        done.wait()

    child = multiprocessing.get_context("fork").Process(target=hold)
    child.start()
    ready.wait()
    times, hwm = [], []
    for _ in range(reads):
        t = time.perf_counter()
        got = memory.rollup(child.pid or 0)
        times.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        memory.peak_rss(child.pid or 0)  # the high-water mark each sweep reads beside it
        hwm.append((time.perf_counter() - t) * 1e6)
    done.set()
    child.join()
    rss = (got or {}).get("rss", 0) >> 20
    med = statistics.median(times)
    return {"held_mb": mb, "rss_mb": rss, "read_us": round(med, 1),
            "peak_read_us": round(statistics.median(hwm), 1),
            "us_per_mb": round(med / max(rss, 1), 2),
            "interval_s_at_duty": round(max(memory.SAMPLE_S, med / 1e6 / memory.DUTY), 3)}


def loop(steps: int, sampled: bool) -> tuple[float, int, float, float]:
    """Median step (us) of `steps` training steps, the sweeps the sampler took, their wall
    time summed (s) and the loop's wall time (s)."""
    data = TensorDataset(torch.randn(steps * 32 + 64, 64), torch.randn(steps * 32 + 64, 1))
    loader = DataLoader(data, batch_size=32, num_workers=2, persistent_workers=True)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    me = os.getpid()

    def procs() -> list[memory.Proc]:
        return [("main", me, None, None)] + [("worker", p.pid or 0, None, i) for i, p in
                                             enumerate(multiprocessing.active_children())]

    sampler = memory.MemorySampler(procs, memory.container_limit()) if sampled else None
    if sampler is not None:
        sampler.start()
    times = []
    last = start = time.perf_counter()
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        now = time.perf_counter()
        if i >= 10:  # the workers' start-up is not a step
            times.append((now - last) * 1e6)
        last = now
        if i >= steps:
            break
    wall = time.perf_counter() - start
    sweeps, sweep_s = 0, 0.0
    if sampler is not None:
        sampler.stop()
        sweeps, sweep_s = sampler.sweeps, sampler.sweep_s
    return statistics.median(times), sweeps, sweep_s, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    reads = [read_cost(mb) for mb in (64, 512, 2048)]
    for r in reads:
        print(f"smaps_rollup of {r['rss_mb']:>5} MB resident: {r['read_us']:>8.1f} us "
              f"({r['us_per_mb']} us/MB), its VmHWM {r['peak_read_us']:.1f} us; sweeps every "
              f"{r['interval_s_at_duty']} s at "
              f"{memory.DUTY:.0%} of a core")
    on, off, sweeps, own = [], [], [], []
    for k in range(args.rounds):
        for sampled in ((True, False) if k % 2 == 0 else (False, True)):
            med, n, sweep_s, wall = loop(args.steps, sampled)
            (on if sampled else off).append(med)
            if sampled:
                sweeps.append(n)
                own.append(100 * sweep_s / wall)
    diff = statistics.median(on) - statistics.median(off)
    spread = max(off) - min(off)
    print(f"step median, sampler on : {statistics.median(on):.1f} us (rounds {on})")
    print(f"step median, sampler off: {statistics.median(off):.1f} us (rounds {off})")
    print(f"difference: {diff:+.1f} us per step ({100 * diff / statistics.median(off):+.2f}%); "
          f"spread of the off rounds {spread:.1f} us; sweeps per sampled round {sweeps}")
    print(f"the sampler's own time: {statistics.median(own):.3f}% of the loop's wall time "
          f"(median of the sampled rounds; {min(own):.3f}-{max(own):.3f}%)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"reads": reads, "on_us": on, "off_us": off, "diff_us": diff,
                       "off_spread_us": spread, "sweeps": sweeps, "own_pct": own,
                       "steps": args.steps}, fh,
                      indent=1)


if __name__ == "__main__":
    main()
