"""A CPU training script whose step is many tiny ops: the host, not the arithmetic, sets its pace.

A deep stack of small layers trained with a for-loop Adam (`foreach=False`, as optimizers ran
before multi-tensor kernels): every step launches thousands of ops of a few microseconds each.
Under a profiler each recorded op pays the profiler's own bookkeeping, so the profiled step
runs much longer than the plain one; stallscope takes that cost out before it predicts.

    python examples/python_heavy.py
    stallscope run examples/python_heavy.py
    python examples/python_heavy.py --foreach   # the multi-tensor optimizer
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--samples", type=int, default=1600)
    parser.add_argument("--depth", type=int, default=48, help="small layers in the stack")
    parser.add_argument("--foreach", action="store_true", help="multi-tensor Adam")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny ops: more threads only add spinning on a shared machine
    data = TensorDataset(torch.randn(args.samples, 16), torch.randint(0, 4, (args.samples,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(16, 16), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=args.foreach)
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
