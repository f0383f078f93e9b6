"""Statistics behind `tune` and `compare`: a seeded bootstrap interval for a speedup, the A/A
noise it must beat, and whether the machine was too busy for the figures to mean much.

The compared figure is throughput: a run's MEAN step. With W DataLoader workers batches arrive
in rounds (W-1 fast steps, then one that waits for the slowest worker), so a median step
flatters a loader that cannot keep up, and steps inside one run are not independent draws:
a resample of single steps could take only the fast ones. The bootstrap therefore resamples in
two levels: whole runs with replacement (run-to-run variation: another process, page cache),
and inside each run its steps in circular blocks of one round (W steps; 1 without workers), so
each resampled run still holds whole rounds. A configuration's figure is the median over its
runs of each run's mean step, as `tune` reports it; one slow run cannot drag it.

A change is a win only when the whole 95% interval of the speedup lies above 1 + the A/A
noise: how far apart two measurements of the UNCHANGED configuration already were. Below
1 / (1 + noise) it is a loss; anything else is "no measurable difference".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stallscope.units import ms, percent

SEED = 20_231_118  # fixed: the same samples always give the same interval
RESAMPLES = 2000
CONFIDENCE = 0.95
# Digits kept for ratios and speedups in tune.json and compare.json: 0.1% steps, well below
# any difference the A/A noise lets through.
RATIO_DIGITS = 3
# Step times of one configuration spread over this factor (slowest / fastest run mean, or
# p90 / p10 of its steps) mean something else varied between steps: the machine was busy.
BUSY_SPREAD = 2.0

FASTER, SLOWER, SAME = "faster", "slower", "no measurable difference"


@dataclass(frozen=True)
class Interval:
    """A speedup (before / after: above 1 is faster) with its bootstrap interval."""

    point: float
    low: float
    high: float

    def as_json(self) -> dict[str, float]:
        return {"speedup": rnd(self.point), "low": rnd(self.low), "high": rnd(self.high),
                "confidence": CONFIDENCE}


def rnd(value: float) -> float:
    """A ratio as the JSON files hold it."""
    return round(float(value), RATIO_DIGITS)


def run_means(runs: Sequence[Sequence[float]]) -> list[float]:
    """Each run's mean step."""
    return [float(np.mean(r)) for r in runs if len(r)]


def centre(runs: Sequence[Sequence[float]]) -> float:
    """The configuration's figure: the median over runs of each run's mean step."""
    return float(np.median(run_means(runs)))


