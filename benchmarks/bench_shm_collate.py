"""What collating a batch costs inside a DataLoader worker, beyond the same collate in the
training process: the replay's SHM_WRITE_US (replay/loader.py).

A worker's default_collate stacks the samples into a tensor in new shared memory (so that the
training process can map it), and each of its pages is allocated and zeroed as the stack first
writes it; in the training process the stack reuses warm memory. Times default_collate on the
same samples in process (one intra-op thread, as a worker runs) and inside workers, and prints
the workers' extra time per 4 KiB page of the batch.

    python benchmarks/bench_shm_collate.py [--mb 25] [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

SAMPLES = 128


class Samples(Dataset):
    """`SAMPLES` per batch, each 1/SAMPLES of `mb` MB, made once (no fetch cost to speak of)."""

    def __init__(self, mb: int) -> None:
        self.sample = torch.rand(mb * 1024 * 1024 // 4 // SAMPLES)

    def __len__(self) -> int:
        return SAMPLES * 40

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.sample.clone()


def timed_collate(batch: list[torch.Tensor]) -> tuple[torch.Tensor, float]:
    a = time.perf_counter()
    out = default_collate(batch)
    return out, time.perf_counter() - a


def collate_s(mb: int, workers: int) -> float:
    """Median seconds of default_collate per batch after the first four."""
    loader = DataLoader(Samples(mb), batch_size=SAMPLES, num_workers=workers,
                        collate_fn=timed_collate)
    times = [t for k, (_, t) in enumerate(loader) if k >= 4]
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=25)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    pages = a.mb * 1024 * 1024 / 4096
    for _ in range(a.rounds):
        here, there = collate_s(a.mb, 0), collate_s(a.mb, a.workers)
        print(f"{a.mb} MB: in process {1e3 * here:.1f} ms, in a worker {1e3 * there:.1f} ms: "
              f"+{1e6 * (there - here) / pages:.2f} us per 4 KiB page")


if __name__ == "__main__":
    main()
