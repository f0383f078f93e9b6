"""Where recording starts: past `--skip`, the steps waited for torch.compile, for a steady run,
and for the one-thread probe.

The session asks this at each skipped boundary and starts the profiler once `last_skipped`
boundaries have passed; everything that moves that boundary lives here, so the recorded window
is decided in one place and reported as the `window` of report.json's `run`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from stallscope import progress
from stallscope.capture import steady, threadprobe
from stallscope.capture.dynamo import CompileWatch
from stallscope.capture.unprofiled import UnprofiledSteps


class StartWait:
    """The skipped steps' waits: torch.compile's (dynamo.py), the steady wait's (steady.py) and
    the one-thread probe's (threadprobe.py). Reads the unprofiled steps and the DataLoader
    watcher; the session reads `last_skipped`."""

    def __init__(self, sched: Any, unprofiled: UnprofiledSteps, watcher: Any,
                 cuda: bool) -> None:
        self.sched = sched  # the session's Schedule
        self.unprofiled = unprofiled
        self.watcher = watcher  # its LoaderWatcher
        self.cuda = cuda
        self.compile = CompileWatch()
        # Steps skipped beyond --skip until the unprofiled steps were steady, and how that wait
        # ended: the `window` of report.json's `run`.
        self.steady_wait = 0
        self.still_moving = ""  # why the wait for steady steps went on, while it did
        self.window: dict[str, Any] | None = None
        self._judged_from = 0  # the first unprofiled step after the start-up prefetch
        self._skip_passed_at: float | None = None
        # The one-thread probe between the steady wait and recording: its steps, skipped like
        # the steady wait's, and what it measured or why it did not run.
        self.probe: threadprobe.ThreadProbe | None = None
        self.probe_wait = 0
        self.probe_skipped = ""

    @property
    def last_skipped(self) -> int:
        """The boundary after which the profiler starts: --skip, plus the steps waited for
        torch.compile and for a steady run, and the one-thread probe's."""
        return self.sched.skip + self.compile.wait + self.steady_wait + self.probe_wait

    @property
    def first_recorded_boundary(self) -> int:
        """The step boundary that ends the first recorded step (1-based)."""
        return self.last_skipped + self.sched.warmup + 1

    def boundary(self, boundaries: int) -> None:
        """At each boundary up to `last_skipped` (the `boundaries`-th): the profiler is not
        touched at all while steps are skipped."""
        if self.probe is not None:  # the last probe step restores the script's threads
            self.probe.boundary(self.watcher.take_unprofiled_wait())
            return
        if boundaries == self.last_skipped:
            compiling = self.compile.wait
            self.compile.boundary(True)
            if self.compile.wait == compiling:  # compilation settled: is the run steady?
                self._wait_for_steady()
        else:
            self.compile.boundary(False)

    def probe_metadata(self) -> dict[str, Any] | None:
        """The trace's `thread_probe`: what the probe measured, or why it did not run."""
        if self.probe is not None and self.probe.result is not None:
            return self.probe.result
        return {"skipped": self.probe_skipped} if self.probe_skipped else None

    def _wait_for_steady(self) -> None:
        """At the last skipped boundary: skip one more step while the unprofiled steps are
        still moving (capture/steady.py), up to its caps; say how the wait ended."""
        now = time.perf_counter()
        if self._skip_passed_at is None:
            self._skip_passed_at = now
        if not self.sched.steady:
            self.window = {"skip": self.sched.skip, "extra_steps": 0, "extra_s": 0.0,
                           "steady": None, "why": "--no-steady-wait: recorded right after "
                           "--skip, steady or not", "first_step": self.first_recorded_boundary}
            return
        left, workers = self.watcher.iters.prefetched_left()
        steps = self.unprofiled.steps_us()
        if left > 0:  # the step starting now takes a batch prefetched at start-up
            self._judged_from = len(steps) + 1
        one_rank = int(os.environ.get("WORLD_SIZE") or 1) <= 1
        judged = steady.judge(steps[self._judged_from:],
                              self.unprofiled.wait_us[1:][self._judged_from:], left,
                              steady.group_size(workers), by_time=one_rank)
        waited_s = now - self._skip_passed_at
        capped = not judged.steady and (self.steady_wait >= steady.MAX_EXTRA_STEPS
                                        or waited_s >= steady.MAX_EXTRA_S)
        short = steady.epoch_too_short(self.watcher.iters.batches_left(),
                                       self.sched.warmup + self.sched.steps)
        if not judged.steady and short:
            capped, judged = True, steady.Judgement(False, f"{judged.why}; {short}")
        if judged.steady or capped:
            self._start_probe()
            self.window = {
                "skip": self.sched.skip, "extra_steps": self.steady_wait,
                "extra_s": round(waited_s, 3), "steady": judged.steady, "why": judged.why,
                "probe_steps": self.probe_wait, "first_step": self.first_recorded_boundary,
            }
            if self.steady_wait or capped:
                progress.say(f"recording from step {self.first_recorded_boundary}: "
                             + (judged.why if judged.steady else f"still moving ({judged.why})"
                                f" after {self.steady_wait} extra step(s)"))
            return
        if self.steady_wait == 0:
            progress.say(f"waiting for steady steps before recording: {judged.why}")
        self.steady_wait += 1
        self.still_moving = judged.why

    def _start_probe(self) -> None:
        """Where the run is judged steady: time a few steps with one intra-op thread before
        recording, when threadprobe.py says this run is one to probe."""
        window = self.sched.warmup + self.sched.steps
        why = threadprobe.skip_reason(self.cuda, torch.get_num_threads(),
                                      int(os.environ.get("WORLD_SIZE") or 1),
                                      self.watcher.iters.batches_left(), window)
        if why:
            self.probe_skipped = why
            return
        self.unprofiled.close()  # the script's own steps end here
        self.probe = threadprobe.ThreadProbe(torch.get_num_threads())
        self.probe_wait = threadprobe.PROBE_STEPS
        progress.say(f"timing {threadprobe.PROBE_STEPS} steps with one intra-op thread (of "
                     f"{self.probe.threads}) before recording: the replay's torch_threads=1")
        self.probe.begin()
