"""The script's own steps before the profiler starts, timed with no profiler on.

No profiler slows these steps, so they are the run's baseline: `tune` compares configurations
on them, the steady wait (capture/steady.py) judges them, and the replay sets the recorded steps
against the last group of them (replay/unprofile.py). Kept apart from the session so that what
is timed, and the other load over it, is read in one place.
"""

from __future__ import annotations

import time
from typing import Any

from stallscope.capture import hostload


class UnprofiledSteps:
    """perf_counter() at each step boundary before the profiler (or the one-thread probe)
    starts, the DataLoader wait since the boundary before, and the stepping thread's scheduler
    figures; the other load over them once they end."""

    def __init__(self) -> None:
        self.at: list[float] = []
        # the time spent waiting on the DataLoader since the boundary before (the first entry:
        # start-up, before any boundary)
        self.wait_us: list[float] = []
        self._sched: list[tuple[float, float] | None] = []
        self._load_start: hostload.CpuSample | None = None
        # The other load over these steps, with the stepping thread's run and run-queue wait in
        # each: `tune` takes other processes' share out of its timings.
        self.load: dict[str, Any] = {}

    def boundary(self, wait_us: float) -> None:
        """One more unprofiled boundary, with the DataLoader wait of the step it ends."""
        if not self.at:  # the load's window holds every timed step: read first
            self._load_start = hostload.sample()
        self.at.append(time.perf_counter())
        self.wait_us.append(wait_us)
        self._sched.append(hostload.thread_sched())

    def close(self) -> None:
        """Where the script's unprofiled steps end (the profiler or the probe starts): the
        other load over them, and the stepping thread's run and run-queue wait in each."""
        if self.load or self._load_start is None:
            return
        load = hostload.other_load(self._load_start, hostload.sample())
        marks = self._sched
        if load and all(m is not None for m in marks) and len(marks) >= 2:
            load["main_run_us"] = [round((b[0] - a[0]) * 1e6, 1)  # type: ignore[index]
                                   for a, b in zip(marks, marks[1:], strict=False)]
            load["main_wait_us"] = [round((b[1] - a[1]) * 1e6, 1)  # type: ignore[index]
                                    for a, b in zip(marks, marks[1:], strict=False)]
        self.load = load

    def steps_us(self) -> list[float]:
        """The skipped steps' durations (us), from the first boundary on: the step before it
        holds the script's start-up."""
        at = self.at
        return [round((b - a) * 1e6, 1) for a, b in zip(at, at[1:], strict=False)]
