"""`stallscope tune SCRIPT [ARGS]`: measure DataLoader settings instead of predicting them.

Every configuration runs in a fresh process (`stallscope run --set ...`), so worker pools, page
cache warm-up and allocator state of one candidate cannot flatter the next; each runs
`--repeats` times, because a few steps on a shared machine vary by tens of percent and a
speedup is only worth pasting when it exceeds that spread. The baseline runs first; what it
measured (cores, GPUs, the dataloader-bound finding, the training DataLoader) decides what is
tried (`tune_plan`). Then each candidate once, then the repeats of all of them interleaved, while
the budget lasts. A candidate wins only when the bootstrap interval of its speedup clears the
baseline's own run-to-run (A/A) noise (`commands/stats.py`).

Exit status: 0 when candidates were measured (whether or not one won), EXIT_BASELINE_ONLY (5)
when the budget fitted nothing but the baseline, so nothing was compared; a failing baseline
passes its own status through.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stallscope import progress
from stallscope.capture.overrides import Overrides, label, set_arguments
from stallscope.commands import COMMANDS, stats, tune_batch
from stallscope.commands.common import add_target_arguments, positive_float, whole_number
from stallscope.commands.tune_plan import (
    Baseline,
    baseline_from_report,
    before_text,
    change_text,
    prefetch_candidates,
    training_loader,
    worker_candidates,
)
from stallscope.errors import (
    EXIT_NO_STEPS,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    InputError,
    StallscopeError,
)
from stallscope.replay.unload import steps_others_share
from stallscope.report.tune_writers import (
    TUNE_FILES,
    render_html,
    render_markdown,
    render_terminal,
)
from stallscope.trace.otherload import OTHER_LOAD_PCT
from stallscope.units import ms, percent

NAME = "tune"
TAKES_SCRIPT = True  # everything after SCRIPT (or -m MODULE) is the script's
RUN_STEPS = 5
# Steps timed (unprofiled) per run, at least: 5 let one slow round swing a 2-worker run's mean
# 22-30 ms on loader_bound.py; 8 hold it steadier for a few more seconds per run.
TIMED_STEPS = 8
# A candidate's run is timed on steps before the profiler starts; it records these few only so
# that `run` completes as usual (the baseline records RUN_STEPS: its findings drive the sweep).
CANDIDATE_PROFILED_STEPS = 1
RUN_SKIP = 2  # `stallscope run`'s default --skip
RUN_WARMUP = 1  # and its default --warmup
DEFAULT_BUDGET_S = 300.0
DEFAULT_REPEATS = 3
# A candidate run that takes this many times the baseline's wall time (plus a margin for
# worker start-up) is taken as hung, e.g. workers deadlocked, and stopped.
HANG_FACTOR = 5
HANG_MARGIN_S = 60.0
TIE_PCT = 5.0
# tune's partial result: the budget fitted only the baseline, nothing was compared
EXIT_BASELINE_ONLY = EXIT_PARTIAL
OUTCOME_FASTER = "faster"  # a candidate's interval cleared the A/A noise
OUTCOME_NONE = "none faster"  # candidates measured, none measurably faster
OUTCOME_BASELINE_ONLY = "baseline only"  # no candidate ran


class TuneError(StallscopeError):
    """The sweep could not measure anything; carries the exit status to end with."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class RunResult:
    """One `stallscope run` of one configuration."""

    exit_status: int
    wall_s: float
    step_us: float | None = None
    steps_us: list[float] = field(default_factory=list)
    error: str | None = None
    report: dict[str, Any] | None = None
    timing: str = "unprofiled"  # whose steps: skipped ones timed without the profiler, or not
    # Of the timed steps' wall time, what other processes took (run-queue wait): taken out of
    # step_us and steps_us; raw_step_us is the mean as timed.
    others_share: float = 0.0
    raw_step_us: float | None = None
    peak: tune_batch.Peak | None = None  # the run's peak memory (its trace's samples)

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and self.step_us is not None

    @property
    def other_cpu_pct(self) -> float | None:
        """Other processes' share of the cores while this run recorded (capture/hostload.py)."""
        env = (self.report or {}).get("environment") or {}
        host = (env.get("captured") or {}).get("host") or {}
        share = host.get("other_cpu_share_pct")
        return float(share) if isinstance(share, int | float) else None

    def as_json(self) -> dict[str, Any]:
        return {
            "exit_status": self.exit_status,
            "wall_s": round(self.wall_s, 2),
            "step_us": self.step_us,
            "steps_us": self.steps_us,
            "timing": self.timing,
            "others_share_pct": round(100 * self.others_share, 1),
            "raw_step_us": _round(self.raw_step_us),
            "peak_memory": self.peak.as_json() if self.peak is not None else None,
            **({"error": self.error} if self.error else {}),
        }


