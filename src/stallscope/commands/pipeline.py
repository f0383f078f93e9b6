"""The analyze pipeline as one call: paths -> load -> model -> diagnose -> replay plan -> Report.

Each trace file goes through load, model, diagnose and the fix plan on its own (in parallel
processes when there are several large ones: see `fanout`); only the job-level rules and the
report need them all together.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from stallscope import fanout, progress
from stallscope.capture.context import RunContext
from stallscope.diagnose import Assessment, diagnose, diagnose_job
from stallscope.diagnose.fixes import Change
from stallscope.diagnose.plan import Plan, make_plan
from stallscope.errors import NoStepsError
from stallscope.report import Report, build_report
from stallscope.text import plain
from stallscope.trace.decode import Limits
from stallscope.trace.load import discover, infer_rank, load_trace, rank_order
from stallscope.trace.model import TraceModel, build_model


def analyze_paths(
    paths: list[Path],
    contexts: dict[str, RunContext] | None = None,
    jobs: int | None = None,
    what_if: list[Change] | None = None,
    scheduler: str | None = None,
    limits: Limits | None = None,
) -> Report:
    """`contexts` maps a trace's resolved path to what `stallscope run` captured beside it;
    `jobs` caps the worker processes (default: sized to the cores and the memory); `what_if`
    changes are replayed on every trace besides the findings' own; `scheduler` sends the
    per-file work of several files to a Dask cluster (see `fanout`); `limits` bound what one
    file may cost to read (trace/decode.py)."""
    limits = limits or Limits()
    files = list(dict.fromkeys(f for p in paths for f in discover(p)))
    contexts = contexts or {}
    progress.consider_inputs(files)  # several files or a large one: say what is happening
    workers = fanout.worker_count(files, jobs)
    size = progress.size_text(progress.total_size(files))
    if len(files) == 1:
        progress.say(f"loading {plain(files[0].name)} ({size})")
        meter = progress.Meter(f"reading {plain(files[0].name)}", fanout.text_size(files[0]))
        context = contexts.get(str(files[0].resolve()))
        results = [_analyze_file(files[0], False, context,
                                 meter if progress.active() else None, what_if, limits)]
    else:
        in_parallel = (f" on the Dask cluster {scheduler}" if scheduler
                       else f" in {workers} processes" if workers > 1 else "")
        progress.say(f"analysing {len(files)} trace files ({size}){in_parallel}")
        done: list[int] = []

        def finished(i: int) -> None:
            done.append(i)
            progress.say(f"analysed {plain(files[i].name)} ({len(done)}/{len(files)})")

        calls = [(f, True, contexts.get(str(f.resolve())), None, what_if, limits)
                 for f in files]
        results = fanout.run_each(_analyze_file, calls, workers, finished, scheduler)
    results.sort(key=lambda r: rank_order(r[0].trace))
    _label_same_ranks(results)
    models = [m for m, _, _ in results]
    if not any(m.steps for m in models):
        which = (f"{plain(files[0].name)} holds no" if len(files) == 1
                 else f"none of the {len(files)} files holds")
        raise NoStepsError(
            f'no steps found: {which} timed ("ph": "X") events that span any time'
        )
    verdicts = [v for _, v, _ in results]
    plans = [p for _, _, p in results]
    if len(models) > 1:
        progress.say(f"diagnosing the job ({len(models)} traces)")
    verdicts.append(diagnose_job(models))
    return build_report(models, verdicts, [str(p) for p in paths], plans)


def _analyze_file(
    path: Path, several: bool, context: RunContext | None, meter: progress.Meter | None,
    what_if: list[Change] | None = None, limits: Limits | None = None,
) -> tuple[TraceModel, list[Assessment], Plan | None]:
    """Load, model, diagnose and plan one file (in a worker process when there are several).

    `meter` (one file only) is fed the bytes read and makes the phases say themselves."""
    say = meter is not None
    trace = load_trace(path, meter, limits or Limits())
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
    trace.args = pd.DataFrame()  # read by the model only: not worth sending back
    return model, verdict, plan


def _label_same_ranks(
    results: list[tuple[TraceModel, list[Assessment], Plan | None]],
) -> None:
    """Files that share a rank number (two runs of one job, a retried rank) are different
    traces: each is named `rank N (file name)`, in its model, findings and assessments, so the
    report keeps them apart instead of merging them under one `rank N`."""
    labels = Counter(m.trace.label for m, _, _ in results if m.trace.rank is not None)
    for model, verdict, plan in results:
        old = model.trace.label
        if model.trace.rank is None or labels[old] < 2:
            continue
        model.trace.alias = f"{old} ({model.trace.path.name})"
        for a in verdict:
            if a.trace == old:
                a.trace = model.trace.label
            if a.finding is not None and a.finding.trace == old:
                a.finding.trace = model.trace.label
        if plan is not None and getattr(plan, "trace", None) == old:
            plan.trace = model.trace.label
