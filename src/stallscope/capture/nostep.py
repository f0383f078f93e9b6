"""`run --no-step-warning`: say so at once when no step boundary has come after a while.

A loop with neither an optimizer nor a DataLoader would otherwise run to its end in silence
before "no step recorded"; a loop whose first `optimizer.step()` is long (an LBFGS closure, a
large model) is told apart, so the user is not sent to mark steps that will come.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from stallscope import progress

# Seconds without a step boundary before stallscope says so.
NO_STEP_S = 60.0


class NoStepWarning:
    """A daemon timer started with the script; `seen()` tells whether a boundary came (or the
    session is over) by then. Reads the step driver and the DataLoader watcher."""

    def __init__(self, after_s: float | None, sched: Any, driver: Any, watcher: Any,
                 seen: Callable[[], bool]) -> None:
        self.after_s = after_s
        self.sched, self.driver, self.watcher = sched, driver, watcher
        self._seen = seen
        self._pid = os.getpid()
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        if self.after_s:
            self._timer = threading.Timer(self.after_s, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self) -> None:
        if self._seen() or os.getpid() != self._pid:
            return
        if _in_optimizer_step():
            progress.warn(
                f"the first optimizer.step() has not returned after {self.after_s:g} s: "
                "steps are long (an LBFGS closure, a large model); recording begins after "
                f"{self.sched.skip} skipped and {self.sched.warmup} warm-up step(s).")
            return
        d = self.driver
        loaders = self.watcher.loaders
        seen = (f"{len(loaders)} DataLoader(s) built, {d.batches} batch(es) drawn"
                if loaders else "no torch DataLoader built")
        progress.warn(
            f"no training step seen after {self.after_s:g} s ({seen}, "
            f"{d.optimizer_steps} optimizer.step() call(s)). If the loop has neither a "
            "torch.optim optimizer nor a DataLoader, mark each iteration with "
            "`import stallscope; stallscope.step()`; or pass --step-on dataloader. "
            "The script keeps running (--no-step-warning SECONDS changes this wait).")


def _in_optimizer_step() -> bool:
    """True when the main thread is inside a torch.optim optimizer's step right now."""
    frame = sys._current_frames().get(threading.main_thread().ident)  # type: ignore[arg-type]
    marker = os.sep + os.path.join("torch", "optim") + os.sep
    while frame is not None:
        if marker in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False
