"""Record the two steady-state window samples (docs/metrics.md "Steps"):

- `cpu-slow-first-step.pt.trace.json.gz`: a CPU training loop recorded with `prof.step()` whose
  first step does a one-off 1.5 s set-up (standing in for autotuning or compilation, as
  `torch.compile` or cuDNN benchmark mode do on the first iteration), then 5 ordinary steps of
  ~40 ms. stallscope must leave the first step out of the verdict and say so.
- `cpu-inference-loop.pt.trace.json.gz`: an inference loop (model.eval(), torch.no_grad(),
  forward over 8 DataLoader batches) recorded with torch.profiler but without `prof.step()`:
  stallscope must infer the 8 iterations from the DataLoader `__next__` ranges.

Run from the repository root:

    python sample_traces/record_windows.py
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

HERE = Path(__file__).resolve().parent
SLOW_FIRST = HERE / "cpu-slow-first-step.pt.trace.json.gz"
INFERENCE = HERE / "cpu-inference-loop.pt.trace.json.gz"
SETUP_S = 1.5  # the one-off work inside the first recorded step
BATCHES = 8


class Images(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16 * BATCHES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 32, 32, generator=g), i % 10


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(), torch.nn.Linear(32 * 16, 10),
    )


def _one_off_setup() -> None:
    """What a compiler or autotuner does once, outside torch ops (so the trace stays small)."""
    with torch.profiler.record_function("compile (one-off)"):
        time.sleep(SETUP_S)


def _save(trace: dict, out: Path, pattern: str) -> None:
    trace["stallscope_sample"] = {
        "recorded_by": "sample_traces/record_windows.py",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "pattern": pattern,
    }
    with gzip.open(out, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


def record_slow_first_step(tmp: Path) -> None:
    model, loss_fn = _model(), torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Images(), batch_size=16)
    raw = tmp / "slow.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=0, active=6, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(raw)),
    ) as prof:
        for step, (x, y) in enumerate(loader):
            if step == 0:
                _one_off_setup()
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            prof.step()
            if step >= 5:
                break
    _save(json.loads(raw.read_text()), SLOW_FIRST,
          f"training loop whose first recorded step holds a {SETUP_S} s one-off set-up")


def record_inference_loop(tmp: Path) -> None:
    model = _model().eval()
    loader = torch.utils.data.DataLoader(Images(), batch_size=16)
    raw = tmp / "infer.json"
    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
        for x, _ in loader:
            model(x)
    prof.export_chrome_trace(str(raw))
    _save(json.loads(raw.read_text()), INFERENCE,
          f"inference loop over {BATCHES} DataLoader batches, no prof.step()")


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        record_slow_first_step(Path(tmp))
        record_inference_loop(Path(tmp))


if __name__ == "__main__":
    main()
