"""Record a small transformer stack's training step in four precisions on a lent GPU: fp32 (TF32
off), tf32, bf16 autocast, and fp32 under torch.compile; each timed plain (two runs of 20 steps,
GPU synchronised at both ends) and recorded for 5 steps by torch.profiler (CPU and CUDA)
after 3 unrecorded ones, then timed plain once more (the third plain figure).
Writes real-<gpu>-xfmr-<config>.pt.trace.json.gz and real-<gpu>-xfmr-measured.json to OUT.

    python sample_traces/record_xfmr_precision.py OUT [--gpu h200]

GEMM-heavy (four linear layers per block, attention written out: matmul, scale, softmax,
dropout), with the elementwise chains a transformer has (GELU, dropout, residual add, layer
norm): the out-of-sample check of the mixed-precision and compile replay models
(docs/replay.md), whose constants were first calibrated on a small CNN.

As recorded (2026-11-26, one call on a lent H200), the fp32 and compiled steps are not steady:
the plain timing before them ends with the queue drained, and their GPU-bound steps (31 ms of
kernels, ~10 ms of host) let the host run ahead until the launch queue fills, so their first
recorded steps are 9-11 ms on the host and the GPU's work of earlier steps runs inside them.
Their kernels are right (compare them per GEMM: 72 per step), their recorded step times are
not. Recording again, wait=12 in the schedule would start the recording in the steady state.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from torch import nn

B, S, D, H, LAYERS = 16, 256, 1024, 16, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
        att = self.drop(torch.softmax(q @ k.transpose(-2, -1) * (D // H) ** -0.5, dim=-1))
        x = x + self.drop(self.proj((att @ v).transpose(1, 2).reshape(B, S, D)))
        return x + self.drop(self.fc2(self.drop(nn.functional.gelu(self.fc1(self.ln2(x))))))


def step_fn(config: str):  # noqa: ANN201
    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(LAYERS)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    run = torch.compile(model) if config == "compile" else model
    x = torch.randn(B, S, D, device="cuda")
    y = torch.randn(B, S, D, device="cuda")
    tf32 = config == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16, enabled=config == "bf16"):
            loss = nn.functional.mse_loss(run(x).float(), y)
        loss.backward()
        opt.step()
    return step


def plain_ms(step, n: int = 20) -> float:  # noqa: ANN001
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1000 / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--gpu", default="h200")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    measured = {"_env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                         "shape": {"batch": B, "seq": S, "dim": D, "heads": H,
                                   "layers": LAYERS}}}
    from torch.profiler import ProfilerActivity, profile, schedule
    for config in ("fp32", "tf32", "bf16", "compile"):
        t0 = time.perf_counter()
        step = step_fn(config)
        for _ in range(5):
            step()
        runs = [round(plain_ms(step), 3) for _ in range(2)]
        raw = a.out / f"{config}.json"
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     schedule=schedule(wait=1, warmup=2, active=5),
                     on_trace_ready=lambda prof, r=raw: prof.export_chrome_trace(str(r))) as prof:
            for _ in range(8):
                step()
                prof.step()
        runs.append(round(plain_ms(step), 3))
        name = f"real-{a.gpu}-xfmr-{config}.pt.trace.json.gz"
        with raw.open("rb") as src, gzip.open(a.out / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        measured[config] = {"plain_mean_step_ms": runs, "wall_s": round(time.perf_counter() - t0,
                                                                          1)}
        print(config, measured[config], flush=True)
        (a.out / f"real-{a.gpu}-xfmr-measured.json").write_text(json.dumps(measured, indent=1))
    sys.exit(0)


if __name__ == "__main__":
    main()
