"""Top host ops and top GPU kernels within steps: where to look once the verdict is read.

Host op times are inclusive (an op's time includes the ops it calls), as in the profiler's own
"CPU total" column; the table says so. Kernel times are GPU busy time. Per-step times and shares
are of the summed step wall time (per GPU for kernels), so a reader can compare them with the
step breakdown, and count the time any call of a name ran, once: calls that overlap (one op on
two threads, a kernel on two streams, an op nested in itself) are a union, not a sum, so no
share passes 100%.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stallscope.report.loader_work import inside_loader
from stallscope.trace.grouped import exact_sums
from stallscope.trace.model import TraceModel

TOP_N = 10


@dataclass
class HotTotals:
    """Time inside steps by op (or kernel) name, in integer nanoseconds: one trace's, or a
    job's summed. Integers make the sum exact in any order, so a job's table does not depend on
    which worker finished first; a worker sends back these kilobytes, not the trace's ops."""

    # name -> [total ns, calls, busy ns]: the calls' summed time, and the time (within the
    # steps) that any of them ran.
    by_name: dict[str, list[int]] = field(default_factory=dict)
    steps: int = 0
    window_ns: int = 0

    def add(self, other: HotTotals) -> None:
        """Sum `other` into this one."""
        for name, row in other.by_name.items():
            acc = self.by_name.get(name)
            if acc is None:
                self.by_name[name] = list(row)
            else:
                for i, value in enumerate(row):
                    acc[i] += value
        self.steps += other.steps
        self.window_ns += other.window_ns


def host_op_totals(model: TraceModel) -> HotTotals:
    """The host ops (cpu_op and user annotations, all threads of the stepping process) inside
    steps, by inclusive time. Ops the training thread ran inside DataLoader `__next__` (the
    dataset's own work) are left out: the breakdown counts them as time in the loader, and
    listing them here would present them as the model's."""
    by_name: dict[str, list[int]] = {}
    ops = model.ops
    if len(ops):
        keep = (ops["step"].to_numpy() >= 0) & ~inside_loader(model, ops)  # row by row
        by_name = _by_name(ops["name"], ops["dur"].to_numpy(), keep)
        _add_busy(by_name, ops["name"], _spans(model, ops, keep), None)
    return HotTotals(by_name, len(model.steps), _ns(model.total_step_us))


def gpu_kernel_totals(model: TraceModel) -> HotTotals:
    """The GPU kernels inside steps by busy time, over every GPU of the trace."""
    gpu = model.gpu
    if len(gpu) == 0:
        return HotTotals()
    keep = (gpu["kind"].to_numpy() == "kernel") & (gpu["step"].to_numpy() >= 0)
    window = model.total_step_us * max(len(model.gpu_devices), 1)
    by_name = _by_name(gpu["name"], gpu["dur"].to_numpy(), keep)
    _add_busy(by_name, gpu["name"], _spans(model, gpu, keep), gpu["device"])
    return HotTotals(by_name, len(model.steps), _ns(window))


def summed(totals: Iterable[HotTotals]) -> HotTotals:
    out = HotTotals()
    for t in totals:
        out.add(t)
    return out


def top_rows(totals: HotTotals, top: int = TOP_N) -> list[dict[str, Any]]:
    """The `top` names by total time, with calls, the time per step any call ran and its
    share of the summed step window (a union: at most 100%)."""
    if not totals.by_name or totals.steps == 0 or totals.window_ns <= 0:
        return []
    ranked = sorted(totals.by_name.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
    return [
        {
            "name": name,
            "calls": calls,
            "total_us": round(total / 1000, 3),
            "per_step_us": round(busy / 1000 / totals.steps, 3),
            "share_pct": round(100.0 * busy / totals.window_ns, 2),
        }
        for name, (total, calls, busy) in ranked
    ]


def _ns(us: float) -> int:
    return round(us * 1000)


def _by_name(names: pd.Series, dur: np.ndarray, keep: np.ndarray) -> dict[str, list[int]]:
    """[total ns, calls] of the rows in `keep` by name, names in order (as pandas' groupby by
    `names.astype(str)` gives them). Summed with bincount where every partial sum is exact
    (`exact_sums`: then the order of summation cannot change a bit), else by that groupby."""
    if not keep.any():
        return {}
    values = dur[keep]
    if isinstance(names.dtype, pd.CategoricalDtype) and exact_sums(values):
        codes = names.array.codes[keep]
        if (codes >= 0).all():
            size = len(names.dtype.categories)
            calls = np.bincount(codes, minlength=size)
            totals = np.bincount(codes, weights=values, minlength=size)
            text = [str(c) for c in names.dtype.categories]
            return {text[c]: [_ns(float(totals[c])), int(calls[c])]
                    for c in sorted(np.flatnonzero(calls).tolist(), key=text.__getitem__)}
    frame = pd.DataFrame({"name": names[keep], "dur": values})
    grouped = frame["dur"].groupby(frame["name"].astype(str)).agg(["sum", "count"])
    return {str(name): [_ns(float(total)), int(calls)]
            for name, total, calls in zip(grouped.index, grouped["sum"], grouped["count"],
                                          strict=True)}


def _spans(model: TraceModel, rows: pd.DataFrame, keep: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of `keep` as [start, end) in integer ns, each cut at the end of the step it
    started in (the window the shares are of), and the mask they were taken with."""
    step = rows["step"].to_numpy()[keep].astype(np.int64)
    stop = model.windows[:, 1][step] if len(step) else np.zeros(0)
    ts = rows["ts"].to_numpy(float)[keep]
    end = np.minimum(rows["end"].to_numpy(float)[keep], stop)
    return np.round(ts * 1000).astype(np.int64), np.round(end * 1000).astype(np.int64), keep


def _add_busy(by_name: dict[str, list[int]], names: pd.Series,
              spans: tuple[np.ndarray, np.ndarray, np.ndarray], device: pd.Series | None) -> None:
    """Append to each row of `by_name` the union of its name's spans (per device, summed over
    the devices, when `device` is given), in integer ns: exact, whatever the order."""
    start, end, keep = spans
    if not keep.any():
        return
    text = names[keep].astype(str).to_numpy()
    codes, uniques = pd.factorize(text)
    group = codes.astype(np.int64)
    if device is not None:
        dev = pd.factorize(device[keep].astype(str).to_numpy())[0]
        group = group * (int(dev.max()) + 1) + dev
    order = np.lexsort((end, start, group))
    s, e, g = start[order], end[order], group[order]
    new = np.r_[True, g[1:] != g[:-1]]
    # Each span adds what lies past the latest end of the spans before it in its group.
    latest = pd.Series(e).groupby(g).cummax().to_numpy()
    before = np.r_[s[:1], latest[:-1]]
    before[new] = s[new]
    add = np.clip(e - np.maximum(s, before), 0, None)
    busy = np.zeros(len(uniques), dtype=np.int64)
    np.add.at(busy, codes[order], add)
    for i, name in enumerate(uniques):
        by_name[str(name)].append(int(busy[i]))
