"""The step-time verdict of `compare`: the mean step and the median step, each with its
interval, and the one odd step that can make them disagree.

The mean step is throughput, what a job's wall time follows; one slow step (a checkpoint, a
page-cache miss, the profiler flushing) moves it by its whole excess over the others, and with a
dozen steps a side that alone can move it past the run-to-run floor or keep it short of it. The
median step moves by one rank at most. Each is judged alike (commands/stats.py: its interval
against its own A/A noise, its point against the floor). When they agree, that is the verdict.
When they do not, compare looks for one step that explains it: on each side the step farthest
from its side's median (by ratio, at least OUTLIER_FACTOR away), and of the two the one whose
removal moves the mean most. If the mean without that step says what the median says, the step
decided the mean, the verdict is the median's, and the step is named. Otherwise the two disagree
for more than one step (slow steps that recur), and no difference is claimed.

When both agree but their points sit on either side of the floor (the median clears it, the mean
does not) and the same one step accounts for it, the step is named too: it pulls the mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stallscope.commands import stats

# A step at least this many times its side's median (or at most 1/this) may be called an
# outlier: under it, a step is within the spread a round of DataLoader workers gives by design.
OUTLIER_FACTOR = 1.5

# What decided the step-time verdict: both readings agreed; the median, because one step decided
# the mean; or nothing, because the mean and the median disagreed without one step to blame.
BOTH, MEDIAN, DISAGREE = "both", "median", "disagree"

Said = Callable[[Sequence[float], Sequence[float]], str]


@dataclass(frozen=True)
class Outlier:
    """The one step that moves the mean: its side, its place in that side's steps, its time
    and its side's median step (microseconds), the mean step's speedup without it, and whether
    it decided the mean's verdict (without it, the mean says what the median says)."""

    side: str
    index: int
    duration_us: float
    median_us: float
    speedup_without: float
    decides: bool


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)  # in the steps' order: the same sum on any CPU


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def point_class(speedup: float, floor: float) -> str:
    """Where a speedup's point lies against the run-to-run floor alone."""
    if speedup > 1.0 + floor:
        return stats.FASTER
    if speedup < 1.0 / (1.0 + floor):
        return stats.SLOWER
    return stats.SAME


def _farthest(steps: Sequence[float]) -> tuple[int, float] | None:
    """The step farthest from the median by ratio (the first such), when it is at least
    OUTLIER_FACTOR away and the side keeps two steps or more without it."""
    if len(steps) < 3:
        return None
    mid = _median(steps)
    if mid <= 0:
        return None
    index = max(range(len(steps)), key=lambda i: (abs(math.log(max(steps[i], 1e-9) / mid)), -i))
    factor = max(steps[index] / mid, mid / max(steps[index], 1e-9))
    return (index, mid) if factor >= OUTLIER_FACTOR else None


def find_outlier(before: Sequence[float], after: Sequence[float], floor: float,
                 said: Said, median_said: str, median_speedup: float) -> Outlier | None:
    """The one step that decides the mean's verdict, or that alone puts the mean's point on
    the other side of the floor from the median's (module docstring); None when there is no
    disagreement or no single step explains it. `said(before, after)` is the mean's verdict
    for those steps."""
    mean_speedup = _mean(before) / _mean(after)
    mean_said = said(before, after)
    split_verdict = mean_said != median_said
    if not split_verdict and point_class(mean_speedup, floor) == point_class(median_speedup,
                                                                            floor):
        return None
    best: tuple[float, str, int, float, list[float], list[float]] | None = None
    for side, steps in (("before", before), ("after", after)):
        found = _farthest(steps)
        if found is None:
            continue
        index, mid = found
        rest = [s for i, s in enumerate(steps) if i != index]
        b, a = (rest, list(after)) if side == "before" else (list(before), rest)
        moved = abs(math.log((_mean(b) / _mean(a)) / mean_speedup))
        if best is None or moved > best[0]:
            best = (moved, side, index, mid, b, a)
    if best is None:
        return None
    _, side, index, mid, b, a = best
    without = _mean(b) / _mean(a)
    if split_verdict:
        decides = said(b, a) == median_said
        if not decides:
            return None
    elif point_class(without, floor) != point_class(median_speedup, floor):
        return None
    else:
        decides = False
    steps = before if side == "before" else after
    return Outlier(side, index, float(steps[index]), mid, without, decides)


def combine(mean_said: str, median_said: str, outlier: Outlier | None) -> tuple[str, str]:
    """The step-time verdict and what decided it (BOTH, MEDIAN or DISAGREE)."""
    if mean_said == median_said:
        return mean_said, BOTH
    if outlier is not None and outlier.decides:
        return median_said, MEDIAN
    return stats.SAME, DISAGREE
