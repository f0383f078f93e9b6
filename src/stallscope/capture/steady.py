"""When to start recording: once the unprofiled steps have settled into the run's steady state.

`--skip N` steps always pass first. Then, at each step boundary, the steps timed so far without
the profiler are judged, and recording waits one more step while the run is still moving:

- the DataLoader that drives the steps still holds batches its workers prefetched at start-up
  (`num_workers * prefetch_factor` per epoch's iterator): those steps are short, and a window
  made of them hides the loader's real pace (one spawn worker measured 88.9, 7.9, 11.9 ms
  recorded against 87.7 and 114.9 ms unprofiled);
- the last group of steps differs from the group before it by more than `SPREAD` (start-up
  costs still fading, a cache filling), or the loader's wait per step is rising (the prefetch
  queue draining).

A group is one round of the driving loader's workers (a round of 4 workers can be 3 quick
steps and one slow one), between `MIN_GROUP` and `MAX_GROUP` steps. The extra wait is capped
at `MAX_EXTRA_STEPS` steps and `MAX_EXTRA_S` seconds past `--skip`, and ends where one more
step would leave the epoch too few batches for the window (a window past the epoch's end holds
the next epoch's start-up, or nothing when the script trains one epoch); a capped window is
recorded anyway, and the report says what was still moving.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from stallscope.units import ms, percent

SPREAD = 0.25
# The loader's wait per step rising by less than this (us) between groups is noise.
WAIT_RISE_US = 500.0
MIN_GROUP = 2
MAX_GROUP = 8
MAX_EXTRA_STEPS = 40
MAX_EXTRA_S = 30.0


@dataclass(frozen=True)
class Judgement:
    """`steady` or not, and why, in words a user reads in the report."""

    steady: bool
    why: str


def group_size(num_workers: int) -> int:
    """Steps per group: one round of the driving loader's workers, clipped."""
    return max(MIN_GROUP, min(MAX_GROUP, num_workers))


def judge(steps_us: list[float], waits_us: list[float], prefetched_left: int,
          group: int, by_time: bool = True) -> Judgement:
    """Whether the run is steady now. `steps_us` and `waits_us` are the unprofiled steps'
    durations and their time waiting on the loader (in step order, from the first step after
    the start-up prefetch was consumed); `prefetched_left` the start-up batches still queued.

    Without `by_time` only the counts are judged (the prefetch used, two groups timed), never
    the times: every rank of a distributed job must record the same steps, and each rank's
    times differ, while its counts do not."""
    if prefetched_left > 0:
        return Judgement(False, f"the DataLoader still held {prefetched_left} batch(es) its "
                                "workers prefetched at start-up")
    if len(steps_us) < 2 * group:
        return Judgement(False, f"fewer than {2 * group} steps timed since start-up")
    if not by_time:
        return Judgement(True, f"the start-up prefetch used and {2 * group} steps timed (the "
                               "same steps on every rank: times are not compared)")
    last, before = steps_us[-group:], steps_us[-2 * group:-group]
    a, b = statistics.fmean(last), statistics.fmean(before)
    if abs(a - b) > SPREAD * max(a, b):
        return Judgement(False, f"the step time was still moving ({ms(b, 'tenths')} -> "
                                f"{ms(a, 'tenths')} ms over the last {2 * group} steps)")
    wa = statistics.fmean(waits_us[-group:])
    wb = statistics.fmean(waits_us[-2 * group:-group])
    if wa - wb > max(SPREAD * wb, WAIT_RISE_US):
        return Judgement(False, "the wait for the DataLoader was still rising "
                                f"({ms(wb, 'tenths')} -> {ms(wa, 'tenths')} ms per step)")
    return Judgement(True, f"the last {group} unprofiled steps (mean {ms(a, 'tenths')} ms) within "
                           f"{percent(100 * SPREAD, 0)} of the {group} before ({ms(b, 'tenths')} "
                           "ms)")


def epoch_too_short(batches_left: int | None, window_steps: int) -> str:
    """Why waiting one more step would leave this epoch too few batches for the warm-up and
    recorded steps (plus the batch that ends the last one), or "" when it would not or the
    epoch's length is unknown. At 0 the epoch has ended: the next step starts another (its
    start-up prefetch is judged as any other), or the script ends whatever is decided here."""
    if not batches_left or batches_left - 1 >= window_steps + 1:
        return ""
    return (f"recorded now: {batches_left} batch(es) were left in this epoch for a window of "
            f"{window_steps} step(s)")


