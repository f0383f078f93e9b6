"""What measuring inside the DataLoader costs the recorded steps (issue 16 target: < 5% of a step).

While `stallscope run` records, each loader's `collate_fn` and its workers' fetches are timed
(capture/anatomy.py): two reads of /proc/thread-self/schedstat and a few clock reads per batch
in the training process, the same per batch in each worker plus a small file written at most
every 0.1 s, a stack sampler waking every ~20 ms while a fetch runs (capture/sampler.py), each
batch's receipt timed against its worker's end stamp (capture/transfer.py), and the workers'
files read back at most every 0.1 s (the session summarises the anatomy into the trace's
metadata where recording begins and ends; the end is timed here). This times step loops with the
DataLoader hooks recording, with and without the anatomy, in alternating order (wall time: the
workers run beside the step), and the first condition again as the noise floor.

Worst cases on purpose: an in-memory dataset and a small model, so that a per-batch cost is a
large share of the step.

    python benchmarks/bench_anatomy.py [--steps 150] [--rounds 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stallscope.capture.loaders import LoaderWatcher

CONDITIONS = ["hooks", "hooks + anatomy", "hooks again"]
# (label, num_workers, hidden width, batch size)
LOOPS = [("0 workers, small MLP", 0, 512, 64), ("2 workers, small MLP", 2, 512, 64),
         ("2 workers, larger MLP", 2, 1024, 256)]


def make_epoch(workers: int, width: int, batch: int, steps: int):
    n = (steps + 1) * batch
    data = TensorDataset(torch.randn(n, width), torch.randint(0, 10, (n,)))
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def epoch(anatomy: bool) -> tuple[float, float]:
        watcher = LoaderWatcher(lambda _info, _it: None)
        if not anatomy:
            watcher._tap = lambda *_a: None  # type: ignore[method-assign]
        watcher.install()
        try:
            loader = DataLoader(data, batch_size=batch, num_workers=workers)
            info = watcher.loaders[-1]
            it = iter(loader)
            next(it)  # workers started and their first batch in: not a step
            watcher.recording = True
            cpu0 = tree_cpu_s()
            start = time.perf_counter()
            for x, y in it:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            watcher.anatomy_of(info)  # what the session does where recording ends (timed too)
            elapsed = (time.perf_counter() - start) / steps
            if anatomy:
                assert info.anatomy.get("bound"), info.anatomy
            del it  # joins the workers: their CPU is counted
            return elapsed, (tree_cpu_s() - cpu0) / steps
        finally:
            watcher.uninstall()

    return epoch


def tree_cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the workers, once joined)."""
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _delta(times: dict[str, list[float]], pick: Any) -> tuple[float, float, float]:
    base = pick(times["hooks"])
    return (base, (pick(times["hooks + anatomy"]) - base) / base * 100,
            (pick(times["hooks again"]) - base) / base * 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.steps} steps x {args.rounds} rounds per condition: wall time per step, and "
          f"CPU time per step of the process tree (workers included); median and min over "
          f"the rounds (noise only adds time: min is the steadier on a busy machine)")
    for label, workers, width, batch in LOOPS:
        epoch = make_epoch(workers, width, batch, args.steps)
        epoch(False)  # warm up
        walls: dict[str, list[float]] = {c: [] for c in CONDITIONS}
        cpus: dict[str, list[float]] = {c: [] for c in CONDITIONS}
        for r in range(args.rounds):
            for cond in CONDITIONS if r % 2 == 0 else CONDITIONS[::-1]:
                wall, cpu = epoch(cond == "hooks + anatomy")
                walls[cond].append(wall)
                cpus[cond].append(cpu)
        for what, times in (("wall", walls), ("CPU", cpus)):
            for stat, pick in (("median", statistics.median), ("min", min)):
                base, cost, floor = _delta(times, pick)
                print(f"{label:>22} {what:>4} {stat:>6}: {base * 1e3:7.3f} ms/step; with the "
                      f"anatomy {cost:+6.2f}%; noise floor {floor:+6.2f}%")

if __name__ == "__main__":
    main()
