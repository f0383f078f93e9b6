"""Spike steps: much slower than their neighbours, judged in log time against a rolling median.

Shared by the regime finder (which flattens spikes first, so a checkpoint every 50 steps is not
a regime) and the stall finder (which explains spikes as periodic or epoch-start). Log time
makes the test relative, so one threshold serves a 5 ms and a 5 s step, and a rolling (not
global) median follows a regime change instead of calling a whole slow half spikes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

WINDOW = 21  # steps in the centred rolling median: a stall every >= 3 steps stays a minority
SPIKE_Z = 5.0  # robust z of the log step time above the rolling median
MIN_EXCESS = 0.2  # and at least 20% over the rolling median: small wobbles are not stalls
SCALE_FLOOR = 0.01  # log units: a run steadier than 1% is not allowed to flag 5% blips


@dataclass(frozen=True)
class Spikes:
    """Over the valid steps only (arrays aligned with them)."""

    mask: np.ndarray  # True where the step is a spike
    baseline_ms: np.ndarray  # the rolling median: what the step would have taken
    excess_ms: np.ndarray  # step_ms - baseline, clipped at 0
    scale: float  # robust sd of the log residual


ROWS_AT_ONCE = 1 << 16  # rolling-median windows taken at once: 11 MB of copies at most


def robust_sd(x: np.ndarray) -> float:
    """1.4826 x MAD: the sd of the bulk, blind to the tails a stall makes."""
    if x.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def rolling_median(x: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """Centred rolling median; the window shrinks to the series on short runs."""
    if x.size == 0:
        return x.copy()
    size = min(window, x.size if x.size % 2 else x.size - 1)
    if size <= 1:
        return x.copy()
    half = size // 2
    padded = np.pad(x, half, mode="reflect")  # mirrored about the ends: an end spike stays one
    windows = sliding_window_view(padded, size)
    # In row blocks: the median copies its windows, and all of them at once would be `size`
    # times the series (336 MB for 2 million steps).
    out = np.empty(x.size)
    for lo in range(0, x.size, ROWS_AT_ONCE):
        out[lo:lo + ROWS_AT_ONCE] = np.median(windows[lo:lo + ROWS_AT_ONCE], axis=1)
    return out


def find_spikes(step_ms: np.ndarray) -> Spikes:
    """Spikes among `step_ms` (finite, positive values only)."""
    logx = np.log(step_ms)
    base = rolling_median(logx)
    resid = logx - base
    scale = max(robust_sd(resid), SCALE_FLOOR)
    baseline = np.exp(base)
    mask = (resid > SPIKE_Z * scale) & (step_ms > (1 + MIN_EXCESS) * baseline)
    return Spikes(mask, baseline, np.clip(step_ms - baseline, 0.0, None), scale)
