"""What a rule returns: a finding with its evidence, or why the rule found nothing or could not
look. Keeping the 'clear' and 'not assessed' outcomes lets the report say what was checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("high", "medium", "low", "info")

# Severity follows impact: the upper-bound share of step time a fix can save.
SEVERITY_FLOOR_PCT = {"high": 15.0, "medium": 5.0, "low": 1.0}


def severity_for(saving_pct: float) -> str:
    for level in ("high", "medium", "low"):
        if saving_pct >= SEVERITY_FLOOR_PCT[level]:
            return level
    return "info"


def severity_rank(severity: str) -> int:
    """0 for high ... 3 for info: lower is worse."""
    return SEVERITIES.index(severity)


@dataclass
class Finding:
    id: str
    title: str
    evidence: dict[str, Any]
    recommendation: str
    snippet: str
    precondition: str
    estimated_saving_pct: float
    saving_basis: str
    docs: str = ""
    trace: str = ""
    severity: str = ""  # derived from estimated_saving_pct unless given
    # Another finding's id when that one is the cause of the time lost here (fix it first).
    caused_by: str = ""
    # The replayed step time (us, median of the steps used) with this finding's change alone,
    # and its place in the fix plan (1 = first); None when its change was not replayed.
    predicted_step_us: float | None = None
    plan_rank: int | None = None
    # What estimated_saving_pct is: "replayed" (its share of the fix plan, 0 when nothing is
    # left on top of it), "counted" (an effect whose cause's fix wins this time back), or
    # "upper_bound" (the rule's own bound: the replay could not model the change).
    saving_kind: str = "upper_bound"
    # An unreplayed cause whose bound outranks its trace's fix plan (diagnose/plan.py
    # `_leads`): the report leads with it.
    leads_plan: bool = False
    # The same cause (rule, device, rank) in each recording of a report over several: each
    # one's trace, title, severity, saving and evidence (report/rank_groups.py
    # `merge_recordings`); empty when one recording shows it. The finding's own fields are
    # those of the recording the report leads with.
    recordings: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.severity:
            self.severity = severity_for(self.estimated_saving_pct)


@dataclass
class Assessment:
    """One rule applied to one trace."""

    rule: str
    status: str  # "finding", "clear" or "not_assessed"
    detail: str
    trace: str = ""
    finding: Finding | None = field(default=None)

    @classmethod
    def found(cls, finding: Finding) -> Assessment:
        return cls(finding.id, "finding", finding.title, finding=finding)
