"""The analyze pipeline as one call: paths -> load -> model -> diagnose -> Report."""

from __future__ import annotations

from pathlib import Path

from stallscope import progress
from stallscope.context import RunContext
from stallscope.diagnose import diagnose, diagnose_job
from stallscope.load import discover, load_paths
from stallscope.model import build_model
from stallscope.report import Report, build_report
from stallscope.report.text import plain


def analyze_paths(paths: list[Path], contexts: dict[str, RunContext] | None = None) -> Report:
    """`contexts` maps a trace's resolved path to what `stallscope run` captured beside it."""
    files = list(dict.fromkeys(f for p in paths for f in discover(p)))
    progress.consider_inputs(files)  # several files or a large one: say what is happening
    progress.say(f"loading {_files_text(files)} ({progress.size_text(progress.total_size(files))})")
    traces = load_paths(paths)
    contexts = contexts or {}
    models = []
    for i, t in enumerate(traces, 1):
        progress.say(f"building the step model of {_which(t.label, i, len(traces))}")
        models.append(build_model(t))
    progress.say("diagnosing" + (f" {len(models)} traces and the job" if len(models) > 1 else ""))
    verdicts = [diagnose(m, contexts.get(str(m.trace.path.resolve()))) for m in models]
    verdicts.append(diagnose_job(models))
    return build_report(models, verdicts, [str(p) for p in paths])


def _files_text(files: list[Path]) -> str:
    if len(files) == 1:
        return plain(files[0].name)
    return f"{len(files)} trace files"


def _which(label: str, i: int, n: int) -> str:
    return plain(label) if n == 1 else f"{plain(label)} ({i}/{n})"
