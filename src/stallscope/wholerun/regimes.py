"""Regimes: stretches of the run with one step-time mix, split where the mix changes.

Method: penalised l2 change points (ruptures' KernelCPD with the linear kernel: the l2 cost,
solved exactly in C; ruptures' Pelt solves the same problem in Python and took 37 s for 2,000
steps on the 2-core VM, this 0.05 s) on two features per step, log step time and the loader-wait
share of the step, after spikes are replaced by their rolling median (a checkpoint every 50
steps is a periodic stall, not 2 regimes per checkpoint). Each feature is divided by its noise
sd, estimated from the MAD of first differences (blind to the level shifts being looked for),
so the penalty is in units of noise. Then adjacent regimes whose difference is too small to act
on (steps within 15% and loader share within 10 points) are merged: a real run drifts, and a
statistically sure 3% drift is not a regime a user needs to hear about; so are regimes shorter
than 1 s of wall time (a busy machine makes such blips; no capture could even follow one).
PEN_BETA was chosen with benchmarks/bench_watch_detector.py, which measures the false-alarm
rate on steady runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import ruptures as rpt  # type: ignore[import-untyped]

from stallscope.units import percent
from stallscope.wholerun.spikes import robust_sd, rolling_median

MIN_STEPS = 20  # fewer valid steps: one regime, no search (nothing to split reliably)
MIN_REGIME = 10  # steps in the shortest regime reported; shorter changes are stalls
PEN_BETA = 4.0  # penalty per change = PEN_BETA * log(n), in noise-sd units (2 features)
MIN_STEP_RATIO = 1.15  # adjacent regimes closer than this in median step time ...
MIN_SHARE_DELTA = 0.10  # ... and closer than this in loader share are one regime
NOISE_LAGS = (1, 5, 20)
MIN_REGIME_MS = 1000.0  # a regime shorter than 1 s of wall time is a blip, not a regime
NOISE_FLOOR = (0.02, 0.02)  # sd floors: log step time (2%), loader share (2 points)
MAX_POINTS = 5000  # longer runs are searched on block means (the search is quadratic)


@dataclass(frozen=True)
class Regime:
    """Bounds are positions in the valid-step arrays (end exclusive)."""

    start: int
    end: int
    median_step_ms: float
    median_wait_ms: float
    wait_share: float
    median_cpu_ms: float = math.nan  # NaN when the process's CPU time was not measured


def _noise_sd(x: np.ndarray, floor: float) -> float:
    """The sd of a feature's noise, from differences at lags 1, 5 and 20 (the largest).

    Differences are blind to a level shift (it touches only `lag` of them), and lags past 1
    also see slow wander (a busy machine, clock changes): a lag-1 estimate alone sees only
    step-to-step noise and calls every wander a change.
    """
    best = floor
    for lag in NOISE_LAGS:
        if x.size > 4 * lag:
            best = max(best, robust_sd(x[lag:] - x[:-lag]) / math.sqrt(2.0))
    return best


def _flatten(x: np.ndarray, spikes: np.ndarray) -> np.ndarray:
    """Spike steps take the rolling median of the other steps around them."""
    if not spikes.any():
        return x
    out = x.copy()
    calm = np.flatnonzero(~spikes)
    if calm.size == 0:
        return out
    med = rolling_median(x[calm])
    # each spike takes the rolling value of the calm step before it (after it at the start),
    # so a stall that ends a regime is not moved into the next one
    pos = np.clip(np.searchsorted(calm, np.flatnonzero(spikes)) - 1, 0, calm.size - 1)
    out[spikes] = med[pos]
    return out


def _describe(step_ms: np.ndarray, wait_ms: np.ndarray, spikes: np.ndarray,
              start: int, end: int, cpu_ms: np.ndarray | None = None) -> Regime:
    keep = ~spikes[start:end]
    if not keep.any():
        keep = np.ones(end - start, dtype=bool)
    s = step_ms[start:end][keep]
    w = wait_ms[start:end][keep]
    cpu = math.nan
    if cpu_ms is not None:
        c = cpu_ms[start:end][keep]
        c = c[np.isfinite(c)]
        cpu = float(np.median(c)) if c.size >= max(3, keep.sum() // 2) else math.nan
    return Regime(start, end, float(np.median(s)), float(np.median(w)),
                  float(np.median(w / s)), cpu)


def _close(a: Regime, b: Regime) -> float | None:
    """How alike two regimes are (lower: more alike), or None when they differ enough."""
    ratio = max(a.median_step_ms, b.median_step_ms) / min(a.median_step_ms, b.median_step_ms)
    delta = abs(a.wait_share - b.wait_share)
    if ratio >= MIN_STEP_RATIO or delta >= MIN_SHARE_DELTA:
        return None
    return max(math.log(ratio) / math.log(MIN_STEP_RATIO), delta / MIN_SHARE_DELTA)


def change_points(step_ms: np.ndarray, wait_ms: np.ndarray, spikes: np.ndarray,
                  beta: float = PEN_BETA) -> list[int]:
    """The penalised change points (positions, exclusive ends, the last = n), before merging."""
    n = step_ms.size
    if n < MIN_STEPS:
        return [n]
    feats = np.column_stack([_flatten(np.log(step_ms), spikes),
                             _flatten(wait_ms / step_ms, spikes)])
    block = max(1, math.ceil(n / MAX_POINTS))
    if block > 1:  # block means: a change is then placed to within one block
        m = n // block
        feats = feats[: m * block].reshape(m, block, 2).mean(axis=1)
    floors = [f / math.sqrt(block) for f in NOISE_FLOOR]
    signal = np.column_stack([feats[:, k] / _noise_sd(feats[:, k], floors[k]) for k in range(2)])
    algo = rpt.KernelCPD(kernel="linear", min_size=max(2, math.ceil(MIN_REGIME / block)))
    bkps = algo.fit(signal).predict(pen=beta * math.log(len(signal)))
    return [min(int(b) * block, n) for b in bkps[:-1]] + [n]


def find_regimes(step_ms: np.ndarray, wait_ms: np.ndarray, spikes: np.ndarray,
                 beta: float = PEN_BETA, cpu_ms: np.ndarray | None = None) -> list[Regime]:
    """Regimes over the valid steps, adjacent ones merged while too alike to act on.

    `cpu_ms` (optional) only describes the regimes: it never moves a boundary.
    """
    n = step_ms.size
    if n == 0:
        return []
    bounds = [0] + change_points(step_ms, wait_ms, spikes, beta)
    pairs = zip(bounds[:-1], bounds[1:], strict=True)
    regimes = [_describe(step_ms, wait_ms, spikes, a, b, cpu_ms) for a, b in pairs]
    while len(regimes) > 1:
        i = _next_merge(regimes, step_ms)
        if i is None:
            break
        merged = _describe(step_ms, wait_ms, spikes, regimes[i].start, regimes[i + 1].end,
                           cpu_ms)
        regimes[i:i + 2] = [merged]
    return regimes


def _next_merge(regimes: list[Regime], step_ms: np.ndarray) -> int | None:
    """The pair to merge next: the most alike pair too close to act on, else the shortest
    regime under MIN_REGIME_MS with its more alike neighbour; None when all may stay."""
    scores = [_close(a, b) for a, b in zip(regimes[:-1], regimes[1:], strict=True)]
    candidates = [(s, i) for i, s in enumerate(scores) if s is not None]
    if candidates:
        return min(candidates)[1]
    walls = [float(step_ms[r.start:r.end].sum()) for r in regimes]
    k = int(np.argmin(walls))
    if walls[k] >= MIN_REGIME_MS:
        return None
    if k == 0:
        return 0
    if k == len(regimes) - 1:
        return k - 1
    left, right = _distance(regimes[k - 1], regimes[k]), _distance(regimes[k], regimes[k + 1])
    return k - 1 if left <= right else k


def _distance(a: Regime, b: Regime) -> float:
    ratio = abs(math.log(a.median_step_ms / b.median_step_ms)) / math.log(MIN_STEP_RATIO)
    return max(ratio, abs(a.wait_share - b.wait_share) / MIN_SHARE_DELTA)


def what_changed(prev: Regime, cur: Regime) -> str:
    """'steps 2.1x longer, loader wait from 3% to 61% of the step'."""
    ratio = cur.median_step_ms / prev.median_step_ms
    parts = []
    if ratio >= 1.005:
        parts.append(f"steps {ratio:.1f}x longer" if ratio >= 1.095 else
                     f"steps {percent(100 * (ratio - 1), 0)} longer")
    elif ratio <= 1 / 1.005:
        inv = 1 / ratio
        parts.append(f"steps {inv:.1f}x shorter" if inv >= 1.095 else
                     f"steps {percent(100 * (1 - ratio), 0)} shorter")
    else:
        parts.append("step time unchanged")
    a, b = round(100 * prev.wait_share), round(100 * cur.wait_share)
    if a != b:
        parts.append(f"loader wait from {a}% to {b}% of the step")
    else:
        parts.append(f"loader wait unchanged at {a}% of the step")
    cpu = cpu_ratio(prev, cur)
    loader_moved = abs(cur.wait_share - prev.wait_share) >= MIN_SHARE_DELTA  # then it says why
    if (cpu is not None and abs(math.log(ratio)) >= math.log(MIN_STEP_RATIO)
            and not loader_moved):
        if abs(math.log(cpu)) <= abs(math.log(ratio)) / 3:
            parts.append(f"the process's CPU time per step {cpu:.2f}x: it waited outside the "
                         "process (other load on the machine, or I/O)")
        else:
            parts.append(f"the process's CPU time per step {cpu:.1f}x")
    return ", ".join(parts)


def cpu_ratio(prev: Regime, cur: Regime) -> float | None:
    """Median CPU time per step, this regime over the previous; None when either lacks it."""
    if not (math.isfinite(prev.median_cpu_ms) and math.isfinite(cur.median_cpu_ms)):
        return None
    if prev.median_cpu_ms <= 0 or cur.median_cpu_ms <= 0:
        return None
    return cur.median_cpu_ms / prev.median_cpu_ms
