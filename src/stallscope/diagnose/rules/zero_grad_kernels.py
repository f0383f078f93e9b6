"""`zero-grad-kernels`: `optimizer.zero_grad()` zeroes every gradient with a kernel of its own.

Before torch 2.0 `zero_grad()` defaulted to `set_to_none=False`: one fill/zero kernel per
parameter every step, each a launch the host pays for while the GPU waits for real work. With
`set_to_none=True` (the default since 2.0) the gradients are dropped instead and the next
backward writes them fresh: no kernels at all. The public ResNet50 traces (torch 1.8) pay it
every step (their report snapshots in tests/__snapshots__ show the share).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.advice import for_torch, has
from stallscope.diagnose.common import busiest_gpu_us, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import MS, Change, Metric, RuleSpec, evidence_key, fixed
from stallscope.runfacts import RunContext
from stallscope.text import plural
from stallscope.trace.model import TraceModel
from stallscope.trace.names import ZERO_GRAD, name_flags
from stallscope.units import millis, percent

RULE_ID = "zero-grad-kernels"
# set_to_none=True launches nothing (the corpus' torch 2 traces show 0 per call), so any launch
# inside zero_grad() means gradients are being zeroed; the share threshold decides if it matters.
MIN_LAUNCHES = 1
# Share of step time below which the saving is noise (the same 1% floor as severity "low").
MIN_SHARE_PCT = 1.0
DOCS = "https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html"


def zero_grad_kernels(model: TraceModel, _context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity: no zeroing kernels.")
    ops = model.ops
    if not model.steps or ops.empty:
        return Assessment(RULE_ID, "not_assessed", "No steps or no CPU ops in the trace.")
    # Row positions and plain arrays: the frames are small, so pandas' per-call cost dominates.
    calls = np.flatnonzero(name_flags(ops["name"], _is_zero_grad) & (ops["step"].to_numpy() >= 0))
    if len(calls) == 0:
        return Assessment(
            RULE_ID, "not_assessed",
            "No optimizer.zero_grad() inside the recorded steps (model.zero_grad() or custom "
            "loops are not labelled in the trace).",
        )
    ts, end = ops["ts"].to_numpy()[calls], ops["end"].to_numpy()[calls]
    launches = _launches_inside(model, ops["tid"].to_numpy()[calls], ts, end)
    n = len(model.steps)
    per_call = int(launches.sum() // len(calls))
    host_us = float(np.nansum(ops["dur"].to_numpy()[calls]))  # = pandas' sum, same order
    share = pct(host_us, model.total_step_us)
    optimizer = str(ops["name"].iloc[calls[0]]).removeprefix(ZERO_GRAD).split(".")[0]
    evidence: dict[str, Any] = {
        "optimizer": optimizer,
        "launches_per_zero_grad": per_call,
        "zero_grad_ms_per_step": ms(host_us / n),
        "zero_grad_share_pct": share,
        "calls": len(calls),
    }
    if per_call < MIN_LAUNCHES or share < MIN_SHARE_PCT:
        return Assessment(
            RULE_ID, "clear",
            f"zero_grad() launches {plural(per_call, 'kernel')} per call and takes "
            f"{percent(share)} of the step (flagged from {MIN_LAUNCHES} launch and "
            f"{percent(MIN_SHARE_PCT, 0)}).",
        )
    room = max(model.total_step_us - busiest_gpu_us(model), 0.0)
    saving = pct(min(host_us, room), model.total_step_us)
    return Assessment.found(advise(model, evidence, saving))


def advise(model: TraceModel, evidence: dict[str, Any], saving: float) -> Finding:
    """The finding: set the gradients to None rather than fill them with zeros."""
    optimizer, per_call = evidence["optimizer"], evidence["launches_per_zero_grad"]
    share = evidence["zero_grad_share_pct"]
    return Finding(
        id=RULE_ID,
        title=(
            f"{optimizer}.zero_grad() launches {per_call} kernels per step "
            f"({millis(evidence['zero_grad_ms_per_step'], 'tenths')} ms)"
        ),
        evidence=evidence,
        recommendation=(
            f"zero_grad() fills the gradients with zeros ({per_call} kernel launches per call, "
            f"{percent(share)} of the step). Setting the gradients to None instead costs no "
            "kernel at all: the next backward allocates and writes them "
            "fresh. " + _default_said(model)
        ),
        snippet=(
            f"{for_torch(model)}\n"
            "optimizer.zero_grad(set_to_none=True)  # the default since torch 2.0"
        ),
        precondition=(
            "No code reads .grad between zero_grad() and backward() expecting zeros (a "
            "None gradient raises there), and no optimizer step runs on parameters "
            "without gradients expecting them to be zero."
        ),
        estimated_saving_pct=saving,
        saving_basis=(
            "upper bound: the host time of the zero_grad() calls, never more than the "
            "step minus the busiest GPU's busy time"
        ),
        docs=DOCS,
    )


def _is_zero_grad(name: str) -> bool:
    return name.startswith(ZERO_GRAD)


def _launches_inside(model: TraceModel, tid: np.ndarray, ts: np.ndarray,
                     end: np.ndarray) -> np.ndarray:
    """Runtime calls on the same thread inside each zero_grad range [ts, end) of a thread `tid`
    (one search per call; a missing thread has none)."""
    rt = model.runtime
    rt_tid, rt_ts = rt["tid"].to_numpy(), rt["ts"].to_numpy()
    counts = np.zeros(len(ts), dtype=int)
    for t in pd.unique(tid[pd.notna(tid)]):
        mine = tid == t
        times = np.sort(rt_ts[rt_tid == t])
        lo = np.searchsorted(times, ts[mine], side="left")
        hi = np.searchsorted(times, end[mine], side="left")
        counts[mine] = hi - lo
    return counts


def _default_said(model: TraceModel) -> str:
    """Why the gradients were zeroed, given the trace's torch (the default changed in 2.0)."""
    info = model.trace.torch_info
    if info.version is None:
        return ("It is the default from torch 2.0 on; this trace passes set_to_none=False or "
                "comes from an older torch.")
    if has(model, (2, 0)):
        return (f"Its torch ({info.text}) already defaults to set_to_none=True, so the code "
                "passes set_to_none=False (or zeroes the gradients itself).")
    return (f"Its torch ({info.text}) still defaults to set_to_none=False (the default changed "
            "in 2.0), so pass it explicitly.")


SPEC = RuleSpec(
    id=RULE_ID,
    title="`optimizer.zero_grad()` fills every gradient with a kernel",
    summary="`zero_grad()` fills every gradient with a kernel (`set_to_none=False`, torch < 2.0)",
    check=zero_grad_kernels,
    thresholds={"MIN_LAUNCHES": MIN_LAUNCHES, "MIN_SHARE_PCT": MIN_SHARE_PCT},
    what_if=("zero_grad",),
    changes=fixed(Change("zero_grad", "none")),
    order=120,
    metric=Metric("zero_grad kernels", MS, evidence_key("zero_grad_ms_per_step"),
                  "zero_grad_share_pct"),
)
