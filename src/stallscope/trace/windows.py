"""Steady-state windows: which spans of a trace are the steps the user repeats.

Steps come from `ProfilerStep#N` when the trace has them. Without them (older
`torch.autograd.profiler` / `emit_nvtx` recordings, inference loops) the iterations are inferred
from what repeats with a regular period on the busiest host thread: DataLoader `__next__`,
`Optimizer.step#...`, `Optimizer.zero_grad#...`, else the shallowest op or annotation that
repeats regularly. Only when nothing repeats is the whole trace one window.

One-off costs are not steps: start-up (CUDA context creation, cuDNN/cuBLAS initialisation, module
loading: runtime calls that take tens of milliseconds without waiting for the GPU) is set aside
and reported as start-up, and a first step far longer than the others (autotuning, compilation)
or whose GPU timeline is still busy with work launched before the recording is left out of the
verdict. See docs/metrics.md "Steps".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

# Markers that delimit one iteration, in order of preference, and whether a marker opens its
# iteration (windows run from one start to the next) or closes it (from one end to the next).
KNOWN_MARKERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^enumerate\((?:DataLoader|DataPipe)\)#.*__next__$"), "opens"),
    (re.compile(r"^Optimizer\.step#"), "closes"),
    (re.compile(r"^Optimizer\.zero_grad#"), "opens"),
)
MARKER_CATS = ("cpu_op", "user_annotation")
# A marker must occur at least this often (giving two iterations) to infer iterations from it.
MIN_MARKERS = 3
# Regular: at least this share of the intervals between markers within PERIOD_TOLERANCE of
# their median. The first interval may carry one-off work, and an op that runs twice per
# iteration alternates short and long intervals, which this rejects.
REGULAR_SHARE = 0.75
PERIOD_TOLERANCE = 0.30
# A host runtime call this long (us) that is not waiting for the GPU (sync, copy, event wait) is
# initialisation: context creation, library handles, module loading, first allocations. A
# steady-state launch or allocation takes microseconds to a few milliseconds.
STARTUP_CALL_US = 50_000.0
WAIT_CALL = re.compile(
    r"^(?:cuda|cu|hip)(?:Memcpy|Memset|.*Synchronize|StreamWaitEvent|EventQuery)")
# A first step this many times the median of the others is a one-off (autotuning, compilation,
# caches filling), not a step the user repeats. Only the first step: a long step later (an
# epoch boundary re-spawning workers) is a cost the user pays again, and rules judge it.
OUTLIER_FACTOR = 2.0
# A first step whose GPU is busy this share of its time with work launched before it straddles
# the recording's start: its GPU timeline belongs partly to an unrecorded step.
PRE_WINDOW_SHARE = 0.10
# Outliers are only set aside when at least this many steps were recorded.
MIN_STEPS_FOR_OUTLIERS = 3


@dataclass
class Iterations:
    """Inferred iteration windows and the marker they came from."""

    windows: np.ndarray
    names: list[str]
    marker: str
    period_us: float


@dataclass
class Startup:
    """One-off start-up set aside before the steady-state window."""

    start_us: float
    end_us: float
    calls: list[dict[str, Any]] = field(default_factory=list)
    what: str = ""

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    def to_dict(self) -> dict[str, Any]:
        return {"start_us": round(self.start_us, 3), "end_us": round(self.end_us, 3),
                "duration_us": round(self.duration_us, 3), "what": self.what,
                "calls": self.calls}


def thread_depth(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Nesting depth of each range of one thread (0: top level), in the input order."""
    order = np.lexsort((-ends, starts))
    s = starts[order]
    depth_sorted = np.arange(len(s)) - np.searchsorted(np.sort(ends), s, side="right")
    depth = np.empty(len(s), dtype=np.int64)
    depth[order] = depth_sorted
    return depth


def infer_iterations(host: pd.DataFrame) -> Iterations | None:
    """Iterations of the stepping thread (`host`: its events), from a regularly repeating
    marker; None when nothing repeats regularly."""
    ranges = host[host["cat"].isin(MARKER_CATS)].sort_values("ts", kind="stable")
    if len(ranges) < MIN_MARKERS:
        return None
    names = ranges["name"].astype(str)
    counts = names.value_counts()
    repeated = ranges[names.isin(counts.index[counts >= MIN_MARKERS]).to_numpy()]
    if repeated.empty:
        return None
    repeated = _outermost(repeated)
    for pattern, kind in KNOWN_MARKERS:
        found = [n for n in repeated["name"].astype(str).unique() if pattern.match(n)]
        for name in found:
            it = _regular(repeated[repeated["name"].astype(str) == name], name, kind)
            if it is not None:
                return it
    all_depth = thread_depth(ranges["ts"].to_numpy(), ranges["end"].to_numpy())
    depth = pd.Series(all_depth, index=ranges.index).loc[repeated.index]
    groups = repeated.assign(depth=depth.to_numpy()).groupby(
        repeated["name"].astype(str), observed=True)
    table = groups.agg(n=("ts", "size"), depth=("depth", "min"), first=("ts", "min"))
    table = table[table["n"] >= MIN_MARKERS].sort_values(
        ["depth", "n", "first"], ascending=[True, False, True])
    for name in table.index:
        it = _regular(repeated[repeated["name"].astype(str) == name], name, "opens")
        if it is not None:
            return it
    return None


