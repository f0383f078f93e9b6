"""Record `cpu-worker-startup.pt.trace.json.gz`: multi-process loading that re-spawns its workers
at every epoch (`persistent_workers=False`, the DataLoader default).

Short epochs (6 batches of 16) over a dataset with real per-sample CPU work, loaded by 2 worker
processes; the profiler records 14 steps spanning two epoch boundaries. At each boundary the
trace shows what torch 2.x really emits: the `__next__` that ends the epoch (it joins the
workers: `_shutdown_workers`), the new iterator's seed ops (`aten::empty`, `aten::random_`,
`aten::item` from `_BaseDataLoaderIter.__init__`), no event at all while the workers are
forked, then a first `__next__` that waits for the fresh workers to produce a batch. There is
no iterator-creation event. `record_cpu_persistent_workers.py` records the same loop with
`persistent_workers=True` as the control. Run from the repository root:

    python sample_traces/record_cpu_worker_startup.py
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

HERE = Path(__file__).resolve().parent
BATCHES_PER_EPOCH = 6


class ImageDataset(torch.utils.data.Dataset):
    """Each sample is decoded and augmented on the CPU, as an image pipeline would."""

    def __len__(self) -> int:
        return 16 * BATCHES_PER_EPOCH

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(i)
        img = rng.random((3, 32, 32), dtype=np.float32)
        for _ in range(3):  # blur passes: the transform
            img = (img + np.roll(img, 1, axis=1) + np.roll(img, 1, axis=2)) / 3.0
        return torch.from_numpy(img), i % 10


def record(persistent: bool, out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(
        ImageDataset(), batch_size=16, shuffle=True, num_workers=2,
        persistent_workers=persistent,
    )
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=14, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(raw)),
        ) as prof:
            step = 0
            for _epoch in range(3):
                for x, y in loader:
                    opt.zero_grad()
                    loss_fn(model(x), y).backward()
                    opt.step()
                    prof.step()
                    step += 1
        trace = json.loads(raw.read_text())
    # Provenance for readers of the sample; the analysis ignores these keys.
    trace["stallscope_sample"] = {
        "recorded_by": f"sample_traces/{Path(sys.argv[0]).name}",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "pattern": (
            "DataLoader(num_workers=2, persistent_workers="
            f"{persistent}), {BATCHES_PER_EPOCH} batches per epoch, two epoch boundaries"
        ),
    }
    with gzip.open(out, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    record(persistent=False, out=HERE / "cpu-worker-startup.pt.trace.json.gz")
