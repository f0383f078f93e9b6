"""Record `cpu-gloo-ddp-rank{0,1}.pt.trace.json.gz`: a two-process DDP job on CPU (backend
gloo, world size 2, torch.multiprocessing), a small MLP whose gradients DDP all-reduces in
small buckets during backward, with ProfilerStep markers. Each rank writes its own trace. The
model is wide enough that the gloo all-reduce of its gradients is a large share of the step,
which comm-bound must assess on a CPU-only trace (tests/rules/test_comm_bound.py). Run from the
repository root:

    python sample_traces/record_cpu_gloo_ddp.py
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

HERE = Path(__file__).resolve().parent
WORLD = 2
STEPS = 6  # recorded, after one wait and one warmup step
WIDTH = 1024
BATCH = 32


def _rank(rank: int, tmp: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.set_num_threads(1)  # two processes on a shared machine
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                          nn.Linear(WIDTH, 10))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,))
    out = Path(tmp) / f"rank{rank}.json"
    sched = torch.profiler.schedule(wait=1, warmup=1, active=STEPS, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=sched,
                                on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
        for _ in range(STEPS + 2):
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            prof.step()
    dist.destroy_process_group()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(tmp,), nprocs=WORLD, join=True)
        for rank in range(WORLD):
            data = json.loads((Path(tmp) / f"rank{rank}.json").read_text())
            dest = HERE / f"cpu-gloo-ddp-rank{rank}.pt.trace.json.gz"
            with gzip.open(dest, "wt", encoding="utf-8") as fh:
                json.dump(data, fh)
            print("recorded", dest.name, dest.stat().st_size, "bytes", file=sys.stderr)
    shutil.rmtree(HERE / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main()
