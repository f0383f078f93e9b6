"""Data-parallel CPU training with the gloo backend: the multi-rank stallscope example.

    torchrun --standalone --nproc-per-node 2 -m stallscope run examples/ddp_gloo.py

Every rank records its own trace; rank 0 writes one report with a row per rank.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.set_num_threads(1)  # two ranks share this machine's cores
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 64), torch.randint(0, 10, (args.samples,)))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    try:
        for epoch in range(args.epochs):
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
