"""`allocator-churn`: device memory is returned to the driver and requested again every step.

PyTorch's caching allocator calls `cudaMalloc` only while its cache grows and `cudaFree` only
when told to give memory back (`torch.cuda.empty_cache()`, an out-of-memory retry, a garbage
collection threshold). In steady state neither should appear: both are slow driver calls, and
`cudaFree` synchronises the whole device, so the host waits for all queued work. The first
recorded step is skipped because the cache legitimately grows there (first batch, optimizer
state); what is left is churn: memory freed and allocated again, or a cache that never stops
growing because tensor shapes keep changing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stallscope.diagnose.advice import for_torch, has
from stallscope.diagnose.common import enclosing_ops, ms, pct
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.spec import MS, Change, Metric, RuleSpec, evidence_sum, fixed
from stallscope.runfacts import RunContext
from stallscope.text import plural
from stallscope.trace.model import TraceModel
from stallscope.trace.names import ALLOC_CALL, FREE_CALL, name_flags, regex_hit
from stallscope.units import millis, percent

RULE_ID = "allocator-churn"
# Share of steady-state step time in device malloc/free calls above which the churn is worth a
# fix (the `low` severity floor); a steady-state cudaFree is reported anyway (at info when cheap)
# because it means the cache is being emptied inside the loop.
CHURN_THRESHOLD_PCT = 1.0
DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#memory-management"


def allocator_churn(model: TraceModel, context: RunContext | None = None) -> Assessment:
    if not model.has_gpu:
        return Assessment(RULE_ID, "not_assessed", "No GPU activity: no device allocator.")
    rt = model.runtime
    # Masks over the runtime rows: most traces have no call at all, and building sub-frames
    # only to count them would cost more than the rule's whole answer.
    is_alloc = name_flags(rt["name"], _is_alloc)
    is_free = name_flags(rt["name"], _is_free)
    is_call = is_alloc | is_free
    dur = rt["dur"].to_numpy()
    if model.steps_source != "ProfilerStep" or len(model.steps) < 2:
        return _too_few_steps(is_call, is_free, dur)
    step = rt["step"].to_numpy()
    is_steady = is_call & (step >= 1)
    steady_steps = model.steps[1:]
    n = len(steady_steps)
    total = float(sum(s.duration_us for s in steady_steps))
    if not is_steady.any():
        first = int((is_call & (step == 0)).sum())
        return Assessment(
            RULE_ID,
            "clear",
            f"No device malloc/free calls in the {plural(n, 'steady-state step')}"
            + (f" ({first} in the first step, where the cache grows)." if first else "."),
        )
    steady = rt[is_steady]
    frees = rt[is_steady & is_free]
    allocs = rt[is_steady & ~is_free]
    spent = float(steady["dur"].sum())
    share = pct(spent, total)
    if frees.empty and share < CHURN_THRESHOLD_PCT:
        return Assessment(
            RULE_ID,
            "clear",
            f"{plural(len(allocs), 'device malloc call')} in steady-state steps take "
            f"{percent(share)} of their time (threshold {percent(CHURN_THRESHOLD_PCT, 0)}): "
            "occasional cache growth.",
        )
    steps_with = int(steady["step"].nunique())
    evidence: dict[str, Any] = {
        "steady_state_steps": n,
        "malloc_calls": len(allocs),
        "free_calls": len(frees),
        "steps_with_calls": steps_with,
        "malloc_ms_per_step": ms(float(allocs["dur"].sum()) / n),
        "free_ms_per_step": ms(float(frees["dur"].sum()) / n),
        "churn_share_pct": share,
        "longest_call_ms": ms(float(steady["dur"].max())),
        "ops": enclosing_ops(model, allocs),
    }
    return Assessment.found(advise(model, evidence, spent, total, steady_steps))


def _too_few_steps(is_call: np.ndarray, is_free: np.ndarray, dur: np.ndarray) -> Assessment:
    """Not assessed: no steady-state steps to judge churn in; what calls the window holds."""
    seen = (
        f" The trace has {int((is_call & ~is_free).sum())} malloc and {int(is_free.sum())} "
        f"free calls ({millis(ms(float(np.nansum(dur[is_call]))), 'tenths')} ms) "
        "in that window." if is_call.any() else ""
    )
    return Assessment(
        RULE_ID,
        "not_assessed",
        "Needs at least two ProfilerStep#N steps: the first step is where the caching "
        "allocator legitimately grows, so churn can only be judged in the steps after it."
        + seen,
    )


def advise(model: TraceModel, evidence: dict[str, Any], spent: float, total: float,
           steady_steps: list[Any]) -> Finding:
    """The finding: why memory churns (empty_cache, or changing shapes) and what steadies it."""
    share = evidence["churn_share_pct"]
    n_allocs, n_frees = evidence["malloc_calls"], evidence["free_calls"]
    if n_frees:
        cause = (
            "Device memory is freed inside the steps (cudaFree) and allocated again "
            "(cudaMalloc): the cache is being emptied in the loop, typically by "
            "torch.cuda.empty_cache(), or by out-of-memory retries that flush it. Each cudaFree "
            "also synchronises the device, so the host waits for all queued GPU work."
        )
    else:
        cause = (
            "The caching allocator keeps asking the driver for new memory after the first step: "
            "tensor shapes change from step to step (variable sequence lengths, a smaller last "
            "batch, dynamic shapes), so cached blocks do not fit and the cache grows."
        )
    title = (
        f"Device memory is freed and re-allocated inside steady-state steps: {n_allocs} "
        f"cudaMalloc / {n_frees} cudaFree, {percent(share)} of step time"
    )
    return Finding(
        id=RULE_ID,
        title=title,
        evidence=evidence,
        recommendation=(
            cause + " Remove torch.cuda.empty_cache() from the step loop, let the "
            "allocator map memory in growable segments, and keep shapes stable (pad to a few "
            "bucket sizes, drop_last=True)."
        ),
        snippet=(
            f"{for_torch(model)}\n"
            + ("# before the first CUDA allocation (or in the shell):\n"
               "import os\n"
               'os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")\n'
               if has(model, (2, 1)) else
               "# expandable_segments needs torch >= 2.1: here, keep shapes stable instead\n")
            + "\n"
            "for step, (x, y) in enumerate(loader):\n"
            "    ...\n"
            "    # torch.cuda.empty_cache()   # remove: frees the cache the next step refills"
        ),
        precondition=(
            "Helps when memory is freed or the cache grows in steady state; if empty_cache() is "
            "there to leave memory for another process on the same GPU, keep it but call it "
            "once per epoch. expandable_segments needs PyTorch >= 2.1 on CUDA."
        ),
        estimated_saving_pct=pct(min(spent, max(total - _busiest_gpu_us(steady_steps), 0.0)),
                                 total),
        saving_basis=(
            "upper bound: the host time of the device malloc/free calls in steady-state steps "
            "(a cudaFree's duration includes the device synchronisation it forces), over the "
            "steady-state steps' time; capped so a step is never shorter than the busiest "
            "GPU's busy time"
        ),
        docs=DOCS,
    )


def _is_alloc(name: str) -> bool:
    return regex_hit(ALLOC_CALL, name)


def _is_free(name: str) -> bool:
    return regex_hit(FREE_CALL, name)


def _busiest_gpu_us(steps: list) -> float:
    devices = steps[0].gpu_us.keys() if steps else []
    return max(
        (sum(s.gpu_us[d]["kernel"] + s.gpu_us[d]["memcpy"] + s.gpu_us[d]["memset"]
             for s in steps) for d in devices),
        default=0.0,
    )


SPEC = RuleSpec(
    id=RULE_ID,
    title="device memory is freed and allocated again inside steady-state steps",
    summary="`cudaMalloc`/`cudaFree` (e.g. `empty_cache()`) inside steady-state steps",
    check=allocator_churn,
    thresholds={"CHURN_THRESHOLD_PCT": CHURN_THRESHOLD_PCT},
    what_if=("allocator",),
    changes=fixed(Change("allocator", "steady")),
    order=90,
    metric=Metric("cudaMalloc/cudaFree calls", MS, evidence_sum("malloc_ms_per_step",
                  "free_ms_per_step"), "churn_share_pct"),
)
