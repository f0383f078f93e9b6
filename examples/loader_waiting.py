"""A CPU training script whose DataLoader waits on storage: each sample takes `--wait-ms` of I/O.

The wait is a `time.sleep`, standing in for a read from a network filesystem or an object store:
the loading process sits idle, off the CPU. Such a loader is not limited by the cores, so more
worker processes than cores keep it fed (measured on a 2-core VM, 4 ms per sample, batches of 16:
0 workers about 80 ms a step, 2 workers about 35 ms, 8 workers about 11 ms).

    python examples/loader_waiting.py
    stallscope run examples/loader_waiting.py
    stallscope tune examples/loader_waiting.py

A worker that fills its prefetch queue while the script still starts up (the transient a
recording must not mistake for the run's pace; `run` waits for steady steps):

    stallscope run examples/loader_waiting.py --num-workers 1 --mp-context spawn \
        --prefetch-factor 4 --startup-s 1
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RemoteSamples(Dataset):
    """Feature vectors with labels; each read waits `wait_ms` as if fetched over a network."""

    def __init__(self, n: int, wait_ms: float) -> None:
        self.n = n
        self.wait_s = wait_ms / 1000.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.wait_s)  # the read: off-CPU
        g = torch.Generator().manual_seed(index)
        return torch.randn(256, generator=g), index % 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--samples", type=int, default=1600)
    parser.add_argument("--wait-ms", type=float, default=4.0, help="I/O wait per sample")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--mp-context", choices=("fork", "spawn"), default=None)
    parser.add_argument("--prefetch-factor", type=int, default=None,
                        help="batches each worker keeps ready (torch's default: 2)")
    parser.add_argument("--startup-s", type=float, default=0.0,
                        help="seconds of start-up after the loader's workers start (a model "
                             "being built): the workers prefetch meanwhile")
    args = parser.parse_args()

    torch.manual_seed(0)
    # One intra-op thread: the model is tiny, and on a shared 2-core machine two spinning
    # threads make its step erratic; the example is about the loader.
    torch.set_num_threads(1)
    loader = DataLoader(
        RemoteSamples(args.samples, args.wait_ms), batch_size=args.batch_size, shuffle=True,
        num_workers=args.num_workers,
        multiprocessing_context=args.mp_context if args.num_workers else None,
        prefetch_factor=args.prefetch_factor if args.num_workers else None,
    )
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        batches = iter(loader)  # the workers start here
        if epoch == 0 and args.startup_s:
            time.sleep(args.startup_s)
        for x, y in batches:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
