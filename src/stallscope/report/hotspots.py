"""Top host ops and top GPU kernels within steps: where to look once the verdict is read.

Host op times are inclusive (an op's time includes the ops it calls), as in the profiler's own
"CPU total" column; the table says so. Kernel times are GPU busy time. Shares are of the summed
step wall time (per GPU for kernels), so a reader can compare them with the step breakdown.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from stallscope.report.loader_work import inside_loader
from stallscope.trace.model import TraceModel

TOP_N = 10


def top_host_ops(models: list[TraceModel], top: int = TOP_N) -> list[dict[str, Any]]:
    """The host ops (cpu_op and user annotations, all threads of the stepping process) with the
    largest total inclusive time inside steps, summed over every trace. Ops the training thread
    ran inside DataLoader `__next__` (the dataset's own work) are left out: the breakdown counts
    them as time in the loader, and listing them here would present them as the model's."""
    frames = []
    for m in models:
        if len(m.ops):
            in_step = m.ops[m.ops["step"] >= 0]
            frames.append(in_step.loc[~inside_loader(m, in_step), ["name", "dur"]])
    steps = sum(len(m.steps) for m in models)
    step_us = sum(m.total_step_us for m in models)
    return _rank(frames, steps, step_us, top)


def top_gpu_kernels(models: list[TraceModel], top: int = TOP_N) -> list[dict[str, Any]]:
    """The GPU kernels with the largest total busy time inside steps, over every GPU and trace."""
    frames, steps, gpu_step_us = [], 0, 0.0
    for m in models:
        if len(m.gpu) == 0:
            continue
        kernels = m.gpu[(m.gpu["kind"] == "kernel") & (m.gpu["step"] >= 0)]
        frames.append(kernels[["name", "dur"]])
        steps += len(m.steps)
        gpu_step_us += m.total_step_us * max(len(m.gpu_devices), 1)
    return _rank(frames, steps, gpu_step_us, top)


def _rank(
    frames: list[pd.DataFrame], steps: int, window_us: float, top: int
) -> list[dict[str, Any]]:
    frames = [f for f in frames if len(f)]
    if not frames or steps == 0 or window_us <= 0:
        return []
    names = pd.concat([f["name"].astype(str) for f in frames], ignore_index=True)
    durs = pd.concat([f["dur"] for f in frames], ignore_index=True)
    grouped = durs.groupby(names).agg(["sum", "count"]).sort_values("sum", ascending=False)
    return [
        {
            "name": str(name),
            "calls": int(row["count"]),
            "total_us": round(float(row["sum"]), 3),
            "per_step_us": round(float(row["sum"]) / steps, 3),
            "share_pct": round(100.0 * float(row["sum"]) / window_us, 2),
        }
        for name, row in grouped.head(top).iterrows()
    ]
