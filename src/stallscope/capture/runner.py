"""Run a training script under the profiler and turn however it ended into an exit status.

`capture()` runs the script in this process with the step hooks installed, maps however it
ended (stopped after recording, finished, raised, exited, interrupted, timed out) to the exit
status python would give (124 for `--timeout`), fills in a RunContext describing the run, and
hands it to `conclude` (analysis and report). The script's own traceback is printed as python
would print it, without stallscope's frames.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from stallscope import progress
from stallscope.capture import budget, steady
from stallscope.capture.dynamo import COMPILE_WAIT_MAX
from stallscope.capture.facts import environment
from stallscope.capture.foreign import describe as describe_source
from stallscope.capture.intraop import IntraOpOverride
from stallscope.capture.nostep import NO_STEP_S
from stallscope.capture.overrides import loader_overrides
from stallscope.capture.session import RECORD_SHAPES, CaptureSession, Schedule, StopScript
from stallscope.capture.steplog import ScalarWriter, StepLog
from stallscope.capture.target import Target, run_target
from stallscope.capture.watchdog import TimedOut, Watchdog
from stallscope.capture.worker_exit import add_exit_status
from stallscope.errors import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_TIMEOUT,
    OutputError,
    Terminated,
    exit_line,
    fail,
)
from stallscope.runfacts import RunContext
from stallscope.text import clean

# Seconds `run` waits, once the script has ended or been stopped, for the threads it started
# and did not make daemons (loggers, metric uploaders): python would wait for them forever,
# and a script stopped after its recorded steps never reaches the code that stops them.
THREAD_GRACE_S = 10.0
TIMED_OUT = "timed out"  # RunContext.ended for `--timeout`; reads as "the script timed out"
_OURS = os.path.dirname(os.path.dirname(__file__)) + os.sep
_REAL_EXIT = os._exit  # before capture() hooks it
# The process capture() runs the script in; a process forked from it is the script's child.
_RECORDING_PID: int | None = None

# (the RunContext, one clause saying how the script ended, or None when it ended well) ->
# the exit status: `stallscope.commands.run.conclude`.
Conclude = Callable[[RunContext, str | None], int]


@dataclass(frozen=True)
class CaptureOptions:
    sched: Schedule
    step_on: str = "auto"
    run_to_end: bool = False
    # `--set KEY=VALUE`, validated: applied to every DataLoader the script builds.
    overrides: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None  # `--timeout`: seconds from the script's start
    max_record_mb: float = budget.DEFAULT_MB  # `--max-record-mb`; 0: no limit
    no_step_s: float | None = NO_STEP_S  # `--no-step-warning`
    # `watch`: every step into this JSON Lines file (capture/steplog.py), and its figures as
    # TensorBoard scalars into `scalars_dir` as the run goes.
    step_log: Path | None = None
    scalars_dir: Path | None = None
    max_steps: int | None = None  # `watch --max-steps`
    max_seconds: float | None = None  # `watch --duration`
    record_shapes: bool = RECORD_SHAPES  # `--record-shapes`: ops' input shapes in the trace


@dataclass
class Ending:
    """How the script ended: `ended` and `status` as in RunContext, `why` for the error line."""

    ended: str
    status: int
    why: str | None = None
    notes: list[str] = field(default_factory=list)


def capture(
    target: Target,
    options: CaptureOptions,
    trace_dir: Path,
    worker: str,
    context: RunContext,
    conclude: Conclude,
) -> int:
    """Run `target` under the profiler, fill in `context`, return `conclude(context, why)`."""
    session = CaptureSession(options.sched, options.step_on, trace_dir, worker, options.run_to_end,
                             options.overrides, options.max_record_mb, options.no_step_s,
                             make_step_log(options.step_log, options.scalars_dir),
                             options.record_shapes, options.max_steps, options.max_seconds)
    context.overrides = dict(options.overrides)
    context.record_shapes = options.record_shapes
    context.steps_requested = options.sched.steps
    watchdog: Watchdog | None = None
    if options.timeout is not None:
        watchdog = Watchdog(
            options.timeout,
            flush=lambda: _flush(session),
            abandon=lambda: _abandon(session, context, conclude, watchdog),
        )
    restore_sigterm = _sigterm_to_exception()
    sigchld = _handler(signal.SIGCHLD)
    threads = options.overrides.get("torch_threads")
    intraop = IntraOpOverride(threads) if threads else None  # run --set torch_threads=N
    if intraop is not None:
        intraop.install()
    started = time.monotonic()
    pid = _arm_fork_guard()
    session.start()
    error: BaseException | None = None
    restore_exit = _hook_os_exit(session, context, conclude)
    try:
        if watchdog is not None:
            watchdog.start()
        ended, status, error = _run(target, sigchld)
        if os.getpid() != pid:  # a child the script forked ran to the script's end
            _end_forked_child(status, error)
    finally:
        restore_exit()
        _repair_stdio()
        if watchdog is not None and not watchdog.stop():
            watchdog.wait_for_exit()  # the clock thread concludes and ends the process
        _mute_worker_deaths(sigchld)
        restore_sigterm()
        session.finish()
        if intraop is not None:
            intraop.uninstall()
            context.notes.extend(intraop.notes)
    failed = session.recorder.export_failed
    if failed is not None:  # stallscope's failure, not the script's
        return _export_failed(failed, status, error)
    if watchdog is not None and watchdog.landed:
        ending = _timed_out(watchdog)
    elif error is not None:
        _print_user_traceback(error)
        cause, note = failure_cause(error, _worker_death())
        ending = Ending(ended, status, f"ended with status {status} ({cause})", [note])
    else:
        ending = Ending(ended, status, f"ended with status {status}" if status else None)
    # Stop the workers the script's loops left, then drop its frames (and the loaders they
    # hold) before analysis.
    session.watcher.iters.shutdown_workers()
    error = None
    sys.last_type = sys.last_value = sys.last_traceback = None
    gc.collect()
    grace = THREAD_GRACE_S
    if options.timeout is not None:  # --timeout covers the whole life of the process
        grace = max(0.0, min(grace, options.timeout - (time.monotonic() - started)))
    lingering = _wait_for_threads(grace)
    if lingering:
        line = (f"the script's non-daemon thread(s) {', '.join(lingering)} were still running "
                f"{grace:g} s after it ended; stallscope ends the process without them")
        sys.stderr.write(f"stallscope: {line}\n")
        ending.notes.append(line[0].upper() + line[1:] + ".")
    describe(session, context, ending)
    # SIGTERM while analysing says so in one line (conclude names the trace kept), as Ctrl-C
    # does, instead of ending the process without a word.
    restore_sigterm = _sigterm_to_exception()
    try:
        status = conclude(context, ending.why)
    finally:
        restore_sigterm()
    if lingering:  # python would join them at exit, forever: end here instead
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)
    return status


def make_step_log(path: Path | None, scalars_dir: Path | None) -> StepLog | None:
    """`watch`'s step log into `path`, with live TensorBoard scalars in `scalars_dir` where the
    writer can be made (a missing or broken tensorboard install costs the scalars only, said
    once); None without a path."""
    if path is None:
        return None
    scalars = None
    if scalars_dir is not None:
        try:
            scalars = ScalarWriter(scalars_dir)
        except Exception as exc:  # noqa: BLE001 (any failure: the log goes on without them)
            progress.warn(f"no live TensorBoard scalars ({type(exc).__name__}: {exc})")
    return StepLog(path, scalars, live=True)


def _export_failed(failed: str, status: int, error: BaseException | None) -> int:
    """The trace could not be written (a full disk): one line saying so. A script that failed
    keeps its own status (and its traceback, as python prints it); else stallscope's exit 2."""
    if not status:
        raise OutputError(failed)
    if error is not None:
        _print_user_traceback(error)
    return fail(f"the script ended with status {status}, and stallscope {failed}", status)


