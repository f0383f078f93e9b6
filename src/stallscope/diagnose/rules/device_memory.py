"""`device-memory`: the GPU's memory near its capacity (out-of-memory risk, the allocator
retrying), or far from it while the GPU waits (room for a larger batch).

The figures are the device's peak allocated and reserved memory against its capacity
(diagnose/device_memory.py: a trace's profile_memory events, or `stallscope run`'s per-step
figures). Near capacity, the caching allocator frees its cache and retries before it raises
out-of-memory: each retry synchronises the device, and memory reserved far above what is
allocated is fragmentation that `expandable_segments` removes. Far from capacity, a GPU that is
lightly used could take a larger batch: the memory held across steps (weights, optimizer
state) stays, the step's transient peak (activations) grows with the batch, so the batch that
fits is the capacity left after the first over the second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stallscope.diagnose import device_memory as figures
from stallscope.diagnose.device_memory import DeviceMemory, not_assessed
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import Metric, RuleSpec, evidence_key
from stallscope.runfacts import RunContext
from stallscope.trace.model import TraceModel
from stallscope.units import fixed_size, percent

RULE_ID = "device-memory"
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
NEAR_CAPACITY = 0.90  # peak reserved over capacity from which out-of-memory is near
SPLIT_SHARE = 0.25  # reserved above allocated, as a share of reserved: fragmentation
HEADROOM_MAX_SHARE = 0.50  # peak reserved over capacity up to which there is room
HEADROOM_BUSY_PCT = 80.0  # the GPU busy less than this share of the step: lightly used
HEADROOM_MIN_FACTOR = 2.0  # a batch at least this many times the current fits
MARGIN = 0.90  # of the capacity, a larger batch is sized to fit in

OOM_RISK = "oom-risk"
HEADROOM = "headroom"


@dataclass(frozen=True)
class MemoryEvidence:
    """The device nearest its capacity and how busy the GPU is (None: no step or GPU time)."""

    device: DeviceMemory
    gpu_busy_pct: float | None
    batch_size: int | None  # the recorded DataLoader's, where the run says


@dataclass(frozen=True)
class Judgement:
    found: bool
    cause: str  # OOM_RISK, HEADROOM or ""
    fit_factor: float | None  # the batch that fits, as a multiple of the current one
    fragmented: bool  # reserved far above allocated


def device_memory(model: TraceModel, context: RunContext | None = None) -> Assessment:
    evidence = measure(model, context)
    if isinstance(evidence, Assessment):
        return evidence
    j = judge(evidence)
    d = evidence.device
    if not j.found:
        return Assessment(RULE_ID, "clear", f"{d.device} peaked at {_share(d)} of its capacity"
                          + (f", with the GPU busy {percent(evidence.gpu_busy_pct, 0)} of the "
                             "step" if evidence.gpu_busy_pct is not None else "")
                          + ": neither near out-of-memory nor idle with room to spare.")
    return Assessment.found(advise(evidence, j))


def measure(model: TraceModel, context: RunContext | None = None) -> MemoryEvidence | Assessment:
    """The device nearest its capacity, or why the rule cannot judge."""
    devices = figures.device_memory(model)
    if not devices:
        return Assessment(RULE_ID, "not_assessed", _sentence(not_assessed(model)))
    usable = [d for d in devices if not d.relative and d.capacity]
    if not usable:
        return Assessment(RULE_ID, "not_assessed", _sentence(
            "the trace's memory events carry each allocation's size but not the device's "
            "total, so the peak against capacity is unknown"))
    d = max(usable, key=lambda x: (x.retries or 0, x.ooms or 0, x.peak_share or 0.0))
    sizes = [x.batch_size for x in (context.dataloaders if context else [])
             if x.batch_size]
    return MemoryEvidence(d, _busy_pct(model, d.device),
                          sizes[0] if len(set(sizes)) == 1 else None)


def judge(e: MemoryEvidence) -> Judgement:
    """Out-of-memory risk first (retries, OOMs, peak near capacity), then headroom."""
    d = e.device
    share = d.peak_share or 0.0
    reserved = d.peak_reserved or 0
    fragmented = bool(reserved and d.peak_allocated is not None
                      and (reserved - d.peak_allocated) >= SPLIT_SHARE * reserved)
    if (d.retries or 0) > 0 or (d.ooms or 0) > 0 or share >= NEAR_CAPACITY:
        return Judgement(True, OOM_RISK, None, fragmented)
    factor = fit_factor(d)
    if (share <= HEADROOM_MAX_SHARE and e.gpu_busy_pct is not None
            and e.gpu_busy_pct < HEADROOM_BUSY_PCT and factor is not None
            and factor >= HEADROOM_MIN_FACTOR):
        return Judgement(True, HEADROOM, factor, fragmented)
    return Judgement(False, "", factor, fragmented)


def fit_factor(d: DeviceMemory) -> float | None:
    """How many times the current batch fits in MARGIN of the capacity: what is held across
    steps stays, the transient peak scales with the batch. None without the figures."""
    if d.capacity is None or d.held is None or not d.transient or d.relative:
        return None
    return round((MARGIN * d.capacity - d.held - cache_above(d)) / d.transient, 1)


def cache_above(d: DeviceMemory) -> int:
    """What the allocator reserved above its peak allocation: kept aside when sizing a larger
    batch, as the cache holds it at this batch already."""
    if d.peak_reserved is None or d.peak_allocated is None:
        return 0
    return max(0, d.peak_reserved - d.peak_allocated)


def predicted_peak(d: DeviceMemory, factor: float) -> int | None:
    """The peak allocated memory predicted at `factor` times the current batch."""
    if d.held is None or d.transient is None or d.relative:
        return None
    return round(d.held + factor * d.transient)


def advise(e: MemoryEvidence, j: Judgement) -> Finding:
    d = e.device
    evidence = {
        "device": d.device, "source": d.source, "peak_allocated_mb": _mb(d.peak_allocated),
        "peak_reserved_mb": _mb(d.peak_reserved), "capacity_mb": _mb(d.capacity),
        "peak_pct_of_capacity": round(100 * (d.peak_share or 0.0), 1),
        "held_mb": _mb(d.held), "transient_mb": _mb(d.transient),
        "alloc_retries": d.retries, "ooms": d.ooms,
        "inactive_split_mb": _mb(d.inactive_split), "gpu_busy_pct": e.gpu_busy_pct,
        "batch_fit_factor": j.fit_factor, "batch_size": e.batch_size, "cause": j.cause,
        "cache_above_peak_mb": _mb(cache_above(d)),
    }
    if j.cause == OOM_RISK:
        return _oom_finding(e, j, evidence)
    return _headroom_finding(e, j, evidence)


def _oom_finding(e: MemoryEvidence, j: Judgement, evidence: dict) -> Finding:
    d = e.device
    counted = ""
    if d.retries or d.ooms:
        counted = (f"; the allocator retried {d.retries or 0} times after freeing its cache "
                   f"and raised {d.ooms or 0} out-of-memory errors")
    title = f"GPU memory near capacity: {d.device} peaked at {_share(d)} of its capacity{counted}"
    steps = []
    if j.fragmented or d.retries:
        steps.append(f"set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (reserved "
                     f"{_gib(d.peak_reserved)} against {_gib(d.peak_allocated)} allocated: the "
                     "cache's segments are split, and expandable segments grow in place)")
    if d.transient is not None and d.peak_allocated and d.transient >= 0.5 * d.peak_allocated:
        steps.append(f"recompute activations in the backward pass (activation checkpointing:"
                     f" the step's transient peak is {_gib(d.transient)} of the "
                     f"{_gib(d.peak_allocated)} allocated)")
    steps.append("keep activations in bf16 or fp16 (autocast), half their fp32 size")
    steps.append("halve the batch and accumulate gradients over two steps, which keeps the "
                 "effective batch and the learning rate")
    return Finding(
        id=RULE_ID, title=title, evidence=evidence,
        recommendation="Make room before the allocator runs out: " + "; ".join(steps) + ".",
        snippet=("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
                 "# activations recomputed in backward:\n"
                 "from torch.utils.checkpoint import checkpoint\n"
                 "x = checkpoint(block, x, use_reentrant=False)"),
        precondition=("Helps when the memory is reserved but split (reserved above allocated) "
                      "or the activations dominate the peak; a model whose weights and "
                      "optimizer state alone fill the device needs sharding instead."),
        estimated_saving_pct=0.0,
        saving_basis="memory, not step time: the headroom before out-of-memory (measured)",
        docs=DOCS, severity="medium" if (d.ooms or d.retries) else "low")


def _headroom_finding(e: MemoryEvidence, j: Judgement, evidence: dict) -> Finding:
    d = e.device
    factor = j.fit_factor or 0.0
    whole = max(2, math.floor(factor))
    batch = (f"A batch of up to {whole * e.batch_size} (now {e.batch_size})" if e.batch_size
             else f"A batch up to {whole} times the current one")
    cache = cache_above(d)
    kept = (f" and the {_gib(cache)} the allocator's cache holds above its peak kept aside"
            if cache else "")
    peak = predicted_peak(d, whole)
    return Finding(
        id=RULE_ID,
        title=(f"GPU memory has room for a larger batch: {d.device} peaked at {_share(d)} of "
               f"its capacity while the GPU was busy {percent(e.gpu_busy_pct, 0)} of the step"),
        evidence={**evidence, "predicted_peak_mb": _mb(peak)},
        recommendation=(
            f"{batch} fits: {_gib(d.held)} is held across steps and the step's transient peak "
            f"is {_gib(d.transient)} (measured), so {whole} times the batch would peak near "
            f"{_gib(peak)} allocated (predicted), within {percent(100 * MARGIN, 0)} of "
            f"{_gib(d.capacity)}{kept}. The learning rate follows the batch: scale it with the "
            "batch (with warm-up) or keep the effective batch as it is; fewer, larger steps use "
            "the GPU better when the per-step overhead is what idles it."),
        snippet=(f"loader = DataLoader(dataset, batch_size={whole * e.batch_size}, ...)"
                 if e.batch_size else f"batch_size = {whole} * batch_size  # and scale the lr"),
        precondition=("Helps when the GPU waits on per-step work (launches, the host, the "
                      "loader at a fixed cost per batch); the peak scales with the batch only "
                      "as far as activations do."),
        estimated_saving_pct=0.0,
        saving_basis="not estimated: a larger batch changes the step itself",
        docs=DOCS, severity="info")


def _busy_pct(model: TraceModel, device: str) -> float | None:
    """The share of the step time the GPU (this device, else the busiest) ran work."""
    total = sum(s.duration_us for s in model.steps)
    if total <= 0 or not model.gpu_devices:
        return None
    busy = {dev: sum(sum(s.gpu_us.get(dev, {}).get(k, 0.0) for k in ("kernel", "memcpy",
                                                                       "memset"))
                     for s in model.steps) for dev in model.gpu_devices}
    own = device.removeprefix("cuda:")
    value = busy[own] if own in busy else max(busy.values())
    return round(min(100.0, 100 * value / total), 1)


def _share(d: DeviceMemory) -> str:
    return percent(100 * (d.peak_share or 0.0), 0)


def _gib(value: int | None) -> str:
    return fixed_size(value or 0, "GiB")


def _mb(value: int | None) -> int | None:
    return None if value is None else round(value / (1 << 20))


def _sentence(text: str) -> str:
    return f"{text[0].upper()}{text[1:]}."


SPEC = RuleSpec(
    id=RULE_ID,
    title="GPU memory near capacity (out-of-memory risk), or far from it while the GPU waits",
    summary="GPU memory near out-of-memory, or room for a larger batch",
    check=device_memory,
    no_change=lambda finding: ("a memory finding: it changes what fits on the device, not a "
                               "step time the replay models"),
    thresholds={"NEAR_CAPACITY": NEAR_CAPACITY, "SPLIT_SHARE": SPLIT_SHARE,
                "HEADROOM_MAX_SHARE": HEADROOM_MAX_SHARE, "HEADROOM_BUSY_PCT": HEADROOM_BUSY_PCT,
                "HEADROOM_MIN_FACTOR": HEADROOM_MIN_FACTOR, "MARGIN": MARGIN},
    order=145,
    metric=Metric("GPU's peak reserved memory", "MB", evidence_key("peak_reserved_mb")),
    no_time_saving=True,
)