def _outermost(ranges: pd.DataFrame) -> pd.DataFrame:
    """Drop ranges nested inside an earlier range of the same name (a wrapper and its inner
    call, both named `forward`): one marker per iteration."""
    key = ranges["name"].astype(str)
    prev_end = ranges.groupby(key, observed=True)["end"].transform(
        lambda e: e.cummax().shift(fill_value=-np.inf))
    return ranges[ranges["ts"].to_numpy() >= prev_end.to_numpy()]


def _regular(marks: pd.DataFrame, name: str, kind: str) -> Iterations | None:
    """Windows between consecutive markers, when their period is regular."""
    if len(marks) < MIN_MARKERS:
        return None
    edges = (marks["ts"] if kind == "opens" else marks["end"]).to_numpy(dtype=float)
    edges = np.unique(edges)
    if len(edges) < MIN_MARKERS:
        return None
    gaps = np.diff(edges)
    period = float(np.median(gaps))
    if period <= 0:
        return None
    near = np.abs(gaps - period) <= PERIOD_TOLERANCE * period
    if near.mean() < REGULAR_SHARE:
        return None
    windows = np.column_stack([edges[:-1], edges[1:]])
    labels = [f"iteration {i}" for i in range(len(windows))]
    return Iterations(windows, labels, name, period)


def startup_calls(runtime: pd.DataFrame, before_us: float | None = None) -> pd.DataFrame:
    """Runtime calls of the training process long enough to be initialisation (not waits), in
    time order; only those starting before `before_us` when given."""
    long = runtime[runtime["dur"] >= STARTUP_CALL_US]
    if long.empty:
        return long
    waits = long["name"].astype(str).str.match(WAIT_CALL.pattern)
    long = long[~waits.to_numpy()]
    if before_us is not None:
        long = long[long["ts"] < before_us]
    return long.sort_values("ts")


def describe_startup(calls: pd.DataFrame, first_call_ts: float, gap_us: float) -> tuple[
        list[dict[str, Any]], str]:
    """The start-up calls as report rows, and one phrase saying what they were."""
    rows: list[dict[str, Any]] = []
    parts: list[str] = []
    for r in calls.itertuples():
        op = str(getattr(r, "top_op", "") or "")
        inner = str(getattr(r, "op", "") or "")
        kind = _startup_kind(str(r.name), inner or op, float(r.ts) <= first_call_ts)
        rows.append({"call": str(r.name), "ts_us": round(float(r.ts), 3),
                     "dur_us": round(float(r.dur), 3), "op": inner or op, "kind": kind})
    by_kind: dict[str, float] = {}
    for row in rows:
        by_kind[row["kind"]] = by_kind.get(row["kind"], 0.0) + row["dur_us"]
    parts = [f"{k} ({v / 1e6:.2f} s)" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])]
    if gap_us > 0:
        parts.append(f"{gap_us / 1e6:.2f} s before the first GPU work")
    return rows, "; ".join(parts)


def _startup_kind(call: str, op: str, first: bool) -> str:
    if first:
        return "CUDA context creation (the first CUDA call)"
    low = op.lower()
    if "cudnn" in low or "conv" in low:
        return "cuDNN initialisation and autotuning"
    if any(k in low for k in ("mm", "linear", "matmul", "cublas")):
        return "cuBLAS initialisation"
    if "Malloc" in call or "Free" in call:
        return "first device allocations"
    return "CUDA library and module loading"


def first_step_outlier(durations: np.ndarray, pre_busy_us: float) -> str | None:
    """Why the first step is left out of the verdict, or None to keep it."""
    n = len(durations)
    if n < MIN_STEPS_FOR_OUTLIERS:
        return None
    rest = float(np.median(durations[1:]))
    first = float(durations[0])
    if rest > 0 and first > OUTLIER_FACTOR * rest:
        return (f"it took {first / 1000:.1f} ms, {first / rest:.1f}x the median of the other "
                f"steps ({rest / 1000:.1f} ms): one-off first-iteration work (autotuning, "
                "compilation, caches and allocator filling) that later steps do not repeat")
    if first > 0 and pre_busy_us >= PRE_WINDOW_SHARE * first:
        return (f"its GPU spent {pre_busy_us / 1000:.1f} ms ({100 * pre_busy_us / first:.0f}% "
                "of the step) on work launched before the recording began: its GPU timeline "
                "straddles the window's start")
    return None
