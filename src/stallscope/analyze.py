"""The analyze pipeline as one call: paths -> load -> model -> diagnose -> Report."""

from __future__ import annotations

from pathlib import Path

from stallscope.diagnose import diagnose
from stallscope.load import load_paths
from stallscope.model import build_model
from stallscope.report import Report, build_report


def analyze_paths(paths: list[Path]) -> Report:
    traces = load_paths(paths)
    models = [build_model(t) for t in traces]
    verdicts = [diagnose(m) for m in models]
    return build_report(models, verdicts, [str(p) for p in paths])