def _arm_fork_guard() -> int:
    """Mark this process as the one stallscope records in, once per process registering
    `_disarm_in_child` to run in every child forked from it; this process's pid."""
    global _RECORDING_PID
    if _RECORDING_PID is None and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_disarm_in_child)
    _RECORDING_PID = os.getpid()
    return _RECORDING_PID


def _disarm_in_child() -> None:
    """In a process forked from the recorded script (os.fork(), multiprocessing's fork, a
    DataLoader worker): stallscope says nothing there, progress lines and warnings included.
    Its timers and pollers are threads, which a fork does not copy; the hooks check the pid."""
    if _RECORDING_PID is not None and os.getpid() != _RECORDING_PID:
        progress.configure(True, False)


def _end_forked_child(status: int, error: BaseException | None) -> NoReturn:
    """End a child the script forked with os.fork() that returned from the script or called
    sys.exit(), as python would end it: its traceback, its threads joined, its atexit
    functions, its output flushed, its status. Nothing of stallscope's runs: no trace, no
    report, and the profiler it inherited is left alone (stopping it, or C++'s exit handlers,
    hang in a forked child: libkineto's ConfigLoader destructor waits on a thread that the
    fork did not copy), so the process ends with os._exit."""
    try:
        if error is not None:
            _print_user_traceback(error)
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).fflush(None)  # C stdio buffers, which exit() would flush
        _REAL_EXIT(status)


