"""`blocking-h2d-copy`: the host blocks for a host-to-device transfer it could have overlapped.

`tensor.to(device)` without `non_blocking=True` is a `cudaMemcpyAsync` followed by a
`cudaStreamSynchronize` (or one synchronous copy call): the host does nothing else until the GPU
copy ends. From pinned memory the same copy could run on the copy engine while the host queues
the next kernels. This rule measures, per host-to-device copy, the time the host was blocked
while the GPU copy itself ran: the overlap of [copy call start, end of the copy call or of the
stream sync right after it] with the GPU copy, counted only when the host stayed blocked until
the copy ended.

Relation to `pageable-h2d-copy`: a copy from pageable memory always blocks the host, and only
pinning it makes `non_blocking=True` overlap anything, so that rule owns pageable copies; this one
reports pinned sources (and sources the trace does not name, such as ROCm's `Host`) and only
mentions the pageable time, so the same lost time is never reported twice. The queue wait before
a blocking copy starts belongs to `host-device-sync`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.common import (
    PINNED_COPY_SNIPPET,
    PINNED_MEMORY_DOCS,
    enclosing_ops,
    ms,
    pct,
    pinned_copy_changes,
)
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import MS, Metric, RuleSpec, evidence_key
from stallscope.runfacts import RunContext
from stallscope.trace.keyed import first_match, missing_last, pick
from stallscope.trace.model import CLOCK_TOLERANCE_US, SYNC_CALLS, TraceModel
from stallscope.trace.workload import step_word
from stallscope.units import millis, percent

RULE_ID = "blocking-h2d-copy"
# Share of step time the host spends blocked in overlappable HtoD transfers. 1% is the floor of
# the `low` severity: below it a fix is within step-to-step noise.
BLOCKED_THRESHOLD_PCT = 1.0
# A sync call starting within this many us after a copy call returns belongs to that copy (the
# real non_blocking=False copies in kineto/resnet50_* are followed by their sync 1-2 us later).
FOLLOW_GAP_US = 20.0
DOCS = PINNED_MEMORY_DOCS


def blocking_h2d_copy(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity in the trace.")
    rows, blocked_us, via = _blocked(model)
    if len(rows) == 0:
        return Assessment(RULE_ID, "clear", "No host-to-device copies inside the steps.")
    n = len(model.steps)
    total = model.total_step_us
    src = model.copies["src"].to_numpy()[rows]
    pageable = src == "Pageable"
    # nansum: Series.sum skips NaN (an unmatched GPU copy) and adds in the same order.
    blocked = float(np.nansum(blocked_us[~pageable]))
    pageable_blocked = float(np.nansum(blocked_us[pageable]))
    share = pct(blocked, total)
    deferred = (
        f" Pageable copies block the host {percent(pct(pageable_blocked, total))} of step time: "
        "see pageable-h2d-copy." if pageable_blocked > 0 else ""
    )
    if share < BLOCKED_THRESHOLD_PCT:
        memory = "pinned" if (src[~pageable] == "Pinned").all() else "non-pageable"
        return Assessment(
            RULE_ID,
            "clear",
            f"The host is blocked in {memory} host-to-device transfers {percent(share)} of step "
            f"time (threshold {percent(BLOCKED_THRESHOLD_PCT, 0)})." + deferred,
        )
    is_hit = ~pageable & (blocked_us > 0)
    hit = model.copies.iloc[rows[is_hit]]
    hit_bytes = hit["bytes"].to_numpy(dtype=float)
    nbytes = float(np.nansum(np.where(np.isnan(hit_bytes), 0.0, hit_bytes)))
    gpu_us = float(np.nansum(hit["dur_gpu"].to_numpy(dtype=float)))
    hit_via = via[is_hit]
    via_sync = float(np.nansum(blocked_us[is_hit][hit_via != "copy call"]))
    kinds = sorted(hit["src"].unique())
    unknown = [k for k in kinds if k != "Pinned"]
    evidence: dict[str, Any] = {
        "blocked_share_pct": share,
        "blocked_ms_per_step": ms(blocked / n),
        "blocking_copies": len(hit),
        "bytes_per_step": int(nbytes / n),
        "gpu_copy_ms_per_step": ms(gpu_us / n),
        "achieved_gbps": round(nbytes / gpu_us / 1e3, 2) if gpu_us > 0 else 0.0,
        "source_memory": kinds,
        "blocked_by": sorted(set(hit_via.tolist())),
        "also_counted_as_sync_ms_per_step": ms(via_sync / n),
        "pageable_blocked_ms_per_step": ms(pageable_blocked / n),
        "ops": enclosing_ops(model, hit),
    }
    # Overlapping the copy cannot make the step shorter than the busiest GPU's kernel time.
    saving = pct(min(blocked, max(total - _busiest_kernel_us(model), 0.0)), total)
    return Assessment.found(advise(model, evidence, unknown, deferred, saving))


def advise(model: TraceModel, evidence: dict[str, Any], unknown: list[str], deferred: str,
           saving: float) -> Finding:
    """The finding: copy with non_blocking=True (from pinned memory) so the transfer overlaps."""
    share = evidence["blocked_share_pct"]
    pin = (
        f" The trace names the source memory {', '.join(unknown)}, not Pinned: pin it too "
        "(pin_memory=True), or non_blocking=True cannot overlap."
        if unknown else ""
    )
    return Finding(
        id=RULE_ID,
        title=(
            f"The host blocks for host-to-device copies {percent(share)} of each "
            f"{step_word(model.workload)} "
            f"({millis(evidence['blocked_ms_per_step'], 'hundredths')} ms) although "
            "they could overlap"
        ),
        evidence=evidence,
        recommendation=(
            "These copies are issued without non_blocking=True, so the host waits until the "
            "GPU transfer ends (cudaMemcpyAsync followed by a stream synchronisation) instead "
            "of queueing the next kernels. Copy with non_blocking=True so the transfer runs on "
            "the copy engine while the host keeps launching work." + pin + " The stream "
            "synchronisation after each copy also shows in host-device-sync; the two overlap."
            + deferred
        ),
        snippet=PINNED_COPY_SNIPPET,
        precondition=(
            "non_blocking=True overlaps only from pinned (page-locked) memory, and only while "
            "the host does not read the copied tensor on the CPU before the GPU has used it; "
            "code that needs the data on the host right away must keep the synchronisation."
        ),
        estimated_saving_pct=saving,
        saving_basis=(
            "upper bound: the host time blocked while these (non-pageable) transfers ran, if "
            "they overlap fully; never below the busiest GPU's kernel time"
        ),
        docs=DOCS,
    )


@dataclass
class _NextCall:
    """Per copy call, the next runtime call on its thread (NaN / code -1: none)."""

    name_code: np.ndarray  # code in `names` (-1: no next call, or a missing name)
    names: pd.CategoricalDtype  # the runtime calls' names as categories
    ts: np.ndarray
    end: np.ndarray

    def name_is(self, wanted: frozenset[str]) -> np.ndarray:
        """Whether the next call's name is one of `wanted`, decided once per category."""
        hit = [str(c) in wanted for c in self.names.categories] + [False]
        return np.array(hit, dtype=bool)[self.name_code]

    def name_or_empty(self) -> np.ndarray:
        """The next call's name as an object array, "" where there is none."""
        names = [str(c) for c in self.names.categories] + [""]
        return np.array(names, dtype=object)[self.name_code]


