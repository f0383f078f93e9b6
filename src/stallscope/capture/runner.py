"""Run a training script under the profiler and turn however it ended into an exit status.

`capture()` runs the script in this process with the step hooks installed, maps however it
ended (stopped after recording, finished, raised, exited, interrupted) to the exit status python
would give, and returns a RunContext describing the run. The script's own traceback is printed
as python would print it, without stallscope's frames.
"""

from __future__ import annotations

import gc
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from stallscope.capture.facts import environment
from stallscope.capture.session import CaptureSession, Schedule, StopScript
from stallscope.capture.target import Target, run_target
from stallscope.context import RunContext


class Terminated(BaseException):
    """SIGTERM (a launcher stopping this rank) turned into an exception, so the run unwinds and
    the steps recorded so far are kept."""


@dataclass(frozen=True)
class CaptureOptions:
    sched: Schedule
    step_on: str = "auto"
    run_to_end: bool = False
    # `--set KEY=VALUE`, validated: applied to every DataLoader the script builds.
    overrides: dict[str, Any] = field(default_factory=dict)


def capture(
    target: Target,
    options: CaptureOptions,
    trace_dir: Path,
    worker: str,
    context: RunContext,
) -> RunContext:
    """Run `target` under the profiler; fill in and return `context`."""
    session = CaptureSession(options.sched, options.step_on, trace_dir, worker, options.run_to_end,
                             options.overrides)
    context.overrides = dict(options.overrides)
    context.steps_requested = options.sched.steps
    restore_sigterm = _sigterm_to_exception()
    session.start()
    try:
        run_target(target)
        ended, status = "finished", 0
    except StopScript:
        ended, status = "stopped", 0
    except SystemExit as exc:
        ended, status = "exit", _exit_status(exc.code)
    except KeyboardInterrupt:
        ended, status = "interrupted", 130
    except Terminated:
        ended, status = "terminated", 128 + signal.SIGTERM
    except BaseException as exc:  # the script's own error: show it as python would
        ended, status = "exception", 1
        _print_user_traceback(type(exc), exc, exc.__traceback__)
    finally:
        restore_sigterm()
        # Drop the script's frames (and the loaders and workers they hold) before analysis.
        sys.last_type = sys.last_value = sys.last_traceback = None
        session.finish()
        gc.collect()
    context.ended = ended
    context.exit_status = status
    context.step_source = session.driver.source
    context.boundaries_seen = session.boundaries
    context.steps_recorded = session.recorded
    context.traces = [str(p) for p in session.traces]
    context.dataloaders = session.watcher.loaders
    context.environment = {**environment(), "activities": session.activities}
    context.notes.extend(session.watcher.notes)
    if options.overrides and not session.watcher.loaders:
        context.notes.append("--set was given but the script built no torch DataLoader: "
                             "nothing was overridden.")
    if session.driver.direct:
        context.notes.append(
            "No DataLoader between optimizer steps: step boundaries were placed inside "
            "optimizer.step(), so each step's range ends just before that call returns."
        )
    if session.stop_requested and ended != "stopped":
        context.notes.append(
            "The script caught stallscope's stop request (a bare except or except "
            "BaseException) and ran on."
        )
    return context


def _exit_status(code: Any) -> int:
    """What python's exit status would be for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_user_traceback(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    """The traceback python would print: frames before the script's first one are dropped."""
    here = str(Path(__file__).resolve().parent)
    while tb is not None and (
        tb.tb_frame.f_code.co_filename.startswith(here)
        or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy>")
        or tb.tb_frame.f_code.co_filename.endswith("runpy.py")
    ):
        tb = tb.tb_next
    traceback.print_exception(exc_type, exc, tb, file=sys.stderr)


def _sigterm_to_exception() -> Any:
    """Turn SIGTERM into `Terminated` unless the script's process already handles it."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return lambda: None
    if previous is not signal.SIG_DFL:
        return lambda: None

    def handler(_signum: int, _frame: Any) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
