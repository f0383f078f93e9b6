"""Other load over a whole run, every half second: what `watch`'s step log carries beside each
step's own figures, so that a slower stretch the machine explains is not called the script's.

Why beside the per-step figures: a step's wall time, its process CPU time and the stepping
thread's wait for a core cannot tell more work of the script's own from other load once the
machine was already oversubscribed (intra-op threads spinning while their peers wait grow the
step, the CPU time and the wait in proportion), nor from a core that runs slower (a hypervisor
taking the core from this guest, a busy sibling hyperthread, a lower clock: the same work then
takes more CPU time). Two figures that the script's own work leaves unchanged do:

- `others_cores`: the cores' busy time (steal included) less this job's CPU time, per second of
  wall time: the cores other processes held. The job is this process and the DataLoader
  workers `procs()` lists (the memory sampler's list), read from /proc; under a job of several
  processes on one host (torchrun), whose other ranks hold cores by design and would need a
  scan of every process to tell apart, it is not measured.
- `probe_us`: the CPU time this thread takes to hash a fixed 256 kB buffer (hashlib releases
  the GIL for it: the training thread is not held). The same work on the same core: it grows
  only when the core runs slower.

A sweep costs a read of /proc/stat, one of /proc/PID/stat per process, and the hash, every
SAMPLE_S seconds (benchmarks/bench_load_sampler.py measures it; docs/watch.md has the figure).
Every failure loses the figures, never the run.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from stallscope.capture import hostload
from stallscope.capture.daemon import DaemonThread

SAMPLE_S = 0.5  # one sweep this often
PROBE_BYTES = 256 * 1024  # hashed by each sweep's probe


@functools.cache
def _probe_buffer() -> bytes:
    """Made at the first probe, not at import: `run` and DataLoader workers never probe."""
    return bytes(range(256)) * (PROBE_BYTES // 256)


def probe_us() -> float | None:
    """The calling thread's CPU time (us) to hash PROBE_BYTES; None where the clock does not
    move (a kernel without per-thread CPU time)."""
    buffer = _probe_buffer()
    start = time.thread_time_ns()
    hashlib.sha256(buffer).digest()
    took = (time.thread_time_ns() - start) / 1e3
    return took if took > 0 else None


class LoadSampler(DaemonThread):
    """Sweeps on a daemon thread; `sweeps` counts them, `others_cores` and `probe_us` hold the
    last one's figures (NaN: not measured). Start and stop are idempotent."""

    thread_name = "stallscope-load"

    def __init__(self, procs: Callable[[], Iterable[tuple[Any, ...]]]) -> None:
        super().__init__()
        self._procs = procs  # (role, pid, ...) of the job's processes
        self._handles: dict[int, psutil.Process] = {}
        self._last: tuple[float, float, float] | None = None  # wall, busy, job CPU (s)
        # the cores this job may use (none: others are not measured) and whether `nice`
        # time is idle to it, read at the first sweep
        self._cores: tuple[list[int], bool] | None = None
        self.sweeps = 0
        self.others_cores = math.nan
        self.probe_us = math.nan

    def _run(self) -> None:
        wait = 0.0  # the first sweep at once: the next one's figures cover the time since
        while not self._stop.wait(wait):
            wait = SAMPLE_S
            with contextlib.suppress(Exception):  # a failed sweep loses its figures only
                self.sweep()

    def sweep(self) -> None:
        """One read of the cores and the job; the figures cover the time since the last."""
        probe = probe_us()
        others = math.nan
        if self._cores is None:
            me = psutil.Process()
            self._cores = ([] if _several_local_processes() else hostload.cpus_of(me),
                           me.nice() <= 0)
        cpus, skip_nice = self._cores
        if cpus:
            busy, _ = hostload.cores_busy(psutil.cpu_times(percpu=True), cpus, skip_nice)
            now = (time.perf_counter(), busy, self._job_cpu())
            last, self._last = self._last, now
            if last is not None and now[0] > last[0]:
                # the counters tick with the kernel's clock: never below 0, nor above the cores
                took = ((now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0])
                others = min(max(took, 0.0), float(len(cpus)))
        self.others_cores = others
        self.probe_us = math.nan if probe is None else probe
        self.sweeps += 1

    def _job_cpu(self) -> float:
        """CPU seconds of the job's processes (`procs()`: this one, whose reaped children count
        too, and its live workers)."""
        total = 0.0
        live = set()
        for proc in self._procs():
            pid = proc[1]
            live.add(pid)
            handle = self._handles.get(pid)
            if handle is None:
                with contextlib.suppress(psutil.Error):
                    handle = self._handles[pid] = psutil.Process(pid)
            if handle is not None:
                total += hostload.process_cpu(handle)
        for pid in set(self._handles) - live:  # ended: its time is in our children's now
            del self._handles[pid]
        return total


def _several_local_processes() -> bool:
    from stallscope.capture.facts import local_processes  # torch: only when measuring

    return local_processes() > 1
