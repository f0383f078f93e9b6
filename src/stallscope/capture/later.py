"""`watch`'s later captures: after the first recorded window, a short profiler window wherever
the run's stalls change (a new regime) and once around a periodic stall, so a stall that starts
after hours is diagnosed from its own steps, not from the start's.

Decided online, one step at a time, in the training process, on what the step log already
measures (wall time, DataLoader wait): `Trigger` is pure Python and cheap (medians of a
second's steps, at most `MAX_SPAN`, every quarter of that or `EVERY` steps). A change is what
the whole-run analysis would keep as a regime (wholerun/regimes.py merges regimes closer than
`STEP_RATIO` in median step time and `SHARE_DELTA` in loader-wait share, and neighbours whose
difference adds up to less than `MIN_WINDOW_MS` over the shorter one's steps: the same
thresholds, so a capture is never spent on a change the report would not show) held over a
whole window of steps, and until its difference adds up to that much over the steps since the
change and those before it since the last capture. A periodic stall is a
spike (a step `SPIKE_FACTOR` times the median of `WINDOW` steps at the last judgement; among
the recent ones, those at least half as long as the longest, and `STANDOUT` times the median
of those off their rhythm) recurring at one gap four times running; its capture starts so that
the recorded steps hold the next one (as their second: the analysis sets the first aside).

Bounds (stated defaults, docs/watch.md): at most `MAX_LATER` later captures, none within
`MIN_GAP_STEPS` steps of the last one's end, and none while the steps recorded under the
profiler so far would exceed `MAX_PROFILED_SHARE` of the steps watched.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from stallscope import loadrule
from stallscope.units import millis, percent

WINDOW = 20  # steps judged together at least: a change must hold this long (and a second)
MAX_SPAN = 200  # ... and at most (a second of 1 ms steps)
REF_STEPS = 50  # steps the reference is measured over at least, after each capture
EVERY = 5  # steps between two judgements at least
STEP_RATIO = 1.15  # = wholerun.regimes.MIN_STEP_RATIO (tests/test_watch_later.py checks)
SHARE_DELTA = 0.10  # = wholerun.regimes.MIN_SHARE_DELTA
MIN_WINDOW_MS = 1000.0  # = wholerun.regimes.MIN_REGIME_MS: a shorter change is a blip
SPIKE_FACTOR = 2.0  # a step this many times the window's median is a stall
MIN_PERIOD = 3  # a shorter gap is a slow loader round, not a periodic stall
REPEATS = 4  # stalls one gap apart before a period is believed (3 made noise periods of 3)
STANDOUT = 1.5  # ... each this many times the median of the other recent stalls
HOLD = 4  # judgements running (a quarter window apart) that must see a change: a window more
# A periodic capture starts this many steps before the stall: one warm-up step, then the stall
# as the second recorded step (the analysis sets the first recorded step aside).
LEAD = 3
MAX_LATER = 3
MIN_GAP_STEPS = 50
MAX_PROFILED_SHARE = 0.05


@dataclass(frozen=True)
class Start:
    """Begin a capture at step boundary `at` (the step numbered `at` + 1 is the first the
    profiler sees, as its warm-up), because of `why`."""

    at: int
    kind: str  # "regime" or "periodic"
    why: str
    every: int | None = None  # a periodic stall's gap, in steps


@dataclass(frozen=True)
class Level:
    """A window's medians: step time (ms), loader-wait share, run-queue wait and process CPU
    time (ms), the cores other processes held and the probe's CPU time (us; NaN: not
    measured)."""

    step_ms: float
    share: float
    runq_ms: float
    cpu_ms: float = math.nan
    others_cores: float = math.nan
    probe_us: float = math.nan

    def __iter__(self) -> Iterator[float]:
        return iter((self.step_ms, self.share, self.runq_ms))


def is_load(a: Level, b: Level) -> bool:
    """The slower of two windows is other load (stallscope/loadrule.py, the rule of the
    report's too: no capture is spent on what the report calls load)."""
    quiet, busy = (a, b) if a.step_ms <= b.step_ms else (b, a)
    return loadrule.why_load(*(loadrule.Figures(x.step_ms, x.runq_ms, x.cpu_ms, x.others_cores,
                                       x.probe_us) for x in (quiet, busy))) is not None


class Trigger:
    """Fed every step after the first capture; says when to begin the next one.

    The reference is the first `REF_STEPS` or more steps after a capture (at least one second),
    kept until a change: the current window is compared with it, so a window's own noise is
    set against a steady figure, not against another noisy window. The window is as many steps
    as a second takes (at least `WINDOW`, at most `MAX_SPAN`), and a change must be seen at
    `HOLD` judgements running. A start the bounds refuse for now is asked for again later
    (`refused`)."""

    def __init__(self) -> None:
        # step ms, loader share, run-queue wait ms, CPU ms, others' cores, probe us (NaN: not
        # measured)
        self._recent: deque[tuple[float, ...]] = deque(maxlen=MAX_SPAN)
        self._ref: Level | None = None
        self._asked_ref: Level | None = None  # the reference a change was seen on ...
        self._asked_first: int | None = None  # ... and its first step
        self._spikes: deque[tuple[int, float]] = deque(maxlen=128)  # step, its time
        self._periods_done: set[int] = set()
        self._seen = 0
        self._held = 0  # judgements running that saw a change
        self._change_from = 0  # the step the change held since began at, at the latest
        self._first: int | None = None  # the first step judged since the last capture
        self._median = 0.0  # the last WINDOW steps' median at the last judgement: spikes' yardstick
        self._every = EVERY  # steps between judgements

    def add(self, step: int, step_ms: float, wait_ms: float,
            runq_ms: float = math.nan, cpu_ms: float = math.nan,
            others_cores: float = math.nan, probe_us: float = math.nan) -> Start | None:
        """One unprofiled step (its number in the run, its wall time, loader wait, the
        stepping thread's wait for a core, the process's CPU time, and the other-load
        sampler's last figures: NaN where not measured)."""
        if not step_ms > 0:
            return None
        if self._first is None:
            self._first = step
        if self._median and step_ms >= SPIKE_FACTOR * self._median:
            self._spikes.append((step, step_ms))
        self._recent.append((step_ms, min(max(wait_ms, 0.0), step_ms) / step_ms,
                             runq_ms if runq_ms >= 0 else math.nan,
                             cpu_ms if cpu_ms >= 0 else math.nan,
                             others_cores if others_cores >= 0 else math.nan,
                             probe_us if probe_us > 0 else math.nan))
        self._seen += 1
        if len(self._recent) < WINDOW or self._seen % self._every:
            return None
        self._median = statistics.median(r[0] for r in self._last(WINDOW))
        span = self._span()
        # a quarter of the window between judgements: a second of 5 ms steps is 200 steps,
        # whose medians cost ~0.2 ms; judged every 5 steps that was 39 us a step
        self._every = max(EVERY, span // 4)
        if self._ref is None:
            if len(self._recent) >= max(span, REF_STEPS):
                self._ref = self._window(max(span, REF_STEPS))
            return self._periodic(step)
        return self._change(step, self._window(span)) or self._periodic(step)

    def rebase(self) -> None:
        """After a capture: its steps were the profiler's, judge afresh from the next ones."""
        self._recent.clear()
        self._ref = None
        self._seen = self._held = 0
        self._first = None
        self._median = 0.0  # no spike is judged against the old pace
        self._every = EVERY

    def _last(self, n: int) -> list[tuple[float, ...]]:
        """The last `n` steps (fewer while the window fills), without copying the rest."""
        return list(itertools.islice(reversed(self._recent), n))

    def _span(self) -> int:
        """Steps in the judged window: a second's worth at the current pace."""
        return min(MAX_SPAN, max(WINDOW, math.ceil(MIN_WINDOW_MS / self._median)))

    def _window(self, n: int) -> Level:
        """The last `n` steps' medians (Level), without their spikes."""
        rows = self._last(n)
        cut = SPIKE_FACTOR * statistics.median(r[0] for r in rows)
        calm = [r for r in rows if r[0] < cut] or rows

        def median(k: int) -> float:  # NaN unless half the steps measured it
            got = [r[k] for r in calm if math.isfinite(r[k])]
            return statistics.median(got) if got and len(got) * 2 >= len(calm) else math.nan

        return Level(statistics.median(r[0] for r in calm), statistics.median(r[1] for r in calm),
                     *(median(k) for k in range(2, 6)))

    def _change(self, step: int, now: Level) -> Start | None:
        assert self._ref is not None
        (ref_ms, ref_share, _), (ms, share, _) = self._ref, now
        ratio = ms / ref_ms
        moved = abs(share - ref_share) >= SHARE_DELTA
        if not (moved or ratio >= STEP_RATIO or ratio <= 1 / STEP_RATIO) or is_load(
                self._ref, now):
            self._held = 0
            return None
        n = self._span()
        if self._held == 0:  # the median moved: half the window's steps at least changed
            self._change_from = step - n // 2
        self._held += 1
        # what the change adds up to over its steps so far, as wholerun/regimes.py `_stake`
        # weighs two stretches: the report merges a change worth less than MIN_WINDOW_MS
        diff = max(abs(ms - ref_ms), abs(share * ms - ref_share * ref_ms))
        steps = min(step - self._change_from, self._change_from - (self._first or 0))
        if self._held < HOLD or diff * steps < MIN_WINDOW_MS:
            return None
        ref, first = self._ref, self._first
        self.rebase()
        self._asked_ref, self._asked_first = ref, first
        return Start(step, "regime", (
            f"the median step went from {millis(ref_ms, 'tenths')} to {millis(ms, 'tenths')} ms "
            f"and the DataLoader wait from {percent(100 * ref_share, 0)} to "
            f"{percent(100 * share, 0)} of the step over the last "
            f"{n} steps"))

    def _periodic(self, step: int) -> Start | None:
        # the stalls at least half as long as the longest lately: a busy machine's small
        # spikes between checkpoints must not break their rhythm
        longest = max((ms for _, ms in self._spikes), default=0.0)
        big = [(st, ms) for st, ms in self._spikes if ms >= 0.5 * longest][-REPEATS:]
        if len(big) < REPEATS:
            return None
        s = [st for st, _ in big]
        gaps = sorted(b - a for a, b in zip(s, s[1:], strict=False))
        gap = gaps[len(gaps) // 2]
        tolerance = 1 if gap >= 10 else 0  # as wholerun/periodic.py: long periods wander
        if gap < MIN_PERIOD or gaps[-1] - gaps[0] > 2 * tolerance or gap in self._periods_done:
            return None
        # ... and stand out from the stalls off their rhythm: on a busy machine, random stalls
        # of one size fall at equal gaps by chance (a third of steady runs with 5% spikes did)
        off = [ms for st, ms in self._spikes
               if min((st - s[-1]) % gap, (s[-1] - st) % gap) > tolerance]
        if off and min(ms for _, ms in big) < STANDOUT * statistics.median(off):
            return None
        following = s[-1] + gap
        while following - LEAD <= step:  # the capture must start before the stall it holds
            following += gap
        self._periods_done.add(gap)
        return Start(following - LEAD, "periodic", (
            f"a stall every {gap} steps (steps {', '.join(map(str, s))}): the capture "
            f"holds step {following}"), every=gap)


    def refused(self, start: Start) -> None:
        """The bounds said not yet: ask again once the change still holds (a regime: judged
        against the same reference again) or the stall recurs (a period: its gap forgotten)."""
        if start.every is not None:
            self._periods_done.discard(start.every)
        elif self._asked_ref is not None:
            self._ref, self._first = self._asked_ref, self._asked_first


class Bounds:
    """How many later captures may still start, and where."""

    def __init__(self, steps_per_capture: int) -> None:
        self.per_capture = steps_per_capture
        self.count = 0
        self.profiled = 0
        self.last_end = 0

    def allows(self, start: Start, watched: int) -> str | None:
        """None when a capture may begin at `start`, else why not."""
        if self.count >= MAX_LATER:
            return f"{MAX_LATER} later captures already taken"
        if start.at - self.last_end < MIN_GAP_STEPS:
            return f"within {MIN_GAP_STEPS} steps of the last capture"
        if self.profiled + self.per_capture > MAX_PROFILED_SHARE * max(watched, start.at):
            return (f"the profiled steps would pass {percent(100 * MAX_PROFILED_SHARE, 0)} of the "
                    "steps watched")
        return None

    @property
    def exhausted(self) -> bool:
        """No later capture will ever be allowed again."""
        return self.count >= MAX_LATER

    def taken(self, first: int, last: int) -> None:
        self.count += 1
        self.profiled += last - first + 1
        self.last_end = last
