"""The profiler around one run: schedule, trace files, and stopping once the steps are recorded.

The profiler is created up front but started only when `skip` step boundaries have passed, so
start-up (imports, model build) never counts as a step and a skipped step costs a counter
increment. Then `warmup` steps warm the profiler up, `steps` steps are recorded, and the trace
is written by `tensorboard_trace_handler` the moment the last one ends. Then, unless asked to
run to the end, the script is stopped by raising `StopScript` from the step hook: a
BaseException, so the script's `finally` blocks and context managers still run while
`except Exception` ignores it.

A script that starts its own profiler makes this session step aside for good (foreign.py):
only one profiler can run in a process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile, schedule

from stallscope import __version__, marker, progress
from stallscope.capture import budget, hostload, memory, opcost, steady, threadprobe
from stallscope.capture.export import export_trace
from stallscope.capture.facts import environment
from stallscope.capture.foreign import ForeignProfilers
from stallscope.capture.loaders import LoaderWatcher
from stallscope.capture.metadata import metadata_text
from stallscope.capture.overrides import loader_overrides
from stallscope.capture.quiet import quiet_profiler_warnings, usdt_filtered
from stallscope.capture.recapture import LaterCaptures, later_off
from stallscope.capture.steplog import StepLog, captures_path
from stallscope.capture.steps import StepDriver
from stallscope.units import size_text

# torch.compile: at most this many steps skipped beyond --skip while dynamo still compiles. The
# first compilation settles within a step or two; a script that compiles step after step is
# recompiling (a changing shape), which the recording must show, not wait out (dynamo gives up
# after 8 recompiles and runs the frame eagerly, and the evidence would be gone).
COMPILE_WAIT_MAX = 3
# `run --no-step-warning`: seconds without a step boundary before stallscope says so.
NO_STEP_S = 60.0
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
    """Hooks, profiler and bookkeeping for one process; `finish()` must follow `start()`."""

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
        self.sched = sched
        # `watch`: every step of the run into a log; the hooks then stay after recording.
        self.step_log = step_log
        self.later: LaterCaptures | None = None  # `watch`: the captures after the first
        self.max_steps = max_steps  # `watch --max-steps`: stop the script after this many
        self.max_seconds = max_seconds  # `watch --duration`: ... after this long
        self._started_at = time.monotonic()
        self.record_shapes = record_shapes
        self.trace_dir = trace_dir
        self.worker = worker
        self.run_to_end = run_to_end
        self.traces: list[Path] = []
        self.boundaries = 0
        # perf_counter() at each step boundary before the profiler starts: the skipped steps'
        # durations, which no profiler slowed (`tune` compares configurations on them).
        self.unprofiled_at: list[float] = []
        # ...and at each of those boundaries, the time spent waiting on the DataLoader since
        # the one before (the first entry: start-up, before any boundary).
        self.unprofiled_wait_us: list[float] = []
        # Steps skipped beyond --skip until the unprofiled steps were steady (capture/steady.py)
        # and how that wait ended: the `window` of report.json's `run`.
        self.steady_wait = 0
        self.still_moving = ""  # why the wait for steady steps went on, while it did
        self.window: dict[str, Any] | None = None
        self._judged_from = 0  # the first unprofiled step after the start-up prefetch
        # The stepping thread's scheduler figures at each unprofiled boundary, and the tree's
        # over those steps: `tune` takes other processes' share out of its timings.
        self._unprofiled_sched: list[tuple[float, float] | None] = []
        self._unprofiled_load_start: hostload.CpuSample | None = None
        self.unprofiled_load: dict[str, Any] = {}
        # The one-thread probe between the steady wait and recording (capture/threadprobe.py):
        # its steps, skipped like the steady wait's, and what it measured or why it did not run.
        self.probe: threadprobe.ThreadProbe | None = None
        self.probe_wait = 0
        self.probe_skipped = ""
        self._skip_passed_at: float | None = None
        self.recorded = 0
        self.incomplete_step: str | None = None
        self.done = False
        self.stop_requested = False
        # The script started its own profiler: this session is stopped and never restarted.
        self.aside = False
        self._discard = False  # stopped with no complete step: write no trace
        self.driver = StepDriver(step_on, self._boundary)
        self.watcher = LoaderWatcher(lambda info, _it: self.driver.on_batch(info),
                                     loader_overrides(overrides or {}))
        self._pid = os.getpid()
        self._started = False
        self._meta_added = False
        self._window: tuple[float, float] | None = None  # wall, process CPU at recording start
        self._cpu: dict[str, Any] = {}  # cores and threads, read when recording starts
        # Cores' busy time and this process tree's CPU, read just before recording starts and
        # at its last step boundary (hostload.py): the other load on the machine meanwhile.
        self._load_start: hostload.CpuSample | None = None
        self.host_load: dict[str, Any] = {}
        self._hook: Any = None
        self.budget = budget.RecordingBudget(max_record_mb, self._cut_mid_step)
        self._no_step_s = no_step_s
        # torch.compile: extra steps skipped because dynamo was still compiling (at most
        # COMPILE_WAIT_MAX), and its counters when recording began.
        self.compile_wait = 0
        self._graphs_seen: int | None = None
        self._dynamo_start: dict[str, Any] | None = None
        self._no_step_timer: threading.Timer | None = None
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.activities = [a.name for a in activities]
        self.profiler_activities = activities
        # What one recorded op costs the host under this profiler (capture/opcost.py): the
        # replay takes it out of the recorded steps. Measured once the recording has stopped,
        # never before: a finished profiler session leaves the process slower (CUPTI stays
        # attached), and the unprofiled steps timed before recording are the run's baseline.
        self.profiler_cost: dict[str, Any] = {}
        self._calibrating = False
        self.export_failed: str | None = None  # what was lost when the export failed
        with warnings.catch_warnings():  # warmup 0 is the user's explicit choice
            warnings.simplefilter("ignore", UserWarning)
            plan = schedule(wait=0, warmup=sched.warmup, active=sched.steps, repeat=1)
        self.prof = profile(
            activities=activities,
            schedule=plan,
            on_trace_ready=self._on_trace_ready,
            record_shapes=record_shapes,
        )
        self.foreign = ForeignProfilers(self, trace_dir, worker)
        # Memory over the run (capture/memory.py): the processes' on a thread of its own, the
        # device's at each boundary once the profiler runs.
        self.memory = (memory.MemorySampler(self._memory_procs, memory.container_limit())
                       if memory.sampling_on() else None)
        self.device_memory = memory.DeviceSteps()
        if step_log is not None:  # `watch`'s step log carries the job's memory too
            step_log.memory = self.memory

    def _memory_procs(self) -> list[memory.Proc]:
        """The training process and the DataLoader workers alive now (the sampler's thread)."""
        return [("main", self._pid, None, None), *self.watcher.worker_processes()]

    def memory_metadata(self) -> dict[str, Any]:
        """The trace metadata's `memory`: the sampled series, the device's steps, and each
        recorded loader's dataset storage (what copy-on-write growth is judged against)."""
        out: dict[str, Any] = (self.memory.snapshot() if self.memory is not None
                               else {"off": f"{memory.OFF_ENV}=0"})
        out["device"] = list(self.device_memory.steps)
        out["pinned"] = self.device_memory.pinned
        out["loaders"] = [{"call_site": d.call_site, "num_workers": d.num_workers,
                           "dataset": d.dataset, "storage": d.dataset_storage}
                          for d in self.watcher.loaders if d.batches]
        return out

    def start(self) -> None:
        quiet_profiler_warnings()
        self.watcher.install()
        self._started_at = time.monotonic()  # `--duration` counts from here: the script's start
        self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        marker.install(self.on_marker)
        if self.memory is not None:
            self.memory.start()
        self.foreign.install()
        if self._no_step_s:
            self._no_step_timer = threading.Timer(self._no_step_s, self._no_step_yet)
            self._no_step_timer.daemon = True
            self._no_step_timer.start()

    def _no_step_yet(self) -> None:
        """Say at once when no step boundary has come after `no_step_s`: a loop with neither an
        optimizer nor a DataLoader would otherwise run to its end in silence (25 minutes for
        pytorch/examples word_language_model) before "no step recorded"."""
        if self.boundaries or self.done or os.getpid() != self._pid:
            return
        if _in_optimizer_step():
            progress.warn(
                f"the first optimizer.step() has not returned after {self._no_step_s:g} s: "
                "steps are long (an LBFGS closure, a large model); recording begins after "
                f"{self.sched.skip} skipped and {self.sched.warmup} warm-up step(s).")
            return
        d = self.driver
        loaders = self.watcher.loaders
        seen = (f"{len(loaders)} DataLoader(s) built, {d.batches} batch(es) drawn"
                if loaders else "no torch DataLoader built")
        progress.warn(
            f"no training step seen after {self._no_step_s:g} s ({seen}, "
            f"{d.optimizer_steps} optimizer.step() call(s)). If the loop has neither a "
            "torch.optim optimizer nor a DataLoader, mark each iteration with "
            "`import stallscope; stallscope.step()`; or pass --step-on dataloader. "
            "The script keeps running (--no-step-warning SECONDS changes this wait).")

    def finish(self) -> None:
        """Remove the hooks and, if the script ended mid-recording, write what was recorded.
        Never in a process the script forked: the profiler there is the parent's copy, and
        stopping it hangs (libkineto's ConfigLoader destructor)."""
        if os.getpid() != self._pid:
            return
        if self._no_step_timer is not None:
            self._no_step_timer.cancel()
        if self.memory is not None:
            self.memory.stop()
        self.budget.end()
        if self._started and not self.done:
            # The script ended mid-recording (its epoch ran out): read the workers' files now,
            # before the hooks go and their folder with them, or the loaders' anatomy is lost.
            for d in self.watcher.loaders:
                if d.batches_recorded:
                    self.watcher.anatomy_of(d)
        self._remove_hooks()
        self.foreign.uninstall()
        if self.step_log is not None:
            if self.later is not None:
                self.later.finish(self.step_log.steps)
            self.step_log.close()
        if self._started and not self.done:
            self._stop_early()
        if self.aside and self.recorded == 0:
            self.foreign.export_last()

    def _stop_early(self) -> None:
        """Stop the profiler before the last step: the complete steps are written (with the
        step it stopped in, marked incomplete)."""
        self.budget.end()
        step = self.prof.step_num
        if self.sched.is_recording(step):
            self.recorded = step - self.sched.warmup
            self.incomplete_step = f"ProfilerStep#{step}"
            self._read_load_end()
            self._add_metadata()
        self.done = True
        with usdt_filtered():
            self.prof.stop()  # writes the trace when recording had begun

    # ------------------------------------------------------------ the script's own profiler

    def owns(self, prof: Any) -> bool:
        """`prof` is one of the profilers this session started: its first capture's, or a
        later capture's (`watch`), either layer of it."""
        if self._calibrating:  # opcost's sessions, after the recording: ours too
            return True
        mine = [self.prof]
        if self.later is not None:
            mine.extend(self.later.started)
        return any(prof is p or prof is getattr(p, "profiler", None) for p in mine)

    def own_running(self) -> bool:
        return self._started and not self.done and not self._calibrating

    def wants_script_trace(self) -> bool:
        return self.recorded < self.sched.steps

    def step_aside(self, site: str, kind: str) -> None:
        """The script starts its own profiler at `site`: stop this session for good, writing
        its complete steps (none: no trace), and let the script's session run alone."""
        if self.aside:
            return
        self.aside = True
        self.budget.end()  # the script's session is not stallscope's to cut
        if self.done:  # recording was over: nothing to stop
            progress.say(f"the script starts its own {kind} at {site}: stallscope's recording "
                         "was over, the script's profiler runs undisturbed")
            return
        running = self.own_running()
        if running:
            self._discard = self.sched.is_recording(self.prof.step_num) and (
                self.prof.step_num == self.sched.warmup)
            self._stop_early()
        self.done = True
        self.watcher.recording = False
        kept = (f"stopped its own after {self.recorded} recorded step(s)" if running
                else "will not start its own")
        progress.say(f"the script starts its own {kind} at {site}: only one profiler can run "
                     f"in a process, so stallscope {kept} and lets the script's run")

    def _after_aside(self) -> None:
        """Once the script's profiler wrote a trace stallscope can analyse and no session is
        on, stop the script as after stallscope's own steps (unless --run-to-end)."""
        if (self.run_to_end or self.stop_requested or self.foreign.seen is None
                or self.foreign.seen.copy is None or self.foreign.recording()
                or threading.current_thread() is not threading.main_thread()):
            return
        self.stop_requested = True
        self._remove_hooks()
        progress.say("the script's profiler wrote its trace: stopping the script")
        raise StopScript()

    def unwritten_steps(self) -> int:
        """Steps the profiler holds in memory and has not written yet (all of them, until the
        trace is written at the end of recording or by `finish()`)."""
        if not self._started or self.done:
            return 0
        return max(0, min(self.prof.step_num, self.sched.profiled) - self.sched.warmup)

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
        if self.step_log is not None:
            later = self.later
            profiled = self.watcher.recording or (later is not None and later.prof is not None)
            self.step_log.boundary(self.watcher.take_step_wait(), self.watcher.current_epoch(),
                                   profiled)
            if later is not None:
                later.boundary(self.step_log.steps, self.step_log.last_step_ms,
                               self.step_log.last_wait_ms, profiled, self.step_log.last_runq_ms,
                               self.step_log.last_cpu_ms)
            if (self.max_seconds and not self.stop_requested
                    and time.monotonic() - self._started_at >= self.max_seconds
                    and threading.current_thread() is threading.main_thread()):
                self._stop_at_limit(f"--duration {self.max_seconds:g}: {self.step_log.steps} "
                                    f"steps watched in {self.max_seconds:g} s", "duration")
            if (self.max_steps and self.step_log.steps >= self.max_steps
                    and not self.stop_requested
                    and threading.current_thread() is threading.main_thread()):
                self._stop_at_max_steps()
        if self.done:
            if self.aside:
                self._after_aside()
            return
        self.boundaries += 1
        if not self._started and not self.probe_wait:  # probe steps are not the script's
            if not self.unprofiled_at:  # the load's window holds every timed step: read first
                self._unprofiled_load_start = hostload.sample()
            self.unprofiled_at.append(time.perf_counter())
            self.unprofiled_wait_us.append(self.watcher.take_unprofiled_wait())
            self._unprofiled_sched.append(hostload.thread_sched())
            if self.boundaries > self.last_skipped:  # the profiler starts here
                self._close_unprofiled()
        if self.boundaries <= self.last_skipped:
            if self.probe is not None:  # the last probe step restores the script's threads
                self.probe.boundary(self.watcher.take_unprofiled_wait())
                return
            if self.boundaries == self.last_skipped:
                compiling = self.compile_wait
                self._wait_for_compile(True)
                if self.compile_wait == compiling:  # compilation settled: is the run steady?
                    self._wait_for_steady()
            else:
                self._wait_for_compile(False)
            return  # the profiler is not touched at all while steps are skipped
        if not self._started:
            self._started = True
            self._report_progress(None)
            if self.sched.is_recording(0):
                self._load_start = hostload.sample()
            with usdt_filtered():
                self.prof.start()
        else:
            self._report_progress(self.prof.step_num)
            self.device_memory.boundary(self.prof.step_num - self.sched.warmup)
            last = False
            if self.sched.is_recording(self.prof.step_num):
                last = self.prof.step_num + 1 >= self.sched.profiled
                done = self.prof.step_num - self.sched.warmup + 1  # recorded steps, this one too
                if not last and not self.budget.next_step_fits(done):
                    self._end_recording(done)  # the next step would not fit the budget
                    return
                if last:
                    self._read_load_end()  # the last recorded step ends with this boundary
                    self._add_metadata()  # the measurements; Kineto keeps the last call's
            elif self._load_start is None and self.sched.is_recording(self.prof.step_num + 1):
                self._load_start = hostload.sample()  # in the warmup step, not a recorded one
            if self.sched.is_recording(self.prof.step_num) and not last:
                self.prof.step()  # tracing goes on: nothing for Kineto to print
            else:
                with usdt_filtered():  # tracing starts, or stops and is written
                    self.prof.step()  # writes the trace after the last recorded step
        self.watcher.recording = self.sched.is_recording(self.prof.step_num)
        if self.watcher.recording and self._window is None:
            self.budget.begin()
            self._window = (time.perf_counter(), time.process_time())
            self._cpu = environment()["cpu"]  # once: the metadata is refreshed every step
        if self.watcher.recording and not self._meta_added:
            self._add_metadata()  # only kept while Kineto records
        if self.prof.step_num >= self.sched.profiled:  # the trace was written by this step()
            self.recorded = self.sched.steps
            self._stop_recording()

    @property
    def last_skipped(self) -> int:
        """The boundary after which the profiler starts: --skip, plus the steps waited for
        torch.compile and for a steady run, and the one-thread probe's."""
        return self.sched.skip + self.compile_wait + self.steady_wait + self.probe_wait

    @property
    def first_recorded_boundary(self) -> int:
        """The step boundary that ends the first recorded step (1-based)."""
        return self.last_skipped + self.sched.warmup + 1

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
        left, workers = self.watcher.prefetched_left()
        steps = self.unprofiled_steps_us()
        if left > 0:  # the step starting now takes a batch prefetched at start-up
            self._judged_from = len(steps) + 1
        one_rank = int(os.environ.get("WORLD_SIZE") or 1) <= 1
        judged = steady.judge(steps[self._judged_from:],
                              self.unprofiled_wait_us[1:][self._judged_from:], left,
                              steady.group_size(workers), by_time=one_rank)
        waited_s = now - self._skip_passed_at
        capped = not judged.steady and (self.steady_wait >= steady.MAX_EXTRA_STEPS
                                        or waited_s >= steady.MAX_EXTRA_S)
        short = steady.epoch_too_short(self.watcher.batches_left(),
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

    def _close_unprofiled(self) -> None:
        """Where the script's unprofiled steps end (the profiler or the probe starts): the
        other load over them, and the stepping thread's run and run-queue wait in each."""
        if self.unprofiled_load or self._unprofiled_load_start is None:
            return
        load = hostload.other_load(self._unprofiled_load_start, hostload.sample())
        marks = self._unprofiled_sched
        if load and all(m is not None for m in marks) and len(marks) >= 2:
            load["main_run_us"] = [round((b[0] - a[0]) * 1e6, 1)  # type: ignore[index]
                                   for a, b in zip(marks, marks[1:], strict=False)]
            load["main_wait_us"] = [round((b[1] - a[1]) * 1e6, 1)  # type: ignore[index]
                                    for a, b in zip(marks, marks[1:], strict=False)]
        self.unprofiled_load = load

    def _start_probe(self) -> None:
        """Where the run is judged steady: time a few steps with one intra-op thread before
        recording, when threadprobe.py says this run is one to probe."""
        window = self.sched.warmup + self.sched.steps
        why = threadprobe.skip_reason("CUDA" in self.activities, torch.get_num_threads(),
                                      int(os.environ.get("WORLD_SIZE") or 1),
                                      self.watcher.batches_left(), window)
        if why:
            self.probe_skipped = why
            return
        self._close_unprofiled()  # the script's own steps end here
        self.probe = threadprobe.ThreadProbe(torch.get_num_threads())
        self.probe_wait = threadprobe.PROBE_STEPS
        progress.say(f"timing {threadprobe.PROBE_STEPS} steps with one intra-op thread (of "
                     f"{self.probe.threads}) before recording: the replay's torch_threads=1")
        self.probe.begin()

    def unprofiled_steps_us(self) -> list[float]:
        """The skipped steps' durations (us), from the first boundary on: the step before it
        holds the script's start-up."""
        at = self.unprofiled_at
        return [round((b - a) * 1e6, 1) for a, b in zip(at, at[1:], strict=False)]

    def _wait_for_compile(self, last: bool) -> None:
        """At each skipped boundary, dynamo's graph count (a dict read, only when the script
        uses torch.compile); at the last one, if a graph was compiled during the step that just
        ended, skip one more: compilation has not settled and recorded steps would hold it."""
        graphs = _dynamo_counter("stats", "unique_graphs")
        if graphs is None:
            return
        before, self._graphs_seen = self._graphs_seen or 0, graphs
        if last and graphs > before and self.compile_wait < COMPILE_WAIT_MAX:
            self.compile_wait += 1
            if self.compile_wait == 1:
                progress.say("torch.compile is still compiling: recording waits for it")

    def _stop_at_max_steps(self) -> None:
        """`watch --max-steps N`: N steps watched."""
        self._stop_at_limit(f"--max-steps {self.max_steps}: {self.max_steps} steps watched",
                            "max steps")

    def _stop_at_limit(self, said: str, limit: str) -> None:
        """`watch --max-steps` or `--duration` reached. The recording, if it is still going,
        keeps its complete steps (as at the script's end), then the script is stopped."""
        self.stop_requested = True
        if self._started and not self.done:
            self._stop_early()
        self._remove_hooks()
        progress.say(f"{said}, stopping the script")
        raise StopScript(self.max_steps, limit)

    def _end_recording(self, recorded: int) -> None:
        """End recording at this boundary with `recorded` complete steps (the budget's cut):
        `prof.stop()` closes the step that ends here and writes the trace."""
        self.recorded = recorded
        self._read_load_end()
        self._add_metadata()
        progress.say(f"memory budget: recording ends after {recorded} step(s)")
        self._stop_recording()

    def _cut_mid_step(self, frame: Any) -> bool:
        """The budget ran out inside a step (main thread, from the budget's signal; see
        capture/budget.py). Stop the script as at the end of recording: `finish()` then writes
        the steps recorded so far and the part of this one, marked cut. False: not here (inside
        stallscope's hooks), ask again."""
        if self.done or not self._started:
            return True
        if budget.in_hooks(frame):
            return False
        step = self.prof.step_num
        if self.run_to_end:  # the script goes on: stop only where no torch range is open
            if not budget.in_script_code(frame):
                return False
            self.recorded = max(step - self.sched.warmup, 0)
            self.incomplete_step = f"ProfilerStep#{step}"
            self.budget.mark_mid_step(self.recorded)
            self._read_load_end()
            self._add_metadata()
            progress.say("memory budget spent mid-step: writing what was recorded")
            self._stop_recording()
            return True
        self.budget.mark_mid_step(max(step - self.sched.warmup, 0))
        self.stop_requested = True
        progress.say("memory budget spent mid-step: stopping the script to write what was "
                     "recorded")
        raise StopScript()

    def _stop_recording(self) -> None:
        self.done = True
        self.watcher.recording = False
        self.budget.end()
        with usdt_filtered():
            self.prof.stop()
        if self.step_log is not None:
            self.step_log.trace_written()
        if self.step_log is None:
            self._remove_hooks()  # nothing left to do: the rest of the run costs nothing
        elif self.run_to_end and not self.aside and self.foreign.seen is None:
            log = captures_path(self.step_log.path)
            if int(os.environ.get("WORLD_SIZE") or 1) > 1:  # each rank would judge alone
                later_off(log, "a distributed job: each rank would capture at its own steps, "
                          "and a rank under the profiler slows the others' collectives")
            else:
                self.later = LaterCaptures(log, self, self.step_log.steps)
        if not self.run_to_end and threading.current_thread() is threading.main_thread():
            self.stop_requested = True
            progress.say("recording done: stopping the script")
            raise StopScript()
        if self.run_to_end:
            progress.say("recording done: the script runs on to its end (--run-to-end)")

    def _read_load_end(self) -> None:
        if self._load_start is not None and not self.host_load:
            self.host_load = hostload.other_load(self._load_start, hostload.sample())

    def _report_progress(self, ended: int | None) -> None:
        """Say when the profiler starts, when recording starts, and each step recorded, at the
        boundary after profiler step `ended` (None: the profiler is about to start). A slow
        script then shows it is moving: one step can take minutes."""
        sched = self.sched
        if ended is None:
            progress.say(
                f"{self.last_skipped} step(s) skipped: starting the profiler"
                + (f", warming up for {sched.warmup} step(s)" if sched.warmup else "")
            )
        elif sched.is_recording(ended):
            progress.say(f"recorded step {ended - sched.warmup + 1}/{sched.steps}")
        now = 0 if ended is None else ended + 1
        if sched.is_recording(now) and (ended is None or not sched.is_recording(ended)):
            progress.say(f"recording {sched.steps} step(s)")

    def _add_metadata(self) -> None:
        """stallscope's facts in the trace itself, so `analyze` of it knows them too: how steps
        were found, and what the replay needs that the profiler cannot see (cores, the CPU the
        process used, what each loader's fetches cost). Called when recording begins (Kineto
        keeps only what is added while it records) and again wherever recording ends (Kineto
        keeps the last value); not at the steps between: the loaders' anatomy reads every
        worker's file, ~1 ms a step saved (benchmarks/bench_anatomy.py)."""
        self._meta_added = True
        self.prof.add_metadata_json("stallscope", metadata_text(self.metadata()))

    def metadata(self) -> dict[str, Any]:
        """The facts `_add_metadata` writes (also each later capture's: capture/recapture.py,
        which adds its own window's unprofiled steps and why it was taken)."""
        meta: dict[str, Any] = {
            "tool": f"stallscope {__version__}",
            # Kineto does not record it; advice is spelled for this version (trace/version.py).
            "torch": torch.__version__,
            "step_source": self.driver.source,
            "incomplete_step": self.incomplete_step,
            "window": self.window,
            # The profiler's settings, and what one op cost under them (measured after recording).
            "record_shapes": self.record_shapes,
            "profiler_cost": self.profiler_cost,
        }
        if self.probe is not None and self.probe.result is not None:
            meta["thread_probe"] = self.probe.result
        elif self.probe_skipped:
            meta["thread_probe"] = {"skipped": self.probe_skipped}
        if self.budget.cut is not None:
            meta["recording_cut"] = self.budget.cut.to_dict()
        dynamo = _dynamo_counters()
        if dynamo is not None:
            if self._dynamo_start is None:
                self._dynamo_start = dynamo
            start = self._dynamo_start
            meta["dynamo"] = {
                "graphs_compiled": dynamo["graphs"] - start["graphs"],
                "graph_breaks": {k: v - start["breaks"].get(k, 0)
                                 for k, v in dynamo["breaks"].items()
                                 if v > start["breaks"].get(k, 0)},
                "compile_wait_steps": self.compile_wait,
                "graphs_total": dynamo["graphs"],
                "recompile_limit": dynamo["limit"],
            }
        if self._window is not None:
            cpu = self._cpu
            # The steps timed without the profiler just before recording (the judged group):
            # the replay sets the recorded steps against them (replay/unprofile.py).
            meta["unprofiled_steps_us"] = self.unprofiled_steps_us()[-steady.MAX_GROUP:]
            meta["host"] = {
                "cores_per_process": cpu["cores_per_process"],
                "torch_threads": cpu["torch_threads"],
                "recorded_wall_us": round((time.perf_counter() - self._window[0]) * 1e6, 1),
                "recorded_cpu_us": round((time.process_time() - self._window[1]) * 1e6, 1),
                **self.host_load,
            }
            meta["loaders"] = [
                {"call_site": d.call_site, "num_workers": d.num_workers,
                 "pin_memory": d.pin_memory, "batches": d.batches_recorded,
                 "fetch_wall_us": round(d.fetch_wall_us, 1),
                 "fetch_cpu_us": round(d.fetch_cpu_us, 1),
                 "fetch_process_cpu_us": round(d.fetch_process_cpu_us, 1),
                 "fetch_bytes": d.fetch_bytes, "anatomy": self.watcher.anatomy_of(d)}
                for d in self.watcher.loaders if d.batches_recorded
            ]
        meta["memory"] = self.memory_metadata()
        return meta

    def measure_profiler_cost(self) -> dict[str, Any]:
        """What one recorded op costs under this session's profiler, measured on first call:
        when the recording has stopped (from `_on_trace_ready`, the session's profiler is off
        and another may run), so that no profiler session comes before the unprofiled steps."""
        if not self.profiler_cost:
            self._calibrating = True  # its profiler sessions are not the script's
            try:
                with usdt_filtered():
                    self.profiler_cost = opcost.session_costs(self.profiler_activities,
                                                              self.record_shapes)
            finally:
                self._calibrating = False
        return self.profiler_cost

    def _on_trace_ready(self, prof: Any) -> None:
        if self._discard:
            return
        # Other ranks write into the same folder at the same moment: only this worker's files.
        pattern = f"{self.worker}.*.pt.trace.json*"
        before = set(self.trace_dir.glob(pattern)) if self.trace_dir.is_dir() else set()
        held = self.recorded or max(0, min(self.prof.step_num, self.sched.profiled)
                                    - self.sched.warmup)
        extra = {"profiler_cost": self.measure_profiler_cost()}
        if self.memory is not None:  # one last sweep, now that no recorded step pays for it
            with contextlib.suppress(Exception):
                self.memory.sweep()
            extra["memory"] = self.memory_metadata()
        failed = export_trace(prof, self.trace_dir, self.worker, held, extra)
        if failed is not None:
            self.export_failed = failed
        written = sorted(set(self.trace_dir.glob(pattern)) - before)
        self.traces.extend(written)
        for path in written:
            progress.say(f"trace written: {path.name} ({size_text(path.stat().st_size)})")


def _dynamo_counter(group: str, key: str) -> int | None:
    """One of dynamo's counters, when the script uses torch.compile (never imports dynamo)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(utils.counters[group][key]) if utils is not None else None
    except Exception:
        return None


def _dynamo_counters() -> dict[str, Any] | None:
    """Graphs compiled so far and graph breaks by reason (reasons clipped to one line)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    try:
        counters = utils.counters
        breaks = {str(k).splitlines()[0][:200]: int(v)
                  for k, v in dict(counters["graph_break"]).items()}
        config = sys.modules.get("torch._dynamo.config")
        limit = getattr(config, "recompile_limit", getattr(config, "cache_size_limit", None))
        return {"graphs": int(counters["stats"]["unique_graphs"]), "breaks": breaks,
                "limit": int(limit) if isinstance(limit, int) else None}
    except Exception:
        return None


def _in_optimizer_step() -> bool:
    """True when the main thread is inside a torch.optim optimizer's step right now."""
    frame = sys._current_frames().get(threading.main_thread().ident)  # type: ignore[arg-type]
    marker = os.sep + os.path.join("torch", "optim") + os.sep
    while frame is not None:
        if marker in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False

