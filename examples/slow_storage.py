"""A CPU training script whose DataLoader waits on storage: each sample takes `--io-ms` of
waiting (a network filesystem, an object store, a cold disk) and almost no CPU.

Worker processes overlap those waits even beyond the core count: on 2 cores, 8 workers wait
for 8 samples at once. Compare with examples/loader_bound.py, whose loading burns CPU.

    python examples/slow_storage.py --epochs 1
    stallscope run examples/slow_storage.py --epochs 1
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RemoteImages(Dataset):
    """3x64x64 images whose every read waits `io_ms` on storage before returning."""

    def __init__(self, n: int, io_ms: float) -> None:
        self.n = n
        self.io_s = io_ms / 1000.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.io_s)  # the read: no CPU, only waiting
        g = torch.Generator().manual_seed(index)
        return torch.rand(3, 64, 64, generator=g), index % 10


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--io-ms", type=float, default=4.0, help="storage wait per sample")
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(0)
    loader = DataLoader(RemoteImages(args.samples, args.io_ms), batch_size=args.batch_size,
                        shuffle=True, num_workers=args.num_workers)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
