"""A CPU training script whose step waits on its DataLoader: the stallscope demo of a loader stall.

Each sample is "decoded and augmented" in the training process (num_workers=0 by default): a
chain of small single-threaded ops per image, the way real decode and augmentation pipelines
spend CPU per sample. The model is small, so loading dominates the step.

    python examples/loader_bound.py --epochs 1
    stallscope run examples/loader_bound.py --epochs 1
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """Random 3x64x64 images with labels; each read costs `work` blur passes of CPU, in small
    single-threaded ops as per-sample decode and augmentation are (no intra-op parallelism)."""

    def __init__(self, n: int, work: int) -> None:
        self.n = n
        self.work = work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(index)
        img = torch.rand(3, 72, 72, generator=g)
        for _ in range(self.work):  # decode + augment: a 3x3 box blur, one axis at a time
            img = (img + img.roll(1, 2) + img.roll(-1, 2)) / 3
            img = (img + img.roll(1, 1) + img.roll(-1, 1)) / 3
        top, left = torch.randint(0, 8, (2,), generator=g).tolist()
        return (img[:, top : top + 64, left : left + 64] - 0.5) / 0.25, index % 10


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=4, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--work", type=int, default=8, help="blur passes per sample")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads for the step (default: torch's)")
    args = parser.parse_args()

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    dataset = SyntheticImages(args.samples, args.work)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers
    )
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
