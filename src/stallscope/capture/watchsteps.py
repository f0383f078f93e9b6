"""`watch`'s part of the capture session: every step into the step log, the later captures once
the first one is written, and the stop at `--max-steps` or `--duration`.

`run` records one window and stops; `watch` keeps its hooks for the whole run. What only
`watch` needs is kept here, so that `run`'s session carries none of it (the session holds no
WatchSteps under `run`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from stallscope.capture.loadsampler import LoadSampler
from stallscope.capture.recapture import LaterCaptures, Session, later_off
from stallscope.capture.steplog import StepLog, captures_path


class WatchSteps:
    """Fed every step boundary by the session; says when a limit is reached and leaves the
    stopping to the session (which owns the recording and the hooks)."""

    def __init__(self, step_log: StepLog, max_steps: int | None,
                 max_seconds: float | None) -> None:
        self.step_log = step_log
        self.later: LaterCaptures | None = None  # the captures after the first
        self.max_steps = max_steps  # `watch --max-steps`: stop the script after this many
        self.max_seconds = max_seconds  # `watch --duration`: ... after this long
        self._started_at = time.monotonic()
        self.load: LoadSampler | None = None  # the other load beside the steps (the session's)

    def start(self) -> None:
        """`--duration` counts from here: the script's start."""
        self._started_at = time.monotonic()
        if self.load is not None:
            self.load.start()

    def boundary(self, watcher: Any, recording: bool,
                 stop_requested: bool) -> tuple[str, str] | None:
        """One step into the log (and to the later captures' trigger); the limit reached at
        this boundary, as (what to say, the StopScript's `limit`), or None."""
        log, later = self.step_log, self.later
        profiled = recording or (later is not None and later.prof is not None)
        log.boundary(watcher.take_step_wait(), watcher.iters.current_epoch(), profiled)
        if later is not None:
            later.boundary(log.steps, log.last_step_ms, log.last_wait_ms, profiled,
                           log.last_runq_ms, log.last_cpu_ms, log.last_others_cores,
                           log.last_probe_us)
        if stop_requested or threading.current_thread() is not threading.main_thread():
            return None
        if self.max_seconds and time.monotonic() - self._started_at >= self.max_seconds:
            return (f"--duration {self.max_seconds:g}: {log.steps} steps watched in "
                    f"{self.max_seconds:g} s", "duration")
        if self.max_steps and log.steps >= self.max_steps:
            return f"--max-steps {self.max_steps}: {self.max_steps} steps watched", "max steps"
        return None

    def first_written(self, session: Session, later_allowed: bool) -> None:
        """The first capture's trace is written: the later captures take over from here, when
        the run goes on (`later_allowed`) on one rank."""
        self.step_log.trace_written()
        if not later_allowed:
            return
        log = captures_path(self.step_log.path)
        if int(os.environ.get("WORLD_SIZE") or 1) > 1:  # each rank would judge alone
            later_off(log, "a distributed job: each rank would capture at its own steps, "
                      "and a rank under the profiler slows the others' collectives")
        else:
            self.later = LaterCaptures(log, session, self.step_log.steps)

    def started(self) -> list[Any]:
        """The profilers the later captures started (the session's own, never the script's)."""
        return list(self.later.started) if self.later is not None else []

    def finish(self) -> None:
        if self.load is not None:
            self.load.stop()
        if self.later is not None:
            self.later.finish(self.step_log.steps)
        self.step_log.close()
