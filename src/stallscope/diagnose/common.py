"""Shared pieces for rules: per-trace totals that several rules bound their savings by, and
advice that more than one rule gives."""

from __future__ import annotations

from stallscope.trace.model import TraceModel

# Pinned memory plus non_blocking copies: the fix for both pageable-h2d-copy and
# blocking-h2d-copy, which differ in what they measured, not in what to do.
PINNED_MEMORY_DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers"
PINNED_COPY_SNIPPET = (
    "loader = torch.utils.data.DataLoader(dataset, ..., pin_memory=True)\n"
    "for inputs, targets in loader:\n"
    "    inputs = inputs.to(device, non_blocking=True)\n"
    "    targets = targets.to(device, non_blocking=True)"
)

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
