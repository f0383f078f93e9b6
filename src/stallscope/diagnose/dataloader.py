"""`dataloader-bound`: the training step waits for the next batch."""

from __future__ import annotations

import math

from stallscope.diagnose.common import busiest_gpu_us, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.model import TraceModel

RULE_ID = "dataloader-bound"
# Share of step wall time the host waits in DataLoader.__next__ with no GPU work running.
# 5% is where the anchors (TensorBoard plugin, Nsight's rules) start flagging input stalls.
WAIT_THRESHOLD_PCT = 5.0
DOCS = "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"


def dataloader_bound(model: TraceModel) -> Assessment:
    if model.loader_kind is None:
        return Assessment(
            RULE_ID,
            "not_assessed",
            "No DataLoader __next__ events on the stepping thread (a custom input loop, or the "
            "loader ran outside the profiled steps): data-loading time could not be measured.",
        )
    total = model.total_step_us
    n = len(model.steps)
    loader = sum(s.loader_us for s in model.steps)
    wait = sum(s.loader_wait_us for s in model.steps)
    wait_pct = pct(wait, total)
    evidence = {
        "loader_share_pct": pct(loader, total),
        "wait_share_pct": wait_pct,
        "loader_ms_per_step": ms(loader / n),
        "wait_ms_per_step": ms(wait / n),
        "step_ms_mean": ms(total / n),
        "loader_kind": model.loader_kind,
        "steps": n,
    }
    if wait_pct < WAIT_THRESHOLD_PCT:
        return Assessment(
            RULE_ID,
            "clear",
            f"The step waits {wait_pct:.1f}% of its time on the DataLoader "
            f"(threshold {WAIT_THRESHOLD_PCT:.0f}%).",
        )
    # Hiding the wait cannot make the step shorter than the GPU's own busy time.
    bound = wait if not model.has_gpu else min(wait, max(total - busiest_gpu_us(model), 0.0))
    saving = pct(bound, total)
    compute_per_step = max(total - wait, 1.0) / n
    load_per_batch = loader / n
    if model.loader_kind == "single-process":
        workers = math.ceil(load_per_batch / compute_per_step) + 1
        evidence["suggested_num_workers"] = workers
        recommendation = (
            f"Loading runs in the training process: each batch takes {ms(load_per_batch):.1f} ms "
            f"to load against {ms(compute_per_step):.1f} ms of other step work, so "
            f"{workers} worker processes (load/compute ratio rounded up, plus one spare) can "
            "prepare batches ahead of the step. Keep the workers alive across epochs."
        )
        snippet = (
            "loader = torch.utils.data.DataLoader(\n"
            "    dataset, batch_size=..., shuffle=...,\n"
            f"    num_workers={workers},\n"
            "    persistent_workers=True,\n"
            "    prefetch_factor=2,\n"
            f"    pin_memory={model.has_gpu},\n"
            ")"
        )
        precondition = (
            f"{workers} spare CPU cores for this training process (cores per process, after "
            "the other ranks on the host); a picklable dataset; transforms that do not touch "
            "the GPU."
        )
    else:
        recommendation = (
            "The DataLoader already uses worker processes, yet the step still waits for batches: "
            "the workers cannot keep up. Add workers only if CPU cores are idle; otherwise make "
            "each sample cheaper (lighter or GPU-side transforms and decoding, caching decoded "
            "samples) or read from faster storage (local NVMe, /dev/shm)."
        )
        snippet = (
            "loader = torch.utils.data.DataLoader(\n"
            "    dataset, batch_size=...,\n"
            "    num_workers=<more, if cores are idle>,\n"
            "    persistent_workers=True,\n"
            "    prefetch_factor=4,\n"
            ")"
        )
        precondition = (
            "More workers help only while CPU cores are free; if the cores are saturated, make "
            "loading cheaper instead."
        )
    title = f"Training waits on the DataLoader for {wait_pct:.1f}% of each step"
    finding = Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=recommendation,
        snippet=snippet,
        precondition=precondition,
        estimated_saving_pct=saving,
        saving_basis=(
            "upper bound: the loader wait with no GPU work running, if fully overlapped; "
            "never below the busiest GPU's busy time"
        ),
        docs=DOCS,
    )
    return Assessment.found(finding)
