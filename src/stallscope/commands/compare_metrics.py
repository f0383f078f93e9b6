"""What `compare` measures a finding by: each rule's own quantity, read from its evidence.

A finding on both sides is worse, better or the same by what it costs, never by its severity or
its saving: both are shares of the step, so when a change makes the step shorter, every finding
it did not touch grows in share and in severity while its cost stays put (gpu-idle on the H200
pair r1-w0 -> r1-w8 went from info to high while its idle time fell from 68.6 to 9.1 ms per
step). Each rule's quantity is the time it costs per step where the rule measures one, in the
rule's own evidence (docs/rules.md), beside its share of the step when the rule gives one.

The rule, in both directions alike (a pair and its reverse get opposite judgements): AFTER's
figure over BEFORE's must pass 1 + the run-to-run floor (`--noise-floor`, the one the step time
must clear: two recordings of one unchanged job differ by that much), and, for a time per step,
the difference must be at least MIN_STEP_PCT of the longer median step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stallscope.units import percent

# Below this share of the step (in percent of the longer of the two median steps), a finding's
# time per step moves by rounding and step noise between two recordings of one job: the
# threshold compare used for a finding's saving before (1 point of the step).
MIN_STEP_PCT = 1.0

WORSE, BETTER, SAME, NOT_MEASURED = "worse", "better", "same", "not measured"

Getter = Callable[[dict[str, Any]], float | None]


def _key(name: str) -> Getter:
    def get(evidence: dict[str, Any]) -> float | None:
        value = evidence.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        return None
    get.key_names = (name,)  # type: ignore[attr-defined]
    return get


def _sum(*names: str) -> Getter:
    def get(evidence: dict[str, Any]) -> float | None:
        values = [_key(n)(evidence) for n in names]
        return None if any(v is None for v in values) else sum(v for v in values if v)
    get.key_names = names  # type: ignore[attr-defined]
    return get


def _optimizer_ms(evidence: dict[str, Any]) -> float | None:
    """The optimizer's host time per training step: its share of the step times the step (its
    own `host_ms_per_optimizer_step` is per optimizer call, and a step may make several)."""
    share, step = _key("optimizer_share_of_step_pct")(evidence), _key("step_ms_mean")(evidence)
    return None if share is None or step is None else share * step / 100.0


def _excess_ms(evidence: dict[str, Any]) -> float | None:
    """The slowest rank's excess over the median rank, on the quantity that differs most."""
    spreads = evidence.get("excess_ms_over_median")
    if not isinstance(spreads, dict):
        return None
    values = [float(v) for v in spreads.values()
              if isinstance(v, int | float) and math.isfinite(v)]
    return max(values) if values else None


def _threads_over(evidence: dict[str, Any]) -> float | None:
    wanted, cores = _key("threads_wanted")(evidence), _key("cores_per_process")(evidence)
    return None if wanted is None or cores is None else wanted - cores


@dataclass(frozen=True)
class Metric:
    """One rule's measured quantity: what it is in words, its unit, how to read it from the
    evidence, and the evidence key of the same as a share of the step (shown beside it)."""

    what: str
    unit: str
    get: Getter
    share_key: str | None = None
    reads: tuple[str, ...] = ()  # the evidence keys `get` reads, when not `_key`'s one

    @property
    def keys(self) -> tuple[str, ...]:
        """Every evidence key this metric reads (tests check the rules still write them)."""
        own = getattr(self.get, "key_names", ())
        return (*own, *self.reads, *([self.share_key] if self.share_key else []))

    @property
    def per_step(self) -> bool:
        return self.unit == "ms per step"


