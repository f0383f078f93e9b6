"""`run --timeout`: stop a script that runs too long and still leave its trace and report.

The script runs in the main thread, so the clock runs in a thread of its own. At the deadline
it sends SIGALRM to the main thread alone (`pthread_kill`): a blocking call there (time.sleep, a
queue, a DataLoader waiting for a batch, a lock) returns, and the handler raises `TimedOut`,
which unwinds the script like Ctrl-C: its `finally` blocks run, then the profiler is stopped in
the main thread and the recorded steps are written. A signal sent to the process could be taken
by any thread and leave the main thread asleep.

When that does not end the script within the grace period:

- the exception landed but the script caught it and ran on: a second signal writes the trace
  from the main thread (the profiler can only be stopped from the thread that started it:
  stopping it from another one crashes torch), without raising again;
- no exception can land (C code waiting with the GIL released, e.g. a deadlock in an
  extension): nothing more can be written, the steps not yet written are lost.

Either way the clock thread then takes over: it concludes the run (report from what was written),
kills the DataLoader workers and exits with EXIT_TIMEOUT. C code that never releases the GIL
stops every thread, this one included; only a kill from outside ends that (Ctrl-C cannot either).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from stallscope import progress
from stallscope.errors import EXIT_TIMEOUT

# How long the script gets to unwind after the deadline (its finally blocks, torch joining its
# DataLoader workers: up to 5 s per hung worker), at most; never longer than the timeout itself.
GRACE_S = 10.0
SIGNAL = signal.SIGALRM
# As code objects name their files (the import path, unresolved).
_OURS = os.path.dirname(os.path.dirname(__file__)) + os.sep
_SESSION = os.path.join(os.path.dirname(__file__), "session.py")
# stallscope's frames inside the script (its DataLoader and optimizer hooks; a timed fetch runs
# through loadertaps.py)
_HOOKS = (_SESSION, *(os.path.join(os.path.dirname(__file__), f"{m}.py")
                      for m in ("loaders", "loadertaps")))
_LIBRARY = tuple(
    {str(Path(p).resolve()) for k in ("stdlib", "platstdlib", "purelib", "platlib")
     if (p := sysconfig.get_paths().get(k))}
)


class TimedOut(BaseException):
    """Raised in the script at `--timeout`: a BaseException, so `except Exception` lets it pass
    and `finally` blocks run."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"stallscope stopped the script at --timeout {timeout_s:g} s")


class Watchdog:
    """One run's deadline. `start()` as the script starts, `stop()` as soon as it has ended."""

    def __init__(
        self,
        timeout_s: float,
        flush: Callable[[], bool],
        abandon: Callable[[], int],
    ) -> None:
        """`flush()` writes the recorded steps (main thread; False when it cannot right now);
        `abandon()` concludes the run from the clock thread, returning the exit status."""
        self.timeout_s = timeout_s
        self.grace_s = min(GRACE_S, timeout_s)
        self.where: str | None = None  # where the script was when the deadline passed
        self.stuck = Location(None, True)  # and where it was when the grace period ended
        self.landed = False  # TimedOut was raised in the script
        self.signal_taken = False  # the script handles SIGALRM itself: no TimedOut from us
        self._flush = flush
        self._abandon = abandon
        self._pid = os.getpid()
        self._main = threading.main_thread().ident
        self._lock = threading.RLock()
        self._ended = threading.Event()  # set by stop(): the main thread concludes
        self._flushed = threading.Event()
        self._claimed = False
        self._stopping = False
        self._sent = 0
        self._deferred = False
        self._previous: Any = None
        self._installed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            try:
                self._previous = signal.signal(SIGNAL, self._on_signal)
                self._installed = True
            except (ValueError, OSError):
                pass
        self._thread = threading.Thread(
            target=self._run, args=(time.monotonic() + self.timeout_s,),
            name="stallscope-timeout", daemon=True,
        )
        self._thread.start()

    def stop(self) -> bool:
        """The script has ended. True: the caller concludes the run. False: the clock thread is
        already concluding it and will exit the process; the caller must wait for that."""
        self._stopping = True  # first, so a signal landing now does not raise
        with self._lock:
            mine = not self._claimed
            self._claimed = True
            sent = self._sent
        self._ended.set()
        # A signal already sent may still arrive: keep the (now inert) handler for it.
        if self._installed and not sent:
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(SIGNAL, self._previous)
        return mine

    @staticmethod
    def wait_for_exit() -> None:
        """Park the main thread while the clock thread concludes and exits the process."""
        threading.Event().wait()

    # ------------------------------------------------------------------ the main thread's side

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid or not self._sent:
            # A forked worker, or the script's own alarm(): what would happen without us.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self._stopping or self._claimed:
            return  # the script has ended already
        if _in_bookkeeping(frame):
            self._deferred = True  # inside stallscope's own bookkeeping: try again shortly
            return
        if not self.landed:
            self.landed = True
            raise TimedOut(self.timeout_s)
        # The script caught TimedOut and ran on: write what was recorded, let it be.
        if self._flush():
            self._flushed.set()
        else:
            self._deferred = True

    # ------------------------------------------------------------------ the clock thread

    def _run(self, deadline: float) -> None:
        if self._ended.wait(max(0.0, deadline - time.monotonic())):
            return
        with self._lock:
            if self._claimed:
                return
            self.where = self._main_location().text
            self.signal_taken = self._installed and not self._handler_in_place()
        progress.say(f"--timeout {self.timeout_s:g} s reached: stopping the script")
        self._signal_until(time.monotonic() + self.grace_s, lambda: False)
        if self._ended.is_set():
            return
        if self.landed:  # caught and ignored: have the main thread write the trace
            with self._lock:
                self._deferred = True
            self._signal_until(time.monotonic() + self.grace_s, self._flushed.is_set)
        with self._lock:
            if self._claimed:
                return
            self._claimed = True
            self.stuck = self._main_location()
        status = EXIT_TIMEOUT
        try:
            status = self._abandon()
        finally:
            end_process(status)

    def _signal_until(self, until: float, done: Callable[[], bool]) -> None:
        """Signal the main thread now, and again whenever the handler deferred, until the
        script ends, `done()`, or `until`."""
        self._deferred = True
        while not self._ended.is_set() and not done():
            with self._lock:
                if self._deferred and not self._claimed and self._handler_in_place():
                    self._deferred = False
                    self._sent += 1
                    signal.pthread_kill(self._main, SIGNAL)  # type: ignore[arg-type]
            left = until - time.monotonic()
            if left <= 0:
                return
            self._ended.wait(min(left, 0.05))

    def _handler_in_place(self) -> bool:
        """False when the script installed its own SIGALRM handler: it is not ours to call."""
        try:
            current = signal.getsignal(SIGNAL)
        except (ValueError, OSError):
            return False
        return self._installed and current == self._on_signal

    def _main_location(self) -> Location:
        frame = sys._current_frames().get(self._main)  # type: ignore[arg-type]
        return script_location(frame)


