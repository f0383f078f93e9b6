"""What measuring inside the DataLoader costs the recorded steps (issue 16 target: < 5% of a step).

While `stallscope run` records, each loader's `collate_fn` and its workers' fetches are timed
(capture/anatomy.py): two schedstat reads and a few clock reads per batch in the training
process, the same per batch in each worker plus a small file written at most every 0.25 s, a
stack sampler waking every 30 ms in workers and 50 ms in the training process
(capture/sampler.py), each batch's receipt timed against its worker's end stamp
(capture/transfer.py), and the workers' files read back at most every 0.25 s. Where recording
ends, the session summarises it all once into the trace's metadata (`anatomy_of`), timed here
separately: it lands in the last recorded step.

Paired design: this project's 2-core VM drifts by 10-20% in speed over seconds, which hid a 5%
effect when conditions alternated per epoch. Here one loop alternates steps between two loaders
over the same data, one with the anatomy and one with the hooks alone (both recording), so
every step with the anatomy has a neighbour without it, timed within milliseconds. The stack
sampler's wake-ups outside fetches are shared by both loaders' steps; `--sampler-blocks`
measures that part alone (blocks of steps with the sampler thread running vs not).

Worst cases on purpose: an in-memory dataset and a small model, so that a per-batch cost is a
large share of the step. With workers, both loaders' workers share the cores (4 workers on 2
cores for the 2-worker loops), which makes every step slower but is the same for both.

    python benchmarks/bench_anatomy.py [--steps 1500] [--threads 1] [--sampler-blocks 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stallscope.capture import sampler
from stallscope.capture.loaders import LoaderWatcher

# (label, num_workers, hidden width, batch size, steps per condition as a share of --steps)
LOOPS = [("0 workers, small MLP", 0, 512, 64, 1.0), ("2 workers, small MLP", 2, 512, 64, 1.0),
         ("2 workers, larger MLP", 2, 1024, 256, 0.25)]


def paired(workers: int, width: int, batch: int, steps: int) -> tuple[float, float, float, float]:
    """Mean step without the anatomy, the mean and median paired difference with it (seconds),
    and the one-off summary where recording ends."""
    n = (steps + 4) * batch
    data = TensorDataset(torch.randn(n, width), torch.randint(0, 10, (n,)))
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watcher = LoaderWatcher(lambda _info, _it: None)
    watcher.install()
    try:
        with_anatomy = DataLoader(data, batch_size=batch, num_workers=workers)
        info = watcher.loaders[-1]
        tap = watcher._tap
        watcher._tap = lambda *_a: None  # type: ignore[method-assign]
        hooks_only = DataLoader(data, batch_size=batch, num_workers=workers)
        watcher._tap = tap  # type: ignore[method-assign]
        its = {"anatomy": iter(with_anatomy), "hooks": iter(hooks_only)}
        for it in its.values():
            next(it)  # workers started and their first batch in: not a step
        watcher.recording = True
        times: dict[str, list[float]] = {"anatomy": [], "hooks": []}
        for i in range(steps):
            for cond in ("anatomy", "hooks") if i % 2 == 0 else ("hooks", "anatomy"):
                start = time.perf_counter()
                x, y = next(its[cond])
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                times[cond].append(time.perf_counter() - start)
        start = time.perf_counter()
        watcher.anatomy_of(info)
        summary = time.perf_counter() - start
        assert info.anatomy.get("bound"), info.anatomy
        del its
    finally:
        watcher.uninstall()
    diffs = [a - h for a, h in zip(times["anatomy"], times["hooks"], strict=True)]
    return statistics.mean(times["hooks"]), statistics.mean(diffs), statistics.median(diffs), \
        summary


def sampler_blocks(blocks: int, fetch_s: float = 0.0002) -> tuple[float, float]:
    """Mean step and the sampler thread's cost (seconds, median over blocks): blocks of 50
    small-MLP steps, each with a `fetch_s` stand-in fetch the sampler may sample, alternating
    with the thread running and not."""
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))

    def block(n: int = 50) -> float:
        start = time.perf_counter()
        for _ in range(n):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            smp = sampler.begin()
            t = time.perf_counter()
            while time.perf_counter() - t < fetch_s:
                pass
            if smp is not None:
                smp.end()
        return (time.perf_counter() - start) / n

    on: list[float] = []
    off: list[float] = []
    for i in range(blocks):
        for running in (True, False) if i % 2 == 0 else (False, True):
            if running:
                sampler.start(sampler.SAMPLE_S_MAIN)  # the training process's (0 workers)
                on.append(block())
                sampler.stop()
                sampler._sampler = None  # a stopped sampler is not restarted: a fresh one next
            else:
                off.append(block())
    return statistics.median(off), statistics.median(on) - statistics.median(off)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="steps per condition")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sampler-blocks", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); paired steps "
          "(with the anatomy - hooks alone, alternating within one loop)")
    for label, workers, width, batch, share in LOOPS:
        base, mean, median, summary = paired(workers, width, batch, int(args.steps * share))
        print(f"{label:>22}: {base * 1e3:7.3f} ms/step; with the anatomy {mean * 1e6:+7.1f} "
              f"us/step = {mean / base * 100:+5.2f}% (median paired {median * 1e6:+.1f} us); "
              f"summary where recording ends {summary * 1e3:.2f} ms once")
    if args.sampler_blocks:
        base, cost = sampler_blocks(args.sampler_blocks)
        print(f"{'sampler wake-ups':>22}: {base * 1e3:7.3f} ms/step; with the thread running "
              f"{cost * 1e6:+7.1f} us/step = {cost / base * 100:+5.2f}% (shared by both "
              "loaders above, so not in their difference)")


if __name__ == "__main__":
    main()
