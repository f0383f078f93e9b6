"""Shared measurements for rules: per-trace totals that several rules bound their savings by."""

from __future__ import annotations

from stallscope.model import TraceModel


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
