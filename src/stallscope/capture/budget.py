"""A memory budget for the recording: the profiler's buffers must not take the machine down.

Kineto keeps every recorded event in the training process until the trace is written: a script
with millions of small ops per step (pytorch/examples `time_sequence_prediction`: LBFGS over an
LSTM unrolled 999 times) took 22.6 GB for one recorded step and was OOM-killed at 24 GB with
nothing written. The budget bounds the growth of the process's resident memory while recording:

- at each recorded step boundary, the growth per step so far predicts the next step's: when it
  would cross the budget, recording ends there, with the complete steps written;
- within a step, a monitor thread reads the resident size every `POLL_S`; past the budget it
  signals the main thread (the profiler can only be stopped from the thread that started it),
  whose handler stops the script as at the end of recording: it raises StopScript, so every
  `record_function` range still open (the optimizer's, the script's own) closes while the
  profiler still runs, and then the part of the step recorded so far is written, marked cut.
  Stopping the profiler inside such a range instead would leave it to close on a profiler that
  is gone. Under --run-to-end the script must go on: the profiler is then stopped only when the
  signal lands in the script's own code, outside torch (rare in op-heavy loops: the boundary
  check is what bounds those).

Writing the trace costs more than recording it: Kineto materialises every event again to export
it. Measured here (60,000 small ops in one step, shapes recorded): the process grew 350 MB while
recording and 1.33 GB at its peak while the trace was written, 3.8x. So the budget is on that
peak: recording stops when its own growth reaches the budget / `EXPORT_FACTOR`.

Growth counts everything the process allocates while recording, the script's own tensors
included: a budget on what the recording may cost, not an exact account of Kineto's buffers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch

DEFAULT_MB = 2048
EXPORT_FACTOR = 4.0  # peak growth while writing the trace / growth while recording (3.8 measured)
POLL_S = 0.25
SIGNAL = signal.SIGUSR2
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# As code objects name their files (the import path, unresolved), like capture/watchdog.py.
_TORCH = os.path.dirname(torch.__file__) + os.sep
_OURS = os.path.dirname(os.path.dirname(__file__)) + os.sep
# stallscope's hooks inside the script: a step boundary, a DataLoader fetch being timed.
_HOOKS = tuple(os.path.join(os.path.dirname(__file__), f"{m}.py")
               for m in ("session", "loaders", "loadertaps", "steps", "anatomy", "budget"))


def rss_bytes() -> int | None:
    """This process's resident memory (Linux /proc/self/statm; psutil elsewhere), or None."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


@dataclass
class Cut:
    """Why and where recording ended before the requested steps."""

    limit_mb: float
    growth_mb: float
    steps_recorded: int
    mid_step: bool  # True: the last step in the trace was cut in the middle

    def text(self, requested: int) -> str:
        where = ("in the middle of a step (the part recorded is kept, marked cut)"
                 if self.mid_step else "at a step boundary")
        return (f"Recording was cut by the memory budget: the profiler's buffers grew the "
                f"process by {self.growth_mb:.0f} MB while recording, and writing the trace "
                f"takes about {EXPORT_FACTOR:.0f}x that at its peak (budget --max-record-mb "
                f"{self.limit_mb:.0f}), so recording ended {where} after "
                f"{self.steps_recorded} of {requested} step(s). Raise --max-record-mb if the "
                "machine has the memory, or record fewer steps.")

    def to_dict(self) -> dict[str, Any]:
        return {"reason": "memory budget", "limit_mb": round(self.limit_mb),
                "growth_mb": round(self.growth_mb), "steps_recorded": self.steps_recorded,
                "mid_step": self.mid_step}


class RecordingBudget:
    """The budget for one recording. `begin()` when recording starts, `end()` when it ends;
    `next_step_fits(recorded)` at each recorded boundary; `on_cut(frame)` is called in the main
    thread when the monitor finds the budget spent mid-step, and returns False to be asked again
    (it may raise to stop the script)."""

    def __init__(self, limit_mb: float, on_cut: Callable[[FrameType | None], bool]) -> None:
        self.limit = limit_mb * 1e6 / EXPORT_FACTOR  # for the recording's own growth
        self.limit_mb = limit_mb
        self.start: int | None = None
        self.cut: Cut | None = None
        self._on_cut = on_cut
        self._main = threading.main_thread().ident
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._requested = False  # the monitor asked the main thread to cut
        self._installed = False
        self._previous: Any = None
        self._thread: threading.Thread | None = None
        self._last_growth = 0.0  # the growth at the last recorded boundary

    def growth(self) -> float | None:
        now = rss_bytes()
        return None if now is None or self.start is None else float(now - self.start)

    def begin(self) -> None:
        self.start = rss_bytes()
        if self.start is None or self.limit <= 0:
            return
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError, TypeError):
                if signal.getsignal(SIGNAL) in (signal.SIG_DFL, None):
                    self._previous = signal.signal(SIGNAL, self._on_signal)
                    self._installed = True
        if self._installed:
            self._thread = threading.Thread(target=self._watch, name="stallscope-budget",
                                            daemon=True)
            self._thread.start()

    def end(self) -> None:
        self._stop.set()
        if self._installed:
            with contextlib.suppress(ValueError, OSError, TypeError):
                if signal.getsignal(SIGNAL) == self._on_signal:
                    signal.signal(SIGNAL, self._previous)
            self._installed = False

    def next_step_fits(self, recorded: int) -> bool:
        """After `recorded` complete steps: would one more stay within the budget? The next
        step is taken to grow the process as much as the mean step did, or as the last one
        did when that was more: the first steps can reuse memory freed before recording
        (run's measurement of the profiler's cost leaves its buffers behind) and grow it
        little, the later ones as much as recording really takes."""
        grown = self.growth()
        if grown is None or recorded <= 0 or self.limit <= 0:
            return True
        last, self._last_growth = grown - self._last_growth, grown
        if grown + max(grown / recorded, last) <= self.limit:
            return True
        self.cut = Cut(self.limit_mb, grown / 1e6, recorded, mid_step=False)
        return False

    def mark_mid_step(self, recorded: int) -> None:
        grown = self.growth() or 0.0
        self.cut = Cut(self.limit_mb, grown / 1e6, recorded, mid_step=True)

    # ---------------------------------------------------------------- the monitor thread

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            grown = self.growth()
            if grown is None or grown <= self.limit:
                continue
            # Ask until the main thread acts (it defers while in torch's or our own code).
            self._requested = True
            if signal.getsignal(SIGNAL) != self._on_signal:
                return  # the script took the signal over: the boundary check still applies
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(self._main, SIGNAL)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- the main thread

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked worker inherited the handler: the default
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if not self._requested or self._stop.is_set():
            return
        self._stop.set()  # stays set when on_cut raises (it stops the script)
        if not self._on_cut(frame):
            self._stop.clear()  # not here: the monitor sends again in POLL_S


def in_hooks(frame: FrameType | None) -> bool:
    """True while the main thread is inside stallscope's own hooks (a step boundary, a timed
    fetch): an exception there would leave the bookkeeping half-done."""
    f = frame
    if f is None or f.f_code.co_filename.startswith(_OURS):
        return True
    while f is not None:
        if f.f_code.co_filename in _HOOKS:
            return True
        f = f.f_back
    return False


def in_script_code(frame: FrameType | None) -> bool:
    """True when the innermost frame is the script's own (neither torch's nor stallscope's)
    and no hook is on the stack."""
    return (frame is not None and not frame.f_code.co_filename.startswith((_TORCH, _OURS))
            and not in_hooks(frame))
