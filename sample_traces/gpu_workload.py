"""The training script behind the real-h100 traces (record_h100.py): a small ResNet-style CNN on
synthetic images, with one switch per fix the replay models, so each before/after pair differs
in exactly one thing.

Each sample costs `--sample-ms` of CPU in the loader (a decode stand-in), so 0 workers starve
the GPU; batches are large enough in bytes (3x128x128 fp32, 128 per batch: 25 MB) that a
pageable copy shows. `--time N` runs N steps without any profiler and prints the mean step a
user would see (wall time over N steps after the first `--time-from`, the GPU synchronized at
both ends).

    python sample_traces/gpu_workload.py --num-workers 4 --pin-memory --non-blocking --time 60
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    """3xSxS float images; each read burns about `cpu_ms` of CPU, the way decode does."""

    def __init__(self, n: int, side: int, cpu_ms: float, slow_from: int = 0) -> None:
        self.n, self.side, self.cpu_s, self.slow_from = n, side, cpu_ms / 1000.0, slow_from

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        slow = 4 if self.slow_from and i >= self.slow_from else 1
        end = time.perf_counter() + self.cpu_s * slow
        x = 0
        while time.perf_counter() < end:
            x += 1
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, self.side, self.side, generator=g), i % 100


def block(cin: int, cout: int, stride: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


def make_model(width: int) -> nn.Module:
    w = width
    return nn.Sequential(
        nn.Conv2d(3, w, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
        block(w, w, 1), block(w, 2 * w, 2), block(2 * w, 4 * w, 2), block(4 * w, 8 * w, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, 100),
    )


def save(model: nn.Module, opt: torch.optim.Optimizer, path: Path) -> None:
    """A blocking checkpoint: the state copied to the host (waits for the GPU), written, synced."""
    with path.open("wb") as f:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--non-blocking", action="store_true")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--side", type=int, default=128)
    p.add_argument("--sample-ms", type=float, default=0.25)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--amp", choices=("none", "bf16"), default="none")
    p.add_argument("--item-every", type=int, default=50, help="loss.item() every N steps")
    p.add_argument("--optimizer", choices=("forloop", "foreach", "fused"), default="foreach")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile's mode (reduce-overhead: CUDA graphs as well)")
    p.add_argument("--time", type=int, default=0, help="time N steps without a profiler")
    p.add_argument("--time-from", type=int, default=10,
                   help="steps run before the timing starts (prefetched batches drain)")
    p.add_argument("--samples", type=int, default=128 * 400)
    p.add_argument("--slow-after-step", type=int, default=0,
                   help="from this step on each sample costs 4x --sample-ms (no shuffle): a "
                        "dataset that outgrows the page cache halfway (for `watch`)")
    p.add_argument("--step-times", type=Path, default=None,
                   help="write each step's wall time (ms, host clock, no GPU sync) as JSON")
    p.add_argument("--save-every", type=int, default=0,
                   help="every N steps torch.save the model and optimizer and fsync (a "
                        "blocking checkpoint, for `watch`)")
    a = p.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    images = Images(a.samples, a.side, a.sample_ms, a.slow_after_step * a.batch_size)
    loader = DataLoader(images, batch_size=a.batch_size, shuffle=not a.slow_after_step,
                        num_workers=a.num_workers, pin_memory=a.pin_memory,
                        drop_last=True, persistent_workers=a.num_workers > 0)
    model = make_model(a.width).to(dev)
    step_model = torch.compile(model, mode=a.compile_mode) if a.compile else model
    kind = {"forloop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, **kind[a.optimizer])
    amp = a.amp == "bf16"
    t0, timed, ends = 0.0, 0, [time.perf_counter()]
    ckpt = Path(tempfile.gettempdir()) / f"gpu_workload-{os.getpid()}.pt"
    for i, (x, y) in enumerate(loader):
        if a.time and i == a.time_from:
            sync()
            t0 = time.perf_counter()
        x = x.to(dev, non_blocking=a.non_blocking)
        y = y.to(dev, non_blocking=a.non_blocking)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(step_model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if a.save_every and (i + 1) % a.save_every == 0:
            save(model, opt, ckpt)
        ends.append(time.perf_counter())
        if (i + 1) % a.item_every == 0:
            print(f"step {i + 1}: loss {loss.item():.3f}", flush=True)
        if a.time and i + 1 == a.time_from + a.time:
            sync()
            timed = a.time
            break
    ckpt.unlink(missing_ok=True)
    if a.step_times:
        a.step_times.write_text(json.dumps([round((b - e) * 1e3, 3)
                                            for e, b in itertools.pairwise(ends)]))
    if a.time:
        ms = (time.perf_counter() - t0) * 1000 / timed
        print(f"MEAN_STEP_MS {ms:.3f} over {timed} steps")


if __name__ == "__main__":
    main()
