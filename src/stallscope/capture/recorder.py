"""stallscope's own profiler over the one recorded window, as a state machine: not started
(steps skipped), warming up, recording, done.

The profiler is created up front but started only at the boundary after the skipped steps, so
start-up never counts as a step. Then `warmup` steps warm it up, `steps` steps are recorded, and
the trace is written by `tensorboard_trace_handler` the moment the last one ends; or sooner,
where the recording budget (capture/budget.py) cuts it or the session stops it early. The
session decides when; this class keeps the profiler's state and writes the trace.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from torch.profiler import profile, schedule

from stallscope import progress
from stallscope.capture import budget
from stallscope.capture.export import export_trace
from stallscope.capture.memory import DeviceSteps
from stallscope.capture.metadata import metadata_text
from stallscope.capture.quiet import usdt_filtered
from stallscope.capture.recordhost import RecordedHost
from stallscope.capture.tracefacts import TraceFacts
from stallscope.units import size_text


class Recorder:
    """The profiler, its recorded steps and the trace files it wrote. Sets the DataLoader
    watcher's `recording` at each boundary (the loaders' figures cover the recorded steps)."""

    def __init__(self, sched: Any, activities: list[Any], trace_dir: Path, worker: str,
                 watcher: Any, budget: budget.RecordingBudget, host: RecordedHost,
                 device: DeviceSteps, facts: TraceFacts) -> None:
        self.sched, self.trace_dir, self.worker = sched, trace_dir, worker
        self.watcher, self.budget, self.host, self.device = watcher, budget, host, device
        self.facts = facts
        self.started = False
        self.done = False
        self.recorded = 0
        self.incomplete_step: str | None = None
        self.discard = False  # stopped with no complete step: write no trace
        self.traces: list[Path] = []
        self.export_failed: str | None = None  # what was lost when the export failed
        self._meta_added = False
        with warnings.catch_warnings():  # warmup 0 is the user's explicit choice
            warnings.simplefilter("ignore", UserWarning)
            plan = schedule(wait=0, warmup=sched.warmup, active=sched.steps, repeat=1)
        self.prof = profile(activities=activities, schedule=plan,
                            on_trace_ready=self._on_trace_ready,
                            record_shapes=facts.record_shapes)

    @property
    def running(self) -> bool:
        return self.started and not self.done

    def unwritten_steps(self) -> int:
        """Steps the profiler holds in memory and has not written yet (all of them, until the
        trace is written at the end of recording or by the session's end)."""
        if not self.running:
            return 0
        return max(0, min(self.prof.step_num, self.sched.profiled) - self.sched.warmup)

    def boundary(self, skipped: int) -> bool:
        """A boundary past the `skipped` steps: start the profiler, or step it. True when the
        recording ended here (its last step, or the budget's cut): the session says what next."""
        if not self.started:
            self.started = True
            say_progress(self.sched, None, skipped)
            if self.sched.is_recording(0):
                self.host.start_load()
            with usdt_filtered():
                self.prof.start()
        elif self._step(skipped):
            return True
        self.watcher.recording = self.sched.is_recording(self.prof.step_num)
        if self.watcher.recording and not self.host.begun:
            self.budget.begin()
            self.host.begin()
        if self.watcher.recording and not self._meta_added:
            self.add_metadata()  # only kept while Kineto records
        if self.prof.step_num >= self.sched.profiled:  # the trace was written by this step()
            self.recorded = self.sched.steps
            self.stop()
            return True
        return False

    def _step(self, skipped: int) -> bool:
        """Step the running profiler (the last recorded step's step writes the trace). True
        when the budget ended the recording here instead."""
        sched, step = self.sched, self.prof.step_num
        say_progress(sched, step, skipped)
        self.device.boundary(step - sched.warmup)
        last = False
        if sched.is_recording(step):
            last = step + 1 >= sched.profiled
            done = step - sched.warmup + 1  # recorded steps, this one too
            if not last and not self.budget.next_step_fits(done):
                self.end(done, "memory budget: recording ends after "
                         f"{done} step(s)")  # the next step would not fit the budget
                self.stop()
                return True
            if last:
                self.host.end_load()  # the last recorded step ends with this boundary
                self.add_metadata()  # the measurements; Kineto keeps the last call's
        elif not self.host.load_started and sched.is_recording(step + 1):
            self.host.start_load()  # in the warmup step, not a recorded one
        if sched.is_recording(step) and not last:
            self.prof.step()  # tracing goes on: nothing for Kineto to print
        else:
            with usdt_filtered():  # tracing starts, or stops and is written
                self.prof.step()  # writes the trace after the last recorded step
        return False

    def end(self, recorded: int, said: str, incomplete: bool = False) -> None:
        """The recording ends with `recorded` complete steps (and, `incomplete`, the part of
        the step it is in): the facts are written as they are now."""
        self.recorded = recorded
        if incomplete:
            self.incomplete_step = f"ProfilerStep#{self.prof.step_num}"
        self.host.end_load()
        self.add_metadata()
        if said:
            progress.say(said)

    def stop(self) -> None:
        """Stop the profiler (writing the trace, unless it was written already)."""
        self.done = True
        self.watcher.recording = False
        self.budget.end()
        with usdt_filtered():
            self.prof.stop()

    def stop_early(self) -> None:
        """Stop the profiler before the last step: the complete steps are written (with the
        step it stopped in, marked incomplete)."""
        self.budget.end()
        step = self.prof.step_num
        if self.sched.is_recording(step):
            self.end(step - self.sched.warmup, "", incomplete=True)
        self.done = True
        with usdt_filtered():
            self.prof.stop()  # writes the trace when recording had begun

    def add_metadata(self) -> None:
        """The trace's facts (capture/tracefacts.py). Called when recording begins (Kineto
        keeps only what is added while it records) and again wherever recording ends (Kineto
        keeps the last value); not at the steps between: the loaders' anatomy reads every
        worker's file (benchmarks/bench_anatomy.py)."""
        self._meta_added = True
        self.prof.add_metadata_json("stallscope",
                                    metadata_text(self.facts.metadata(self.incomplete_step)))

    def _on_trace_ready(self, prof: Any) -> None:
        if self.discard:
            return
        # Other ranks write into the same folder at the same moment: only this worker's files.
        pattern = f"{self.worker}.*.pt.trace.json*"
        before = set(self.trace_dir.glob(pattern)) if self.trace_dir.is_dir() else set()
        held = self.recorded or max(0, min(self.prof.step_num, self.sched.profiled)
                                    - self.sched.warmup)
        failed = export_trace(prof, self.trace_dir, self.worker, held,
                              self.facts.after_recording())
        if failed is not None:
            self.export_failed = failed
        written = sorted(set(self.trace_dir.glob(pattern)) - before)
        self.traces.extend(written)
        for path in written:
            progress.say(f"trace written: {path.name} ({size_text(path.stat().st_size)})")


def say_progress(sched: Any, ended: int | None, skipped: int) -> None:
    """Say when the profiler starts, when recording starts, and each step recorded, at the
    boundary after profiler step `ended` (None: the profiler is about to start, after `skipped`
    steps). A slow script then shows it is moving: one step can take minutes."""
    if ended is None:
        progress.say(
            f"{skipped} step(s) skipped: starting the profiler"
            + (f", warming up for {sched.warmup} step(s)" if sched.warmup else "")
        )
    elif sched.is_recording(ended):
        progress.say(f"recorded step {ended - sched.warmup + 1}/{sched.steps}")
    now = 0 if ended is None else ended + 1
    if sched.is_recording(now) and (ended is None or not sched.is_recording(ended)):
        progress.say(f"recording {sched.steps} step(s)")
