"""`with stallscope.profile(): <loop>`: profile a loop already running in this process (and
`stallscope.watch()`: the same, with every step of the block timed and analysed, as the
`watch` command does for a script).

The machinery is `stallscope run`'s own (capture/session.py): the same schedule (skip, warm up,
record), the same step boundaries (optimizer.step(), batches of DataLoaders built inside the
block, or `stallscope.step()` / `session.step()`, which win once seen), the same trace metadata.
Two differences suit a notebook cell or a loop inside a larger program: the loop is never
stopped (once the steps are recorded the profiler and the hooks are removed and the loop runs
on at full speed), and the analysis runs when the block ends, into `session.report`.

The trace files are kept (in `out_dir/tensorboard/profile/`, else in a temporary folder named
by `session.trace_dir`) so the report's trace and TensorBoard command stay valid.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from stallscope import marker
from stallscope.api.result import Report
from stallscope.commands.pipeline import analyze_paths
from stallscope.commands.run import Launch
from stallscope.errors import EXIT_INTERRUPTED, NoStepsError, StallscopeError
from stallscope.outputs import prepare_out_dir
from stallscope.report.build import analyze_command, attach_run
from stallscope.runfacts import RunContext

if TYPE_CHECKING:
    from stallscope.capture.session import CaptureSession

TARGET = "stallscope.profile()"  # report.json run.target: what ran, in place of a script


def watch(steps: int = 5, skip: int = 2, out_dir: str | os.PathLike[str] | None = None, *,
          warmup: int = 1, step_on: str = "auto", steady: bool = True) -> ProfileSession:
    """`profile`, and every step of the block timed as `stallscope watch` times a script's:
    wall time, CPU time, DataLoader wait and epoch into `out_dir/watch/steps.jsonl` (a
    TensorBoard point each half second beside the trace), the whole block's series analysed
    (regimes, periodic and epoch-start stalls) into `session.report`'s `watch` section."""
    return ProfileSession(steps, skip, out_dir, warmup=warmup, step_on=step_on, steady=steady,
                          watch=True)


def profile(steps: int = 5, skip: int = 2, out_dir: str | os.PathLike[str] | None = None, *,
            warmup: int = 1, step_on: str = "auto", steady: bool = True) -> ProfileSession:
    """Profile the loop in the `with` block: `skip` steps pass (then, with `steady`, more
    until the steps have settled, as `run` waits), `warmup` warm the profiler up, `steps` are
    recorded; then the loop runs on unprofiled. On leaving the block the recorded steps are
    analysed into `session.report` (and written to `out_dir` when given).

    `step_on`: what ends a step, as `run --step-on` ("auto", "optimizer", "dataloader"), or
    "marker" for `session.step()` / `stallscope.step()` calls only."""
    return ProfileSession(steps, skip, out_dir, warmup=warmup, step_on=step_on, steady=steady)


