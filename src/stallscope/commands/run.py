"""`stallscope run`: capture the script under the profiler, gather the ranks, analyse into a report.

Every process (one, or each rank under torchrun) captures its own trace into
`OUT/tensorboard/<run>/` and its context into `OUT/capture/rank-N.json`. Ranks other than 0 stop
there; rank 0 waits for the others' contexts and analyses every rank's trace into one report.
`conclude` is that second half: the capture calls it once the script has ended (or, under
`--timeout`, from its clock thread when the script would not stop). The parser is built at
start-up with every command's, so torch, pandas and the writers load only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallscope import progress
from stallscope.capture import steady
from stallscope.capture.overrides import OVERRIDE_KEYS, parse_overrides
from stallscope.capture.target import Target
from stallscope.commands import COMMANDS
from stallscope.commands.common import (
    add_target_arguments,
    add_what_if_argument,
    gate,
    seconds,
    whole_number,
    write_report,
)
from stallscope.errors import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    NoStepsError,
    OutputError,
    StallscopeError,
    Terminated,
    fail,
)
from stallscope.runfacts import RunContext

if TYPE_CHECKING:
    from stallscope.report import Report

NAME = "run"
TAKES_SCRIPT = True  # everything after SCRIPT (or -m MODULE) is the script's

# The recording's memory budget (capture/budget.py, which cannot be imported here: torch).
DEFAULT_RECORD_MB = 2048
# How long rank 0 waits, after its own script ended, for the other ranks to report.
RANK_WAIT_S = 120.0


# ---------------------------------------------------------------------------- command line


def add_parser(sub: Any) -> argparse.ArgumentParser:
    run = sub.add_parser(
        NAME,
        help=COMMANDS[NAME],
        usage="stallscope run [OPTIONS] (SCRIPT | -m MODULE) [ARGS...]",
        description="Run an unmodified training script (as `python SCRIPT ARGS` or `python -m "
        "MODULE ARGS` would) under torch.profiler, record a few training steps, stop the "
        "script, and diagnose the trace. Everything after SCRIPT or MODULE goes to the script.",
    )
    add_capture_arguments(run)
    run.add_argument("--run-to-end", action="store_true",
                     help="let the script finish after recording instead of stopping it")
    return run


def add_capture_arguments(run: argparse.ArgumentParser) -> None:
    """The options `run` and `watch` share: the script, the recorded window, the output."""
    add_target_arguments(run, "./stallscope-<script name>", "overwrite an existing report")
    run.add_argument("--skip", type=whole_number(0), default=2, metavar="N",
                     help="steps to let pass first, for one-off start-up costs (default 2)")
    run.add_argument("--warmup", type=whole_number(0), default=1, metavar="N",
                     help="steps the profiler warms up on, not recorded (default 1)")
    run.add_argument("--steps", type=whole_number(1), default=5, metavar="N",
                     help="steps to record (default 5)")
    run.add_argument("--no-steady-wait", action="store_true",
                     help="record right after --skip; by default recording waits (at most "
                     f"{steady.MAX_EXTRA_STEPS} steps, {steady.MAX_EXTRA_S:g} s) until the "
                     "unprofiled steps have settled and the loader's start-up prefetch is used")
    run.add_argument(
        "--step-on",
        choices=("auto", "optimizer", "dataloader"),
        default="auto",
        help="what ends a training step: optimizer.step(), or each DataLoader batch; auto uses "
        "the optimizer, and batches when no optimizer steps (default auto)",
    )
    run.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="pass KEY=VALUE to every DataLoader the script builds, instead of the script's own "
        "value, without editing it (torch_threads=N: torch.set_num_threads(N) in the training "
        "process for the run); repeatable; KEY is one of "
        f"{', '.join(OVERRIDE_KEYS)}, VALUE a whole number or true/false",
    )
    run.add_argument(
        "--max-record-mb", type=whole_number(0), default=DEFAULT_RECORD_MB, metavar="MB",
        help="memory the recording may add to the training process, writing the trace included "
        "(the profiler keeps every event until then, and writing takes about 4x what recording "
        "took); past it recording ends with the steps recorded so far, and the report says so; "
        f"0 for no limit (default {DEFAULT_RECORD_MB})",
    )
    run.add_argument(
        "--no-step-warning", type=seconds, default=60.0, metavar="SECONDS",
        help="say on stderr when no training step has been seen this many seconds after the "
        "script started, with what was seen and how to mark steps (default 60)",
    )
    run.add_argument(
        "--record-shapes", action="store_true",
        help="also record each op's input shapes, for TensorBoard's operator view grouped by "
        "input shape; no diagnosis reads them, and they add to every recorded op's cost and "
        "to the trace's size (docs/performance.md, benchmarks/bench_profiler_cost.py); the "
        "report says what the recording cost")
    run.add_argument(
        "--timeout", type=seconds, metavar="SECONDS",
        help="stop the script if it is still running this many seconds after it started "
        "(stallscope's own start-up and the analysis after do not count), keep the steps "
        "recorded so far, write a partial report and exit 124; a script that does not stop "
        "within min(10, SECONDS) s more is ended with what was written",
    )
    add_what_if_argument(run)
    run.add_argument("--fail-on", choices=("high", "medium", "low"),
                     help="exit 3 when a finding at or above this severity exists")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="print nothing on success: no summary, no progress lines")


def main(args: argparse.Namespace, script_args: list[str], command: list[str]) -> int:
    """Check the script and the options, capture it, and let `conclude` write the report."""
    from stallscope.capture.target import check_target
    from stallscope.diagnose.fixes import parse_what_if
    from stallscope.outputs import default_run_out_dir, prepare_out_dir

    overrides = parse_overrides(args.overrides)
    what_if = parse_what_if(args.what_if)  # a typo is refused before the script runs
    target = Target(args.target, tuple(script_args), args.module)
    check_target(target)
    # Absolute now: the script may change the working folder.
    out = (args.out or default_run_out_dir(target.stem)).resolve()
    launch = Launch.from_env()
    # Every rank of a torchrun job writes into the same folder: the lock is for other jobs.
    prepare_out_dir(out, args.force, lock=not launch.distributed)
    # Rank 0 speaks for the job (it also says when it waits for the others); every rank
    # reporting each step would interleave N copies of the same lines.
    progress.configure(args.quiet, launch.rank == 0)
    command = launch.command_prefix() + command
    watch = bool(getattr(args, "watch", False))  # `stallscope watch` (commands/watch.py)
    plan = RunPlan(target, out, command, args.force, tuple(what_if), watch)
    clear_previous(plan, launch)

    from stallscope.capture.runner import CaptureOptions, capture
    from stallscope.capture.session import Schedule

    ctx = RunContext(
        command=command,
        target=target.name,
        rank=launch.rank if launch.distributed else None,
        world_size=launch.world_size if launch.distributed else None,
    )
    options = CaptureOptions(Schedule(args.skip, args.warmup, args.steps,
                                      steady=not args.no_steady_wait), args.step_on,
                             args.run_to_end or watch, overrides, args.timeout,
                             args.max_record_mb, args.no_step_warning,
                             step_log=step_log_path(out, launch) if watch else None,
                             scalars_dir=trace_dir(plan) if watch else None,
                             record_shapes=args.record_shapes,
                             max_steps=getattr(args, "max_steps", None),
                             max_seconds=getattr(args, "duration", None))
    if watch:
        progress.say(f"watching {target.name} to its end: every step timed into "
                     f"{step_log_path(out, launch)}, {args.steps} steps recorded under the "
                     f"profiler once steady")
    else:
        progress.say(
            f"running {target.name} under the profiler: {args.skip} step(s) skipped, "
            f"{args.warmup} warm-up, {args.steps} recorded"
        )
    if overrides:
        progress.say("DataLoader overrides: " + _overrides_text(overrides))
    # The report is written by `conclude`, which the capture calls once the script has ended
    # (from its clock thread when a --timeout script would not stop).
    return capture(target, options, trace_dir(plan), launch.worker, ctx,
                   lambda c, why: conclude(plan, launch, args.quiet, args.fail_on, c, why))


def _overrides_text(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in overrides.items())


# ---------------------------------------------------------------------------- the job


@dataclass(frozen=True)
class Launch:
    """Where this process sits in a torchrun job (rank 0 of 1 when run alone)."""

    rank: int
    world_size: int
    run_id: str

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls) -> Launch:
        try:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            rank = int(os.environ.get("RANK", "0"))
        except ValueError:
            world, rank = 1, 0
        return cls(rank, max(world, 1), os.environ.get("TORCHELASTIC_RUN_ID", ""))

    def command_prefix(self) -> list[str]:
        """The launcher part of the command that reproduces this run (torchrun, if any)."""
        if not self.distributed:
            return []
        local = os.environ.get("LOCAL_WORLD_SIZE", str(self.world_size))
        nodes = self.world_size // max(int(local) if local.isdigit() else 1, 1)
        prefix = ["torchrun", "--nproc-per-node", local]
        if nodes > 1:
            prefix += ["--nnodes", str(nodes)]
        return [*prefix, "-m"]

    @property
    def worker(self) -> str:
        """Trace file prefix: the host, plus the rank in a job (the loader reads it back)."""
        host = socket.gethostname().split(".")[0] or "host"
        return f"{host}_rank-{self.rank}" if self.distributed else host


@dataclass(frozen=True)
class RunPlan:
    target: Target
    out: Path
    command: list[str]
    force: bool = False
    what_if: tuple[Any, ...] = ()  # `--what-if` changes, replayed on the recorded steps
    watch: bool = False  # `stallscope watch`: the whole run's steps are logged and analysed


def trace_dir(plan: RunPlan) -> Path:
    return plan.out / "tensorboard" / plan.target.stem


def step_log_path(out: Path, launch: Launch) -> Path:
    """Where `watch` logs every step of this process (one file per rank in a job)."""
    name = f"steps-rank-{launch.rank}.jsonl" if launch.distributed else "steps.jsonl"
    return out / "watch" / name


def later_captures(log: Path) -> list[dict[str, Any]]:
    """`watch`'s captures after the first (capture/recapture.py wrote one line each beside the
    step log), each diagnosed from its own trace (its report kept in `report`, for the page to
    lead with when its stretch lost the most); the skipped and failed ones as they are."""
    from stallscope.capture.steplog import captures_path
    from stallscope.commands.pipeline import analyze_paths
    from stallscope.report.json_writer import verdict_data

    lines = captures_path(log)
    try:
        records = [json.loads(line) for line in lines.read_text(encoding="utf-8").splitlines()
                   if line.strip()]
    except (OSError, ValueError):
        return []
    out = []
    for rec in records:
        traces = [p for p in (_kept_trace(Path(t), log) for t in rec.get("traces") or [])
                  if p is not None]
        if traces:
            try:
                report = analyze_paths(traces)
            except (StallscopeError, OSError) as exc:  # one capture's trace, not the report
                rec["failed"] = f"not analysed: {exc}"
            else:
                rec["verdict"] = verdict_data(report)
                rec["report"] = report
                if rec.get("kind") == "periodic":
                    rec["stall"] = longest_step(report.steps)
        out.append(rec)
    return out


def _kept_trace(listed: Path, log: Path) -> Path | None:
    """A later capture's trace where it was written, or at the same place below the watch
    folder when the folder was moved since (`analyze OUT` of a copied folder)."""
    if listed.is_file():
        return listed
    moved = log.parent.parent / "tensorboard" / listed.parent.name / listed.name
    return moved if moved.is_file() else None


def longest_step(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A periodic capture's stall: its longest recorded step against their median, and where
    that step's time went (the step's breakdown, as report.json's steps[] has it)."""
    timed = [s for s in steps if (s.get("duration_us") or 0) > 0]
    if len(timed) < 2:
        return None
    worst = max(timed, key=lambda s: s["duration_us"])
    durations = sorted(s["duration_us"] for s in timed)
    median = durations[len(durations) // 2]
    parts = worst.get("breakdown_us") or {}
    return {"step": worst.get("name"), "step_ms": round(worst["duration_us"] / 1e3, 3),
            "median_step_ms": round(median / 1e3, 3),
            "breakdown_pct": {k: round(100 * v / worst["duration_us"], 1)
                              for k, v in parts.items() if v}}


def context_path(out: Path, rank: int) -> Path:
    return out / "capture" / f"rank-{rank}.json"


def clear_previous(plan: RunPlan, launch: Launch) -> None:
    """Remove this rank's context left by an earlier run in `out` (it would pass for this run's)
    and, with --force, this worker's earlier traces (and the originals kept beside their
    TensorBoard plugin copies: report/tensorboard_trace.py)."""
    context_path(plan.out, launch.rank).unlink(missing_ok=True)
    if plan.force and trace_dir(plan).is_dir():
        for pattern in (f"{launch.worker}.*.pt.trace.json*", f"{launch.worker}.*.original.json*"):
            for old in trace_dir(plan).glob(pattern):
                old.unlink(missing_ok=True)


def save_context(plan: RunPlan, launch: Launch, ctx: RunContext) -> None:
    ctx.environment = {**ctx.environment, "run_id": launch.run_id}
    path = context_path(plan.out, launch.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    ctx.save(path)


def gather(plan: RunPlan, launch: Launch, own: RunContext, wait_s: float = RANK_WAIT_S
           ) -> tuple[list[RunContext], list[int]]:
    """Rank 0's view of the job: every rank's context, and the ranks that never reported."""
    if not launch.distributed:
        return [own], []
    deadline = time.monotonic() + wait_s
    found: dict[int, RunContext] = {launch.rank: own}
    waiting_said = False
    while True:
        for rank in range(launch.world_size):
            path = context_path(plan.out, rank)
            if rank in found or not path.is_file():
                continue
            try:
                ctx = RunContext.load(path)
            except (OSError, ValueError):
                continue  # being written: try again
            if ctx.environment.get("run_id", "") == launch.run_id:
                found[rank] = ctx
        if len(found) == launch.world_size or time.monotonic() > deadline:
            break
        if not waiting_said:
            waiting_said = True
            pending = [r for r in range(launch.world_size) if r not in found]
            progress.say(
                f"waiting for rank(s) {', '.join(map(str, pending))} to finish "
                f"(up to {wait_s:.0f} s)"
            )
        time.sleep(0.2)
    missing = [r for r in range(launch.world_size) if r not in found]
    progress.say(
        f"gathered {len(found)} of {launch.world_size} ranks"
        + (f"; missing: {', '.join(map(str, missing))}" if missing else "")
    )
    return [found[r] for r in sorted(found)], missing


def conclude(plan: RunPlan, launch: Launch, quiet: bool, fail_on: str | None, ctx: RunContext,
             why: str | None) -> int:
    """Gather the ranks, write the report and say how the script ended; the exit status.

    `why` is how the script ended, as a clause after "the script" ("ended with status 1
    (RuntimeError: ...)"), None when it ended well: with the script's status, it is the one
    error line.
    """
    progress.say(ended_text(ctx))
    if launch.distributed:
        save_context(plan, launch, ctx)
    if launch.rank != 0:
        return ctx.exit_status
    try:
        return _analyse(plan, launch, quiet, fail_on, ctx, why)
    except (KeyboardInterrupt, Terminated) as exc:
        if not ctx.traces:
            raise
        how, code = (("interrupted", EXIT_INTERRUPTED) if isinstance(exc, KeyboardInterrupt)
                     else ("terminated (SIGTERM)", EXIT_TERMINATED))
        return fail(f"{how} while analysing the recorded steps; the trace is kept: "
                    f"{kept_trace(plan)}", code)


def _analyse(plan: RunPlan, launch: Launch, quiet: bool, fail_on: str | None, ctx: RunContext,
             why: str | None) -> int:
    """Rank 0's half of `conclude`: gather, analyse, write the report; the exit status."""
    contexts, missing = gather(plan, launch, ctx)
    try:
        report = analyze_run(contexts, missing, plan)
        if plan.watch:
            from stallscope.report.watch_view import watch_report

            log = step_log_path(plan.out, launch)
            report = watch_report(log, report, later_captures(log))
    except NoStepsError as exc:
        seen = write_unrecorded(plan, contexts[0])
        if ctx.exit_status:
            why = why or f"ended with status {ctx.exit_status}"
            return fail(f"no step recorded: the script {why}{seen}", ctx.exit_status)
        raise NoStepsError(f"{exc}{seen}") from None
    try:
        write_report(report, plan.out, quiet, trace_dir(plan))
    except OutputError as exc:  # a full disk: the trace was written before, and is kept
        return fail(f"{_ended_badly(ctx, why)}could not write its output ({exc}); the trace is "
                    f"kept: {kept_trace(plan)}", ctx.exit_status or EXIT_USAGE)
    assert report.run is not None
    if not quiet:
        print(f"  trace: {report.run['trace_dir']}\n  open it: ui.perfetto.dev, Open trace file "
              "(read in the browser, not uploaded)\n  or: "
              f"{report.run['tensorboard_command']} (the profiler plugin's page needs internet "
              "access)")
    status = report.run["exit_status"]
    if status:
        if not (why and status == ctx.exit_status):  # another rank failed first
            why = f"ended with status {status}"
        watched = (f"the {report.watch['n_steps']:,} step(s) watched and "
                   if report.watch else "")
        return fail(f"the script {why}; the report covers {watched}the "
                    f"{report.run['steps_recorded']} step(s) recorded before that "
                    f"({plan.out / 'report.html'})", status)
    return gate(report, fail_on)


def kept_trace(plan: RunPlan) -> str:
    """Where the recorded trace is and the command that analyses it again, into another
    folder (the one given may be the full disk)."""
    return (f"{trace_dir(plan)}, analyse it again with `stallscope analyze {trace_dir(plan)} "
            "-o FOLDER`")


def _ended_badly(ctx: RunContext, why: str | None) -> str:
    """"the script ended with status 3; " for a script that failed, to lead stallscope's own
    failure's line (which keeps the script's status), else ""."""
    if not ctx.exit_status:
        return ""
    return f"the script {why or f'ended with status {ctx.exit_status}'}; "


def write_unrecorded(plan: RunPlan, ctx: RunContext) -> str:
    """What was seen of a script that ended before a step was recorded, in report.md and
    run.json (report/unrecorded.py); the clause for the error line: where it is, and the
    command that records the steps the script ran. "" for a script whose own profiler ran."""
    from stallscope.report import unrecorded

    if ctx.script_profiler is not None:
        return ""
    window = unrecorded.Window.fitting(ctx.boundaries_seen, ctx.steps_requested or 5)
    command = None if window is None else unrecorded.rerun_command(
        plan.command, len(plan.target.args) + 1, window)
    try:
        unrecorded.write(plan.out, ctx, how_it_ended(ctx), command)
    except OSError:
        return ""  # the error line says what went wrong; this is only what was seen
    where = f"what ran: {plan.out / 'report.md'}"
    if window is None or command is None:
        return f" ({where})"
    return f"; this records {window.steps} of the steps it ran: {command} ({where})"


def how_it_ended(ctx: RunContext) -> str:
    """How the script ended, as a clause after "the script"."""
    return {
        "stopped": "stopped after recording",
        "finished": "finished",
        "exit": f"exited with status {ctx.exit_status}",
        "exception": "raised an exception",
        "interrupted": "was interrupted",
        "terminated": "was terminated",
        "timed out": "was stopped at --timeout",
        "max steps": "was stopped at --max-steps",
        "duration": "was stopped at --duration",
    }.get(ctx.ended, str(ctx.ended))


def ended_text(ctx: RunContext) -> str:
    """How the script ended, for the progress line after it."""
    how = how_it_ended(ctx)
    if ctx.trace_source == "script-profiler":
        how = how.replace("stopped after recording", "stopped once its profiler wrote a trace")
        return f"the script {how}; analysing the trace its own profiler wrote"
    return f"the script {how}; {ctx.steps_recorded} step(s) recorded"


def analyze_run(contexts: list[RunContext], missing: list[int], plan: RunPlan) -> Report:
    from stallscope.commands.pipeline import analyze_paths
    from stallscope.report.build import attach_run

    paths = [Path(p) for c in contexts for p in c.traces]
    if not paths:
        raise NoStepsError(no_steps_reason(contexts[0]))
    by_path = {str(Path(p).resolve()): c for c in contexts for p in c.traces}
    progress.say(f"analysing {len(paths)} trace(s)")
    report = analyze_paths(paths, contexts=by_path, what_if=list(plan.what_if))
    attach_run(report, contexts, trace_dir(plan), plan.out / "tensorboard")
    for rank in missing:
        report.notes.append(
            f"rank {rank} did not report within {RANK_WAIT_S:.0f} s of rank 0 ending (another "
            "host, or it failed first): its trace is not in this report."
        )
    return report


def no_steps_reason(ctx: RunContext) -> str:
    """Why nothing was recorded, and what to try."""
    script = ctx.script_profiler
    if script is not None:
        return (
            f"no step recorded: the script starts its own {script['kind']} at {script['site']}"
            " before stallscope recorded a step (only one profiler can run in a process), and "
            "its profiler wrote no trace stallscope could read; export one (on_trace_ready="
            "torch.profiler.tensorboard_trace_handler(DIR), or prof.export_chrome_trace(PATH))"
            " and run `stallscope analyze` on it, or run without the script's profiler"
        )
    batches = sum(d.batches for d in ctx.dataloaders)
    if ctx.step_source is None and batches:
        return (
            f"no step recorded: the script drew {batches} DataLoader batch(es) but never "
            "called optimizer.step() on a torch.optim optimizer; try --step-on dataloader"
        )
    if ctx.step_source is None:
        return (
            "no step recorded: the script never called optimizer.step() on a torch.optim "
            "optimizer nor drew a batch from a torch DataLoader; call stallscope.step() at the "
            "end of each iteration (a no-op when stallscope is not running)"
        )
    if ctx.ended in ("max steps", "duration"):
        flag = "--max-steps" if ctx.ended == "max steps" else "--duration"
        return (
            f"no step recorded: {flag} stopped the script before recording began "
            f"(after --skip, --warmup and the wait for steady steps); raise {flag}"
        )
    return (
        "no step recorded: the script ended before recording began (during the --skip and "
        "--warmup steps" + (", and the wait for steady steps" if ctx.window is None and any(
            "waited for steady steps" in n for n in ctx.notes) else "")
        + "); lower them or let the script run more steps"
    )
