"""compare.json as a contract: typed definitions of its shape, and the JSON Schema made from them.

A CI gate reads compare.json beside the exit status of `compare --fail-on`; it needs to know
which keys are always there, which may be null, and in which unit each number is. These msgspec
Structs are that description; `msgspec.json.schema` turns them into the JSON Schema shipped
beside this module (`compare.schema.json`) and copied to docs/compare-schema.json
(tests/test_compare.py checks both are current and that compare.json validates).

Rules the schema states, and `commands/compare.py` keeps:
- Absent values are `null`. The unit is a word in the key's name: `us` microseconds, `pct`
  percent (0-100) of the step or of the GPU's time; ratios and speedups are plain numbers
  rounded to `step_time.ratio_digits` digits; `aa_noise` and `noise_floor` are fractions.
- `step_time.speedup` is the one speedup every view states (the mean step's, before / after:
  above 1 is faster), `speedup_text` its words ("3.79x faster", "1.25x slower").
- Findings are matched by cause (rule, device, rank), each cause once. On both sides they are
  `worse`, `better` or `unchanged` by `metric` (the quantity each rule measures, mostly its
  time per step, pooled as the median over a side's recordings), never by severity or saving;
  each row quotes AFTER's title (BEFORE's for a resolved finding).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

from stallscope.report.schema import json_schema, shipped

SCHEMA_FILE = Path(__file__).with_name("compare.schema.json")
SCHEMA_ID = "https://stallscope.dev/compare-schema.json"

StepVerdict = Literal["faster", "slower", "no measurable difference"]


class StepStats(msgspec.Struct, forbid_unknown_fields=True):
    """One side's step wall times, in microseconds."""

    median: float
    mean: float
    p10: float
    p90: float
    min: float
    max: float


class Side(msgspec.Struct, forbid_unknown_fields=True):
    """One input: `kind` is `report` (an output folder's report.json) or `traces` (analysed
    now); `busy` says why its machine counts as busy ([] when it does not)."""

    path: str
    kind: Literal["report", "traces"]
    traces: list[str | None]
    steps: int
    step_time_us: StepStats
    partial: bool
    busy: list[str]


class Interval(msgspec.Struct, forbid_unknown_fields=True):
    """The mean step's speedup with its seeded bootstrap interval."""

    speedup: float
    low: float
    high: float
    confidence: float


class MedianReading(msgspec.Struct, forbid_unknown_fields=True):
    """The median step's speedup (before / after), its seeded bootstrap interval, its A/A
    noise (each side's halves' medians, the larger; null when a side is too short) and its
    verdict, judged as the mean's."""

    speedup: float
    speedup_text: str
    interval: Interval
    aa_noise: float | None
    verdict: StepVerdict


class Outlier(msgspec.Struct, forbid_unknown_fields=True):
    """The one step that decides the mean's verdict (`decides`) or alone keeps the mean's
    speedup on the other side of the run-to-run floor from the median's: its side, step name,
    recording, its time and its side's median step, and the mean's speedup without it."""

    side: Literal["before", "after"]
    step: str
    trace: str
    duration_us: float
    median_us: float
    speedup_without: float
    speedup_without_text: str
    decides: bool


class StepTime(msgspec.Struct, forbid_unknown_fields=True):
    """`ratio`/`ratio_mean`: after / before of the medians and means (below 1 is faster);
    `ratio_range`: after's p10-p90 against before's p90-p10; `speedup`, `interval` and
    `aa_noise` are the mean step's, `mean_verdict` what they say, `median` the median step's
    reading; `verdict` combines the two (`decided_by`: `both` agreed, `median` because
    `outlier` decided the mean, `disagree`: no difference claimed; `note` says so in words, ""
    when both agree and no one step pulls the mean), `no measurable difference`
    on a busy machine, where `interval_verdict` keeps what the readings said."""

    ratio: float
    speedup: float
    speedup_text: str
    ratio_mean: float
    ratio_range: list[float]
    delta_us: float
    interval: Interval
    aa_noise: float | None
    aa_noise_from: str
    aa_noise_sides: list[float | None]
    noise_floor: float
    mean_verdict: StepVerdict
    median: MedianReading
    outlier: Outlier | None
    decided_by: Literal["both", "median", "disagree"]
    note: str
    verdict: StepVerdict
    interval_verdict: StepVerdict
    ratio_digits: int


