"""The training script behind the replay's CPU validation pairs (record_replay_pairs.py and
benchmarks/bench_replay.py): a DataLoader whose samples either burn CPU or wait on storage,
and a small model, on one intra-op thread.

One thread, because torch's default (one per core) plus busy loader workers oversubscribes the
cores and OpenMP barriers then stall at random: on loader_bound.py with one worker, steps
ranged 22-134 ms (p10-p90) on a 2-core machine, and no median of 20 steps is a measurement.
The replay predicts the step a user will see on average; a workload that has one is needed to
check it.

    python sample_traces/replay_workload.py --load cpu --num-workers 2
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    """3x64x64 samples; each read burns `cpu_ms` of CPU or waits `io_ms` on storage."""

    def __init__(self, n: int, cpu_ms: float, io_ms: float) -> None:
        self.n, self.cpu_s, self.io_s = n, cpu_ms / 1000.0, io_ms / 1000.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(index)
        img = torch.rand(3, 64, 64, generator=g)
        if self.io_s:
            time.sleep(self.io_s)
        # Decode + augment: CPU time, not wall time, in Python (as PIL decoding is: no profiler
        # events, so the traces stay small).
        deadline, x = time.thread_time() + self.cpu_s, 0
        while time.thread_time() < deadline:
            x = (x * 31 + index) % 1_000_003
        return img, index % 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", choices=("cpu", "io"), default="cpu")
    parser.add_argument("--sample-ms", type=float, default=3.0,
                        help="per sample: CPU burnt (--load cpu) or storage wait (--load io)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=24, help="model width: the step's compute")
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cpu_ms = args.sample_ms if args.load == "cpu" else 0.0
    io_ms = args.sample_ms if args.load == "io" else 0.0
    loader = DataLoader(Samples(args.samples, cpu_ms, io_ms), batch_size=args.batch_size,
                        shuffle=True, num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0)
    w = args.width
    model = nn.Sequential(
        nn.Conv2d(3, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w, w, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for images, labels in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
