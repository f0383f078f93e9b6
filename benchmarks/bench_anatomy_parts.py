"""Which part of the DataLoader anatomy costs the 2-worker small-MLP loop its time (issue 16).

benchmarks/bench_anatomy.py measures wall time, which this 2-core VM's noise (+-10% between
identical conditions) hides. This measures the CPU time of the whole process tree (the training
process and its reaped workers) per step, for the hooks alone, the full anatomy, and the
anatomy with the stack sampler (capture/sampler.py) and/or the batch transfer timing
(capture/transfer.py) switched off, in alternating order.

    python benchmarks/bench_anatomy_parts.py [--steps 300] [--rounds 4]
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stallscope.capture.sampler as smp
import stallscope.capture.transfer as tr
from stallscope.capture.loaders import LoaderWatcher

MODES = ["hooks", "full", "notransfer", "nosampler", "nosampler-notransfer"]
ORIG = {"start": smp.start, "begin": smp.begin, "made": tr.made, "ring_of": tr.ring_of,
        "received": tr.TransferTap.received}


def set_mode(mode: str) -> None:
    smp.start, smp.begin = ORIG["start"], ORIG["begin"]
    tr.made, tr.ring_of, tr.TransferTap.received = ORIG["made"], ORIG["ring_of"], ORIG["received"]
    if "nosampler" in mode:
        smp.start = lambda *a, **k: None
        smp.begin = lambda *a, **k: None
    if "notransfer" in mode:
        tr.made = lambda *a, **k: None
        tr.ring_of = lambda *a, **k: None
        tr.TransferTap.received = lambda *a, **k: None


def cpu_s() -> float:
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps, width, batch, workers = args.steps, 512, 64, 2
    n = (steps + 1) * batch
    data = TensorDataset(torch.randn(n, width), torch.randint(0, 10, (n,)))
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def epoch(mode: str) -> tuple[float, float]:
        set_mode(mode)
        watcher = LoaderWatcher(lambda _info, _it: None)
        if mode == "hooks":
            watcher._tap = lambda *_a: None  # type: ignore[method-assign]
        watcher.install()
        try:
            c0, t0 = cpu_s(), time.perf_counter()
            loader = DataLoader(data, batch_size=batch, num_workers=workers)
            info = watcher.loaders[-1]
            it = iter(loader)
            next(it)
            watcher.recording = True
            for x, y in it:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                watcher.anatomy_of(info)
            del it, loader
            gc.collect()
            time.sleep(0.3)  # the workers exit and are reaped: their CPU time counts
            return (cpu_s() - c0) / steps * 1e3, (time.perf_counter() - t0) / steps * 1e3
        finally:
            watcher.uninstall()

    epoch("hooks")  # warm up
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            results[mode].append(epoch(mode))
    for mode in MODES:
        cpu = statistics.median(x[0] for x in results[mode])
        wall = statistics.median(x[1] for x in results[mode])
        print(f"{mode:>22}: CPU {cpu:.3f} ms/step (process tree), wall {wall:.3f} ms/step")


if __name__ == "__main__":
    main()