def _repair_stdio() -> None:
    """A script that closed sys.stdout/sys.stderr must not cost the report or the exit status:
    stallscope's own lines go to the same descriptor again (python's stdio objects leave it
    open), or to /dev/null when the script closed that too."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name, None)
        if stream is not None and not getattr(stream, "closed", False):
            continue
        try:
            os.fstat(fd)
            fresh = open(fd, "w", encoding="utf-8", errors="backslashreplace",  # noqa: SIM115
                         closefd=False, buffering=1)
        except OSError:
            fresh = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
        setattr(sys, name, fresh)


def _hook_os_exit(session: CaptureSession, context: RunContext,
                  conclude: Conclude) -> Callable[[], None]:
    """While the script runs, `os._exit(n)` from its main thread first writes the steps
    recorded so far and the report (python runs no exit handler for it, so nothing else would);
    forked children (DataLoader workers, multiprocessing) exit untouched. Returns the undo."""
    real = os._exit
    pid = os.getpid()

    def _exit(n: int) -> None:
        if os.getpid() == pid and threading.current_thread() is threading.main_thread():
            os._exit = real
            code = n & 0xFF if isinstance(n, int) else 1
            try:
                _mute_worker_deaths(_handler(signal.SIGCHLD))
                session.finish()
                describe(session, context, Ending(
                    "exit", code, f"called os._exit({n}) (status {code})" if code else None,
                    [f"The script called os._exit({n}): stallscope wrote what it had recorded "
                     "before the process ended."]))
                conclude(context, f"called os._exit({n}) (status {code})" if code else None)
            except BaseException as exc:  # the process ends now whatever happens: say so
                with contextlib.suppress(Exception):
                    sys.stderr.write(f"stallscope: the script called os._exit({n}); the steps "
                                     f"recorded could not be written ({exc})\n")
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
        real(n)

    os._exit = _exit  # type: ignore[assignment]
    return lambda: setattr(os, "_exit", real)


def _wait_for_threads(grace_s: float) -> list[str]:
    """Wait up to `grace_s` for the script's non-daemon threads; the names of those still
    running after it (empty: the process can end the way python ends it)."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = [t for t in threading.enumerate()
                 if t is not threading.main_thread() and not t.daemon and t.is_alive()]
        left = deadline - time.monotonic()
        if not alive or left <= 0:
            return [repr(t.name) for t in alive[:5]] + (
                [f"and {len(alive) - 5} more"] if len(alive) > 5 else [])
        alive[0].join(min(left, 0.2))


