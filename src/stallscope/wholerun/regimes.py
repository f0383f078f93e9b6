"""Regimes: stretches of the run with one step-time mix, split where the mix changes.

Method: penalised l2 change points (ruptures' KernelCPD with the linear kernel: the l2 cost,
solved exactly in C; ruptures' Pelt solves the same problem in Python, hundreds of times
slower) on two features per step, log step time and the loader-wait
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
from dataclasses import dataclass, replace

import numpy as np
import ruptures as rpt  # type: ignore[import-untyped]

from stallscope import loadrule
from stallscope.units import percent
from stallscope.wholerun.spikes import robust_sd, rolling_median

MIN_STEPS = 20  # fewer valid steps: one regime, no search (nothing to split reliably)
MIN_REGIME = 10  # steps in the shortest regime reported; shorter changes are stalls
PEN_BETA = 4.0  # penalty per change = PEN_BETA * log(n), in noise-sd units (2 features)
MIN_STEP_RATIO = 1.15  # adjacent regimes closer than this in median step time ...
MIN_SHARE_DELTA = 0.10  # ... and closer than this in loader share are one regime
NOISE_LAGS = (1, 5, 20)
MIN_REGIME_MS = 1000.0  # a change adding up to less over the shorter side's steps is a blip
REFINE_STEPS = 60  # steps each side of a boundary searched for where the median switches
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
    median_runq_ms: float = math.nan  # the stepping thread's wait for a core; NaN: not measured
    load: str | None = None  # why other load explains the stretch (then no regime)
    median_others_cores: float = math.nan  # the cores other processes held; NaN: not measured
    median_probe_us: float = math.nan  # the CPU time of the sampler's fixed work; NaN: ditto

    def figures(self) -> loadrule.Figures:
        """What the load rule weighs (stallscope/loadrule.py)."""
        return loadrule.Figures(self.median_step_ms, self.median_runq_ms, self.median_cpu_ms,
                                self.median_others_cores, self.median_probe_us)


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


@dataclass(frozen=True)
class Beside:
    """Per-step figures beside the step time (NaN where not measured): they never move a
    boundary, they say what a stretch is. The process's CPU time, the stepping thread's wait
    for a core, and the other-load sampler's figures (capture/loadsampler.py), each step
    holding its last sweep's."""

    cpu_ms: np.ndarray | None = None
    runq_ms: np.ndarray | None = None
    others_cores: np.ndarray | None = None
    probe_us: np.ndarray | None = None


def _median(x: np.ndarray | None, start: int, end: int, keep: np.ndarray) -> float:
    """The stretch's median of the kept steps' finite values; NaN unless half of them have
    one (and three at least)."""
    if x is None:
        return math.nan
    v = x[start:end][keep]
    v = v[np.isfinite(v)]
    return float(np.median(v)) if v.size >= max(3, keep.sum() // 2) else math.nan


def _describe(step_ms: np.ndarray, wait_ms: np.ndarray, spikes: np.ndarray,
              start: int, end: int, beside: Beside) -> Regime:
    keep = ~spikes[start:end]
    if not keep.any():
        keep = np.ones(end - start, dtype=bool)
    s = step_ms[start:end][keep]
    w = wait_ms[start:end][keep]
    return Regime(start, end, float(np.median(s)), float(np.median(w)),
                  float(np.median(w / s)), _median(beside.cpu_ms, start, end, keep),
                  _median(beside.runq_ms, start, end, keep),
                  median_others_cores=_median(beside.others_cores, start, end, keep),
                  median_probe_us=_median(beside.probe_us, start, end, keep))


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
                 beta: float = PEN_BETA, beside: Beside | None = None) -> list[Regime]:
    """Stretches over the valid steps: the script's regimes, and between them the stretches
    other load explains (`load` says why; they are no regime of the script's).

    The penalised search proposes boundaries; adjacent stretches too alike to act on, or whose
    difference adds up to less than MIN_REGIME_MS over the shorter one's steps, are merged;
    each boundary left is moved to the step where the median level switches; stretches that
    other load explains are labelled; and the script's stretches on either side of a load
    stretch are merged when alike. The figures `beside` never move a boundary.
    """
    n = step_ms.size
    if n == 0:
        return []
    beside = beside or Beside()
    bounds = [0] + change_points(step_ms, wait_ms, spikes, beta)
    drop = spikes.copy()
    found = _merged(_describe_all(bounds, step_ms, wait_ms, drop, beside),
                    step_ms, wait_ms, drop, beside)
    bounds = refine(step_ms, wait_ms, spikes, [r.start for r in found] + [n])
    script = _describe_all(bounds, step_ms, wait_ms, drop, beside)
    loads: list[Regime] = []
    for _ in range(len(bounds)):  # each round takes one stretch or more out: bounded
        labelled = label_load(script)
        new = [r for r in labelled if r.load is not None]
        if not new:
            break
        loads += new
        for r in new:
            drop[r.start:r.end] = True
        # the script's stretches, each holding the load stretches after it (before it, at
        # the start), described without them and merged while alike
        starts = [r.start for r in labelled if r.load is None]
        starts[0] = 0
        script = _merged(_describe_all(starts + [n], step_ms, wait_ms, drop, beside),
                         step_ms, wait_ms, drop, beside)
    return sorted(script + _union(loads), key=lambda r: (r.start, r.load is not None))


