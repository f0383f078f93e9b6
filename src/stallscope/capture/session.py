"""The capture session around one run: stallscope's hooks into the script, and the step
boundaries they find, handed to the parts that own the rest.

The profiler (capture/recorder.py) starts only once the skipped steps are over and the waits
before recording (capture/startwait.py) have ended, so start-up (imports, model build) never
counts as a step and a skipped step costs a counter increment. Then, unless asked to run to the
end, the script is stopped by raising `StopScript` from the step hook: a BaseException, so the
script's `finally` blocks and context managers still run while `except Exception` ignores it.
`watch` keeps the hooks for the whole run (capture/watchsteps.py).

A script that starts its own profiler makes this session step aside for good (foreign.py):
only one profiler can run in a process.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity

from stallscope import marker, progress
from stallscope.capture import budget, memory, opcost
from stallscope.capture.foreign import ForeignProfilers
from stallscope.capture.loaders import LoaderWatcher
from stallscope.capture.loadsampler import LoadSampler
from stallscope.capture.nostep import NO_STEP_S, NoStepWarning
from stallscope.capture.overrides import loader_overrides
from stallscope.capture.quiet import quiet_profiler_warnings
from stallscope.capture.recorder import Recorder
from stallscope.capture.recordhost import RecordedHost
from stallscope.capture.startwait import StartWait
from stallscope.capture.steplog import StepLog
from stallscope.capture.steps import StepDriver
from stallscope.capture.tracefacts import TraceFacts
from stallscope.capture.unprofiled import UnprofiledSteps
from stallscope.capture.watchsteps import WatchSteps

# Input shapes ("Input Dims") are not recorded by default: no rule reads them (they feed only
# TensorBoard's "group by input shape" view), and they add to every recorded op's cost
# (benchmarks/bench_profiler_cost.py; the figures are in docs/replay.md). `run --record-shapes`
# turns them on.
RECORD_SHAPES = False


class StopScript(BaseException):
    """Raised in the training loop once the requested steps are recorded (see --run-to-end),
    or, under `watch --max-steps` / `--duration`, once that many steps were watched or that
    long has passed (`limit`: "max steps" or "duration")."""

    def __init__(self, max_steps: int | None = None, limit: str | None = None) -> None:
        super().__init__(f"stallscope watched {max_steps} steps and stopped the script"
                         if max_steps else
                         "stallscope recorded the requested steps and stopped the script")
        self.max_steps = max_steps
        self.limit = limit or ("max steps" if max_steps else None)


@dataclass(frozen=True)
class Schedule:
    skip: int = 2
    warmup: int = 1
    steps: int = 5
    # Past `skip`, wait for the unprofiled steps to settle (capture/steady.py); False records
    # right after `skip` (`run --no-steady-wait`: an exact window, steady or not).
    steady: bool = True

    @property
    def profiled(self) -> int:
        """Steps the profiler sees: it is started only once the skipped steps are over."""
        return self.warmup + self.steps

    def is_recording(self, profiler_step: int) -> bool:
        return self.warmup <= profiler_step < self.profiled


class CaptureSession:
    """Hooks for one process; `finish()` must follow `start()`. Each step boundary goes to the
    parts in one direction: `watch`'s step log, the unprofiled steps' timing, the waits before
    recording, then the recorder. The session alone decides when the script stops."""

    def __init__(
        self,
        sched: Schedule,
        step_on: str,
        trace_dir: Path,
        worker: str,
        run_to_end: bool,
        overrides: Mapping[str, Any] | None = None,
        max_record_mb: float = budget.DEFAULT_MB,
        no_step_s: float | None = NO_STEP_S,
        step_log: StepLog | None = None,
        record_shapes: bool = RECORD_SHAPES,
        max_steps: int | None = None,
        max_seconds: float | None = None,
    ) -> None:
        self.sched, self.trace_dir, self.worker = sched, trace_dir, worker
        self.run_to_end, self.record_shapes = run_to_end, record_shapes
        self.step_log = step_log  # `watch`: every step of the run into a log; hooks stay on
        self.watch = (WatchSteps(step_log, max_steps, max_seconds) if step_log is not None
                      else None)
        self.boundaries = 0
        self.stop_requested = False
        self.aside = False  # the script started its own profiler: stopped, never restarted
        self.driver = StepDriver(step_on, self._boundary)
        self.watcher = LoaderWatcher(lambda info, _it: self.driver.on_batch(info),
                                     loader_overrides(overrides or {}))
        self._pid = os.getpid()
        self._hook: Any = None
        self.profiler_activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            self.profiler_activities.append(ProfilerActivity.CUDA)
        self.activities = [a.name for a in self.profiler_activities]
        self.unprofiled = UnprofiledSteps()
        self.wait = StartWait(sched, self.unprofiled, self.watcher, "CUDA" in self.activities)
        def procs() -> list[memory.Proc]:
            return [("main", self._pid, None, None), *self.watcher.iters.worker_processes()]

        self.memory = memory.RunMemory(procs)
        if step_log is not None and self.watch is not None:
            # `watch`'s step log carries the job's memory and the other load too
            step_log.memory = self.memory.sampler
            step_log.load = self.watch.load = LoadSampler(procs)
        self.budget = budget.RecordingBudget(max_record_mb, self._cut_mid_step)
        # What one recorded op costs the host under this profiler: the replay takes it out of
        # the recorded steps. Measured once the recording has stopped (opcost.py says why).
        self.cost = opcost.ProfilerCost(self.profiler_activities, record_shapes)
        host = RecordedHost()
        self.facts = TraceFacts(record_shapes, self.driver, self.wait, self.unprofiled, host,
                                self.budget, self.cost, self.watcher, self.memory)
        self.recorder = Recorder(sched, self.profiler_activities, trace_dir, worker,
                                 self.watcher, self.budget, host, self.memory.device, self.facts)
        self.no_step = NoStepWarning(no_step_s, sched, self.driver, self.watcher,
                                     lambda: bool(self.boundaries or self.recorder.done))
        self.foreign = ForeignProfilers(self, trace_dir, worker)

    def start(self) -> None:
        quiet_profiler_warnings()
        self.watcher.install()
        if self.watch is not None:
            self.watch.start()
        self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        marker.install(self.on_marker)
        self.memory.start()
        self.foreign.install()
        self.no_step.start()

    def finish(self) -> None:
        """Remove the hooks and, if the script ended mid-recording, write what was recorded.
        Never in a process the script forked: the profiler there is the parent's copy, and
        stopping it hangs (libkineto's ConfigLoader destructor)."""
        if os.getpid() != self._pid:
            return
        self.no_step.cancel()
        self.memory.stop()
        self.budget.end()
        if self.recorder.running:
            # The script ended mid-recording (its epoch ran out): read the workers' files now,
            # before the hooks go and their folder with them, or the loaders' anatomy is lost.
            self.watcher.read_recorded()
        self._remove_hooks()
        self.foreign.uninstall()
        if self.watch is not None:
            self.watch.finish()
        if self.recorder.running:
            self.recorder.stop_early()
        if self.aside and self.recorder.recorded == 0:
            self.foreign.export_last()

    def metadata(self) -> dict[str, Any]:
        """The trace's facts as of now (also each later capture's: capture/recapture.py)."""
        return self.facts.metadata(self.recorder.incomplete_step)

    def measure_profiler_cost(self) -> dict[str, Any]:
        """What one recorded op costs under this session's profiler (capture/opcost.py)."""
        return self.cost.measure()

    # ------------------------------------------------------------ the script's own profiler

    def owns(self, prof: Any) -> bool:
        """`prof` is one of the profilers this session started: its first capture's, or a
        later capture's (`watch`), either layer of it; or opcost's, after the recording."""
        if self.cost.calibrating:
            return True
        mine = [self.recorder.prof, *(self.watch.started() if self.watch is not None else [])]
        return any(prof is p or prof is getattr(p, "profiler", None) for p in mine)

    def own_running(self) -> bool:
        return self.recorder.running and not self.cost.calibrating

    def wants_script_trace(self) -> bool:
        return self.recorder.recorded < self.sched.steps

    def step_aside(self, site: str, kind: str) -> None:
        """The script starts its own profiler at `site`: stop this session for good, writing
        its complete steps (none: no trace), and let the script's session run alone."""
        if self.aside:
            return
        self.aside = True
        self.budget.end()  # the script's session is not stallscope's to cut
        rec = self.recorder
        if rec.done:  # recording was over: nothing to stop
            progress.say(f"the script starts its own {kind} at {site}: stallscope's recording "
                         "was over, the script's profiler runs undisturbed")
            return
        running = self.own_running()
        if running:
            step = rec.prof.step_num
            rec.discard = self.sched.is_recording(step) and step == self.sched.warmup
            rec.stop_early()
        rec.done = True
        self.watcher.recording = False
        kept = (f"stopped its own after {rec.recorded} recorded step(s)" if running
                else "will not start its own")
        progress.say(f"the script starts its own {kind} at {site}: only one profiler can run "
                     f"in a process, so stallscope {kept} and lets the script's run")

    def _after_aside(self) -> None:
        """Once the script's profiler wrote a trace stallscope can analyse and no session is
        on, stop the script as after stallscope's own steps (unless --run-to-end)."""
        seen = self.foreign.seen
        if (self.run_to_end or self.stop_requested or seen is None or seen.copy is None
                or self.foreign.recording()
                or threading.current_thread() is not threading.main_thread()):
            return
        self._stop_script("the script's profiler wrote its trace: stopping the script")

    # ------------------------------------------------------------ hooks and step boundaries

    def _remove_hooks(self) -> None:
        self.watcher.uninstall()
        marker.uninstall(self.on_marker)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _on_optimizer_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if os.getpid() == self._pid:
            self.driver.on_optimizer_step(optimizer)

    def on_marker(self) -> None:
        """`stallscope.step()` in this process (not in a forked DataLoader worker)."""
        if os.getpid() == self._pid:
            self.driver.on_marker()

    def _boundary(self) -> None:
        if self.watch is not None:
            limit = self.watch.boundary(self.watcher, self.watcher.recording, self.stop_requested)
            if limit is not None:
                self._stop_at_limit(*limit)
        if self.recorder.done:
            if self.aside:
                self._after_aside()
            return
        self.boundaries += 1
        wait = self.wait
        if not self.recorder.started and not wait.probe_wait:  # probe steps: not the script's
            self.unprofiled.boundary(self.watcher.take_unprofiled_wait())
            if self.boundaries > wait.last_skipped:  # the profiler starts here
                self.unprofiled.close()
        if self.boundaries <= wait.last_skipped:
            wait.boundary(self.boundaries)
            return  # the profiler is not touched at all while steps are skipped
        if self.recorder.boundary(wait.last_skipped):
            self._recording_over()

    # ------------------------------------------------------------ stopping the script

    def _stop_at_limit(self, said: str, limit: str) -> None:
        """`watch --max-steps` or `--duration` reached. The recording, if it is still going,
        keeps its complete steps (as at the script's end), then the script is stopped."""
        self.stop_requested = True
        if self.recorder.running:
            self.recorder.stop_early()
        max_steps = self.watch.max_steps if self.watch is not None else None
        self._stop_script(f"{said}, stopping the script", StopScript(max_steps, limit))

    def _stop_script(self, said: str, stop: StopScript | None = None) -> None:
        self.stop_requested = True
        self._remove_hooks()
        progress.say(said)
        raise stop or StopScript()

    def _cut_mid_step(self, frame: Any) -> bool:
        """The budget ran out inside a step (main thread, from the budget's signal; see
        capture/budget.py). Stop the script as at the end of recording: `finish()` then writes
        the steps recorded so far and the part of this one, marked cut. False: not here (inside
        stallscope's hooks), ask again."""
        rec = self.recorder
        if not rec.running:
            return True
        if budget.in_hooks(frame):
            return False
        recorded = max(rec.prof.step_num - self.sched.warmup, 0)
        if self.run_to_end:  # the script goes on: stop only where no torch range is open
            if not budget.in_script_code(frame):
                return False
            self.budget.mark_mid_step(recorded)
            rec.end(recorded, "memory budget spent mid-step: writing what was recorded",
                    incomplete=True)
            rec.stop()
            self._recording_over()
            return True
        self.budget.mark_mid_step(recorded)
        self.stop_requested = True
        progress.say("memory budget spent mid-step: stopping the script to write what was "
                     "recorded")
        raise StopScript()

    def _recording_over(self) -> None:
        """The recorder wrote its trace: `run` removes the hooks, `watch` goes on with its
        later captures; the script stops here unless --run-to-end."""
        if self.watch is None:
            self._remove_hooks()  # nothing left to do: the rest of the run costs nothing
        else:
            self.watch.first_written(self, self.run_to_end and not self.aside
                                     and self.foreign.seen is None)
        if not self.run_to_end and threading.current_thread() is threading.main_thread():
            self.stop_requested = True
            progress.say("recording done: stopping the script")
            raise StopScript()
        if self.run_to_end:
            progress.say("recording done: the script runs on to its end (--run-to-end)")
