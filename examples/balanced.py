"""A CPU training script whose step is compute, not loading: the stallscope "healthy" example.

The data sits in memory as tensors (TensorDataset), so a batch costs indexing and stacking
only, while the model does real work. `stallscope run` should find no DataLoader stall here.

    python examples/balanced.py --epochs 1
    stallscope run examples/balanced.py --epochs 1
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--width", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    images = torch.randn(args.samples, 3, 32, 32)
    labels = torch.randint(0, 10, (args.samples,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True)
    model = make_model(args.width)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