class BreakdownRow(msgspec.Struct, forbid_unknown_fields=True):
    """One host category: its share of the step and its time per step, each side."""

    category: str
    before_pct: float
    after_pct: float
    delta_pct: float
    before_us: float
    after_us: float
    delta_us: float


class GpuRow(msgspec.Struct, forbid_unknown_fields=True):
    """One GPU's busy and idle shares; null on the side that has no such device."""

    device: str
    before_busy_pct: float | None
    after_busy_pct: float | None
    before_idle_pct: float | None
    after_idle_pct: float | None
    delta_busy_pct: float | None


class Metric(msgspec.Struct, forbid_unknown_fields=True):
    """What a rule measures, each side (null where the side has no such finding): `unit` is
    `ms per step` for most rules, `ms per epoch`, `ms in the steps` or `threads`."""

    what: str
    unit: str
    before: float | None
    after: float | None
    share_before_pct: float | None
    share_after_pct: float | None


class RecordingFigure(msgspec.Struct, forbid_unknown_fields=True):
    """What one recording of a side measured for a cause (null when not measured)."""

    trace: str
    figure: float | None
    share_pct: float | None


class FindingRow(msgspec.Struct, forbid_unknown_fields=True):
    """A cause, matched across the sides by rule, device and rank, once (`trace`: where it is,
    `rank N`, `device N`, both, `job`, or `all recordings`). Each side's `metric` figure is
    the median over the recordings that found it (`pooled_*` says so, `figures_*` lists each
    recording's; `found_*` of `recordings_*` found it); its words come from one recording,
    `trace_before` / `trace_after`. `title` is AFTER's (BEFORE's when resolved);
    `metric` null for a rule compare has no quantity for; `judged`: worse, better, same or
    `not measured` for a finding on both sides, null otherwise; `change` the quantity in words;
    `worse_because` why a worse row is worse ([] otherwise)."""

    id: str
    trace: str
    device: str | None
    rank: int | None
    trace_before: str | None
    trace_after: str | None
    title: str | None
    title_before: str | None
    severity_before: str | None
    severity_after: str | None
    saving_before_pct: float | None
    saving_after_pct: float | None
    saving_before_kind: str | None
    saving_after_kind: str | None
    caused_by_before: str | None
    caused_by_after: str | None
    found_before: int
    found_after: int
    recordings_before: int
    recordings_after: int
    pooled_before: str | None
    pooled_after: str | None
    figures_before: list[RecordingFigure]
    figures_after: list[RecordingFigure]
    metric: Metric | None
    judged: Literal["worse", "better", "same", "not measured"] | None
    change: str
    worse_because: list[str]


class Findings(msgspec.Struct, forbid_unknown_fields=True):
    """Resolved (before only, clear after), new (after only), worse / better / unchanged (both
    sides, by `metric`), unsteady (found in some recordings of one side, not most, and in none
    of the other's: no gate counts it), not_assessed (one side only, the rule not assessable on
    the other)."""

    resolved: list[FindingRow]
    new: list[FindingRow]
    worse: list[FindingRow]
    better: list[FindingRow]
    unchanged: list[FindingRow]
    unsteady: list[FindingRow]
    not_assessed: list[FindingRow]


class Gates(msgspec.Struct, forbid_unknown_fields=True):
    """Each `--fail-on` gate's line, the one it prints when it fires; null when it passes."""

    slower: str | None
    new: str | None
    worse: str | None
    cause_worse: str | None = msgspec.field(name="cause-worse")


class Compare(msgspec.Struct, forbid_unknown_fields=True):
    """compare.json, top level. `verdict` is the comparison's first line."""

    schema_version: int
    stallscope_version: str
    before: Side
    after: Side
    step_time: StepTime
    breakdown: list[BreakdownRow]
    gpu: list[GpuRow]
    findings: Findings
    verdict: str
    gates: Gates


def compare_schema() -> dict[str, Any]:
    """The JSON Schema of compare.json, made from the Structs above."""
    return json_schema(Compare, SCHEMA_ID, "stallscope compare.json", __doc__)


def render_schema() -> str:
    """The schema as the shipped file holds it: sorted keys, two-space indent."""
    return shipped(compare_schema())


def check(data: dict[str, Any]) -> Compare:
    """Decode compare.json data against the typed definitions; raises msgspec.ValidationError
    naming the first key that breaks the contract."""
    return msgspec.convert(data, Compare, strict=False)
