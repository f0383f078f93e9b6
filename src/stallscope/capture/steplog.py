"""Every step of a whole run, one JSON line each: the series `stallscope watch` analyses.

Why a file written as the run goes: a run of days must be readable mid-run (and by TensorBoard,
which gets the same figures as scalars), and a crash or kill of the script must leave every
step it took. Each line is one write(2) of its own, unbuffered: a kill (SIGKILL, a node failure)
loses only the step it interrupts, at the cost of a system call per step beside a perf_counter
read, a few float operations and a string format (benchmarks/bench_hooks.py measures it beside
the hooks it rides on; docs/watch.md has the figure). A full disk ends the log on a whole line
(a line written in part is cut off again) with one warning; the run goes on.

A line: `{"step": 12, "start_s": 3.914, "step_ms": 41.2, "cpu_ms": 12.0, "loader_wait_ms":
30.1, "runq_ms": 0.2, "epoch": 0, "profiled": false}` (and `"mem_mb": 412.5` on the first step
after each sweep of the memory sampler: the training process's resident memory plus its
DataLoader workers' own, capture/memory.py; `"others_cores": 1.02, "probe_us": 185.3` on the
first step after each sweep of the other-load sampler: the cores other processes held since the
last sweep, and the CPU time of a fixed piece of work, capture/loadsampler.py; a sweep comes at
most every half second, so the log gains fields a few times a second, never a read per step):
the step's number (1-based, from the
first boundary), when it began (seconds after the first boundary), its wall time, the process's
CPU time in it (all threads: a step that got slower while its CPU time did not waited outside
the process), the time the training process spent waiting in DataLoader `__next__` during it,
the stepping thread's time runnable but waiting for a core (schedstat, null where the kernel
does not say: time other load held the core; a pread of a descriptor kept open, about as cheap
as the clock reads), the epoch of the loader
whose batch opened it (None without a torch DataLoader), and whether the profiler recorded it (a
profiled step is slower: watch's analysis sets those aside). stallscope/wholerun/series.py reads
it.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from stallscope import progress
from stallscope.capture import schedstat

SCALAR_S = 0.5  # TensorBoard gets a point (the mean of the steps since the last) this often
# OUT/watch/live.html is rewritten this often (STALLSCOPE_WATCH_LIVE_S overrides it), by a
# process of its own (report/watch_live.py): the analysis never holds this process's GIL.
LIVE_S = 60.0


def captures_path(log: Path) -> Path:
    """Where `watch`'s later captures are listed, beside the step log `log`
    (capture/recapture.py writes it, commands/run.py reads it)."""
    return log.with_name(log.stem + ".captures.jsonl")


class StepLog:
    """Appends one line per step boundary to `path`; `close()` flushes (idempotent)."""

    def __init__(self, path: Path, scalars: Any = None, live: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = 0  # bytes of whole lines written: a line written in part is cut back to it
        self._warned = False
        captures_path(path).unlink(missing_ok=True)  # an earlier run's, in the same folder
        self._pid = os.getpid()
        self._started = False
        self._first = self._last = self._cpu = 0.0
        self._runq = -1.0  # the stepping thread's run-queue wait so far (ms; < 0: unknown)
        self.steps = 0
        self.last_step_ms = self.last_wait_ms = 0.0  # the step logged last (capture/later.py)
        self.last_runq_ms = math.nan  # ... and its wait for a core (NaN: not measured)
        self.last_cpu_ms = 0.0  # ... and the process's CPU time in it
        self._next_profiled = False  # the next step carries a trace's writing
        self._scalars = scalars  # a ScalarWriter (or anything with its methods), or None
        self._scalar_at = 0.0
        self._pending: list[tuple[float, float]] = []  # (step ms, wait ms) since the last point
        self._live_every = _live_every() if live else None
        self._live_at = time.perf_counter()
        self._live: subprocess.Popen[bytes] | None = None
        # The memory sampler (capture/memory.py MemorySampler: its `job_bytes` and
        # `job_sweeps`), set by the session that owns both; None: no memory in the log.
        self.memory: Any = None
        self._mem_sweeps = 0
        # The other-load sampler (capture/loadsampler.py LoadSampler: its `sweeps`,
        # `others_cores` and `probe_us`), set the same way; None: no other load in the log.
        self.load: Any = None
        self._load_sweeps = 0
        self.last_others_cores = self.last_probe_us = math.nan  # its last figures, held

    def boundary(self, loader_wait_us: float, epoch: int | None, profiled: bool) -> None:
        """A step ended now (and the next began): write its line."""
        now, cpu = time.perf_counter(), time.process_time()
        if self._fd is None or os.getpid() != self._pid:
            return  # closed, or a process the script forked: never ours to write
        sched = schedstat.thread_times_ns()
        runq = -1.0 if sched is None else sched[1] / 1e6
        if not self._started:  # the first boundary: what came before it was start-up
            self._started = True
            self._first = self._last = now
            self._cpu, self._runq = cpu, runq
            return
        self.steps += 1
        profiled, self._next_profiled = profiled or self._next_profiled, False
        step_ms, wait_ms = (now - self._last) * 1e3, loader_wait_us / 1e3
        self.last_step_ms, self.last_wait_ms = step_ms, wait_ms
        self.last_cpu_ms = (cpu - self._cpu) * 1e3
        self.last_runq_ms = runq - self._runq if runq >= 0 and self._runq >= 0 else math.nan
        runq_text = "null" if math.isnan(self.last_runq_ms) else f"{self.last_runq_ms:.4f}"
        swept = ""
        sampler = self.memory
        if sampler is not None and sampler.job_sweeps != self._mem_sweeps:
            self._mem_sweeps = sampler.job_sweeps
            if sampler.job_bytes:
                swept = f'"mem_mb":{sampler.job_bytes / 1048576:.1f},'
        load = self.load
        if load is not None and load.sweeps != self._load_sweeps:
            self._load_sweeps = load.sweeps
            self.last_others_cores, self.last_probe_us = load.others_cores, load.probe_us
            if math.isfinite(self.last_others_cores):
                swept += f'"others_cores":{self.last_others_cores:.3f},'
            if math.isfinite(self.last_probe_us):
                swept += f'"probe_us":{self.last_probe_us:.1f},'
        # Formatted by hand: json.dumps of a dict costs several times as much, every step.
        line = (f'{{"step":{self.steps},"start_s":{self._last - self._first:.6f},'
                f'"step_ms":{step_ms:.4f},"cpu_ms":{self.last_cpu_ms:.4f},'
                f'"loader_wait_ms":{wait_ms:.4f},'
                f'"runq_ms":{runq_text},'
                f'"epoch":{"null" if epoch is None else int(epoch)},{swept}'
                f'"profiled":{"true" if profiled else "false"}}}\n')
        self._last, self._cpu, self._runq = now, cpu, runq
        if not self._append(line.encode()):
            return
        if self._scalars is not None:
            self._pending.append((step_ms, wait_ms))
            if now - self._scalar_at >= SCALAR_S:
                self._scalar_point(now)
        if self._live_every is not None and now - self._live_at >= self._live_every:
            self._refresh_live(now)

    def _append(self, data: bytes) -> bool:
        """Write one line whole, or cut the log back to its last whole line, say so once and
        stop logging (a full disk): False then."""
        assert self._fd is not None
        done = 0
        try:
            while done < len(data):  # a short write (a disk filling up) goes on where it stopped
                done += os.write(self._fd, data[done:])
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            self._give_up(f"the step log {self.path} stops at step {self.steps - 1} "
                          f"({exc.strerror or exc}); the script runs on", log_too=True)
            return False
        self._size += done
        return True

    def _give_up(self, why: str, log_too: bool = False) -> None:
        """Stop writing (the log and the scalars: a full disk fails both) with one warning."""
        if not self._warned:
            self._warned = True
            progress.warn(why)
        scalars, self._scalars = self._scalars, None
        if scalars is not None:
            with contextlib.suppress(Exception):
                scalars.close()
        if log_too and self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def trace_written(self) -> None:
        """A trace was written in this boundary's hook: its time falls in the step that begins
        here (hundreds of ms for a few steps' trace), which is the profiler's, not the run's."""
        self._next_profiled = True

    def _refresh_live(self, now: float) -> None:
        """Start the live page's writer on the steps so far, unless the last one still runs."""
        self._live_at = now
        if self._live is not None and self._live.poll() is None:
            return
        try:
            self._live = subprocess.Popen(
                [sys.executable, "-m", "stallscope.report.watch_live", str(self.path),
                 f"{self._live_every:g}"], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, ValueError):  # no process to spare: the live page waits
            self._live = None

    def _scalar_point(self, now: float) -> None:
        """One TensorBoard point: the mean of the steps since the last one. A point per step
        would cost more than a 5 ms step's 1% budget (`benchmarks/bench_hooks.py` times
        `add_scalar`); the step log keeps every step."""
        pending, self._pending, self._scalar_at = self._pending, [], now
        if not pending or self._scalars is None:
            return
        try:
            self._scalars.add_scalar("watch/step_ms", sum(p[0] for p in pending) / len(pending),
                                     self.steps)
            self._scalars.add_scalar("watch/loader_wait_ms",
                                     sum(p[1] for p in pending) / len(pending), self.steps)
            self._scalars.flush()
        except Exception as exc:  # noqa: BLE001 (TensorBoard's writer failing never stops the run)
            self._give_up(f"no more live TensorBoard scalars ({type(exc).__name__}: {exc}); "
                          "the step log and the script go on")

    def close(self) -> None:
        if os.getpid() != self._pid:
            return
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._live is not None:  # let the last live page finish; the report follows
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._live.wait(timeout=10)
            self._live = None
        if self._scalars is not None:
            self._scalar_point(time.perf_counter())
            with contextlib.suppress(Exception):
                if self._scalars is not None:
                    self._scalars.close()
            self._scalars = None


def _live_every() -> float:
    """LIVE_S, or STALLSCOPE_WATCH_LIVE_S when it is a positive number of seconds."""
    try:
        value = float(os.environ.get("STALLSCOPE_WATCH_LIVE_S", LIVE_S))
    except ValueError:
        return LIVE_S
    return value if value > 0 else LIVE_S


class ScalarWriter:
    """TensorBoard scalars written in the calling thread, one event record per point, flushed by
    the caller. Not torch's SummaryWriter: its writer thread prints a traceback of its own into
    the script's output when a write fails (a full disk), and it cannot be told not to; here a
    failure is an exception the step log turns into one warning line."""

    def __init__(self, logdir: Path) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2  # type: ignore[import-untyped]
        from tensorboard.summary.writer.record_writer import (  # type: ignore[import-untyped]
            RecordWriter,
        )

        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        self._fh: IO[bytes] | None = (logdir / name).open("wb")
        self._records = RecordWriter(self._fh)
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def _write(self, event: Any) -> None:
        if self._fh is None:
            raise ValueError("the scalar writer is closed")
        self._records.write(event.SerializeToString())

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        summary = self._summary_pb2.Summary(
            value=[self._summary_pb2.Summary.Value(tag=tag, simple_value=float(value))])
        self._write(self._event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()
