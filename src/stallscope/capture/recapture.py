"""`watch`'s later captures, recorded: a fresh torch.profiler window (the first capture's
activities, warm-up and step count) begun at the step boundary capture/later.py chose, its
trace written beside the first one's in a folder of its own (`<trace dir>-capture-<k>`: a run
of its own in TensorBoard, never read as another rank), and each capture's facts appended to
`OUT/watch/steps.captures.jsonl` (capture/steplog.py `captures_path`) for the report
(commands/run.py `later_captures`), the skipped ones too.

Nothing here may stop the user's run: a capture that fails to start or write ends the later
captures, and says so in its line of captures.jsonl.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from torch.profiler import profile, schedule

from stallscope import progress
from stallscope.capture import hostload
from stallscope.capture.export import export_trace
from stallscope.capture.later import WINDOW, Bounds, Start, Trigger
from stallscope.capture.metadata import metadata_text
from stallscope.capture.quiet import usdt_filtered


class Session(Protocol):
    """What a later capture takes from the session (capture/session.py CaptureSession)."""

    sched: Any  # its Schedule: warmup, steps
    record_shapes: bool
    profiler_activities: list[Any]
    watcher: Any  # its LoaderWatcher
    trace_dir: Path
    worker: str
    step_log: Any  # its StepLog

    def metadata(self) -> dict[str, Any]: ...

    def measure_profiler_cost(self) -> dict[str, Any]: ...


class LaterCaptures:
    """Owned by the session once its first capture is written; fed every step boundary."""

    def __init__(self, log: Path, session: Session, first_end: int) -> None:
        self.log, self.session = log, session
        self.warmup, self.steps = session.sched.warmup, session.sched.steps
        self.trigger = Trigger()
        self.bounds = Bounds(self.warmup + self.steps)
        self.bounds.last_end = first_end
        self.prof: Any = None
        # every profiler this started, so the session never takes one for the script's
        # (capture/foreign.py asks the session whose a starting profiler is)
        self.started: list[Any] = []
        self.pending: Start | None = None
        self.started_at = 0
        self.index = 1  # the first capture is the session's own
        self.broken = False
        self.plain: deque[float] = deque(maxlen=WINDOW)  # unprofiled steps before a capture
        self._written: list[Path] = []
        self._discard = False
        self._said: set[tuple[Any, ...]] = set()  # the skipped starts already noted
        self._load: Any = None  # hostload.sample() where the recorded steps begin
        self._clock = (0.0, 0.0)  # wall, process CPU there

    @property
    def recording(self) -> bool:
        """Whether the step now starting is recorded (not the warm-up)."""
        return self.prof is not None and self.prof.step_num >= self.warmup

    def boundary(self, step: int, step_ms: float, wait_ms: float, profiled: bool,
                 runq_ms: float = math.nan, cpu_ms: float = math.nan,
                 others_cores: float = math.nan, probe_us: float = math.nan) -> None:
        """Step `step` just ended after `step_ms` (it was recorded when `profiled`); the
        other-load sampler's last figures are held from its last sweep."""
        if self.broken:
            return
        try:
            if self.prof is not None:
                self._advance(step)
                return
            if not profiled:
                self.plain.append(step_ms * 1e3)
                start = self.trigger.add(step, step_ms, wait_ms, runq_ms, cpu_ms,
                                         others_cores, probe_us)
                if start is not None:
                    self._consider(start, step)
            if self.pending is not None and step >= self.pending.at:
                self._start(step)
        except Exception as exc:  # the user's run goes on without later captures
            self.broken = True
            self._line({"failed": f"{type(exc).__name__}: {exc}"[:300], "at_step": step})
            with contextlib.suppress(Exception):
                if self.prof is not None:
                    self._discard = True
                    self.prof.stop()
            self.prof = None
            self.session.watcher.recording = False

    def _consider(self, start: Start, step: int) -> None:
        if self.pending is not None:
            return
        why_not = self.bounds.allows(start, step)
        if why_not is None:
            self.pending = start
            return
        if not self.bounds.exhausted:
            self.trigger.refused(start)  # asked for again while it holds: one note for it
        said = (start.kind, start.every, why_not)
        if said not in self._said:
            self._said.add(said)
            self._line({"kind": start.kind, "why": start.why, "at_step": step,
                        "skipped": why_not})

    def _start(self, step: int) -> None:
        assert self.pending is not None
        self.index += 1
        self.started_at = step
        self._discard = False
        self.session.watcher.new_window()
        self.prof = profile(activities=self.session.profiler_activities,
                            schedule=schedule(wait=0, warmup=self.warmup, active=self.steps,
                                              repeat=1),
                            on_trace_ready=self._ready, record_shapes=self.session.record_shapes)
        self.started.append(self.prof)
        with usdt_filtered():
            self.prof.start()
        if self.warmup == 0:
            self._begin_recorded()
        progress.say(f"capture {self.index} from step {step + 1}: {self.pending.why}")

    def _begin_recorded(self) -> None:
        """The recorded steps begin: the loaders' figures and the other load count from here."""
        self.session.watcher.recording = True
        self._load = hostload.sample()
        self._clock = (time.perf_counter(), time.process_time())
        self._metadata(end=False)

    def _advance(self, step: int) -> None:
        last = self.prof.step_num + 1 >= self.warmup + self.steps
        if last:
            self._metadata(end=True)  # Kineto keeps the last value added while it records
        with usdt_filtered():
            self.prof.step()  # the trace is written by the step() that ends the window
        if self.prof.step_num == self.warmup and not last:
            self._begin_recorded()
        if self.prof.step_num >= self.warmup + self.steps:
            self.session.watcher.recording = False
            with usdt_filtered():
                self.prof.stop()
            self._finished(step)
            self.session.step_log.trace_written()

    def _finished(self, last: int) -> None:
        first = self.started_at + self.warmup + 1
        assert self.pending is not None
        self.bounds.taken(self.started_at + 1, last)
        self._line({"index": self.index, "kind": self.pending.kind, "why": self.pending.why,
                    "first_step": first, "last_step": last,
                    "traces": [str(p) for p in self._written]})
        self.prof, self.pending, self._written = None, None, []
        self.trigger.rebase()
        self.plain.clear()

    def finish(self, step: int) -> None:
        """The script ended (or was stopped): a capture holding complete steps is written,
        one still warming up is dropped."""
        if self.prof is None:
            return
        held = self.prof.step_num - self.warmup
        self._discard = held <= 0
        with contextlib.suppress(Exception), usdt_filtered():
            self.prof.stop()
        if not self._discard:
            self._finished(step)
        self.prof = None
        self.session.watcher.recording = False

    def _ready(self, prof: Any) -> None:
        if self._discard:
            return
        trace_dir, worker = self.session.trace_dir, self.session.worker
        folder = trace_dir.parent / f"{trace_dir.name}-capture-{self.index}"
        pattern = f"{worker}.*.pt.trace.json*"
        before = set(folder.glob(pattern)) if folder.is_dir() else set()
        held = max(0, min(prof.step_num, self.warmup + self.steps) - self.warmup)
        failed = export_trace(prof, folder, worker, held,
                              {"profiler_cost": self.session.measure_profiler_cost()})
        if failed is not None:
            self._line({"index": self.index, "failed": failed})
        self._written = sorted(set(folder.glob(pattern)) - before)

    def _metadata(self, end: bool) -> None:
        """The session's facts (capture/session.py `metadata`) for this window: its own
        unprofiled steps, loaders, time and other load; not the first window's thread probe,
        budget cut or window."""
        assert self.pending is not None
        meta = self.session.metadata()
        for key in ("thread_probe", "recording_cut", "window", "incomplete_step"):
            meta.pop(key, None)
        meta["unprofiled_steps_us"] = [round(v, 1) for v in self.plain]
        meta["watch_capture"] = {"index": self.index, "kind": self.pending.kind,
                                 "why": self.pending.why,
                                 "first_step": self.started_at + self.warmup + 1}
        host = dict(meta.get("host") or {})
        for key in list(host):
            if key not in ("cores_per_process", "torch_threads"):
                del host[key]
        if end and self._load is not None:
            host["recorded_wall_us"] = round((time.perf_counter() - self._clock[0]) * 1e6, 1)
            host["recorded_cpu_us"] = round((time.process_time() - self._clock[1]) * 1e6, 1)
            host.update(hostload.other_load(self._load, hostload.sample()) or {})
        if host:
            meta["host"] = host
        self.prof.add_metadata_json("stallscope", metadata_text(meta))

    def _line(self, record: dict[str, Any]) -> None:
        with contextlib.suppress(OSError), self.log.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def later_off(log: Path, why: str) -> None:
    """Say in the captures' list that no later capture will be taken, and why."""
    with contextlib.suppress(OSError), log.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"off": why}) + "\n")
