"""What a rule declares about itself (diagnose/registry.py collects them): its id and title, the
named thresholds it judges by, the `--what-if` changes that fix it and how a finding picks them,
and its docs entry. The fix plan, the what-if vocabulary, the README's rule table and
docs/rules.md are made from these declarations (diagnose/docgen.py), so they cannot drift apart.
"""

from __future__ import annotations

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
