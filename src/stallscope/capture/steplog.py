"""Every step of a whole run, one JSON line each: the series `stallscope watch` analyses.

Why a file written as the run goes: a run of days must be readable mid-run (and by TensorBoard,
which gets the same figures as scalars), and a crash or kill of the script must leave every
step it took. Lines are buffered and flushed at most every FLUSH_S seconds, so the cost per step
is a perf_counter read, a few float operations and a string format (benchmarks/bench_hooks.py
measures it beside the hooks it rides on).

A line: `{"step": 12, "start_s": 3.914, "step_ms": 41.2, "loader_wait_ms": 30.1, "epoch": 0,
"profiled": false}`: the step's number (1-based, from the first boundary), when it began
(seconds after the first boundary), its wall time, the time the training process spent waiting
in DataLoader `__next__` during it, the epoch of the loader whose batch opened it (None without
a torch DataLoader), and whether the profiler recorded it (a profiled step is slower: watch's
analysis sets those aside).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import IO, Any

FLUSH_S = 1.0  # a report read mid-run is at most this late


class StepLog:
    """Appends one line per step boundary to `path`; `close()` flushes (idempotent)."""

    def __init__(self, path: Path, scalars: Any = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[str] | None = path.open("w", encoding="utf-8")
        self._pid = os.getpid()
        self._first: float | None = None
        self._last: float | None = None
        self._flushed = time.perf_counter()
        self.steps = 0
        self._scalars = scalars  # a TensorBoard SummaryWriter, or None

    def boundary(self, loader_wait_us: float, epoch: int | None, profiled: bool) -> None:
        """A step ended now (and the next began): write its line."""
        now = time.perf_counter()
        if self._fh is None or os.getpid() != self._pid:
            return  # closed, or a process the script forked: never ours to write
        if self._last is None:  # the first boundary: what came before was start-up
            self._first = self._last = now
            return
        assert self._first is not None
        self.steps += 1
        step_ms = (now - self._last) * 1e3
        line = {"step": self.steps, "start_s": round(self._last - self._first, 6),
                "step_ms": round(step_ms, 4), "loader_wait_ms": round(loader_wait_us / 1e3, 4),
                "epoch": epoch, "profiled": profiled}
        self._last = now
        try:
            self._fh.write(json.dumps(line, separators=(",", ":")) + "\n")
            if now - self._flushed >= FLUSH_S:
                self._fh.flush()
                self._flushed = now
        except OSError:  # a full disk: the steps so far are kept, the script runs on
            self.close()
            return
        if self._scalars is not None:
            try:
                self._scalars.add_scalar("watch/step_ms", step_ms, self.steps)
                self._scalars.add_scalar("watch/loader_wait_ms", loader_wait_us / 1e3,
                                         self.steps)
            except Exception:  # TensorBoard's writer failing never stops the run
                self._scalars = None

    def close(self) -> None:
        if os.getpid() != self._pid:
            return
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
        if self._scalars is not None:
            with contextlib.suppress(Exception):
                self._scalars.close()
            self._scalars = None


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The lines of a step log; a last line cut by a kill is left out."""
    steps = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and "step_ms" in item:
            steps.append(item)
    return steps
