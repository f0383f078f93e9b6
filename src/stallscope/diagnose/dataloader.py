"""`dataloader-bound`: the training step waits for the next batch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from stallscope.capture.context import LoaderInfo, RunContext
from stallscope.diagnose.common import busiest_gpu_us, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.hostload import other_load
from stallscope.trace.model import TraceModel

RULE_ID = "dataloader-bound"
# Share of step wall time the host waits in DataLoader.__next__ with no GPU work running.
# 5% is where the anchors (TensorBoard plugin, Nsight's rules) start flagging input stalls.
WAIT_THRESHOLD_PCT = 5.0
# Below this share of the step, a projected gain from more workers is within noise: no advice.
MIN_GAIN = 0.02
DOCS = "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"


def dataloader_bound(model: TraceModel, context: RunContext | None = None) -> Assessment:
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
    loader_info = context.training_loader() if context else None
    cores = context.cores_per_process if context else None
    advice = _advice(model, loader_info, cores, step=total / n, wait=wait / n, load=loader / n)
    evidence.update(advice.evidence)
    saving = pct(min(bound / n, advice.saving_us), total / n)
    who, unit = ("Inference", "batch") if model.workload == "inference" else ("Training", "step")
    title = f"{who} waits on the DataLoader for {wait_pct:.1f}% of each {unit}"
    precondition = advice.precondition
    busy = other_load(model, context)  # others held the cores: the sizing assumed them free
    if busy is not None:
        evidence["other_cpu_share_pct"] = busy.share_pct
        precondition = f"{precondition} {busy.caveat}"
    finding = Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=advice.recommendation,
        snippet=advice.snippet,
        precondition=precondition,
        estimated_saving_pct=saving,
        saving_basis=advice.basis,
        docs=DOCS,
    )
    return Assessment.found(finding)


@dataclass
class _Advice:
    recommendation: str
    snippet: str
    precondition: str
    saving_us: float  # per step
    basis: str
    evidence: dict


def _advice(
    model: TraceModel, info: LoaderInfo | None, cores: int | None, step: float, wait: float,
    load: float,
) -> _Advice:
    """How many workers, from the measured load/compute ratio and the cores this process has."""
    compute = max(step - wait, 1.0)
    single = model.loader_kind == "single-process"
    workers_now = info.num_workers if info else (0 if single else None)
    upper_basis = (
        "upper bound: the loader wait with no GPU work running, if fully overlapped; "
        "never below the busiest GPU's busy time"
    )
    if workers_now is None:  # workers in use, count unknown: no number can be derived
        return _Advice(
            "The DataLoader already uses worker processes, yet the step still waits for batches: "
            "the workers cannot keep up. Add workers only if CPU cores are idle; otherwise make "
            "each sample cheaper (lighter or GPU-side transforms and decoding, caching decoded "
            "samples) or read from faster storage (local NVMe, /dev/shm).",
            "loader = torch.utils.data.DataLoader(\n"
            "    dataset, batch_size=...,\n"
            "    num_workers=<more, if cores are idle>,\n"
            "    persistent_workers=True,\n"
            "    prefetch_factor=4,\n"
            ")",
            "More workers help only while CPU cores are free; if the cores are saturated, make "
            "loading cheaper instead.",
            wait,
            upper_basis,
            {},
        )
    # One worker's time per batch: measured in-process for a single-process loader; with W
    # workers that cannot keep up, each delivers one batch every W steps.
    per_batch = load if workers_now == 0 else workers_now * step
    ideal = math.ceil(per_batch / compute) + (1 if workers_now == 0 else 0)
    workers = ideal if cores is None else max(1, min(ideal, cores))
    evidence: dict = {"suggested_num_workers": workers, "ideal_num_workers": ideal}
    if cores is not None:
        evidence["cores_per_process"] = cores
    projected = max(compute, per_batch / workers)
    if cores is not None and not model.has_gpu:
        # CPU training: the step's own compute and the workers share the same cores.
        projected = max(projected, (compute + per_batch) / cores)
    if workers <= workers_now or step - projected < MIN_GAIN * step:
        # Every core already has work: more workers would only contend for them.
        busy = (
            f"the DataLoader has {workers_now} worker(s)" if workers_now
            else "the step's own compute already keeps them busy"
        )
        return _Advice(
            f"{_where(info)}The step waits for batches, but this process may use {cores} "
            f"core(s) and {busy}: more worker processes would compete for the same cores "
            "rather than overlap. Make each sample cheaper (lighter or GPU-side transforms and "
            "decoding, caching decoded samples), read from faster storage, or give the process "
            "more cores (fewer processes per host).",
            f"# {info.call_site if info else 'the DataLoader'}: loading competes with the step "
            f"for {cores} core(s)\n"
            "# - cache decoded samples, or move augmentation to the GPU\n"
            "# - fewer processes per host, or a wider CPU affinity for this one",
            "Loading is CPU-bound on cores that are all in use.",
            wait,
            upper_basis.replace("if fully overlapped", "if loading cost nothing"),
            evidence,
        )
    evidence["projected_step_ms"] = ms(projected)
    change = {"num_workers": workers, "persistent_workers": True}
    if model.has_gpu and not (info and info.pin_memory):
        change["pin_memory"] = True
    why = (
        f"each batch takes {ms(per_batch):.1f} ms of loading against {ms(compute):.1f} ms of "
        f"other step work, so {ideal} worker process(es) (load/compute rounded up"
        f"{', plus one spare' if workers_now == 0 else ''}) can prepare batches ahead of the step"
    )
    if cores is not None and workers < ideal:
        why += f"; capped at the {cores} core(s) this process may use"
    basis = upper_basis
    if cores is not None:
        basis = (
            f"estimate: with {workers} worker(s) on {cores} core(s) a step takes about "
            f"{ms(projected):.1f} ms (the largest of the other step work, loading spread over the "
            f"workers{', and all CPU work spread over the cores' if not model.has_gpu else ''}); "
            "never more than the loader wait"
        )
    where = "Loading runs in the main process" if workers_now == 0 else "The workers lag"
    return _Advice(
        f"{_where(info, change)}{where}: {why}. Keep the workers alive across epochs.",
        _snippet(info, change),
        f"{workers} CPU core(s) free for loading in this process (cores per process, after the "
        "other ranks on the host); a picklable dataset; transforms that do not touch the GPU."
        + (" pin_memory helps only with .to(device, non_blocking=True)." if "pin_memory" in change
           else ""),
        max(step - projected, 0.0),
        basis,
        evidence,
    )


def _where(info: LoaderInfo | None, change: dict | None = None) -> str:
    """`train.py:42 DataLoader(num_workers=0, ...) -> DataLoader(..., num_workers=2)`."""
    if info is None:
        return ""
    now = (
        f"{info.call_site} DataLoader(num_workers={info.num_workers}, "
        f"pin_memory={info.pin_memory})"
    )
    if change is None:
        return f"{now}: "
    return f"{now} -> DataLoader(..., {', '.join(f'{k}={v}' for k, v in change.items())}). "


def _snippet(info: LoaderInfo | None, change: dict) -> str:
    after = ", ".join(f"{k}={v}" for k, v in change.items())
    if info is None:
        args = "".join(f"    {k}={v},\n" for k, v in change.items())
        return f"loader = torch.utils.data.DataLoader(\n    dataset, batch_size=...,\n{args})"
    before = (
        f"num_workers={info.num_workers}, pin_memory={info.pin_memory}, "
        f"persistent_workers={info.persistent_workers}"
    )
    return (
        f"# {info.call_site}  ({info.dataset}, batch_size={info.batch_size})\n"
        f"-DataLoader(..., {before})\n"
        f"+DataLoader(..., {after})"
    )