def _next_call(model: TraceModel, correlation: np.ndarray) -> _NextCall:
    """The runtime call after the one with each correlation id, on the same thread, in
    (thread, start) order; the first call of a correlation id when several share it."""
    rt = model.runtime
    tid = rt["tid"]
    if isinstance(tid.dtype, pd.CategoricalDtype):
        tid_code = tid.cat.codes.to_numpy()  # sort_values orders categories by code
    else:
        tid_code, _ = pd.factorize(tid, sort=True)
    name = pd.Categorical(rt["name"])  # keeps a categorical column's categories and codes
    name_code = name.codes
    ts, end = rt["ts"].to_numpy(dtype=float), rt["end"].to_numpy(dtype=float)
    # Missing threads sort last and have no next call (groupby drops them).
    key = missing_last(tid_code)
    order = np.lexsort((ts, key))
    follows = np.zeros(len(order), dtype=bool)
    follows[:-1] = (key[order][1:] == key[order][:-1]) & (tid_code[order][:-1] >= 0)
    after = np.full(len(order), -1)
    after[order[:-1][follows[:-1]]] = order[1:][follows[:-1]]
    call = pick(order, first_match(rt["correlation"].to_numpy(dtype=float)[order], correlation), -1)
    nxt = pick(after, call, -1)
    return _NextCall(
        name_code=pick(name_code, nxt, -1),
        names=name.dtype,
        ts=pick(ts, nxt, np.nan),
        end=pick(end, nxt, np.nan),
    )


def _blocked(model: TraceModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The HtoD copies in steps: their positions in model.copies, `blocked_us` (the host
    blocked during the GPU copy) and `via` ("copy call", or the name of the call after the copy
    that held the host)."""
    copies = model.copies
    rows = np.flatnonzero((copies["direction"].to_numpy() == "HtoD")
                          & (copies["step"].to_numpy() >= 0))
    if len(rows) == 0:
        return rows, np.zeros(0), np.zeros(0, dtype=object)
    nxt = _next_call(model, copies["correlation"].to_numpy(dtype=float)[rows])
    c_ts, c_end = copies["ts"].to_numpy()[rows], copies["end"].to_numpy()[rows]
    ts_gpu, end_gpu = copies["ts_gpu"].to_numpy()[rows], copies["end_gpu"].to_numpy()[rows]
    follows = nxt.name_is(SYNC_CALLS) & ((nxt.ts - c_end) <= FOLLOW_GAP_US)
    host_end = np.where(follows, np.maximum(nxt.end, c_end), c_end)
    held = host_end >= end_gpu - CLOCK_TOLERANCE_US
    overlap = np.minimum(host_end, end_gpu) - np.maximum(c_ts, ts_gpu)
    blocked_us = np.where(held, np.clip(overlap, 0.0, None), 0.0)
    in_call = c_end >= end_gpu - CLOCK_TOLERANCE_US
    return rows, blocked_us, np.where(in_call, "copy call", nxt.name_or_empty())


def _busiest_kernel_us(model: TraceModel) -> float:
    return max(
        (sum(s.gpu_us[d]["kernel"] for s in model.steps) for d in model.gpu_devices),
        default=0.0,
    )


SPEC = RuleSpec(
    id=RULE_ID,
    title="the host blocks for host-to-device copies that could overlap",
    summary="the host blocks for pinned host-to-device copies that could overlap "
            "(`non_blocking=False`)",
    check=blocking_h2d_copy,
    thresholds={"BLOCKED_THRESHOLD_PCT": BLOCKED_THRESHOLD_PCT, "FOLLOW_GAP_US": FOLLOW_GAP_US},
    what_if=("pin_memory", "non_blocking"),
    changes=pinned_copy_changes,
    order=50,
    metric=Metric("host blocked in host-to-device copies", MS, evidence_key("blocked_ms_per_step"),
                  "blocked_share_pct"),
)