def _in_bookkeeping(frame: FrameType | None) -> bool:
    """True while the main thread runs stallscope's code rather than the script's: a step
    boundary (the profiler mid-step) or the code around the script. An exception raised there
    would leave the profiler half-stepped, or escape past the script."""
    if frame is not None and frame.f_code.co_filename.startswith(_OURS):
        return True
    while frame is not None:
        if frame.f_code.co_filename == _SESSION:
            return True
        frame = frame.f_back
    return False


@dataclass(frozen=True)
class Location:
    """Where the main thread is: `train.py:12, in torch.utils.data.dataloader.__next__`."""

    text: str | None
    in_script: bool  # False once the script's own frames have all returned


def script_location(frame: FrameType | None) -> Location:
    """The innermost line of the user's own code in `frame`'s stack (not the standard library,
    installed packages or stallscope), with the library call it is in. Once the script's frames
    have all returned (torch shutting its workers down as the script's objects are freed), only
    that library call."""
    inner: str | None = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_OURS) and filename not in _HOOKS:  # beyond the script
            return Location(inner, False)
        if _is_library(filename):
            module = frame.f_globals.get("__name__", "")
            inner = f"{module}.{frame.f_code.co_name}" if module else frame.f_code.co_name
        elif not filename.startswith(("<", _OURS)):
            where = f"{_display(filename)}:{frame.f_lineno}"
            return Location(f"{where}, in {inner}" if inner else where, True)
        frame = frame.f_back
    return Location(None, False)


def _is_library(filename: str) -> bool:
    return filename.startswith(_LIBRARY) or filename.startswith("<frozen")


def _display(filename: str) -> str:
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def end_process(status: int) -> None:
    """Exit now, from any thread, killing this process's multiprocessing children first
    (DataLoader workers, fork or spawn): the code that would shut them down will not run.

    From the first kill to the exit this thread keeps the GIL: a worker's death runs torch's
    SIGCHLD handler in the main thread, which would print an error about the workers we kill.
    """
    children = [c.pid for c in multiprocessing.active_children() if c.pid]
    _release_semaphores()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    sys.setswitchinterval(60.0)
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(status)


def _release_semaphores() -> None:
    """Unlink the named semaphores of spawn-started DataLoaders' queues, as the finalizers that
    `os._exit` skips would: otherwise multiprocessing's resource tracker finds them after us and
    prints a warning about leaked semaphores (while cleaning them up anyway)."""
    try:
        from multiprocessing import synchronize, util

        # private to multiprocessing, so typeshed leaves them out; a python without them is
        # the AttributeError below
        cleanup = synchronize.SemLock._cleanup  # type: ignore[attr-defined]
        pending = [f for f in list(util._finalizer_registry.values())  # type: ignore[attr-defined]
                   if getattr(f, "_callback", None) is cleanup]
    except (ImportError, AttributeError):  # another python: the warning it is
        return
    for finalizer in pending:
        with contextlib.suppress(Exception):
            finalizer()