class ProfileSession:
    """One profiling window in this process; `report` once it has ended."""

    def __init__(self, steps: int = 5, skip: int = 2,
                 out_dir: str | os.PathLike[str] | None = None, *, warmup: int = 1,
                 step_on: str = "auto", steady: bool = True, watch: bool = False) -> None:
        from stallscope.capture.steps import MODES

        for name, value, least in (("steps", steps, 1), ("skip", skip, 0), ("warmup", warmup, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise StallscopeError(f"{name} must be a whole number of at least {least}, "
                                      f"got {value!r}")
        if step_on not in MODES:
            raise StallscopeError(f"step_on must be one of {', '.join(MODES)}, got {step_on!r}")
        self.steps, self.skip, self.warmup, self.step_on = steps, skip, warmup, step_on
        self.steady = steady
        self.watch = watch
        self.step_log: Path | None = None  # `watch`: where every step is logged
        self.out_dir = Path(out_dir).expanduser().resolve() if out_dir is not None else None
        self.report: Report | None = None
        self.trace_dir: Path | None = None
        self._capture: CaptureSession | None = None
        self._stopped = False
        self._temporary: Path | None = None  # the folder made for the traces without out_dir

    # ------------------------------------------------------------------------ while it runs

    def start(self) -> ProfileSession:
        """Install the step hooks; the profiler itself starts after `skip` steps."""
        if self._capture is not None:
            raise StallscopeError("this profiling session was already used: start a new "
                                  "stallscope.profile()")
        if marker.active():
            raise StallscopeError(
                "stallscope is already profiling this process (stallscope run, a callback, or "
                "another stallscope.profile() still open): one profiler at a time"
            )
        from stallscope.capture.session import CaptureSession, Schedule

        if self.out_dir is not None:  # refused now, not after the loop has run
            prepare_out_dir(self.out_dir, force=True)
        if self.out_dir is None:
            self._temporary = Path(tempfile.mkdtemp(prefix="stallscope-profile-"))
        base = self.out_dir or self._temporary
        assert base is not None
        self.trace_dir = base / "tensorboard" / "profile"
        worker = Launch.from_env().worker
        if self.trace_dir.is_dir():  # an earlier session's traces from this host: replaced
            for old in self.trace_dir.glob(f"{worker}.*.pt.trace.json*"):
                old.unlink(missing_ok=True)
        log = None
        if self.watch:
            from stallscope.capture.runner import make_step_log

            self.step_log = base / "watch" / "steps.jsonl"
            log = make_step_log(self.step_log, self.trace_dir)
        self._capture = CaptureSession(Schedule(self.skip, self.warmup, self.steps, self.steady),
                                       self.step_on, self.trace_dir, worker, run_to_end=True,
                                       step_log=log)
        self._capture.start()
        return self

    def step(self) -> None:
        """Mark the end of one step (the same as `stallscope.step()` inside the block)."""
        if self._capture is not None and not self._stopped:
            self._capture.on_marker()

    @property
    def recording_done(self) -> bool:
        """All requested steps are recorded (the profiler and the hooks are already off)."""
        return self._capture is not None and self._capture.recorder.done

    @property
    def ended(self) -> bool:
        """`stop()` was called (by the `with` block's end, or by a callback)."""
        return self._stopped

    @property
    def steps_recorded(self) -> int:
        return self._capture.recorder.recorded if self._capture is not None else 0

    @property
    def traces(self) -> list[Path]:
        """The trace files this session wrote."""
        return list(self._capture.recorder.traces) if self._capture is not None else []

    # ------------------------------------------------------------------------ the end

    def stop(self, ended: str = "finished", status: int = 0) -> Report:
        """Stop profiling (writing a step cut short as a partial trace), analyse the recorded
        steps, write the report to `out_dir` when given; the Report. `ended` and `status` say
        how the profiled code ended, as report.json's `run` does for a script."""
        if self._capture is None:
            raise StallscopeError("this profiling session was never started")
        if self._stopped:
            if self.report is None:
                raise StallscopeError("this profiling session ended without a report")
            return self.report
        self._stopped = True
        from stallscope.capture.runner import Ending, describe

        capture = self._capture
        capture.finish()
        ctx = RunContext(command=[], target=TARGET, steps_requested=self.steps)
        describe(capture, ctx, Ending(ended, status))
        if not capture.recorder.traces:
            if self._temporary is not None:  # nothing in it worth keeping
                shutil.rmtree(self._temporary, ignore_errors=True)
            raise NoStepsError(self._no_steps(ctx))
        assert self.trace_dir is not None
        report = analyze_paths(list(capture.recorder.traces),
                               contexts={str(p.resolve()): ctx for p in capture.recorder.traces})
        report.source["command"] = analyze_command(report.source["paths"], None, False)
        attach_run(report, [ctx], self.trace_dir, self.trace_dir.parent)
        if self.step_log is not None:
            from stallscope.commands.run import later_captures
            from stallscope.report.watch_view import watch_report

            report = watch_report(self.step_log, report, later_captures(self.step_log))
        self.report = Report(report)
        if self.out_dir is not None:
            self.report.save(self.out_dir)
        return self.report

    def _no_steps(self, ctx: RunContext) -> str:
        """Why nothing was recorded, and what to do, in the caller's terms."""
        batches = sum(d.batches for d in ctx.dataloaders)
        if ctx.step_source is None:
            drew = (f"drew {batches} DataLoader batch(es) but never called optimizer.step()"
                    if batches else "never called optimizer.step() on a torch.optim optimizer "
                    "nor drew a batch from a DataLoader built inside it")
            return (f"no step recorded: the profiled code {drew}, and never called "
                    "stallscope.step(); call session.step() (or stallscope.step()) at the end "
                    "of each iteration")
        return (f"no step recorded: the profiled code ended after {ctx.boundaries_seen} step(s), "
                f"before recording began (skip={self.skip}, warmup={self.warmup}, then "
                f"{self.steps} recorded); run more iterations or lower skip")

    def __enter__(self) -> ProfileSession:
        try:
            return self.start()
        except StallscopeError as exc:
            raise exc.with_traceback(None) from None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            try:
                self.stop()
            except StallscopeError as error:
                raise error.with_traceback(None) from None
            return
        # The block raised: its exception goes on unchanged; the steps recorded before it are
        # still analysed (an interrupted notebook cell keeps what it recorded).
        interrupted = issubclass(exc_type, KeyboardInterrupt)
        try:
            self.stop("interrupted" if interrupted else "exception",
                      EXIT_INTERRUPTED if interrupted else 1)
        except StallscopeError:
            pass  # nothing recorded: the block's own exception says what happened
        except Exception as error:  # never hide the block's exception behind stallscope's
            warnings.warn(f"stallscope could not analyse the recorded steps: {error!r}",
                          RuntimeWarning, stacklevel=2)

    def __repr__(self) -> str:
        state = ("not started" if self._capture is None else
                 "ended" if self._stopped else
                 "recorded" if self.recording_done else "recording")
        return (f"<stallscope.ProfileSession {state}: {self.steps_recorded}/{self.steps} "
                "step(s) recorded>")
