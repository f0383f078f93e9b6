"""The analyze pipeline as one call: paths -> load -> model -> diagnose -> Report."""

from __future__ import annotations

from pathlib import Path

from stallscope.context import RunContext
from stallscope.diagnose import diagnose, diagnose_job
from stallscope.load import load_paths
from stallscope.model import build_model
from stallscope.report import Report, build_report


def analyze_paths(paths: list[Path], contexts: dict[str, RunContext] | None = None) -> Report:
    """`contexts` maps a trace's resolved path to what `stallscope run` captured beside it."""
    traces = load_paths(paths)
    contexts = contexts or {}
    models = [build_model(t) for t in traces]
    verdicts = [diagnose(m, contexts.get(str(m.trace.path.resolve()))) for m in models]
    verdicts.append(diagnose_job(models))
    return build_report(models, verdicts, [str(p) for p in paths])
