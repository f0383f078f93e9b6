"""What `compare` measures a finding by: each rule's own quantity, read from its evidence.

A finding on both sides is worse, better or the same by what it costs, never by its severity or
its saving: both are shares of the step, so when a change makes the step shorter, every finding
it did not touch grows in share and in severity while its cost stays put (docs/metrics.md has a
recorded pair where gpu-idle went from info to high while its idle time fell). Each rule's
quantity (its SPEC's `metric`) is the time it costs per step where the rule measures one, in
the rule's own evidence (docs/rules.md), beside its share of the step when the rule gives one.

The rule, in both directions alike (a pair and its reverse get opposite judgements): AFTER's
figure over BEFORE's must pass 1 + the run-to-run floor (`--noise-floor`, the one the step time
must clear: two recordings of one unchanged job differ by that much), and, for a time per step,
the difference must be at least MIN_STEP_PCT of the longer median step.
"""

from __future__ import annotations

from typing import Any

from stallscope.diagnose.registry import ALL_RULES
from stallscope.diagnose.spec import MS, Metric, evidence_key
from stallscope.units import percent

# Below this share of the step (in percent of the longer of the two median steps), a finding's
# time per step moves by rounding and step noise between two recordings of one job: the
# threshold compare used for a finding's saving before (1 point of the step).
MIN_STEP_PCT = 1.0

WORSE, BETTER, SAME, NOT_MEASURED = "worse", "better", "same", "not measured"

# Rule id -> its quantity, each declared in its rule's SPEC (diagnose/spec.py Metric).
# tests/test_compare.py checks that every rule stallscope has declares one, so a new rule cannot
# slip past the gate unjudged.
METRICS: dict[str, Metric] = {s.id: s.metric for s in ALL_RULES if s.metric is not None}


def _figure(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def figure_of(rule: str, finding: dict[str, Any] | None) -> tuple[float | None, float | None]:
    """One finding's quantity and its share of the step, from its evidence (None when the rule
    has no known quantity or the evidence lacks it)."""
    metric = METRICS.get(rule)
    ev = finding.get("evidence") if finding else None
    if metric is None or not isinstance(ev, dict):
        return None, None
    share = evidence_key(metric.share_key)(ev) if metric.share_key else None
    return metric.get(ev), share


def metric_of(rule: str, before: tuple[float | None, float | None],
              after: tuple[float | None, float | None]) -> dict[str, Any] | None:
    """The rule's quantity and share on each side, as compare.json holds them; None when the
    rule has no known quantity (a report from another stallscope version)."""
    metric = METRICS.get(rule)
    if metric is None:
        return None
    return {
        "what": metric.what,
        "unit": metric.unit,
        "before": _figure(before[0]),
        "after": _figure(after[0]),
        "share_before_pct": _figure(before[1]) if metric.share_key else None,
        "share_after_pct": _figure(after[1]) if metric.share_key else None,
    }


def measure(rule: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> \
        dict[str, Any] | None:
    """The rule's quantity on each side (None for a side without the finding); None when the
    rule has no known quantity (a report from another stallscope version)."""
    return metric_of(rule, figure_of(rule, before), figure_of(rule, after))


def judge(metric: dict[str, Any] | None, floor: float, step_ms: float) -> str:
    """WORSE, BETTER or SAME by the quantity (module docstring); NOT_MEASURED without it.
    `floor` is the run-to-run floor as a fraction, `step_ms` the longer median step."""
    if metric is None or metric["before"] is None or metric["after"] is None:
        return NOT_MEASURED
    b, a = metric["before"], metric["after"]
    least = MIN_STEP_PCT / 100.0 * step_ms if metric["unit"] == MS else 0.0
    if abs(a - b) < max(least, 1e-9):
        return SAME
    if a > b * (1.0 + floor):
        return WORSE
    if a < b / (1.0 + floor):
        return BETTER
    return SAME


def _num(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.2f}"


def change_text(metric: dict[str, Any] | None) -> str:
    """The quantity for people: "GPU idle 20.0 -> 5.0 ms per step (40.0% -> 20.0% of the
    step)" on both sides, "... 20.0 ms per step (40.0% of the step) before" on one; "" when
    there is none."""
    if metric is None or (metric["before"] is None and metric["after"] is None):
        return ""
    b, a = metric["before"], metric["after"]
    sb, sa = metric.get("share_before_pct"), metric.get("share_after_pct")
    if b is not None and a is not None:
        text = f"{metric['what']} {_num(b)} -> {_num(a)} {metric['unit']}"
        if sb is not None and sa is not None:
            text += f" ({percent(sb)} -> {percent(sa)} of the step)"
        return text
    value, share, when = (b, sb, "before") if b is not None else (a, sa, "after")
    text = f"{metric['what']} {_num(value)} {metric['unit']}"
    if share is not None:
        text += f" ({percent(share)} of the step)"
    return f"{text} {when}"
