"""The one module of what several rules share (a rule never imports another rule): per-trace
totals they bound their savings by, advice more than one gives, the step windows they measure
with, and the thresholds two rules read alike (the kernel classes are trace/kernels.py's)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stallscope.diagnose.spec import Change
from stallscope.trace.model import TraceModel

# Pinned memory plus non_blocking copies: the fix for both pageable-h2d-copy and
# blocking-h2d-copy, which differ in what they measured, not in what to do.
PINNED_MEMORY_DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers"
PINNED_COPY_SNIPPET = (
    "loader = torch.utils.data.DataLoader(dataset, ..., pin_memory=True)\n"
    "for inputs, targets in loader:\n"
    "    inputs = inputs.to(device, non_blocking=True)\n"
    "    targets = targets.to(device, non_blocking=True)"
)

def pinned_copy_changes(finding: object, model: TraceModel) -> list[Change]:
    """The change both pageable-h2d-copy and blocking-h2d-copy recommend: pinned memory where a
    copy is pageable, then non_blocking copies."""
    c = model.copies
    pageable = ((c["direction"] == "HtoD") & (c["src"] == "Pageable")).any()
    return ([Change("pin_memory", "true")] if pageable else []) + [Change("non_blocking", "true")]


def busiest_gpu_us(model: TraceModel) -> float:
    """Busy time (kernel + memcpy + memset) of the busiest GPU, summed over steps."""
    best = 0.0
    for dev in model.gpu_devices:
        busy = sum(s.gpu_us[dev]["kernel"] + s.gpu_us[dev]["memcpy"] + s.gpu_us[dev]["memset"]
                   for s in model.steps)
        best = max(best, busy)
    return best


def host_total(model: TraceModel, category: str) -> float:
    return float(sum(s.breakdown_us[category] for s in model.steps))


def pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 2) if whole > 0 else 0.0


def ms(us: float) -> float:
    return round(us / 1000.0, 3)


def nansum(values: np.ndarray) -> float:
    """Series.sum() of a float column: NaN counted as 0, then numpy's (pairwise) sum, so the
    bits are pandas' own."""
    return float(np.where(np.isnan(values), 0.0, values).sum())


# The most frequent enclosing ops a finding names (allocator-churn, blocking-h2d-copy).
MAX_ENCLOSING_OPS = 5


def enclosing_ops(model: TraceModel, calls: pd.DataFrame) -> list[str]:
    """`outermost > innermost` op (same thread) around each of a few runtime calls, most
    frequent first.

    Looks at every call whatever its length (the model names only calls of 20 us or more);
    meant for the handful of calls a rule reports, not for whole tables."""
    ops = model.ops
    if calls.empty or ops.empty:
        return []
    names = ops["name"].astype(str).to_numpy()
    tids = ops["tid"].astype(str).to_numpy()
    found: list[str] = []
    for tid, group in calls.groupby(calls["tid"].astype(str), observed=True):
        mine = tids == tid
        if not mine.any():  # no op recorded on the calls' thread (a damaged or edited tid)
            continue
        o_ts, o_end, o_names = ops["ts"].to_numpy()[mine], ops["end"].to_numpy()[mine], names[mine]
        around = (o_ts[None, :] <= group["ts"].to_numpy()[:, None]) & (
            o_end[None, :] >= group["end"].to_numpy()[:, None])
        has = around.any(axis=1)
        inner = np.argmax(np.where(around, o_ts[None, :], -np.inf), axis=1)[has]
        outer = np.argmin(np.where(around, o_ts[None, :], np.inf), axis=1)[has]
        found.extend(
            o if o == i else f"{o} > {i}" for o, i in zip(o_names[outer], o_names[inner],
                                                          strict=True)
        )
    counts = pd.Series(found, dtype=object).value_counts()
    return counts.index[:MAX_ENCLOSING_OPS].tolist()


# gpu-idle's threshold; gpu-bound calls a GPU bound when it is busy for the rest of the step.
# Share of step time the busiest GPU is idle before the rule flags it. Back-to-back kernels
# always leave a few percent of launch latency between them that no user change removes (HTA
# calls it "kernel wait"); at 10% the GPU loses one step in ten, enough to be worth acting on.
IDLE_THRESHOLD_PCT = 10.0


def idle_windows(model: TraceModel) -> np.ndarray:
    """The step windows; without ProfilerStep markers, the span of GPU activity instead of the
    whole trace (whose setup and teardown would otherwise count as idle GPU time). Inferred
    iterations are steps like ProfilerStep ones."""
    windows = model.windows
    if model.steps_source != "whole-trace" or model.gpu.empty:
        return windows
    lo, hi = float(model.gpu["ts"].min()), float(model.gpu["end"].max())
    clipped = np.column_stack([np.maximum(windows[:, 0], lo), np.minimum(windows[:, 1], hi)])
    clipped[:, 1] = np.maximum(clipped[:, 1], clipped[:, 0])
    return clipped


# Kernel precision (no-mixed-precision's signal, gpu-bound's tensor-core advice).
# Tensor cores arrived with Volta (sm_70); below it mixed precision brings no tensor cores.
MIN_COMPUTE_MAJOR = 7
# fp32 GEMM/conv share of compute kernel time from which the rule reports. With a 2x speedup on
# those kernels, 20% of kernel time is 10% of GPU work saved: below that, the numerics risk of
# reduced precision is not worth taking on this evidence.
MIN_FP32_SHARE_PCT = 20.0


# The plan's window (plan.py), which gpu-idle bounds its saving over too.
# A long recording is replayed over this many consecutive steps from its middle: a median needs
# no more, and every replay of the plan costs time in proportion to the steps.
MAX_REPLAY_STEPS = 24


def judged_steps(n: int) -> slice:
    """The recorded steps the plan's medians are over (of `n`): the replayed window less its
    first step when three or more are replayed. A rule's bound compared with the plan's step
    and floor is computed over these steps too."""
    window = replay_window(n)
    first = window.start + 1 if window.stop - window.start >= 3 else window.start
    return slice(first, window.stop)


def replay_window(n: int) -> slice:
    """The steps to replay: all of them, or MAX_REPLAY_STEPS from the middle of a long run."""
    if n <= MAX_REPLAY_STEPS:
        return slice(0, n)
    first = (n - MAX_REPLAY_STEPS) // 2
    return slice(first, first + MAX_REPLAY_STEPS)
