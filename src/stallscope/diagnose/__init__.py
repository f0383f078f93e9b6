"""Rules: small pure functions from a TraceModel to an Assessment (GUIDE §4 ids)."""

from __future__ import annotations

from collections.abc import Callable

from stallscope.context import RunContext
from stallscope.diagnose.copies import pageable_h2d_copy
from stallscope.diagnose.dataloader import dataloader_bound
from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.sync import host_device_sync
from stallscope.model import TraceModel

# A rule sees the trace's model and, under `stallscope run`, what was captured in-process.
Rule = Callable[[TraceModel, RunContext | None], Assessment]
RULES: list[Rule] = [
    dataloader_bound,
    pageable_h2d_copy,
    host_device_sync,
]


def diagnose(model: TraceModel, context: RunContext | None = None) -> list[Assessment]:
    """Every rule's verdict on one trace, each tagged with the trace's label."""
    out = []
    for rule in RULES:
        a = rule(model, context)
        a.trace = model.trace.label
        if a.finding is not None:
            a.finding.trace = model.trace.label
        out.append(a)
    return out


def ranked_findings(assessments: list[Assessment]) -> list[Finding]:
    """Findings ordered by estimated saving, largest first (ties: worse severity first)."""
    found = [a.finding for a in assessments if a.finding is not None]
    return sorted(found, key=lambda f: (-f.estimated_saving_pct, f.id, f.trace))


__all__ = ["Assessment", "Finding", "RULES", "diagnose", "ranked_findings"]
