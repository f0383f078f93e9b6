"""The host over the recorded steps: its cores and threads, the wall and CPU time the process
used, and the other load on the machine meanwhile (the trace's `host` metadata).

The replay needs what the profiler cannot see: how many cores the process had and how much of
them other processes took while it was recorded. The figures are read at the recording's edges
only, never per step, so the recorded steps do not pay for them.
"""

from __future__ import annotations

import time
from typing import Any

from stallscope.capture import hostload
from stallscope.capture.facts import environment


class RecordedHost:
    """Reads taken when recording starts and at its last step boundary; `figures()` is the
    trace's `host` (None before recording started)."""

    def __init__(self) -> None:
        self._window: tuple[float, float] | None = None  # wall, process CPU at recording start
        self._cpu: dict[str, Any] = {}  # cores and threads, read when recording starts
        # Cores' busy time and this process tree's CPU, read just before recording starts and
        # at its last step boundary (hostload.py): the other load on the machine meanwhile.
        self._load_start: hostload.CpuSample | None = None
        self.load: dict[str, Any] = {}

    @property
    def load_started(self) -> bool:
        return self._load_start is not None

    def start_load(self) -> None:
        """Just before the first recorded step (the other load's window opens)."""
        self._load_start = hostload.sample()

    def end_load(self) -> None:
        """At the boundary that ends the last recorded step (once: later calls keep it)."""
        if self._load_start is not None and not self.load:
            self.load = hostload.other_load(self._load_start, hostload.sample())

    @property
    def begun(self) -> bool:
        return self._window is not None

    def begin(self) -> None:
        """At the first boundary while recording: the wall and CPU clocks start, and the cores
        are read once (the metadata is refreshed every step)."""
        self._window = (time.perf_counter(), time.process_time())
        self._cpu = environment()["cpu"]

    def figures(self) -> dict[str, Any] | None:
        """The trace's `host`, up to now; None before recording started."""
        if self._window is None:
            return None
        return {
            "cores_per_process": self._cpu["cores_per_process"],
            "torch_threads": self._cpu["torch_threads"],
            "recorded_wall_us": round((time.perf_counter() - self._window[0]) * 1e6, 1),
            "recorded_cpu_us": round((time.process_time() - self._window[1]) * 1e6, 1),
            **self.load,
        }
