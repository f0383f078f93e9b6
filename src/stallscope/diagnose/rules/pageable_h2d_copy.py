"""`pageable-h2d-copy`: host-to-device copies from pageable memory, slow and host-blocking."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from stallscope.diagnose.common import (
    PINNED_COPY_SNIPPET,
    PINNED_MEMORY_DOCS,
    ms,
    nansum,
    pct,
    pinned_copy_changes,
)
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.knobs import Knobs
from stallscope.diagnose.spec import MS, Metric, RuleSpec, evidence_key
from stallscope.runfacts import RunContext
from stallscope.trace.model import TraceModel
from stallscope.units import fixed_size

RULE_ID = "pageable-h2d-copy"
# Below this many pageable bytes per step the copies are scalars and indices: not worth pinning.
MIN_BYTES_PER_STEP = 1 << 20
DOCS = PINNED_MEMORY_DOCS


def pageable_h2d_copy(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity in the trace.")
    # Row masks on the copies table's arrays: boolean-indexing the frame cost more than the
    # arithmetic.
    copies = model.copies
    h2d = (copies["direction"].to_numpy(dtype=object) == "HtoD") & (copies["step"].to_numpy() >= 0)
    if not h2d.any():
        return Assessment(RULE_ID, "clear", "No host-to-device copies inside the steps.")
    src = copies["src"].to_numpy(dtype=object)
    pageable = h2d & (src == "Pageable")
    if not pageable.any():
        kinds = sorted(pd.unique(src[h2d]))
        if "Pinned" in kinds or kinds == ["Device"]:
            return Assessment(RULE_ID, "clear", "Host-to-device copies come from pinned memory.")
        return Assessment(
            RULE_ID,
            "not_assessed",
            f"The trace names the copy source {', '.join(kinds)}, not Pageable or Pinned "
            "(e.g. ROCm traces), so pinning cannot be judged.",
        )
    n = len(model.steps)
    total = model.total_step_us
    size = copies["bytes"].to_numpy(dtype=float)[pageable]
    nbytes = nansum(size)
    gpu_us = nansum(copies["dur_gpu"].to_numpy(dtype=float)[pageable])
    blocked = nansum(copies["copy_us"].to_numpy(dtype=float)[pageable])
    waited = nansum(copies["wait_us"].to_numpy(dtype=float)[pageable])
    if nbytes / n < MIN_BYTES_PER_STEP:
        return Assessment(
            RULE_ID,
            "clear",
            f"Pageable host-to-device copies move only {fixed_size(nbytes / n, 'KiB')} per step.",
        )
    gbps = round(nbytes / gpu_us / 1e3, 2) if gpu_us > 0 else 0.0
    saving = pct(blocked, total)
    evidence: dict[str, Any] = {
        "copies": int(pageable.sum()),
        "bytes_per_step": int(nbytes / n),
        "achieved_gbps": gbps,
        "gpu_copy_ms_per_step": ms(gpu_us / n),
        "host_blocked_ms_per_step": ms(blocked / n),
        "host_wait_for_queue_ms_per_step": ms(waited / n),
        "largest_copy_bytes": int(np.nanmax(size)),
        "ops": sorted(o for o in pd.unique(copies["op"].to_numpy(dtype=object)[pageable]) if o),
    }
    return Assessment.found(advise(evidence, nbytes, n, gbps, saving, context))


def advise(evidence: dict[str, Any], nbytes: float, n: int, gbps: float, saving: float,
           context: RunContext | None) -> Finding:
    """The finding: pin the batches and copy them asynchronously, in the loader's own knobs
    when `run` knows it."""
    title = (
        f"Host-to-device copies from pageable memory: {fixed_size(nbytes / n, 'MB')} per step at "
        f"{gbps:.1f} GB/s"
    )
    # `stallscope run` knows the training loader: say where to pin in the user's own knobs
    # (diagnose/knobs.py), unless it already pins (then these copies are not its batches).
    loader = context.training_loader() if context else None
    knobs = Knobs.of(loader) if loader is not None and not loader.pin_memory else None
    return Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=(
            "The inputs are copied from pageable (ordinary) host memory, so the driver stages "
            "them through a bounce buffer and the host blocks for the whole transfer. Pin the "
            "batches in the DataLoader and copy them asynchronously so the transfer overlaps "
            "GPU work. Host time the copy call spent waiting for earlier GPU work is not "
            "counted here (see host-device-sync)."
            + (knobs.pin_sentence() if knobs else "")
        ),
        snippet=knobs.pin_snippet() if knobs else PINNED_COPY_SNIPPET,
        precondition=(
            "Pinning alone overlaps nothing: the copy must also be non_blocking=True. Pinned "
            "memory is page-locked RAM, so pin batches, not a whole in-memory dataset. For a "
            "custom loop, copy from a pinned staging buffer (tensor.pin_memory())."
        ),
        estimated_saving_pct=saving,
        saving_basis=(
            "upper bound: the host time blocked in these transfers, if they overlap fully "
            "with GPU work"
        ),
        docs=DOCS,
    )


SPEC = RuleSpec(
    id=RULE_ID,
    title="host-to-device copies from pageable memory",
    summary="host-to-device copies come from pageable memory (slow, host-blocking)",
    check=pageable_h2d_copy,
    thresholds={"MIN_BYTES_PER_STEP": MIN_BYTES_PER_STEP},
    what_if=("pin_memory", "non_blocking"),
    changes=pinned_copy_changes,
    order=20,
    metric=Metric("host blocked in pageable host-to-device copies", MS,
                  evidence_key("host_blocked_ms_per_step")),
    loader_setting=True,
)