def _run(target: Target, sigchld: Any) -> tuple[str, int, BaseException | None]:
    """Run the script; how it ended, its exit status, and its own exception if it raised.

    Torch's SIGCHLD handler (a DataLoader's) raises when a worker dies; once the script has
    ended, a second death (or the same one's signal, late) would raise in stallscope's own
    frames: while the script's exception is handled here it is the script's failure too, and
    the handler is muted before this returns (`_mute_worker_deaths`)."""
    try:
        return _ending(target)
    except RuntimeError as exc:
        if "DataLoader worker" not in str(exc):
            raise
        return "exception", 1, exc
    finally:
        _mute_worker_deaths(sigchld)


def _ending(target: Target) -> tuple[str, int, BaseException | None]:
    try:
        run_target(target)
    except StopScript as stop:
        return (stop.limit or "stopped"), 0, None
    except SystemExit as exc:
        return "exit", _exit_status(exc.code), None
    except KeyboardInterrupt:
        return "interrupted", EXIT_INTERRUPTED, None
    except Terminated:
        return "terminated", EXIT_TERMINATED, None
    except TimedOut:
        return TIMED_OUT, EXIT_TIMEOUT, None
    except BaseException as exc:  # the script's own error: shown as python would show it
        return "exception", 1, exc
    return "finished", 0, None


def describe(session: CaptureSession, context: RunContext, ending: Ending) -> None:
    """Fill in `context` from the session and the ending."""
    context.ended = ending.ended
    context.exit_status = ending.status
    context.step_source = session.driver.source
    context.boundaries_seen = session.boundaries
    context.unprofiled_steps_us = session.unprofiled.steps_us()
    session.unprofiled.close()  # a script that ended before the profiler started
    context.unprofiled_load = dict(session.unprofiled.load)
    rec, wait = session.recorder, session.wait
    context.steps_recorded = rec.recorded
    describe_source(context, [str(p) for p in rec.traces], rec.recorded,
                    session.sched.steps, session.foreign.seen)
    context.dataloaders = list(session.watcher.loaders)
    context.environment = {**environment(), "activities": session.activities}
    if rec.host.load:
        context.environment["host"] = dict(rec.host.load)
    probe = wait.probe_metadata()
    if probe is not None:
        context.environment["thread_probe"] = dict(probe)
    context.notes.extend(ending.notes)
    if wait.compile.wait:
        capped = wait.compile.wait >= COMPILE_WAIT_MAX
        context.notes.append(
            f"Recording began {wait.compile.wait} step(s) after --skip: torch.compile was "
            "still compiling graphs (dynamo's graph count grew in the last skipped step)"
            + ("; it still was after that many, so recording went ahead: see compile-in-steps."
               if capped else "."))
    context.window = wait.window
    if wait.window is None and wait.steady_wait:
        context.notes.append(
            f"The script ended while recording waited for steady steps ({wait.steady_wait} "
            f"step(s) past --skip {session.sched.skip}): {wait.still_moving}.")
    note = window_note(wait.window, session.sched.warmup)
    if note:
        context.notes.append(note)
    phases = session.driver.phases
    context.step_phases = [{"driver": d, "from_boundary": at + 1} for d, at in phases]
    if len(phases) > 1:
        start = wait.first_recorded_boundary
        active = [d for d, at in phases if at < start][-1] if phases[0][1] < start else None
        chain = ", then ".join(f"{d} (from step boundary {at + 1})" for d, at in phases)
        context.notes.append(
            f"The script ran in {len(phases)} phases; steps followed {chain}."
            + (f" Recording began at step boundary {start}, in the phase of {active}."
               if active and rec.recorded else ""))
    if session.budget.cut is not None:
        context.recording_cut = session.budget.cut.to_dict()
        context.notes.append(session.budget.cut.text(context.steps_requested))
    context.notes.extend(session.watcher.notes)
    if loader_overrides(context.overrides) and not session.watcher.loaders:
        context.notes.append("--set was given but the script built no torch DataLoader: "
                             "nothing was overridden.")
    if session.driver.direct:
        context.notes.append(
            "No DataLoader between optimizer steps: step boundaries were placed inside "
            "optimizer.step(), so each step's range ends just before that call returns."
        )
    if session.stop_requested and ending.ended not in ("stopped", "max steps", "duration"):
        context.notes.append(
            "The script caught stallscope's stop request (a bare except or except "
            "BaseException) and ran on."
        )


