"""Record `cpu-loader-bound.pt.trace.json.gz`: a CPU training loop whose DataLoader dominates.

The dataset does real per-sample CPU work (a small convolution-like transform in numpy) in the
training process (num_workers=0), while the model step is light, so most of each step is spent
inside `DataLoader.__next__`. Recorded with torch.profiler and `prof.step()` markers, the way
torch 2.x writes it (DataLoader spans as `user_annotation`). Run from the repository root:

    python sample_traces/record_cpu_loader_bound.py
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, schedule

OUT = Path(__file__).resolve().parent / "cpu-loader-bound.pt.trace.json.gz"


class SlowDataset(torch.utils.data.Dataset):
    """Each sample is decoded and augmented on the CPU, as an image pipeline would."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(i)
        img = rng.random((3, 64, 64), dtype=np.float32)
        for _ in range(6):  # blur passes: the expensive transform
            img = (img + np.roll(img, 1, axis=1) + np.roll(img, 1, axis=2)) / 3.0
        return torch.from_numpy(img), i % 10


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=32, num_workers=0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=5, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(raw)),
        ) as prof:
            for step, (x, y) in enumerate(loader):
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
                prof.step()
                if step >= 8:
                    break
        trace = json.loads(raw.read_text())
    # Provenance for readers of the sample; the analysis ignores these keys.
    trace["stallscope_sample"] = {
        "recorded_by": "sample_traces/record_cpu_loader_bound.py",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "pattern": "single-process DataLoader with a CPU-heavy transform, light model step",
    }
    with gzip.open(OUT, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