def _boot_samples(steps: Sequence[float], block: int, rng: np.random.Generator,
                  n: int) -> np.ndarray:
    """`n` resamples of one run, one a row: its steps drawn in circular blocks of `block`."""
    x = np.asarray(steps, dtype=float)
    size = len(x)
    block = max(1, min(block, size))
    blocks = -(-size // block)
    starts = rng.integers(0, size, size=(n, blocks))
    idx = (starts[:, :, None] + np.arange(block)[None, None, :]) % size
    return x[idx].reshape(n, -1)


def _boot_run_means(steps: Sequence[float], block: int, rng: np.random.Generator,
                    n: int) -> np.ndarray:
    """`n` resampled means of one run: its steps drawn in circular blocks of `block`."""
    return _boot_samples(steps, block, rng, n).mean(axis=1)


def _boot_centres(runs: Sequence[Sequence[float]], block: int, rng: np.random.Generator,
                  n: int) -> np.ndarray:
    """`n` resampled figures of one configuration: runs drawn with replacement, each with its
    steps resampled in rounds, then the median of the runs' means."""
    runs = [r for r in runs if len(r)]
    per_run = np.stack([_boot_run_means(r, block, rng, n) for r in runs])  # (runs, n)
    pick = rng.integers(0, len(runs), size=(n, len(runs)))
    return np.median(per_run[pick, np.arange(n)[:, None]], axis=1)


def speedup_interval(before: Sequence[Sequence[float]], after: Sequence[Sequence[float]],
                     block_before: int = 1, block_after: int = 1,
                     resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """Speedup of `after` over `before` (each a list of runs, each run its step times) with a
    seeded percentile-bootstrap interval."""
    rng = np.random.default_rng(seed)
    b = _boot_centres(before, block_before, rng, resamples)
    a = _boot_centres(after, block_after, rng, resamples)
    ratios = b / a
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return Interval(centre(before) / centre(after), float(low), float(high))


def rate_interval(runs: Sequence[Sequence[float]], per_step: float, block: int = 1,
                  resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """Items per second of one configuration that takes `per_step` items a step (a batch's
    samples), from its figure (`centre`, in microseconds), with a seeded bootstrap interval
    over its runs and rounds of steps: a step's time does not compare across batch sizes, its
    throughput does."""
    rng = np.random.default_rng(seed)
    rates = per_step * 1e6 / _boot_centres(runs, block, rng, resamples)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(rates, [tail, 100 - tail])
    return Interval(per_step * 1e6 / centre(runs), float(low), float(high))


def median_interval(before: Sequence[float], after: Sequence[float], block_before: int = 1,
                    block_after: int = 1, resamples: int = RESAMPLES,
                    seed: int = SEED) -> Interval:
    """Speedup of the median step (BEFORE's median over AFTER's) with a seeded percentile
    bootstrap interval, the steps resampled in whole rounds as for the mean. The robust
    reading: one odd step moves a median by at most one rank, a mean by its whole excess.
    Medians and percentiles pick and interpolate values, they sum nothing, so the interval is
    the same on any CPU."""
    rng = np.random.default_rng(seed)
    b = np.median(_boot_samples(before, block_before, rng, resamples), axis=1)
    a = np.median(_boot_samples(after, block_after, rng, resamples), axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(b / a, [tail, 100 - tail])
    return Interval(float(np.median(before) / np.median(after)), float(low), float(high))


def aa_noise(runs: Sequence[Sequence[float]], block: int = 1,
             statistic: str = "mean") -> tuple[float, str]:
    """How far apart two measurements of the same configuration were, as a fraction, and how
    it was measured. Several runs: slowest run mean / fastest - 1 (tune's baseline repeats).
    One run: its first half of whole rounds against its second half (compare, or a baseline
    that ran once), the nearest thing to two runs inside one recording. Infinite when neither
    can be measured (one run of fewer than two rounds): then no difference is ever claimed.
    `statistic` "median" compares the halves' medians (for the median step's reading)."""
    means = run_means(runs)
    if len(means) >= 2:
        return max(means) / min(means) - 1.0, f"{len(means)} runs of the same configuration"
    steps = np.asarray(next(r for r in runs if len(r)), dtype=float)
    rounds = len(steps) // max(block, 1)
    half = (rounds // 2) * max(block, 1)
    if half == 0:
        return math.inf, "one run too short to split in two: not measured"
    first_half, second_half = steps[:half], steps[half:2 * half]
    if statistic == "median":
        first, second = float(np.median(first_half)), float(np.median(second_half))
    else:
        first, second = float(first_half.mean()), float(second_half.mean())
    return (float(max(first, second) / min(first, second)) - 1.0,
            "the first half of one run's steps against its second half")


def noise_json(noise: float) -> float | None:
    """The A/A noise as the JSON files hold it: null when it could not be measured."""
    return None if math.isinf(noise) else rnd(noise)


def noise_text(noise: float | None) -> str:
    """The A/A noise for people, from its JSON value."""
    return "not measured" if noise is None else f"{percent(100 * noise)}"


def classify(interval: Interval, noise: float, floor: float = 0.0) -> str:
    """FASTER only when the whole interval clears 1 + noise; SLOWER when it lies below
    1 / (1 + noise); otherwise SAME. With a `floor`, the speedup itself must also clear
    1 + floor (or lie below 1 / (1 + floor)): the least change worth claiming when the noise
    could not see what varies between two runs."""
    if interval.low > 1.0 + noise and interval.point > 1.0 + floor:
        return FASTER
    if interval.high < 1.0 / (1.0 + noise) and interval.point < 1.0 / (1.0 + floor):
        return SLOWER
    return SAME


def busy_reasons(runs: Sequence[Sequence[float]], block: int = 1,
                 other_cpu_pct: Sequence[float] = (),
                 threshold_pct: float | None = None) -> list[str]:
    """Why the machine looked busy while one configuration was measured, [] when it did not:
    its step times spread over BUSY_SPREAD x, between runs' means or, inside a run, p10-p90 of
    its rounds' means (whole rounds of `block` steps: a round of workers has one slow step by
    design, which is not noise), or other processes took at least `threshold_pct` of the cores
    (capture/hostload.py's measurement, from each run's report)."""
    reasons = []
    means = run_means(runs)
    if len(means) >= 2 and min(means) > 0 and max(means) / min(means) > BUSY_SPREAD:
        reasons.append(f"run means {ms(min(means), 'tenths')}-{ms(max(means), 'tenths')} ms "
                       f"(over {BUSY_SPREAD:g}x apart)")
    block = max(block, 1)
    for r in runs:
        rounds = len(r) // block
        if rounds < 10:  # fewer: one odd step (a GC pause) moves p90
            continue
        per_round = np.asarray(r[:rounds * block], dtype=float).reshape(rounds, block).mean(1)
        p10, p90 = np.percentile(per_round, [10, 90])
        if p10 > 0 and p90 / p10 > BUSY_SPREAD:
            reasons.append(f"steps inside one run {ms(p10, 'tenths')}-{ms(p90, 'tenths')} ms "
                           f"p10-p90 (over {BUSY_SPREAD:g}x apart)")
            break
    if threshold_pct is not None:
        over = [p for p in other_cpu_pct if p >= threshold_pct]
        if over:
            reasons.append(f"other processes took up to {percent(max(over), 0)} of the cores")
    return reasons
