"""The analyze pipeline as one call: paths -> load -> model -> diagnose -> replay plan -> Report.

Each trace file goes through load, model, diagnose and the fix plan on its own (in parallel
processes when there are several large ones: see `fanout`); only the job-level rules and the
report need them all together.

A job whose rank crashed has a file that cannot be read (empty, cut before its first event,
not JSON, unreadable). That file is left out and listed (a note, and `source.left_out` in
report.json) and the other ranks are analysed: the report is partial, which `analyze` says with
its own exit status (errors.EXIT_PARTIAL). A single file that cannot be read is still an error.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallscope import fanout, progress
from stallscope.commands.one_job import mixed_jobs, refusal
from stallscope.diagnose import Assessment, diagnose, diagnose_job
from stallscope.diagnose.fixes import Change
from stallscope.diagnose.plan import make_plan
from stallscope.errors import InputError, NoStepsError
from stallscope.report import Report
from stallscope.report.build import report_from
from stallscope.report.digest import TraceDigest, digest, pick_drawn
from stallscope.report.hotspots import HotTotals
from stallscope.report.timeline import trace_timeline
from stallscope.runfacts import RunContext
from stallscope.text import plain
from stallscope.trace.decode import Limits
from stallscope.trace.load import discover, infer_rank, load_trace
from stallscope.trace.model import build_model
from stallscope.trace.split import Reading
from stallscope.units import size_text


def analyze_paths(
    paths: list[Path],
    contexts: dict[str, RunContext] | None = None,
    jobs: int | None = None,
    what_if: list[Change] | None = None,
    scheduler: str | None = None,
    limits: Limits | None = None,
    reading: Reading | None = None,
) -> Report:
    """`contexts` maps a trace's resolved path to what `stallscope run` captured beside it;
    `jobs` caps the worker processes (default: sized to the cores and the memory); `what_if`
    changes are replayed on every trace besides the findings' own; `scheduler` sends the
    per-file work of several files to a Dask cluster (see `fanout`); `limits` bound what one
    file may cost to read (trace/decode.py); `reading`: a large file's parts already being read
    (trace/split.py `start`, begun before this module was imported)."""
    limits = limits or Limits()
    files = list(dict.fromkeys(f for p in paths for f in discover(p)))
    contexts = contexts or {}
    progress.consider_inputs(files)  # several files or a large one: say what is happening
    workers = fanout.worker_count(files, jobs)
    size = size_text(progress.total_size(files))
    hot: tuple[HotTotals, HotTotals] | None = None  # summed as files finish, for several
    left_out: dict[int, LeftOut] = {}  # files of a job that could not be read, by index
    if len(files) == 1:
        progress.say(f"loading {plain(files[0].name)} ({size})")
        meter = progress.Meter(f"reading {plain(files[0].name)}", fanout.text_size(files[0]))
        context = contexts.get(str(files[0].resolve()))
        # A large plain file is read on several cores (trace/split.py); --jobs caps them.
        cores = jobs if jobs is not None else fanout.usable_cores()
        one = _analyze_file(files[0], False, context, meter if progress.active() else None,
                            what_if, limits, cores, reading)
        assert not isinstance(one, LeftOut)  # a lone file that cannot be read raises
        results = [one]
    else:
        in_parallel = (f" on the Dask cluster {scheduler}" if scheduler
                       else f" in {workers} processes" if workers > 1 else "")
        progress.say(f"analysing {len(files)} trace files ({size}){in_parallel}")
        done: list[int] = []

        def finished(i: int) -> None:
            done.append(i)
            what = "left out" if i in left_out else "analysed"
            progress.say(f"{what} {plain(files[i].name)} ({len(done)}/{len(files)})")

        calls = [(f, True, contexts.get(str(f.resolve())), None, what_if, limits)
                 for f in files]
        host_ops, gpu_kernels = HotTotals(), HotTotals()
        hot = (host_ops, gpu_kernels)

        def fold(i: int, result: Analysed | LeftOut) -> Analysed | LeftOut:
            """Sum each file's hotspot totals as it arrives: thousands of ranks' name tables
            would not fit, their sum does (the ranks run the same ops)."""
            if isinstance(result, LeftOut):
                left_out[i] = result
                return result
            d = result[0]
            host_ops.add(d.host_ops)
            gpu_kernels.add(d.gpu_kernels)
            d.host_ops = d.gpu_kernels = HotTotals()
            return result

        outcomes = fanout.run_each(_analyze_file, calls, workers, finished, scheduler, fold)
        results = [r for r in outcomes if not isinstance(r, LeftOut)]
        if not results:
            raise _none_readable(list(left_out.values()))
    # By rank when known, then by file name (trace/load.py rank_order).
    results.sort(key=lambda r: (r[0].rank is None, r[0].rank or 0, r[0].path))
    _label_same_ranks(results)
    digests = [d for d, _ in results]
    mixed = mixed_jobs(digests)
    if mixed is not None:
        raise InputError(refusal(mixed))
    if not any(d.steps for d in digests):
        unread = f" ({len(left_out):,} more could not be read)" if left_out else ""
        which = (f"{plain(files[0].name)} holds no" if len(files) == 1
                 else f"none of the {len(digests)} files{unread} holds")
        raise NoStepsError(
            f'no steps found: {which} timed ("ph": "X") events that span any time'
        )
    verdicts = [v for _, v in results]
    if len(digests) > 1:
        progress.say(f"diagnosing the job ({len(digests)} traces)")
    verdicts.append(diagnose_job([d.work for d in digests]))
    _draw(digests, limits)
    report = report_from(digests, verdicts, [str(p) for p in paths], hot)
    if len(files) > 1 and left_out:
        _say_left_out(report, [left_out[i] for i in sorted(left_out)], len(files))
    return report


Analysed = tuple[TraceDigest, list[Assessment]]


@dataclass(frozen=True)
class LeftOut:
    """A file of a job that could not be read, and why (the loader's one line, less the path)."""

    path: str
    reason: str

    def row(self) -> dict[str, Any]:
        return {"path": self.path, "reason": self.reason}


# Files named one by one in the note; the rest are counted (all are in source.left_out).
NAMED_LEFT_OUT = 10


def _say_left_out(report: Report, left: list[LeftOut], total: int) -> None:
    """The note that heads a partial report, and the machine-readable list in its source."""
    named = "; ".join(f"{plain(Path(x.path).name)} ({plain(x.reason)})"
                      for x in left[:NAMED_LEFT_OUT])
    more = f"; and {len(left) - NAMED_LEFT_OUT:,} more" if len(left) > NAMED_LEFT_OUT else ""
    were = "was" if len(left) == 1 else "were"
    report.notes.insert(0, (
        f"Partial report: {len(left):,} of {total:,} trace files could not be read and {were} "
        f"left out (a rank that crashed leaves such a file): {named}{more}. The other "
        f"{total - len(left):,} were analysed; figures across ranks cover those only."))
    report.source["left_out"] = [x.row() for x in left]


def _none_readable(left: list[LeftOut]) -> InputError:
    """The error for a job none of whose files could be read: the first one's reason."""
    first = left[0]
    others = f" (and {len(left) - 1:,} more)" if len(left) > 1 else ""
    return InputError(f"none of the {len(left):,} trace files could be read: {first.path}: "
                      f"{first.reason}{others}")


def _analyze_file(
    path: Path, several: bool, context: RunContext | None, meter: progress.Meter | None,
    what_if: list[Change] | None = None, limits: Limits | None = None, cores: int = 1,
    reading: Reading | None = None,
) -> Analysed | LeftOut:
    """Load, model, diagnose, plan and digest one file (in a worker process when there are
    several): what comes back is kilobytes, not the model (report/digest.py).

    `meter` (one file only) is fed the bytes read and makes the phases say themselves.
    `several`: one file of a job, where a file that cannot be read is left out (`LeftOut`)
    rather than the job refused; a lone file that cannot be read is the error itself."""
    say = meter is not None
    try:
        trace = load_trace(path, meter, limits or Limits(), cores, reading)
    except InputError as exc:
        if not several:
            raise
        reason = str(exc).removeprefix(f"{path}: ")
        return LeftOut(str(path), reason)
    if several:
        infer_rank(trace)
    if say:
        progress.say(f"building the step model of {plain(trace.label)}")
    model = build_model(trace)
    if say:
        progress.say("diagnosing")
    verdict = diagnose(model, context)
    if say:
        progress.say("replaying the steps with each fix")
    plan = make_plan(model, verdict, what_if)
    # The report draws rank 0's median step, else the first trace's (pick_drawn): a lone file,
    # or rank 0 of a job, draws it here while its model is at hand.
    return digest(model, plan, draw=not several or trace.rank == 0), verdict


def _draw(digests: list[TraceDigest], limits: Limits) -> None:
    """The drawn trace's timeline, when its worker did not draw it (a job without a rank 0 that
    has steps): that one file is read and modelled again here."""
    drawn = pick_drawn(digests)
    if drawn is None or drawn.timeline is not None:
        return
    trace = load_trace(Path(drawn.path), None, limits)
    infer_rank(trace)
    drawn.timeline = trace_timeline(build_model(trace))
    if drawn.timeline:
        drawn.timeline["trace"] = drawn.label


def _label_same_ranks(results: list[tuple[TraceDigest, list[Assessment]]]) -> None:
    """Files that share a rank number (two runs of one job, a retried rank) are different
    traces: each is named `rank N (file name)`, in its digest, findings and assessments, so the
    report keeps them apart instead of merging them under one `rank N`."""
    labels = Counter(d.label for d, _ in results if d.rank is not None)
    for d, verdict in results:
        old = d.label
        if d.rank is None or labels[old] < 2:
            continue
        new = f"{old} ({Path(d.path).name})"
        d.relabel(new)
        for a in verdict:
            if a.trace == old:
                a.trace = new
            if a.finding is not None and a.finding.trace == old:
                a.finding.trace = new