@dataclass
class Candidate:
    """A configuration and what its runs measured (or why it was not run)."""

    overrides: Overrides
    stage: str  # baseline, num_workers, prefetch_factor or batch_size
    runs: list[RunResult] = field(default_factory=list)
    skipped: str | None = None  # why it never ran
    refused: str | None = None  # why it was not run: its predicted memory would not fit
    predictions: list[tune_batch.Prediction] = field(default_factory=list)
    short: str | None = None  # why it ran fewer times than --repeats
    interval: stats.Interval | None = None  # its speedup over the baseline, with the interval
    verdict: str | None = None  # stats.FASTER / SLOWER / SAME

    @property
    def samples(self) -> list[list[float]]:
        """Each successful run's step times (its mean alone where the report listed none)."""
        return [r.steps_us or [r.step_us] for r in self.runs if r.ok and r.step_us is not None]

    @property
    def means(self) -> list[float]:
        """Each successful run's mean step (its throughput)."""
        return [r.step_us for r in self.runs if r.ok and r.step_us is not None]

    @property
    def step_us(self) -> float | None:
        """The median over runs of each run's mean step. The mean, not the median step: with
        W workers batches arrive in rounds, W-1 fast steps then one that waits (4 workers of a
        storage-waiting loader, measured: steps of 2.7-7.4 ms and one of 57.8 ms, a median of
        3.9 ms; over whole rounds the mean is the loading per batch over the workers, 68 / 4 =
        17 ms, the true cost of a batch). The median over runs: one run slowed by
        another process on the machine does not drag it (measured here: 66 ms and 9516 ms
        runs of the same script)."""
        return statistics.median(self.means) if self.means else None

    @property
    def spread_us(self) -> list[float] | None:
        """Lowest and highest per-run mean step: the range the next run is likely to land in."""
        return [min(self.means), max(self.means)] if self.means else None

    @property
    def peak(self) -> tune_batch.Peak | None:
        """The largest peak memory of its runs (host and device apart)."""
        peaks = [r.peak for r in self.runs if r.peak is not None]
        if not peaks:
            return None
        host = [p.host_bytes for p in peaks if p.host_bytes is not None]
        dev = [p.device_bytes for p in peaks if p.device_bytes is not None]
        cap = [p.device_capacity_bytes for p in peaks if p.device_capacity_bytes is not None]
        return tune_batch.Peak(max(host) if host else None, max(dev) if dev else None,
                               max(cap) if cap else None)

    @property
    def status(self) -> str:
        if self.refused:
            return "refused"
        if self.skipped:
            return "skipped"
        return "measured" if self.means else "failed"

    def as_json(self, baseline: Candidate | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "overrides": self.overrides,
            "label": label(self.overrides),
            "stage": self.stage,
            "status": self.status,
            "step_us": _round(self.step_us),
            "spread_us": [_round(v) for v in self.spread_us] if self.spread_us else None,
            "peak_memory": self.peak.as_json() if self.peak is not None else None,
            "runs": [r.as_json() for r in self.runs],
        }
        if baseline is not None:
            out["speedup"] = _speedup(baseline, self)
            out["interval"] = self.interval.as_json() if self.interval else None
            out["verdict"] = self.verdict
        if self.skipped:
            out["skipped"] = self.skipped
        if self.short:
            out["short"] = self.short
        if self.refused:
            out["refused"] = self.refused
        if self.predictions:
            out["predicted_memory"] = [p.as_json() for p in self.predictions]
        return out


Launcher = Callable[[Overrides, float | None], RunResult]