def window_note(window: dict[str, Any] | None, warmup: int) -> str | None:
    """Which steps were recorded and why those, when the wait for a steady run (capture/
    steady.py) or the one-thread probe (capture/threadprobe.py) went past --skip; None when
    recording began right after --skip."""
    probe = (window or {}).get("probe_steps") or 0
    if not window or window["steady"] is None or (window["steady"]
                                                   and not window["extra_steps"] and not probe):
        return None  # right after --skip, as asked (--no-steady-wait) or as it came
    first, extra = window["first_step"], window["extra_steps"]
    timed = (f", {probe} step(s) timed with one intra-op thread for the replay's "
             "torch_threads=1" if probe else "")
    where = (f"Recording began at step {first} ({extra} step(s) past --skip {window['skip']}"
             f"{timed} and {warmup} warm-up step(s))")
    if window["steady"]:
        return f"{where}, once the unprofiled steps were steady: {window['why']}."
    cap = ("the wait ends where the epoch's batches would no longer hold the window; run more "
           "samples or epochs for a steady one" if "left in this epoch" in window["why"] else
           f"the wait is capped at {steady.MAX_EXTRA_STEPS} steps and {steady.MAX_EXTRA_S:g} s "
           "past --skip")
    return (f"{where} although the run was still moving: {window['why']}; {cap}. The "
            "recorded steps may not show the run's steady pace.")


def _timed_out(watchdog: Watchdog) -> Ending:
    at = f" (at {watchdog.where})" if watchdog.where else ""
    limit = f"--timeout {watchdog.timeout_s:g} s"
    return Ending(
        TIMED_OUT, EXIT_TIMEOUT,
        why=f"was still running at {limit}{at}, so stallscope stopped it (status {EXIT_TIMEOUT})",
        notes=[f"The script was still running at {limit}{at}: stallscope stopped it there and "
               "kept the steps recorded before."],
    )


def _flush(session: CaptureSession) -> bool:
    """Write what the profiler holds, from the main thread (see watchdog)."""
    session.finish()
    return True


def _abandon(session: CaptureSession, context: RunContext, conclude: Conclude,
             watchdog: Watchdog | None) -> int:
    """`--timeout`, the script would not stop: conclude from the clock thread with what was
    written. The profiler is left alone: it can only be stopped from the main thread. This
    thread ends the process, so it says its own error line."""
    assert watchdog is not None
    ending = _abandoned(watchdog, session.recorder.unwritten_steps())
    try:
        describe(session, context, ending)
        return conclude(context, ending.why)
    except Exception as exc:
        return exit_line(exc)


def _abandoned(watchdog: Watchdog, lost: int) -> Ending:
    """How a script that would not stop ended: why it did not, where it was, what was lost."""
    at = f" (at {watchdog.where})" if watchdog.where else ""
    stuck = watchdog.stuck
    if watchdog.signal_taken:
        how = "it handles SIGALRM itself, which stallscope needs to interrupt it"
    elif not watchdog.landed:
        how = "it waits in C code that no exception can interrupt"
    elif not stuck.in_script:
        how = "its cleanup was still running"
    else:
        how = "it caught the stop exception and ran on, or a finally block still ran"
    if stuck.text and stuck.text != watchdog.where:
        how += f", at {stuck.text}"
    lost_text = (f"; the {lost} step(s) recorded were still in the profiler's memory and are "
                 "lost (only the script's own thread can stop it)") if lost else ""
    head = (f"was still running at --timeout {watchdog.timeout_s:g} s{at} and did not stop "
            f"within {watchdog.grace_s:g} s more ({how})")
    return Ending(
        TIMED_OUT, EXIT_TIMEOUT,
        why=f"{head}, so stallscope ended it (status {EXIT_TIMEOUT}){lost_text}",
        notes=[f"The script {head}: stallscope ended the process"
               + (f"{lost_text}." if lost else " with the steps written before.")],
    )