MS = "ms per step"
# Rule id -> its quantity. tests/test_compare.py checks that every rule stallscope has is here,
# so a new rule cannot slip past the gate unjudged.
METRICS: dict[str, Metric] = {
    "dataloader-bound": Metric("step waiting for the DataLoader (no GPU work)", MS,
                               _key("wait_ms_per_step"), "wait_share_pct"),
    "pageable-h2d-copy": Metric("host blocked in pageable host-to-device copies", MS,
                                _key("host_blocked_ms_per_step")),
    "blocking-h2d-copy": Metric("host blocked in host-to-device copies", MS,
                                _key("blocked_ms_per_step"), "blocked_share_pct"),
    "host-device-sync": Metric("host blocked waiting for the GPU", MS,
                               _key("blocked_ms_per_step"), "sync_share_pct"),
    "gpu-idle": Metric("GPU idle", MS, _key("idle_ms_per_step"), "idle_share_pct"),
    "no-mixed-precision": Metric("fp32 GEMM/convolution kernels", MS,
                                 _key("fp32_gemm_conv_ms_per_step"), "fp32_gemm_conv_share_pct"),
    "zero-grad-kernels": Metric("zero_grad kernels", MS, _key("zero_grad_ms_per_step"),
                                "zero_grad_share_pct"),
    "worker-startup": Metric("DataLoader worker start-up", "ms per epoch",
                             _key("startup_ms_per_epoch")),
    "worker-memory": Metric("largest DataLoader worker's own memory", "MB",
                            _key("max_worker_unique_mb")),
    "device-memory": Metric("GPU's peak reserved memory", "MB", _key("peak_reserved_mb")),
    "dataparallel": Metric("DataParallel replicate/scatter/gather", MS,
                           _key("replicate_scatter_gather_ms_per_step"),
                           "replicate_scatter_gather_share_pct"),
    "allocator-churn": Metric("cudaMalloc/cudaFree calls", MS,
                              _sum("malloc_ms_per_step", "free_ms_per_step"), "churn_share_pct"),
    "single-tensor-optimizer": Metric("optimizer host time", MS, _optimizer_ms,
                                      "optimizer_share_of_step_pct", ("step_ms_mean",)),
    "comm-bound": Metric("communication not hidden under compute", MS,
                         _key("exposed_ms_per_step"), "exposed_share_pct"),
    "rank-imbalance": Metric("slowest rank's excess over the median rank", MS, _excess_ms,
                             reads=("excess_ms_over_median",)),
    "cpu-oversubscription": Metric("threads wanted beyond the cores", "threads", _threads_over,
                                   reads=("threads_wanted", "cores_per_process")),
    "pageable-d2h-copy": Metric("host in device-to-host copies into pageable memory", MS,
                                _key("host_copy_ms_per_step"), "host_copy_share_pct"),
    "gpu-bound": Metric("GPU busy", MS, _key("gpu_busy_ms_per_step"), "gpu_busy_share_pct"),
    "compile-in-steps": Metric("compiling inside the recorded steps", "ms in the steps",
                               _key("compile_ms_in_steps"), "compile_share_pct"),
}


def _figure(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def figure_of(rule: str, finding: dict[str, Any] | None) -> tuple[float | None, float | None]:
    """One finding's quantity and its share of the step, from its evidence (None when the rule
    has no known quantity or the evidence lacks it)."""
    metric = METRICS.get(rule)
    ev = finding.get("evidence") if finding else None
    if metric is None or not isinstance(ev, dict):
        return None, None
    share = _key(metric.share_key)(ev) if metric.share_key else None
    return metric.get(ev), share


def metric_of(rule: str, before: tuple[float | None, float | None],
              after: tuple[float | None, float | None]) -> dict[str, Any] | None:
    """The rule's quantity and share on each side, as compare.json holds them; None when the
    rule has no known quantity (a report from another stallscope version)."""
    metric = METRICS.get(rule)
    if metric is None:
        return None
    return {
        "what": metric.what,
        "unit": metric.unit,
        "before": _figure(before[0]),
        "after": _figure(after[0]),
        "share_before_pct": _figure(before[1]) if metric.share_key else None,
        "share_after_pct": _figure(after[1]) if metric.share_key else None,
    }


def measure(rule: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> \
        dict[str, Any] | None:
    """The rule's quantity on each side (None for a side without the finding); None when the
    rule has no known quantity (a report from another stallscope version)."""
    return metric_of(rule, figure_of(rule, before), figure_of(rule, after))


def judge(metric: dict[str, Any] | None, floor: float, step_ms: float) -> str:
    """WORSE, BETTER or SAME by the quantity (module docstring); NOT_MEASURED without it.
    `floor` is the run-to-run floor as a fraction, `step_ms` the longer median step."""
    if metric is None or metric["before"] is None or metric["after"] is None:
        return NOT_MEASURED
    b, a = metric["before"], metric["after"]
    least = MIN_STEP_PCT / 100.0 * step_ms if metric["unit"] == MS else 0.0
    if abs(a - b) < max(least, 1e-9):
        return SAME
    if a > b * (1.0 + floor):
        return WORSE
    if a < b / (1.0 + floor):
        return BETTER
    return SAME


def _num(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.2f}"


def change_text(metric: dict[str, Any] | None) -> str:
    """The quantity for people: "GPU idle 68.6 -> 9.1 ms per step (86.8% -> 43.5% of the
    step)" on both sides, "... 64.1 ms per step (81.2% of the step) before" on one; "" when
    there is none."""
    if metric is None or (metric["before"] is None and metric["after"] is None):
        return ""
    b, a = metric["before"], metric["after"]
    sb, sa = metric.get("share_before_pct"), metric.get("share_after_pct")
    if b is not None and a is not None:
        text = f"{metric['what']} {_num(b)} -> {_num(a)} {metric['unit']}"
        if sb is not None and sa is not None:
            text += f" ({percent(sb)} -> {percent(sa)} of the step)"
        return text
    value, share, when = (b, sb, "before") if b is not None else (a, sa, "after")
    text = f"{metric['what']} {_num(value)} {metric['unit']}"
    if share is not None:
        text += f" ({percent(share)} of the step)"
    return f"{text} {when}"
