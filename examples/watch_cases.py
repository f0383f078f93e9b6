"""CPU training loops whose stalls change during the run: the known truths `stallscope watch`
is tested on (tests/test_watch.py), one per --case.

    python examples/watch_cases.py --case slowdown   # the loader slows down halfway
    python examples/watch_cases.py --case save       # a blocking checkpoint every 25 steps
    python examples/watch_cases.py --case epochs     # workers started again every epoch
    python examples/watch_cases.py --case steady     # nothing changes
    stallscope watch examples/watch_cases.py --case slowdown

`slowdown`: each sample costs CPU in the loader (num_workers=0); after --steps/2 steps it costs
four times as much, as when a dataset outgrows the page cache and every read goes to disk.
`save`: every 25 steps the loop writes a 16 MB checkpoint and fsyncs it (`torch.save`),
holding the step. `epochs`: 2 workers, persistent_workers=False, several short epochs: each
epoch starts its workers again (each worker's start-up is made slow on purpose, as importing a
real pipeline's libraries is), so the first steps of each epoch wait.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    """Feature vectors whose reads cost `cost_ms` of CPU each (`slow_after`: from that index on,
    4x); `start_ms`: a worker's start-up, paid by each worker at its first sample."""

    def __init__(self, n: int, cost_ms: float, slow_after: int | None = None,
                 start_ms: float = 0.0) -> None:
        self.n, self.cost_ms, self.slow_after, self.start_ms = n, cost_ms, slow_after, start_ms
        self.started = False

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.start_ms and not self.started:
            self.started = True
            time.sleep(self.start_ms / 1e3)  # a worker importing its pipeline's libraries
        cost = self.cost_ms * (4 if self.slow_after is not None and i >= self.slow_after else 1)
        end = time.perf_counter() + cost / 1e3
        x = torch.zeros(64)
        while time.perf_counter() < end:  # decode/augment: CPU work, not a sleep
            x = x + 1
        return torch.randn(64), i % 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("slowdown", "save", "epochs", "steady"), required=True)
    ap.add_argument("--steps", type=int, default=240, help="steps in all (default 240)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    batch = 8
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.case == "epochs":
        epochs, per_epoch = 6, args.steps // 6
        data = Samples(per_epoch * batch, 0.2, start_ms=400.0)
        loader = DataLoader(data, batch_size=batch, num_workers=2, persistent_workers=False)
    else:
        epochs, per_epoch = 1, args.steps
        slow_after = per_epoch * batch // 2 if args.case == "slowdown" else None
        # 1.2 ms a sample before the slowdown: the first regime lasts over a second, the
        # shortest stretch `watch` calls a regime (a shorter one is a blip of other load).
        cost = 1.2 if args.case == "slowdown" else 0.25
        loader = DataLoader(Samples(per_epoch * batch, cost, slow_after), batch_size=batch)
    folder = tempfile.mkdtemp(prefix="watch-cases-")
    state = torch.randn(4 << 20) if args.case == "save" else None
    step = 0
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            step += 1
            if args.case == "save" and step % 25 == 0:  # a blocking checkpoint
                path = os.path.join(folder, "ckpt.pt")
                # The model and 16 MB of optimizer-like state, written and fsynced: 37-42 ms
                # on the 2-core VM, 10-20 plain steps' time.
                torch.save({"model": model.state_dict(), "state": state}, path)
                with open(path, "rb+") as fh:
                    os.fsync(fh.fileno())
    print(f"trained {step} steps")


if __name__ == "__main__":
    main()