def _union(loads: list[Regime]) -> list[Regime]:
    """Load stretches found in several rounds, overlapping ones joined (the longer's reason)."""
    out: list[Regime] = []
    for r in sorted(loads, key=lambda r: r.start):
        if out and r.start <= out[-1].end:
            last = out[-1]
            keep = last if last.end - last.start >= r.end - r.start else r
            out[-1] = replace(keep, start=last.start, end=max(last.end, r.end))
        else:
            out.append(r)
    return out


def _describe_all(bounds: list[int], step_ms: np.ndarray, wait_ms: np.ndarray,
                  drop: np.ndarray, beside: Beside) -> list[Regime]:
    return [_describe(step_ms, wait_ms, drop, a, b, beside)
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _merged(found: list[Regime], step_ms: np.ndarray, wait_ms: np.ndarray, drop: np.ndarray,
            beside: Beside) -> list[Regime]:
    """Adjacent stretches merged, the most alike pair first, while one is too alike to act on
    or too small to matter."""
    found = list(found)
    while len(found) > 1:
        i = _next_merge(found)
        if i is None:
            break
        found[i:i + 2] = [_describe(step_ms, wait_ms, drop, found[i].start, found[i + 1].end,
                                    beside)]
    return found


def _next_merge(found: list[Regime]) -> int | None:
    """The pair to merge next: the most alike pair too close to act on, else the pair whose
    difference adds up to the least time over the shorter one's steps, when under
    MIN_REGIME_MS; None when all may stay."""
    pairs = list(zip(found[:-1], found[1:], strict=True))
    scores = [_close(a, b) for a, b in pairs]
    candidates = [(s, i) for i, s in enumerate(scores) if s is not None]
    if candidates:
        return min(candidates)[1]
    stakes = [_stake(a, b) for a, b in pairs]
    k = int(np.argmin(stakes))
    return k if stakes[k] < MIN_REGIME_MS else None


def _stake(a: Regime, b: Regime) -> float:
    """What the difference between two adjacent stretches adds up to over the shorter one's
    steps (ms): 0.1 ms over 50 steps is no regime, 34 ms over 200 steps is."""
    diff = max(abs(a.median_step_ms - b.median_step_ms), abs(a.median_wait_ms - b.median_wait_ms))
    return diff * min(a.end - a.start, b.end - b.start)


def refine(step_ms: np.ndarray, wait_ms: np.ndarray, spikes: np.ndarray,
           bounds: list[int]) -> list[int]:
    """Each inner boundary (`bounds`: starts, then the end) moved to the step where the median
    level switches: the split of the steps around it (at most REFINE_STEPS each side, within
    the two stretches) with the least absolute deviation from each side's median. The l2
    search places a boundary where its criterion first pays, which a ramp, a stall or noise
    near the change can move by tens of steps."""
    if len(bounds) <= 2:
        return bounds
    feats = [_flatten(np.log(step_ms), spikes), _flatten(wait_ms / step_ms, spikes)]
    signal = [f / _noise_sd(f, floor) for f, floor in zip(feats, NOISE_FLOOR, strict=True)]
    out = list(bounds)
    for j in range(1, len(bounds) - 1):
        lo = max(out[j - 1], bounds[j] - REFINE_STEPS)
        hi = min(bounds[j + 1], bounds[j] + REFINE_STEPS)
        best = (math.inf, 0, bounds[j])
        for k in range(lo + 1, hi):
            cost = sum(_l1(x[lo:k]) + _l1(x[k:hi]) for x in signal)
            key = (cost, abs(k - bounds[j]), k)
            if key < best:
                best = key
        out[j] = best[2]
    return out


def _l1(x: np.ndarray) -> float:
    return float(np.abs(x - np.median(x)).sum())


def label_load(found: list[Regime]) -> list[Regime]:
    """Each stretch slower than a neighbour by what other load explains, labelled as load (the
    fastest stretch never is: it is what the load is measured against)."""
    out = list(found)
    for j, cur in enumerate(found):
        for i in (j - 1, j + 1):
            if 0 <= i < len(found) and found[i].median_step_ms < cur.median_step_ms:
                why = load_why(found[i], cur)
                if why is not None:
                    out[j] = replace(cur, load=why)
                    break
    return out


def load_why(quiet: Regime, busy: Regime) -> str | None:
    """Why `busy` (slower than `quiet`) is other load, or None when it is not
    (stallscope/loadrule.py weighs the evidence)."""
    return loadrule.why_load(quiet.figures(), busy.figures())


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
    return loadrule.cpu_ratio(prev.figures(), cur.figures())
