"""What reading a batch received from a DataLoader worker costs the first time, beyond a read of
warm memory: the replay's SHM_FIRST_TOUCH_US (replay/models/dataloader_bound.py).

A worker's batch arrives in shared-memory pages the training process has not touched; the
first read (a pageable host-to-device copy's staging memcpy, here a copy into a warm tensor)
maps each page as it goes. Copies each batch twice into the same warm destination, in process
(num_workers=0: the batch's pages are warm) and from workers, and prints the first read's extra
time per 4 KiB page.

    python benchmarks/bench_first_touch.py [--mb 25] [--workers 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    def __init__(self, mb: int) -> None:
        self.numel = mb * 1024 * 1024 // 4

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((self.numel,), float(i))


def first_and_second(mb: int, workers: int) -> tuple[float, float]:
    """Median seconds of the first and the second copy of each batch after the first four."""
    first, second = [], []
    dst = torch.zeros(mb * 1024 * 1024 // 4)
    loader = DataLoader(Batches(mb), batch_size=None, num_workers=workers)
    for k, t in enumerate(loader):
        if k < 4:
            continue
        a = time.perf_counter()
        dst.copy_(t)
        b = time.perf_counter()
        dst.copy_(t)
        first.append(b - a)
        second.append(time.perf_counter() - b)
        time.sleep(0.05)  # the workers are ahead: the batch waits in the queue, as in training
    return statistics.median(first), statistics.median(second)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=25)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(1)
    pages = a.mb * 1024 * 1024 / 4096
    for _ in range(a.rounds):
        extra = {}
        for workers in (0, a.workers):
            f, s = first_and_second(a.mb, workers)
            extra[workers] = (f - s) / pages * 1e6
            print(f"workers={workers}: first read {f * 1e3:.2f} ms, second {s * 1e3:.2f} ms; "
                  f"first-read extra per 4 KiB page {extra[workers]:.3f} us", flush=True)
        print(f"  a worker's batch costs {extra[a.workers] - extra[0]:.3f} us per 4 KiB page "
              "more than an in-process one", flush=True)


if __name__ == "__main__":
    main()
