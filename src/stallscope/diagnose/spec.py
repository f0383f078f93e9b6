"""What a rule declares about itself (diagnose/registry.py collects them): its id and title, the
named thresholds it judges by, the `--what-if` changes that fix it and how a finding picks them,
the quantity `compare` judges it by, the findings that cause it, the figure a verdict on it
states, how the fix plan bounds its saving, how the report speaks of it, and its docs entry.
The fix plan, the what-if vocabulary, compare's gate, the README's rule table and docs/rules.md
are made from these declarations (diagnose/docgen.py), so a rule is one record in one module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stallscope.trace.model import TraceModel

# Said of a finding whose rule declares no change, or whose change does not fit this finding.
NO_CHANGE = "its change is not one the replay can model"


@dataclass(frozen=True)
class Change:
    """One change, as a user would make it: `num_workers=4`, `amp=bf16`."""

    key: str
    value: str

    @property
    def text(self) -> str:
        return f"{self.key}={self.value}"


def fixed(*changes: Change) -> Callable[[Any, TraceModel], list[Change]]:
    """A rule's changes when they do not depend on the finding: always these."""
    return lambda finding, model: list(changes)


Getter = Callable[[dict[str, Any]], float | None]
MS = "ms per step"


def evidence_key(name: str) -> Getter:
    """Read one evidence key as a finite number (None when absent or not one)."""
    def get(evidence: dict[str, Any]) -> float | None:
        value = evidence.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        return None
    get.key_names = (name,)  # type: ignore[attr-defined]
    return get


def evidence_sum(*names: str) -> Getter:
    """The sum of several evidence keys; None when any is missing."""
    def get(evidence: dict[str, Any]) -> float | None:
        values = [evidence_key(n)(evidence) for n in names]
        return None if any(v is None for v in values) else sum(v for v in values if v)
    get.key_names = names  # type: ignore[attr-defined]
    return get


@dataclass(frozen=True)
class Metric:
    """A rule's measured quantity, as `compare` judges a finding on both sides: what it is in
    words, its unit, how to read it from the evidence, and the evidence key of the same as a
    share of the step (shown beside it)."""

    what: str
    unit: str
    get: Getter
    share_key: str | None = None
    reads: tuple[str, ...] = ()  # the evidence keys `get` reads, when not `evidence_key`'s one

    @property
    def keys(self) -> tuple[str, ...]:
        """Every evidence key this metric reads (tests check the rules still write them)."""
        own = getattr(self.get, "key_names", ())
        return (*own, *self.reads, *([self.share_key] if self.share_key else []))

    @property
    def per_step(self) -> bool:
        return self.unit == MS


@dataclass(frozen=True)
class Cause:
    """Another rule's finding that owns this one's lost time: when this finding's evidence says
    at least CAUSE_SHARE_PCT (diagnose/__init__.py) of it coincides with `rule`'s (`share_key`),
    and `rule` was found on the same trace, the finding is reported as caused by it. A None key:
    always `rule`'s when both are found."""

    rule: str
    share_key: str | None = None


@dataclass(frozen=True)
class RuleSpec:
    """One rule, declared where it is written (its module's `SPEC`)."""

    id: str
    title: str  # docs/rules.md's heading: what the finding means
    summary: str  # the README's table line
    # The rule itself: (model, context) -> Assessment; a job rule takes each rank's RankWork;
    # a rule that `reads` earlier findings also takes them, by id.
    check: Callable[..., Any]
    # The named constants it judges by (name -> value), as the docs print them.
    thresholds: Mapping[str, float | int] = field(default_factory=dict)
    # `--what-if` keys its fixes use (the vocabulary is the union, in rule order)...
    what_if: tuple[str, ...] = ()
    # ...and the ones a finding of it recommends, in what-if terms ([] when it has none to
    # replay, then `no_change` says why).
    changes: Callable[[Any, TraceModel], list[Change]] | None = None
    no_change: Callable[[Any], str] | None = None
    # Ids of rules run before it on the same trace whose findings it reads (never runs them).
    reads: tuple[str, ...] = ()
    job: bool = False  # over all the ranks of one job, not one trace
    # Where it runs and is reported among the rules: ascending (ties by id). Spaced by tens so
    # a new rule slots in without renumbering the others; one that `reads` comes after them.
    order: int = 0
    # The quantity `compare` judges a finding of it by (None: "not measured" on both sides).
    metric: Metric | None = None
    # The rules whose findings own its lost time, in the order they are tried.
    causes: tuple[Cause, ...] = ()
    # The figure a verdict on it states, as (evidence key, TensorBoard tag name); None: the
    # verdict states its saving.
    verdict_metric: tuple[str, str] | None = None
    # The fix plan, for an unreplayed bound: why the floor does not cap it ("" when it does)...
    not_capped: str = ""
    # ...whether its saving is per epoch, on a base of its own, not a share of the step...
    per_epoch: bool = False
    # ...and whether its change is the loader's own (the workers' pace does not bound it).
    loader_pace: bool = False
    # Its replayed change is a DataLoader setting (written as Trainer's fields where it builds
    # the loader: diagnose/knobs.py).
    loader_setting: bool = False
    # The step's bound rather than a fix: the verdict names it first, and as an upper bound it
    # claims no saving of its own (only faster GPU work helps).
    bound: bool = False
    # Its lost time is the GPU's idle time: unreplayed, the verdict states the plan's floor;
    # minor, it adds the profiler's note.
    idle_time: bool = False
    # Its evidence holds the loader's time and wait (loader_share_pct, wait_share_pct), which the
    # report relates in one sentence.
    loader_story: bool = False
    # Its evidence's "device" is the device index the finding is about (one finding per
    # device), which compare matches findings by.
    per_device: bool = False
    # What it finds is not time (what fits in memory): its findings claim no saving.
    no_time_saving: bool = False
    # The evidence key listing the traces it names ({"trace": label} each): the rank table
    # keeps their rows when it summarises ("" when none).
    names_traces: str = ""

    @property
    def name(self) -> str:
        """The id as a Python name: its module `diagnose/rules/<name>.py`, its tests
        `tests/rules/test_<name>.py`."""
        return self.id.replace("-", "_")

    @property
    def module(self) -> str:
        return f"src/stallscope/diagnose/rules/{self.name}.py"

    @property
    def tests(self) -> str:
        return f"tests/rules/test_{self.name}.py"

    @property
    def replay_models(self) -> str:
        """Where the replay models of the keys this rule is the first to declare live."""
        return f"src/stallscope/replay/models/{self.name}.py"

    @property
    def docs(self) -> str:
        return f"docs/rules.md#{self.id}"

    def changes_for(self, finding: Any, model: TraceModel) -> list[Change]:
        return self.changes(finding, model) if self.changes else []

    def no_change_reason(self, finding: Any) -> str:
        return self.no_change(finding) if self.no_change else NO_CHANGE