# ---------------------------------------------------------------------------- command line


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The `tune` subcommand; returned so the CLI can split SCRIPT's arguments off exactly as
    for `run`."""
    tune = sub.add_parser(
        NAME,
        help=COMMANDS[NAME],
        usage="stallscope tune [OPTIONS] (SCRIPT | -m MODULE) [ARGS...]",
        description="Run the script as it is (the baseline), then with DataLoader settings "
        "chosen from what the baseline measured (num_workers up to the cores this process may "
        "use, or up to 4 per core when the loader waits on storage, persistent_workers, "
        "pin_memory when a GPU is used, prefetch_factor), each in a "
        f"fresh `stallscope run --set ...` process for {RUN_STEPS} recorded steps (after the "
        "batches its workers prefetch); each candidate runs once, then the repeats of all, "
        "the baseline included, interleaved while the budget lasts. A candidate wins only "
        "when the 95% bootstrap interval of its speedup clears the baseline's own "
        "run-to-run noise; otherwise: no measurable difference. "
        "Writes tune.json, tune.md and tune.html with the winner, its speedup and interval, "
        "and the constructor change at the DataLoader's call site. Exit status 0 when "
        f"candidates were measured, {EXIT_BASELINE_ONLY} when the budget fitted only the "
        "baseline (nothing compared).",
    )
    add_target_arguments(tune, "./stallscope-tune-<script name>",
                         "overwrite an earlier tune result")
    tune.add_argument("--budget", type=positive_float, default=DEFAULT_BUDGET_S,
                      metavar="SECONDS",
                      help="launch no run, the baseline's repeats included, that would end "
                      "after this many seconds, estimated from the wall time of the runs so "
                      "far; the baseline's first run always runs "
                      f"(default {DEFAULT_BUDGET_S:.0f})")
    tune.add_argument("--repeats", type=whole_number(1), default=DEFAULT_REPEATS, metavar="N",
                      help="runs per configuration, budget permitting; the median of their mean "
                      "steps is compared (a mean: with workers, batches arrive in rounds), "
                      "with a bootstrap interval over runs and rounds of steps; the "
                      "baseline's repeats measure the run-to-run noise a win must exceed "
                      f"(default {DEFAULT_REPEATS})")
    tune.add_argument("--timeout", type=positive_float, metavar="SECONDS",
                      help="stop any run, the baseline included, whose script is still running "
                      "this many seconds after it started (`run --timeout`); it counts as "
                      f"failed (default: none for the baseline; a candidate is stopped after "
                      f"{HANG_FACTOR}x the baseline's time per run plus {HANG_MARGIN_S:.0f} s)")
    tune.add_argument("--batch-sizes", type=_batch_sizes, metavar="auto|N,N,...",
                      help="also try these DataLoader batch sizes (auto: half, twice and four "
                      "times the script's) on the fastest worker configuration, smallest "
                      "first, compared in samples per second with 95%% intervals; a size whose "
                      "peak memory, predicted from the sizes measured before it, would not fit "
                      "the container's limit (or the memory available; the device's capacity "
                      "on a GPU) is refused, not run. Off by default. The learning rate "
                      "follows the batch: the most samples per second is not the best training")
    tune.add_argument("-q", "--quiet", action="store_true",
                      help="print nothing on success: no summary, no progress lines")
    return tune


def _batch_sizes(text: str) -> tune_batch.Asked:
    try:
        return tune_batch.parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(args: argparse.Namespace, script_args: list[str], command: list[str]) -> int:
    """Measure the baseline and the candidates, write OUT/tune.{json,md,html}, print a summary."""
    from stallscope.capture.target import Target, check_target

    target = Target(args.target, tuple(script_args), args.module)
    check_target(target)
    out = (args.out or Path.cwd() / f"stallscope-tune-{target.stem}").resolve()
    prepare_tune_dir(out, args.force)
    progress.configure(args.quiet, True)
    target_argv = (["-m"] if target.is_module else []) + [target.name, *target.args]

    baseline: list[dict[str, Any] | None] = [None]  # the baseline's first report

    def launch(overrides: Overrides, timeout: float | None) -> RunResult:
        limits = [t for t in (timeout, args.timeout) if t is not None]  # the stricter one
        epoch = (epoch_batches(baseline[0], overrides.get("batch_size")) if baseline[0]
                 else None)
        result = run_once(overrides, target_argv, min(limits) if limits else None, epoch)
        if not overrides and baseline[0] is None and result.report is not None:
            baseline[0] = result.report
        return result

    asked = getattr(args, "batch_sizes", None)
    result = sweep(launch, args.repeats, args.budget, batches=asked,
                   limit=tune_batch.host_limit() if asked is not None else None)
    result["script"] = target.name
    result["command"] = shlex.join(command)
    write_outputs(result, out)
    if not args.quiet:
        sys.stdout.write(render_terminal(result, out))
    if result["outcome"] == OUTCOME_BASELINE_ONLY:  # said even under -q: it is no result
        sys.stderr.write(f"stallscope: only the baseline ran: the {args.budget:.0f} s budget "
                         f"fitted no candidate, nothing was compared (exit "
                         f"{EXIT_BASELINE_ONLY}); {out / 'tune.json'} says what was skipped\n")
        return EXIT_BASELINE_ONLY
    failed = [c for c in result["candidates"] if c["status"] == "failed"]
    ran = [c for c in result["candidates"] if c["status"] != "skipped"]
    if ran and len(failed) == len(ran):
        first = failed[0]["runs"][0]
        raise TuneError(
            f"every candidate run failed ({first.get('error') or 'no report'}); the baseline "
            f"and the errors are in {out / 'tune.json'}",
            first["exit_status"] or EXIT_USAGE,
        )
    return EXIT_OK


def prepare_tune_dir(out: Path, force: bool) -> None:
    """Refuse, before an expensive sweep, to overwrite an earlier result without --force."""
    from stallscope.outputs import prepare_out_dir

    prepare_out_dir(out, force, TUNE_FILES)


def run_command(overrides: Overrides, target_argv: list[str], out: Path,
                timeout: float | None = None, epoch: int | None = None) -> list[str]:
    """The `stallscope run` command line that measures one configuration. tune sets the window
    itself (the prefetched batches skipped, then its timed steps), so run's own wait for steady
    steps is off: it would spend batches an epoch may not have."""
    limit = ["--timeout", f"{timeout:g}"] if timeout is not None else []
    skip = skip_for(overrides) + timed_steps(overrides, epoch)  # the timed ones come last
    steps = RUN_STEPS if not overrides else CANDIDATE_PROFILED_STEPS
    return [
        sys.executable, "-m", "stallscope", "run", "-q", "--force", "-o", str(out),
        "--skip", str(skip), "--steps", str(steps), "--no-steady-wait", *limit,
        *set_arguments(overrides), *target_argv,
    ]


def timed_steps(overrides: Overrides, epoch: int | None = None) -> int:
    """`steps_for`, fitted to an epoch of `epoch` batches when it is known: the skipped and
    prefetched batches, the timed steps, run's warm-up step and the recorded ones must fit, or an
    8-worker candidate of a short epoch fails where 8 workers are the fastest, spends the budget on
    the failure and leaves a slower configuration chosen. Never fewer than one round of the
    workers (at least 2 steps)."""
    timed = steps_for(overrides)
    if not epoch:
        return timed
    recorded = RUN_STEPS if not overrides else CANDIDATE_PROFILED_STEPS
    room = epoch - 1 - skip_for(overrides) - RUN_WARMUP - recorded
    workers = overrides.get("num_workers")
    least = max(2, workers if isinstance(workers, int) else 0)
    return max(least, min(timed, room))


def epoch_batches(report: dict[str, Any], batch_size: int | None = None) -> int | None:
    """Batches in an epoch of the training DataLoader, from the baseline's report: its dataset's
    length over its batch size (or over `batch_size`, a candidate's); None when the dataset has
    no length."""
    loader = training_loader(report)
    if loader is None:
        return None
    size = loader.get("dataset_len")
    batch = batch_size if batch_size is not None else loader.get("batch_size")
    if not isinstance(size, int) or not isinstance(batch, int) or batch <= 0:
        return None
    return size // batch if loader.get("drop_last") else -(-size // batch)


def steps_for(overrides: Overrides) -> int:
    """Steps to time: at least two rounds of the workers (each round W-1 fast steps and one
    that waits), so that the mean step is the loader's steady rate. They are the last steps
    `run` skips, timed with no profiler running: the profiler slows each op it records, and an
    in-process loader's ops are recorded where a worker's are not (examples/loader_bound.py
    measured 95.7 ms per profiled step at 0 workers, 41.7 ms unprofiled, in an earlier version
    of it)."""
    workers = overrides.get("num_workers")
    return max(TIMED_STEPS, 2 * workers) if isinstance(workers, int) else TIMED_STEPS


def skip_for(overrides: Overrides) -> int:
    """Steps to skip before recording a configuration: `run`'s default, plus the batches its
    workers prefetch (num_workers x prefetch_factor, torch's default 2). Recorded before that
    queue drains, a loader that cannot keep up looks fast: 4 workers of a storage-waiting loader
    measured 6.3 ms per step over the prefetched batches, against 17 ms of loading per batch."""
    workers = overrides.get("num_workers")
    if not isinstance(workers, int) or workers <= 0:
        return RUN_SKIP
    depth = overrides.get("prefetch_factor")
    return RUN_SKIP + workers * (depth if isinstance(depth, int) and depth > 0 else 2)


def run_once(overrides: Overrides, target_argv: list[str], timeout: float | None,
             epoch: int | None = None) -> RunResult:
    """Run one configuration in a fresh process and read its report.json.

    With a `timeout` the run stops its own script (`run --timeout`: its DataLoader workers end
    with it, and its error says where the script was); the process is killed only if it
    outlives that by HANG_MARGIN_S."""
    with tempfile.TemporaryDirectory(prefix="stallscope-tune-") as tmp:
        out = Path(tmp) / "run"
        env = {**os.environ, progress.ENV: "0"}
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                run_command(overrides, target_argv, out, timeout, epoch), capture_output=True,
                text=True, env=env, check=False,
                timeout=None if timeout is None else timeout + HANG_MARGIN_S,
            )
        except subprocess.TimeoutExpired as exc:
            return RunResult(EXIT_TIMEOUT, time.monotonic() - t0,
                             error=f"killed after {exc.timeout:.0f} s: taken as hung")
        wall = time.monotonic() - t0
        error = _last_error(proc.stderr) if proc.returncode else None
        report_path = out / "report.json"
        if not report_path.is_file():
            if not overrides:  # the baseline's findings drive the sweep: it needs its report
                return RunResult(proc.returncode or 1, wall,
                                 error=error or "the run wrote no report.json")
            return _timed_only(out, proc.returncode, wall, error,
                               timed_steps(overrides, epoch))
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return RunResult(proc.returncode or 1, wall, error=f"unreadable report.json: {exc}")
        peak = run_peak(report)  # before the run's folder, its trace with it, is gone
    timed = timed_steps(overrides, epoch)
    run = report.get("run") or {}
    unprofiled = [float(v) for v in run.get("unprofiled_steps_us") or []]
    if len(unprofiled) >= timed:
        steps = unprofiled[-timed:]
        result = _unloaded(proc.returncode, wall, steps, run.get("unprofiled_load"), error,
                           report)
    else:  # an older run, or a script that ended before: the profiled steps, said in tune.json
        steps = [float(s["duration_us"]) for s in report.get("steps") or []]
        mean = ((report.get("summary") or {}).get("step_time_us") or {}).get("mean")
        result = RunResult(proc.returncode, wall, float(mean) if mean is not None else None,
                           steps, error, report, timing="profiled")
    result.peak = peak
    return result


def run_peak(report: dict[str, Any]) -> tune_batch.Peak | None:
    """The run's peak memory from the memory samples in its trace (`stallscope run` writes
    them into the trace's metadata, not report.json); None where there are none."""
    from stallscope.trace.load import discover, load_trace

    folder = (report.get("run") or {}).get("trace_dir")
    try:
        paths = discover(Path(folder)) if folder else []
        mem = load_trace(paths[0]).capture.get("memory") if paths else None
    except (InputError, OSError, ValueError):
        return None
    return tune_batch.run_peak(mem)


def _unloaded(status: int, wall: float, steps: list[float], load: Any,
              error: str | None = None, report: dict[str, Any] | None = None) -> RunResult:
    """A run measured on its timed unprofiled steps, less other processes' share of them."""
    share = others_share(load if isinstance(load, dict) else {}, steps)
    kept = [v * (1.0 - share) for v in steps]
    return RunResult(status, wall, statistics.fmean(kept), kept, error, report,
                     timing="unprofiled", others_share=share,
                     raw_step_us=statistics.fmean(steps))


def others_share(load: dict[str, Any], steps: list[float]) -> float:
    """Of the timed steps' wall time, the share their stepping thread waited for cores other
    processes held (replay/unload.py): the neighbours' doing, not the configuration's. Beside busy
    neighbours, runs of one configuration differ by more than the effect being measured."""
    runs, waits = load.get("main_run_us"), load.get("main_wait_us")
    if not isinstance(runs, list) or not isinstance(waits, list) or len(runs) < len(steps) \
            or len(waits) != len(runs):
        return 0.0
    n = len(steps)
    try:
        return steps_others_share(load, float(sum(runs[-n:])), float(sum(waits[-n:])),
                                  float(sum(steps)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0.0


def _timed_only(out: Path, status: int, wall: float, error: str | None,
                timed: int) -> RunResult:
    """A run that recorded nothing (its script ended first) still timed its skipped steps
    (run.json, report/unrecorded.py): enough of them measure the configuration."""
    try:
        seen = json.loads((out / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        seen = {}
    steps = [float(v) for v in seen.get("unprofiled_steps_us") or []]
    if status == EXIT_NO_STEPS and len(steps) >= timed:
        return _unloaded(0, wall, steps[-timed:], seen.get("unprofiled_load"))
    return RunResult(status or 1, wall, error=error or "the run wrote no report.json")


def _last_error(stderr: str) -> str:
    """The child's `stallscope:` line, else its last line: the one that says what went wrong."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    mine = [ln for ln in lines if ln.startswith("stallscope:")]
    text = (mine or lines or ["exited without a message"])[-1]
    return text.removeprefix("stallscope:").strip()


# ---------------------------------------------------------------------------- the sweep


class Schedule:
    """Launches runs while the budget lasts: a run starts only when, at the median wall time of
    that configuration's runs so far (of all runs before its first), it ends within the budget.
    Once one does not fit, nothing more is launched: the rest is recorded as skipped."""

    def __init__(self, launch: Launcher, budget_s: float, clock: Callable[[], float]) -> None:
        self.launch, self.budget_s, self.clock = launch, budget_s, clock
        self.start = clock()
        self.walls: list[float] = []
        self.over: str | None = None  # why launching stopped

    def run(self, cand: Candidate, timeout: float | None) -> RunResult | None:
        """One more run of `cand`, or None (and `cand` marked) when it would overrun."""
        own = [r.wall_s for r in cand.runs]
        per_run = statistics.median(own or self.walls)
        ends = self.clock() - self.start + per_run
        if self.over is None and ends > self.budget_s:
            self.over = (f"budget: a run of about {per_run:.0f} s would end at {ends:.0f} s, "
                         f"after the {self.budget_s:.0f} s budget")
        if self.over is not None:
            if cand.runs:
                cand.short = f"{len(cand.runs)} run(s) instead of the repeats asked: {self.over}"
            else:
                cand.skipped = self.over
            progress.say(f"skipping {label(cand.overrides) or 'baseline'}: over the budget")
            return None
        progress.say(f"{label(cand.overrides) or 'baseline'}: run {len(cand.runs) + 1}")
        result = self.launch(cand.overrides, timeout)
        cand.runs.append(result)
        self.walls.append(result.wall_s)
        _say_run(cand, result)
        return result


def sweep(launch: Launcher, repeats: int, budget_s: float,
          clock: Callable[[], float] = time.monotonic,
          batches: tune_batch.Asked | None = None,
          limit: tune_batch.Limit | None = None) -> dict[str, Any]:
    """Baseline once, each candidate once (worker counts, then prefetch_factor on the fastest,
    then, when `batches` asks, batch sizes on the fastest that fit `limit`), then further
    rounds of all of them, interleaved, up to `repeats` runs each while the budget lasts: a
    machine that drifts slows every configuration alike, and the budget is spent on candidates
    before the baseline's repeats. The tune.json document."""
    schedule = Schedule(launch, budget_s, clock)
    baseline = Candidate({}, "baseline")
    progress.say("baseline: run 1")
    first = schedule.launch({}, None)
    baseline.runs.append(first)
    schedule.walls.append(first.wall_s)
    _say_run(baseline, first)
    if not first.ok:  # a script that fails once fails again: say so now
        raise TuneError(f"the baseline run failed: {first.error or 'no step was measured'}",
                        first.exit_status or EXIT_USAGE)
    assert first.report is not None
    try:
        base = baseline_from_report(first.report)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    hang = HANG_FACTOR * first.wall_s + HANG_MARGIN_S
    candidates: list[Candidate] = []

    def once(overrides: Overrides, stage: str) -> None:
        cand = Candidate(overrides, stage)
        candidates.append(cand)
        schedule.run(cand, hang)

    for overrides in worker_candidates(base):
        once(overrides, "num_workers")
    fastest = min([c for c in candidates if c.step_us is not None],
                  key=lambda c: c.step_us or 0.0, default=baseline)
    for overrides in prefetch_candidates(base, fastest.overrides):
        once(overrides, "prefetch_factor")
    sized: list[Candidate] = []
    why_not = None
    if batches is not None:
        why_not = batch_stage(schedule, base, fastest, batches, limit, hang, sized)
    for _ in range(1, repeats):
        for cand in [baseline, *candidates, *sized]:
            if cand.skipped or cand.refused or not all(r.ok for r in cand.runs):
                continue  # not run, or failed: a failing configuration fails again
            schedule.run(cand, None if cand is baseline else hang)
    result = _document(base, baseline, candidates, repeats, budget_s, clock() - schedule.start)
    if batches is not None:
        result["batch_sizes"] = batch_document(base, fastest, sized, limit, why_not)
    return result


def batch_stage(schedule: Schedule, base: Baseline, reference: Candidate,
                asked: tune_batch.Asked, limit: tune_batch.Limit | None, hang: float,
                out: list[Candidate]) -> str | None:
    """Each batch size on `reference` (the fastest worker configuration), smallest first, each
    judged before it runs against the peaks measured so far (tune_batch.judge): one that would
    not fit is refused, not run. Fills `out`; returns why no size was tried, or None."""
    current = base.loader.get("batch_size")
    if not isinstance(current, int) or current <= 0:
        return ("the training DataLoader takes no batch_size (it was given a batch_sampler, or "
                "batches are made in the dataset): no batch size was tried")
    host: list[tuple[int, int]] = []
    device: list[tuple[int, int]] = []

    def add(cand: Candidate, batch: int) -> None:
        peak = cand.peak
        if peak is not None and peak.host_bytes:
            host.append((batch, peak.host_bytes))
        if peak is not None and peak.device_bytes:
            device.append((batch, peak.device_bytes))

    add(reference, current)
    for batch in tune_batch.candidate_sizes(asked.sizes, current):
        cand = Candidate({**reference.overrides, "batch_size": batch}, "batch_size")
        out.append(cand)
        cap = (reference.peak or tune_batch.Peak(None)).device_capacity_bytes
        device_limit = tune_batch.Limit(cap, "the device's capacity") if cap else None
        cand.predictions, cand.refused = tune_batch.judge(batch, host, limit, device,
                                                          device_limit)
        if cand.refused:
            progress.say(f"batch_size={batch}: refused, {cand.refused}")
            continue
        if schedule.run(cand, hang) is not None:
            add(cand, batch)
    return None


def batch_document(base: Baseline, reference: Candidate, sized: list[Candidate],
                   limit: tune_batch.Limit | None, why_not: str | None) -> dict[str, Any]:
    """tune.json's `batch_sizes`: each size's samples per second with its interval, its ratio
    to the reference's (the fastest worker configuration at the script's batch size) with the
    verdict against the reference's own run-to-run noise, its peak memory and predictions."""
    current = base.loader.get("batch_size")
    out: dict[str, Any] = {"reference": label(reference.overrides), "batch_size": current,
                           "limit": limit.as_json() if limit else None,
                           "caveat": tune_batch.CAVEAT, "why_not": why_not, "rows": [],
                           "best": None, "change": None, "fit": None}
    if why_not is not None or not isinstance(current, int):
        return out
    noise, _ = stats.aa_noise(reference.samples, _block(base, reference.overrides))
    points = []
    for cand in [reference, *sized]:
        batch = int(cand.overrides.get("batch_size", current))
        row = _batch_row(base, reference, cand, batch, current, noise)
        out["rows"].append(row)
        peak = cand.peak
        if peak is not None and peak.host_bytes:
            points.append((batch, peak.host_bytes))
    out["rows"].sort(key=lambda r: r["batch_size"])
    fit = tune_batch.fit_line(points)
    out["fit"] = fit.as_json() if fit is not None else None
    wins = [r for r in out["rows"] if r["verdict"] == stats.FASTER]
    if wins:
        best = max(wins, key=lambda r: r["samples_per_s"] or 0.0)
        out["best"] = best["batch_size"]
        out["change"] = change_text(base.loader, {"batch_size": best["batch_size"]})
    return out


def _batch_row(base: Baseline, reference: Candidate, cand: Candidate, batch: int,
               current: int, noise: float) -> dict[str, Any]:
    """One batch size's line of `batch_sizes` (see batch_document)."""
    row: dict[str, Any] = {
        "batch_size": batch, "label": label(cand.overrides), "status": cand.status,
        "runs": len(cand.samples), "step_us": _round(cand.step_us), "samples_per_s": None,
        "samples_per_s_range": None, "vs_reference": None, "verdict": None,
        "peak_memory": cand.peak.as_json() if cand.peak is not None else None,
        "predicted_memory": [p.as_json() for p in cand.predictions],
        "refused": cand.refused, "skipped": cand.skipped}
    if cand.samples:
        rate = stats.rate_interval(cand.samples, batch, _block(base, cand.overrides))
        row["samples_per_s"] = round(rate.point, 1)
        row["samples_per_s_range"] = [round(rate.low, 1), round(rate.high, 1)]
    if cand is not reference and cand.samples and reference.samples:
        step = stats.speedup_interval(reference.samples, cand.samples,
                                      _block(base, reference.overrides),
                                      _block(base, cand.overrides))
        scale = batch / current  # samples per step, against the reference's
        ratio = stats.Interval(step.point * scale, step.low * scale, step.high * scale)
        row["vs_reference"] = ratio.as_json()
        row["verdict"] = stats.classify(ratio, noise)
    return row


def _say_run(cand: Candidate, run: RunResult) -> None:
    if run.ok and run.step_us is not None:
        progress.say(f"  mean step {ms(run.step_us, 'tenths')} ms ({run.wall_s:.0f} s)")
    else:
        progress.say(f"  failed with status {run.exit_status}: {run.error}")


def _block(base: Baseline, overrides: Overrides) -> int:
    """Steps per round of workers: the block the bootstrap resamples whole."""
    workers = overrides.get("num_workers", base.loader.get("num_workers"))
    return workers if isinstance(workers, int) and workers > 0 else 1


def _best(baseline: Candidate, candidates: list[Candidate]) -> Candidate:
    """The fastest candidate whose speedup is measurable (verdict faster), else the baseline."""
    wins = [c for c in candidates if c.verdict == stats.FASTER]
    fastest = min(wins, key=lambda c: c.step_us or 0.0, default=None)
    if fastest is None:
        return baseline
    # Within TIE_PCT of the fastest is run-to-run noise on a loaded machine (measured: 327,
    # 334 and 340 ms medians swapping places between sweeps); the tie goes to the smaller
    # change, then to fewer worker processes, which cost memory.
    limit = (fastest.step_us or 0.0) * (1 + TIE_PCT / 100)
    tied = [c for c in wins if (c.step_us or 0.0) <= limit]
    return min(tied, key=lambda c: (len(c.overrides), c.overrides.get("num_workers", 0),
                                    c.step_us or 0.0))


def _busy(base: Baseline, cands: list[Candidate]) -> list[str]:
    """Each configuration's busy-machine reasons (stats.busy_reasons), labelled."""
    out = []
    for c in cands:
        other = [r.other_cpu_pct for r in c.runs if r.ok and r.other_cpu_pct is not None]
        for why in stats.busy_reasons(c.samples, _block(base, c.overrides), other,
                                      OTHER_LOAD_PCT):
            out.append(f"{label(c.overrides) or 'baseline'}: {why}")
    return out


def _document(base: Baseline, baseline: Candidate, candidates: list[Candidate],
              repeats: int, budget_s: float, elapsed_s: float) -> dict[str, Any]:
    noise, noise_how = stats.aa_noise(baseline.samples, _block(base, {}))
    for c in candidates:
        if c.step_us is None or baseline.step_us is None:
            continue
        iv = stats.speedup_interval(baseline.samples, c.samples, _block(base, {}),
                                    _block(base, c.overrides))
        c.interval = stats.Interval(baseline.step_us / c.step_us, iv.low, iv.high)
        c.verdict = stats.classify(c.interval, noise)
    best = _best(baseline, candidates)
    ran = [c for c in candidates if c.runs]
    outcome = (OUTCOME_FASTER if best is not baseline
               else OUTCOME_NONE if ran else OUTCOME_BASELINE_ONLY)
    notes = list(base.notes)
    skipped = [{"label": label(c.overrides), "reason": c.skipped}
               for c in candidates if c.skipped]
    if skipped:
        notes.append(f"skipped to stay within the {budget_s:.0f} s budget: "
                     f"{'; '.join(s['label'] for s in skipped)} (raise --budget to measure them)")
    short = [c for c in [baseline, *candidates] if c.short]
    if short:
        notes.append("fewer runs than --repeats, to stay within the budget: " + "; ".join(
            f"{label(c.overrides) or 'baseline'} ({len(c.runs)})" for c in short))
    shares = [r.others_share for c in [baseline, *candidates] for r in c.runs if r.ok]
    if shares and max(shares) > 0:
        notes.append(
            "other processes held the cores: the stepping thread waited for them "
            f"{100 * min(shares):.0f}-{percent(100 * max(shares), 0)} of the timed steps' time "
            "(the kernel's run-queue figures), taken out of each run's steps before comparing (as "
            "timed: runs[].raw_step_us)")
    busy = _busy(base, [baseline, *candidates])
    if busy:
        notes.append("busy machine, the figures are less certain (re-run on a quiet machine): "
                     + "; ".join(busy))
    change = change_text(base.loader, best.overrides) if best is not baseline else None
    rng = ([stats.rnd(best.interval.low), stats.rnd(best.interval.high)]
           if best.interval is not None else None)
    return {
        "tune_version": 2,
        "outcome": outcome,
        "exit_status": EXIT_BASELINE_ONLY if outcome == OUTCOME_BASELINE_ONLY else EXIT_OK,
        "repeats": repeats,
        "steps_per_run": RUN_STEPS,
        "budget_s": budget_s,
        "elapsed_s": round(elapsed_s, 1),
        "cores_per_process": base.cores,
        "gpu_used": base.gpu_used,
        "loader_bound": base.loader_bound,
        "suggested_num_workers": base.suggested_num_workers,
        "dataloader": base.loader,
        "statistics": {
            "figure": "median over runs of each run's mean step, less the share its stepping "
                      "thread waited for cores other processes held",
            "others_share_pct": [_round(100 * min(shares)), _round(100 * max(shares))]
            if shares else None,
            "interval": f"{percent(100 * stats.CONFIDENCE, 0)} bootstrap ({stats.RESAMPLES} "
                        f"resamples, seed {stats.SEED}): runs with replacement, steps in whole "
                        "rounds of workers",
            "aa_noise": stats.noise_json(noise),
            "aa_noise_from": noise_how,
            "win_rule": "faster only when the interval's low end exceeds 1 + aa_noise",
            "ratio_digits": stats.RATIO_DIGITS,
        },
        "busy": busy,
        "baseline": baseline.as_json(),
        "best": {**best.as_json(baseline), "speedup_range": rng},
        "speedup": _speedup(baseline, best),
        "speedup_range": rng,
        "candidates": [c.as_json(baseline) for c in candidates],
        "skipped": skipped,
        "call_site": base.call_site,
        "before": (before_text(base.loader, best.overrides, base.torch_threads)
                   if change else None),
        "change": change,
        "set_arguments": shlex.join(set_arguments(best.overrides)) if change else None,
        "notes": notes,
    }


def _speedup(baseline: Candidate, cand: Candidate) -> float | None:
    if cand.step_us is None or baseline.step_us is None:
        return None
    return stats.rnd(baseline.step_us / cand.step_us)


def _round(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


# ---------------------------------------------------------------------------- outputs


def write_outputs(result: dict[str, Any], out: Path) -> None:
    """tune.json/md/html as one set: a full disk never leaves old and new side by side."""
    from stallscope.outputs import write_files

    write_files(out, {
        "tune.json": json.dumps(result, indent=2, default=str) + "\n",
        "tune.md": render_markdown(result),
        "tune.html": render_html(result),
    })
