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

import numpy as np
import pandas as pd

from stallscope.capture.context import RunContext
from stallscope.diagnose.allocator import enclosing_ops
from stallscope.diagnose.common import PINNED_COPY_SNIPPET, PINNED_MEMORY_DOCS, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.trace.model import CLOCK_TOLERANCE_US, SYNC_CALLS, TraceModel
from stallscope.trace.workload import step_word

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
    h2d = blocked_h2d(model)
    if h2d.empty:
        return Assessment(RULE_ID, "clear", "No host-to-device copies inside the steps.")
    n = len(model.steps)
    total = model.total_step_us
    pageable = h2d["src"] == "Pageable"
    mine = h2d[~pageable]
    blocked = float(mine["blocked_us"].sum())
    pageable_blocked = float(h2d.loc[pageable, "blocked_us"].sum())
    share = pct(blocked, total)
    deferred = (
        f" Pageable copies block the host {pct(pageable_blocked, total):.1f}% of step time: "
        "see pageable-h2d-copy." if pageable_blocked > 0 else ""
    )
    if share < BLOCKED_THRESHOLD_PCT:
        kinds = "pinned" if (mine["src"] == "Pinned").all() else "non-pageable"
        return Assessment(
            RULE_ID,
            "clear",
            f"The host is blocked in {kinds} host-to-device transfers {share:.1f}% of step time "
            f"(threshold {BLOCKED_THRESHOLD_PCT:.0f}%)." + deferred,
        )
    hit = mine[mine["blocked_us"] > 0]
    nbytes = float(hit["bytes"].fillna(0).sum())
    gpu_us = float(hit["dur_gpu"].sum())
    via_sync = float(hit.loc[hit["via"] != "copy call", "blocked_us"].sum())
    kinds = sorted(hit["src"].unique())
    unknown = [k for k in kinds if k != "Pinned"]
    evidence = {
        "blocked_share_pct": share,
        "blocked_ms_per_step": ms(blocked / n),
        "blocking_copies": len(hit),
        "bytes_per_step": int(nbytes / n),
        "gpu_copy_ms_per_step": ms(gpu_us / n),
        "achieved_gbps": round(nbytes / gpu_us / 1e3, 2) if gpu_us > 0 else 0.0,
        "source_memory": kinds,
        "blocked_by": sorted(hit["via"].unique()),
        "also_counted_as_sync_ms_per_step": ms(via_sync / n),
        "pageable_blocked_ms_per_step": ms(pageable_blocked / n),
        "ops": enclosing_ops(model, hit),
    }
    # Overlapping the copy cannot make the step shorter than the busiest GPU's kernel time.
    saving = pct(min(blocked, max(total - _busiest_kernel_us(model), 0.0)), total)
    pin = (
        f" The trace names the source memory {', '.join(unknown)}, not Pinned: pin it too "
        "(pin_memory=True), or non_blocking=True cannot overlap."
        if unknown else ""
    )
    finding = Finding(
        id=RULE_ID,
        title=(
            f"The host blocks for host-to-device copies {share:.1f}% of each "
            f"{step_word(model.workload)} "
            f"({ms(blocked / n):.2f} ms) although they could overlap"
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
    return Assessment.found(finding)


def blocked_h2d(model: TraceModel) -> pd.DataFrame:
    """HtoD copies in steps with `blocked_us` (host blocked during the GPU copy) and `via`."""
    copies = model.copies
    h2d = copies[(copies["direction"] == "HtoD") & (copies["step"] >= 0)].copy()
    if h2d.empty:
        return h2d.assign(blocked_us=pd.Series(dtype=float), via=pd.Series(dtype=object))
    rt = model.runtime.sort_values(["tid", "ts"], kind="stable")
    grouped = rt.groupby("tid", observed=True, sort=False)
    rt = rt.assign(next_name=grouped["name"].shift(-1), next_ts=grouped["ts"].shift(-1),
                   next_end=grouped["end"].shift(-1))
    nxt = rt.dropna(subset=["correlation"]).drop_duplicates("correlation").set_index(
        "correlation")[["next_name", "next_ts", "next_end"]]
    h2d = h2d.join(nxt, on="correlation")
    follows = (
        h2d["next_name"].isin(list(SYNC_CALLS)).to_numpy()
        & ((h2d["next_ts"] - h2d["end"]).to_numpy() <= FOLLOW_GAP_US)
    )
    host_end = np.where(follows, np.maximum(h2d["next_end"].to_numpy(), h2d["end"].to_numpy()),
                        h2d["end"].to_numpy())
    held = host_end >= h2d["end_gpu"].to_numpy() - CLOCK_TOLERANCE_US
    overlap = np.minimum(host_end, h2d["end_gpu"].to_numpy()) - np.maximum(
        h2d["ts"].to_numpy(), h2d["ts_gpu"].to_numpy())
    h2d["blocked_us"] = np.where(held, np.clip(overlap, 0.0, None), 0.0)
    in_call = h2d["end"].to_numpy() >= h2d["end_gpu"].to_numpy() - CLOCK_TOLERANCE_US
    # object first: the names are categorical, and "" is not one of their categories
    h2d["via"] = np.where(in_call, "copy call",
                          h2d["next_name"].astype(object).fillna("").astype(str))
    return h2d


def _busiest_kernel_us(model: TraceModel) -> float:
    return max(
        (sum(s.gpu_us[d]["kernel"] for s in model.steps) for d in model.gpu_devices),
        default=0.0,
    )