def failure_cause(exc: BaseException, worker_death: str | None = None) -> tuple[str, str]:
    """The script's exception in one line for the error line, and a note for the report.

    A DataLoader worker that died surfaces as `RuntimeError: DataLoader worker (pid(s) N)
    exited unexpectedly`, raised from the more precise one (killed by which signal, or the exit
    code): that one is named, with the worker's exit status where torch's words leave it out.
    When the death broke something else first (the batch being received:
    ConnectionResetError), `worker_death`, torch's own account of it, is added.
    """
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    worker = [e for e in chain if _first_line(e).startswith("DataLoader worker")]
    if worker:
        death = add_exit_status(_first_line(worker[-1]))
        cause = f"{type(worker[-1]).__name__}: {death}"
    else:
        cause = f"{type(exc).__name__}: {_first_line(exc)}".rstrip(": ")
        if worker_death is None:
            return cause, f"The script raised {cause}"
        death = add_exit_status(worker_death)
        cause = f"{cause}; {death}"
    note = f"A DataLoader worker process died mid-run: {death}"
    if "signal: Killed" in death:
        note += (" SIGKILL is what the kernel's out-of-memory killer sends: if memory ran "
                 "out, `dmesg` says so.")
    return cause, note


def _worker_death() -> str | None:
    """torch's account of a DataLoader worker of this process that died, if one did (its
    loaders are still alive here, held by the script's traceback)."""
    try:
        from torch.utils.data._utils.signal_handling import _error_if_any_worker_fails

        _error_if_any_worker_fails()
    except RuntimeError as exc:
        return _first_line(exc) or None
    except Exception:  # another torch: no account to give
        return None
    return None


def _first_line(exc: BaseException) -> str:
    """The exception's first line, without the escape sequences (colours) a script may have
    put in its message: it goes into stallscope's error line and the report."""
    text = clean(str(exc)).strip()
    line = text.splitlines()[0].strip() if text else ""
    return line if len(line) <= 240 else line[:239] + "…"


def _exit_status(code: Any) -> int:
    """What python's exit status would be for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_user_traceback(exc: BaseException) -> None:
    """The traceback python would print: stallscope's frames (the runner before the script,
    the DataLoader wrapper inside it) and runpy's leading ones are left out, in every chained
    exception too."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    seen: set[int] = set()
    todo = [te]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        frames = list(item.stack)
        while frames and _is_runpy(frames[0].filename):
            frames.pop(0)
        item.stack = traceback.StackSummary.from_list(
            [f for f in frames if not f.filename.startswith(_OURS)]
        )
        todo += [e for e in (item.__cause__, item.__context__) if e is not None]
    sys.stderr.write("".join(te.format()))


def _is_runpy(filename: str) -> bool:
    return filename.startswith(("<frozen runpy>", _OURS)) or filename.endswith("runpy.py")


def _handler(signum: int) -> Any:
    try:
        return signal.getsignal(signum)
    except (ValueError, OSError):
        return None


def _mute_worker_deaths(before: Any) -> None:
    """Once the script has ended, stop torch's SIGCHLD handler from raising into stallscope.

    A DataLoader installs a handler that raises `DataLoader worker ... is killed` in the main
    thread when a worker dies: after the script failed on that death, a second worker's (or the
    same one's signal, arriving late) would land in stallscope's own code, e.g. while the
    profiler writes the trace. A no-op handler rather than the default, because a signal
    already received would otherwise be reported as "ignored due to race condition".
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if _handler(signal.SIGCHLD) is not before:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGCHLD, _ignore)


def _ignore(_signum: int, _frame: Any) -> None:
    return None


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
    pid = os.getpid()

    def handler(signum: int, _frame: Any) -> None:
        if os.getpid() != pid:  # a forked DataLoader worker being shut down: die as it would
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
