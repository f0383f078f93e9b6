"""Rules: small pure functions from a TraceModel to an Assessment, one module each
(diagnose/rules/, collected by diagnose/registry.py). Their ids are stable (docs/architecture.md,
"The diagnosis catalogue").
"""

from __future__ import annotations

from collections.abc import Callable

from stallscope.diagnose.finding import Assessment, Finding
from stallscope.diagnose.registry import JOB_RULES as JOB_SPECS
from stallscope.diagnose.registry import TRACE_RULES
from stallscope.diagnose.rules.rank_imbalance import RankWork, rank_work
from stallscope.runfacts import RunContext
from stallscope.trace.model import TraceModel
from stallscope.units import percent

# A rule sees the trace's model and, under `stallscope run`, what was captured in-process
# (diagnose/registry.py lists them, each declared in its own module).
Rule = Callable[[TraceModel, RunContext | None], Assessment]
RULES: list[Rule] = [spec.check for spec in TRACE_RULES]


# Rules over all the traces of one job (several ranks) at once. They see each rank's RankWork
# (diagnose/rules/rank_imbalance.py), not its model: a job's models do not fit in one process.
JOB_RULES: list[Callable[[list[RankWork | None]], Assessment]] = [s.check for s in JOB_SPECS]

# (effect, evidence key, cause), from each rule's SPEC `causes` (diagnose/spec.py Cause): when
# the effect's evidence says that at least CAUSE_SHARE_PCT of its lost time coincides with the
# cause's, and the cause was found on the same trace, the effect is reported as caused by it
# (one lost millisecond, one owner). A None key: the effect is always the cause's when both are
# found.
CAUSES: list[tuple[str, str | None, str]] = [
    (spec.id, cause.share_key, cause.rule) for spec in TRACE_RULES for cause in spec.causes
]
CAUSE_SHARE_PCT = 50.0


def diagnose(model: TraceModel, context: RunContext | None = None) -> list[Assessment]:
    """Every rule's verdict on one trace, each tagged with the trace's label."""
    out = []
    found: dict[str, Finding] = {}  # made so far on this trace, for rules that read them
    for spec in TRACE_RULES:
        a = spec.check(model, context, found) if spec.reads else spec.check(model, context)
        if a.finding is not None:
            found[a.rule] = a.finding
        if model.too_little and a.finding is not None:
            # Nothing in the window is a training step: no finding about it can be acted on.
            a = Assessment(a.rule, "not_assessed", f"Too little to judge: {model.too_little}.")
        a.trace = model.trace.label
        if a.finding is not None:
            a.finding.trace = model.trace.label
        out.append(a)
    _attribute_causes([a.finding for a in out if a.finding is not None])
    return out


def diagnose_job(works: list[RankWork | None]) -> list[Assessment]:
    """The job-level rules over each trace's `rank_work`; their assessments carry the trace
    label `job`."""
    out = []
    for rule in JOB_RULES:
        a = rule(works)
        a.trace = "job"
        out.append(a)
    return out


def _attribute_causes(findings: list[Finding]) -> None:
    by_id = {f.id: f for f in findings}
    for effect, key, cause in CAUSES:
        f = by_id.get(effect)
        if f is None or f.caused_by or cause not in by_id:
            continue
        if key is None:
            f.caused_by = cause
            f.recommendation = f"This comes from `{cause}`: fix that first. {f.recommendation}"
            continue
        share = f.evidence.get(key)
        if isinstance(share, int | float) and share >= CAUSE_SHARE_PCT:
            f.caused_by = cause
            if f"`{cause}`" in f.recommendation:  # the rule already says so in its own words
                continue
            f.recommendation = (
                f"{percent(share, 0)} of this lost time is `{cause}`: fix that first, then "
                f"re-measure. {f.recommendation}"
            )


def ranked_findings(assessments: list[Assessment]) -> list[Finding]:
    """Findings by what fixing each saves on one base: in each trace, a cause the replay could
    not model that outranks the trace's fix plan (`Finding.leads_plan`, see plan.py) first, then
    the plan in its order (each change's share of its saving), then the other bounds, largest
    first. Across the traces of one report, places are compared alike (each trace's lead, then
    each one's second, ...), the larger saving first; ties by id and trace."""
    found = [a.finding for a in assessments if a.finding is not None]
    led = {f.trace for f in found if f.leads_plan}

    def place(f: Finding) -> int | None:
        if f.leads_plan:
            return 1
        return None if f.plan_rank is None else f.plan_rank + (f.trace in led)

    return sorted(found, key=lambda f: (place(f) is None, place(f) or 0,
                                        -f.estimated_saving_pct, f.id, f.trace))


__all__ = ["Assessment", "Finding", "JOB_RULES", "RULES", "RankWork", "diagnose", "diagnose_job",
           "rank_work", "ranked_findings"]
